"""Mamba-3's scan (the op ``mamba3_scan`` of ssm_ref/ops.py) as a differentiable JAX function, a
bridge (ssm_jax/_bridge.py) of its declaration, as the scan is: a ``jax.custom_vjp`` whose forward
and backward are ``jax.pure_callback`` calls of a numpy backend on the host. Works under
``jax.jit``, ``jax.grad`` / ``jax.vjp`` and ``jax.vmap`` (a vmapped call runs the backend once per
batch element). What is Mamba-3's own is here: the rotation (its one keyword), its outputs' shapes
and dtypes, and which backends compute it (the default backend).

Glossary: S sequences, T tokens, H heads, P channels per head, N state size, G groups, M MIMO
rank, F rotated pairs, R cache rows (docs/SPEC.md, "Mamba-3").
"""

from __future__ import annotations

from ssm_ref.backend_names import resolve_backend
from ssm_ref.bridging import computes, default_backend
from ssm_ref.mamba3_checks import check_rotation, output_shapes
from ssm_ref.ops import MAMBA3
from ssm_ref.precision import check_precision

from ._bridge import Bridge, backend_module, ids_for_check, standin

__all__ = ["mamba3_scan"]


def mamba3_scan(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi=None, s_theta=None, s_h=None, s_k=None, s_v=None,
                ids=None, *, rotation: str = "interleaved", backend=None, precision=None):
    """Mamba-3's scan, differentiable in every float input (the start states included).

    The arguments of ssm_ref.mamba3_scan (docs/SPEC.md, "Mamba-3"): SISO x (S,T,H,P), dt, dA, lam
    (S,T,H), B and C (S,T,G,N), biases (H,N), dtheta (S,T,H,F), psi None, states s_theta (R,H,F),
    s_h (R,H,P,N), s_k (R,H,N), s_v (R,H,P); MIMO rank M: B and C (S,T,M,G,N), biases (H,M,N),
    psi (H,M,P) or None, s_k (R,H,M,N), s_v (R,H,M,P). The four states all None (zero start, ids
    None) or all given; ids (S,) integers or None. rotation "interleaved" or "halved". backend:
    "ssm_fast", "ssm_vk", "ssm_ref" (or "fast", "vk", "ref"), or None: ssm_fast where it computes the op, else
    ssm_ref. Computed in float32 (float64 with backend="ssm_ref", x64 enabled and every float
    input float64). precision: as ssm_jax.ssm_scan's.

    Returns (y, theta, h, k, v): y in x's dtype; each final state in its start state's dtype
    (without start states: theta in dtheta's, k in B's, h and v in x's). Raises ValueError for a
    backend that does not compute the op, and the backends' TypeError / ValueError naming the
    argument for shapes and dtypes, before any work.
    """
    if precision is not None:
        check_precision(precision)
    if backend is None:
        backend = default_backend(MAMBA3, backend_module)
    else:
        backend = resolve_backend(backend)
        if not computes(MAMBA3, backend_module(backend)):
            raise ValueError(f"backend: {backend} does not compute {MAMBA3.name}; use backend='ssm_fast' or 'ssm_ref'")
    rotation = check_rotation(rotation)
    inputs = (x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v, ids)
    MAMBA3.check_forward(*map(standin, inputs[:-1]), ids_for_check(ids), rotation=rotation)
    return _BRIDGE(inputs, (backend, rotation))


_SHAPED_BY = tuple(MAMBA3.input_names.index(n) for n in ("x", "B", "dtheta"))

# y in x's dtype; each final state in its start state's when the states are given, else theta in
# dtheta's, h and v in x's, k in B's
_BRIDGE = Bridge(MAMBA3, keywords=lambda statics: {"rotation": statics[1]},
                 shapes=lambda inputs, statics: output_shapes(*(inputs[i].shape for i in _SHAPED_BY)),
                 like={"y": "x", "theta": "dtheta", "h": "x", "k": "B", "v": "x"})
