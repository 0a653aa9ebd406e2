"""Mamba-3's scan (the op ``mamba3_scan`` of ssm_ref/ops.py) as a differentiable JAX function, the
way ssm_jax bridges the scan: a ``jax.custom_vjp`` whose forward and backward are
``jax.pure_callback`` calls of a numpy backend on the host, found through the op's declaration
(its function names, its input order, its gradient names). Works under ``jax.jit``, ``jax.grad`` /
``jax.vjp`` and ``jax.vmap`` (a vmapped call runs the backend once per batch element).

Glossary: S sequences, T tokens, H heads, P channels per head, N state size, G groups, M MIMO
rank, F rotated pairs, R cache rows (docs/SPEC.md, "Mamba-3").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import ssm_ref.ops
from ssm_ref.backend_names import resolve_backend
from ssm_ref.results import Where

from . import _LAST, _LOCK, _ids_for_check, _module, _standin

__all__ = ["mamba3_scan"]

_OP = "mamba3_scan"
_ROTATIONS = ("interleaved", "halved")
_OUTPUTS = ("y", "theta", "h", "k", "v")


def _record(name: str, r, work, backend: str) -> None:
    """ssm_jax.last_where's record of a backend call (the backend named when its result names none)."""
    w = Where(op=name, where=getattr(r, "where", "CPU"), backend=getattr(r, "backend", backend),
              dtype=np.dtype(work).name)
    with _LOCK:
        _LAST[0] = w


def _op():
    return ssm_ref.ops.get(_OP)


def _computes(backend: str) -> bool:
    d = _op()
    try:
        mod = _module(backend)
    except ImportError:
        return False
    return callable(getattr(mod, d.name, None)) and callable(getattr(mod, d.backward_name, None))


def mamba3_scan(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi=None, s_theta=None, s_h=None, s_k=None, s_v=None,
                ids=None, *, rotation: str = "interleaved", backend=None):
    """Mamba-3's scan, differentiable in every float input (the start states included).

    The arguments of ssm_ref.mamba3_scan (docs/SPEC.md, "Mamba-3"): SISO x (S,T,H,P), dt, dA, lam
    (S,T,H), B and C (S,T,G,N), biases (H,N), dtheta (S,T,H,F), psi None, states s_theta (R,H,F),
    s_h (R,H,P,N), s_k (R,H,N), s_v (R,H,P); MIMO rank M: B and C (S,T,M,G,N), biases (H,M,N),
    psi (H,M,P) or None, s_k (R,H,M,N), s_v (R,H,M,P). The four states all None (zero start, ids
    None) or all given; ids (S,) integers or None. rotation "interleaved" or "halved". backend:
    "ssm_fast", "ssm_vk", "ssm_ref" (or "fast", "vk", "ref"), or None: ssm_fast where it computes the op, else
    ssm_ref. Computed in float32 (float64 with backend="ssm_ref", x64 enabled and every float
    input float64).

    Returns (y, theta, h, k, v): y in x's dtype; each final state in its start state's dtype
    (without start states: theta in dtheta's, k in B's, h and v in x's). Raises ValueError for a
    backend that does not compute the op, and the backends' TypeError / ValueError naming the
    argument for shapes and dtypes, before any work.
    """
    if backend is None:
        backend = "ssm_fast" if _computes("ssm_fast") else "ssm_ref"
    else:
        backend = resolve_backend(backend)
        if not _computes(backend):
            raise ValueError(f"backend: {backend} does not compute {_OP}; use backend='ssm_fast' or 'ssm_ref'")
    if not isinstance(rotation, str) or rotation not in _ROTATIONS:
        raise ValueError(f"rotation: expected 'interleaved' or 'halved', got {rotation!r}")
    floats = [None if a is None else jnp.asarray(a) for a in (x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi,
                                                                 s_theta, s_h, s_k, s_v)]
    _check(floats, ids, rotation)
    f64 = backend == "ssm_ref" and all(a.dtype == jnp.float64 for a in floats if a is not None)
    work = np.dtype(np.float64 if f64 else np.float32)
    x_, B_, dtheta_ = floats[0], floats[4], floats[8]
    states = None if floats[10] is None else tuple(floats[10:14])
    ids_ = None if ids is None else jnp.asarray(ids, dtype=jnp.int32)
    cast = [a if a is None else a.astype(work) for a in floats]
    out = _scan(backend, rotation, work.name, *cast[:10], None if states is None else tuple(cast[10:14]), ids_)
    dtypes = ((x_.dtype, *(s.dtype for s in states)) if states is not None
              else (x_.dtype, dtheta_.dtype, x_.dtype, B_.dtype, x_.dtype))
    return tuple(o.astype(t) for o, t in zip(out, dtypes, strict=True))


def _check(floats, ids, rotation) -> None:
    """The declared validator on shapes and dtypes (and ids' values when they are concrete)."""
    _op().check_forward(*(None if a is None else _standin(a.shape, a.dtype) for a in floats),
                        _ids_for_check(ids), rotation=rotation)


def _shapes(x, B, dtheta) -> tuple:
    S, T, H, P = x.shape
    N, F = B.shape[-1], dtheta.shape[-1]
    if B.ndim == 5:
        M = B.shape[2]
        return (S, T, M, H, P), (S, H, F), (S, H, P, N), (S, H, M, N), (S, H, M, P)
    return (S, T, H, P), (S, H, F), (S, H, P, N), (S, H, N), (S, H, P)


def _flat(psi, states, ids) -> tuple:
    """The optional inputs given, in order, and which were (the callback rebuilds the 15)."""
    flat = ([] if psi is None else [psi]) + ([] if states is None else list(states)) + ([] if ids is None else [ids])
    return flat, (psi is not None, states is not None, ids is not None)


def _inputs(arrays: list, has: tuple) -> list:
    """The 15 inputs in the declared order from the 9 floats and the optional ones given."""
    it = iter(arrays[9:])
    psi = next(it) if has[0] else None
    states = [next(it) for _ in range(4)] if has[1] else [None] * 4
    ids = next(it) if has[2] else None
    return [*arrays[:9], psi, *states, ids]


def _kw(backend: str, rotation: str, work) -> dict:
    kw = {"rotation": rotation}
    if backend == "ssm_ref":
        kw["dtype"] = np.dtype(work)
    return kw


# backend, rotation and the working dtype's name are static; psi and the states may be None (no
# cotangent then), ids an int32 array or None.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _scan(backend, rotation, work, x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, states, ids):
    return _forward(backend, rotation, work, x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, states, ids)


def _forward(backend, rotation, work, x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, states, ids):
    shapes = tuple(jax.ShapeDtypeStruct(s, work) for s in _shapes(x, B, dtheta))
    flat, has = _flat(psi, states, ids)
    d, kw = _op(), _kw(backend, rotation, work)

    def host(*arrays):
        args = _inputs([np.asarray(a) for a in arrays], has)
        r = getattr(_module(backend), d.name)(*args, **kw)
        _record(d.name, r, work, backend)
        return tuple(np.asarray(getattr(r, n), work) for n in _OUTPUTS)

    return jax.pure_callback(host, shapes, x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, *flat,
                             vmap_method="sequential")


def _fwd(backend, rotation, work, x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, states, ids):
    res = (x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, states, ids)
    return _forward(backend, rotation, work, *res), res


def _bwd(backend, rotation, work, res, cotangents):
    *floats, psi, states, ids = res
    flat, has = _flat(psi, states, ids)
    given = [*floats, *([psi] if psi is not None else []), *(states or ())]
    shapes = tuple(jax.ShapeDtypeStruct(a.shape, work) for a in given)
    d, kw = _op(), _kw(backend, rotation, work)
    n_in = 9 + len(flat)

    def host(*arrays):
        arrays = [np.asarray(a) for a in arrays]
        args = _inputs(arrays[:n_in], has)
        g = getattr(_module(backend), d.backward_name)(*args, *arrays[n_in:], **kw)
        _record(d.backward_name, g, work, backend)
        return tuple(np.asarray(g[d.grad_of[name]], work) for name, a in zip(d.float_inputs, args[:14], strict=True)
                     if a is not None)

    grads = list(jax.pure_callback(host, shapes, *floats, *flat, *(c.astype(work) for c in cotangents),
                                   vmap_method="sequential"))
    g_floats, rest = grads[:9], grads[9:]
    g_psi = rest.pop(0) if psi is not None else None
    g_states = tuple(rest) if states is not None else None
    return (*g_floats, g_psi, g_states, None)


_scan.defvjp(_fwd, _bwd)
