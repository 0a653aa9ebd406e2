"""ssm_jax: the selective scan of ssm-scan as a differentiable JAX function.

    import ssm_jax
    y, states = ssm_jax.ssm_scan(s, x, dt, A, B, C)                  # ssm_fast, ggml's softplus
    jax.grad(lambda x: ssm_jax.ssm_scan(s, x, dt, A, B, C)[0].sum())(x)
    y, states = ssm_jax.ssm_scan(None, x, dt, A, B, C, dt_softplus=True)  # zero start, mamba_ssm's softplus
    y, states, snaps = ssm_jax.ssm_scan(s, x, dt, A, B, C, snapshots=4)   # snaps[k]: after T - k tokens
    ssm_jax.last_where()          # Where(op='ssm_scan', where='CPU', backend='ssm_fast', dtype='float32')
    y, theta, h, k, v = ssm_jax.mamba3_scan(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta)   # Mamba-3

Shapes as every backend takes them (docs/SPEC.md): s (R,H,P,N), x (S,T,H,P), dt (S,T,H),
A (H,) | (H,1) | (H,N), B and C (S,T,G,N), ids (S,) or None; s=None for zero start states.
``last_where()`` returns an ``ssm_ref.Where`` (the type ssm_torch.last_where returns).
A ``jax.custom_vjp`` whose forward
and backward are ``jax.pure_callback`` calls of a numpy backend on the host, so it works under
``jax.jit``, ``jax.grad`` / ``jax.vjp`` and ``jax.vmap`` (a vmapped call runs the backend once per
batch element). docs/JAX.md is the user's guide.
"""

from __future__ import annotations

import functools
import importlib
import threading

from ssm_ref.extras import install_hint

try:
    import jax
except ModuleNotFoundError as e:   # jax is an optional dependency of ssm-scan (its extra "jax")
    if e.name != "jax":
        raise
    raise ModuleNotFoundError(f"ssm_jax needs jax, which is not installed: {install_hint('jax', 'jax')}",
                              name="jax") from e
import jax.numpy as jnp
import numpy as np

import ssm_ref
import ssm_ref.checks
from ssm_ref.backend_names import BACKENDS, refusal, resolve_backend
from ssm_ref.checks import MISSING, check_five_arrays
from ssm_ref.ops import SCAN
from ssm_ref.results import Where

__all__ = ["BACKENDS", "Where", "last_where", "mamba3_scan", "ssm_scan"]


def __dir__():
    # The public names only; jax, numpy and the helpers are not the API.
    return sorted(__all__)


_LOCK = threading.Lock()
_LAST: list = [None]   # the Where of the last call (one slot: replaced whole, read under the lock)


def last_where() -> Where | None:
    """The :class:`ssm_ref.Where` (op, where, backend, dtype) of the last call of a backend in
    this process (callbacks may run on another thread), or None before the first. The type
    ssm_torch.last_where returns."""
    with _LOCK:
        return _LAST[0]


def _module(backend: str):
    """The backend module named ``backend`` (the module name ssm_scan resolved)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: {refusal(backend)}")
    return importlib.import_module(backend)


def _kwargs(backend: str, mode, work) -> dict:
    """The backend call's keywords for ``mode`` = (dt_softplus, invariant): the form, checked
    (every backend takes the three), ssm_vk's invariant mode when asked for, and
    ssm_ref's working dtype."""
    dt_softplus, invariant = mode
    kw = {"dt_softplus": ssm_ref.check_dt_softplus(dt_softplus)}
    if invariant and backend == "ssm_vk":
        kw["invariant"] = True
    if backend == "ssm_ref":
        kw["dtype"] = work
    return kw


def _record(op: str, r, work) -> None:
    w = Where(op=op, where=r.where, backend=r.backend, dtype=np.dtype(work).name)
    with _LOCK:
        _LAST[0] = w


def _standin(shape, dtype) -> np.ndarray:
    """A zero-stride numpy array that the shared checker judges as an array of ``dtype``
    (bfloat16 and JAX's other extra floats as float32)."""
    dt = np.dtype(dtype)
    if jnp.issubdtype(dt, jnp.floating) and dt not in (np.float16, np.float32, np.float64):
        dt = np.dtype(np.float32)
    return np.broadcast_to(np.zeros((), dt), tuple(shape))


def _ids_for_check(ids):
    """``ids`` as the shared checker takes them: their values where they are concrete, a stand-in of
    their shape and dtype under a trace (their values are checked when the call runs)."""
    if ids is None:
        return None
    try:
        return np.asarray(ids)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return _standin(jnp.shape(ids), jnp.result_type(ids))


def _check(arrays, ids, snapshots=1) -> ssm_ref.Dims:
    """The shared checker on shapes and dtypes (and ids' values when they are concrete); K as
    ``snapshots``."""
    return ssm_ref.checks.check_shapes(*(None if a is None else _standin(jnp.shape(a), jnp.result_type(a))
                                         for a in arrays), _ids_for_check(ids), snapshots=snapshots)


def ssm_scan(s, x, dt, A, B, C=MISSING, ids=None, *, backend: str = "ssm_fast", dt_softplus="ggml", invariant=False,
             snapshots=None):
    """The forward selective scan, differentiable in s, x, dt, A, B and C.

    Arrays of any float dtype; computed in float32 (float64 when backend="ssm_ref", x64 is
    enabled and every float input is float64). ``s=None``: zero start states (S,H,P,N) in x's
    dtype (ids must then be None). Returns (y (S,T,H,P) in x's dtype, states (S,H,P,N) in s's
    dtype). backend: "ssm_fast" (default), "ssm_vk" or "ssm_ref", or their short names "fast", "vk",
    "ref" (ssm_ref.backend_names); dt_softplus: "ggml" (default,
    ggml's form), "log1p" or True (mamba_ssm's softplus), None or False (dt is the step); every
    backend takes every form. invariant: True for batch- and split-invariant results
    (docs/SPEC.md section 3.2): ssm_vk's invariant mode; ssm_ref is invariant anyway; ssm_fast
    refuses it (ValueError).

    snapshots: None (default) or K, an integer >= 1 (docs/SPEC.md section 3.1), passed to the
    backend as ``snapshots=K``: a third output, snapshots (K,S,H,P,N) in s's dtype, slot k the
    state after T - k tokens (slot 0 equals states, slot T the start state, slots k > T NaN),
    differentiable as the other outputs (a NaN slot's cotangent is ignored).
    """
    check_five_arrays(x, C)
    backend = resolve_backend(backend)
    _module(backend)
    dt_softplus = ssm_ref.check_dt_softplus(dt_softplus)
    mode = (dt_softplus, ssm_ref.checks.check_invariant(invariant, backend))
    K = None if snapshots is None else ssm_ref.check_snapshots(snapshots)
    if s is None:   # the shared checker's zero start states (it raises for ids given with them)
        x_ = jnp.asarray(x)
        d = _check((None, x_, *(jnp.asarray(a) for a in (dt, A, B, C))), ids)
        s = jnp.zeros((d.S, d.H, d.P, d.N), x_.dtype)
    arrays = tuple(jnp.asarray(a) for a in (s, x, dt, A, B, C))
    d = _check(arrays, ids, 1 if K is None else K)
    f64 = backend == "ssm_ref" and all(a.dtype == jnp.float64 for a in arrays)
    work = np.dtype(np.float64 if f64 else np.float32)
    _kwargs(backend, mode, work)  # a bad form raises here, not inside the callback
    ids_ = jnp.arange(d.S, dtype=jnp.int32) if ids is None else jnp.asarray(ids, dtype=jnp.int32)
    out = _scan(backend, mode, work.name, K, *(a.astype(work) for a in arrays), ids_)
    # y in x's dtype, the states (and the snapshots) in s's
    return tuple(o.astype(arrays[1].dtype if i == 0 else arrays[0].dtype) for i, o in enumerate(out))


# K (static, like the backend and the form): None, the two outputs (y, states) and no
# ``snapshots`` keyword for the backend; an int, the three outputs (y, states, snapshots).
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _scan(backend, dt_softplus, work, K, s, x, dt, A, B, C, ids):
    return _forward(backend, dt_softplus, work, K, s, x, dt, A, B, C, ids)


def _forward(backend, dt_softplus, work, K, s, x, dt, A, B, C, ids):
    S, T, H, P = x.shape
    N = s.shape[3]
    shapes = (jax.ShapeDtypeStruct((S, T, H, P), work), jax.ShapeDtypeStruct((S, H, P, N), work))
    kw = _kwargs(backend, dt_softplus, work)
    if K is not None:
        shapes += (jax.ShapeDtypeStruct((K, S, H, P, N), work),)
        kw["snapshots"] = K

    def host(*arrays):
        *floats, ids_ = (np.asarray(a) for a in arrays)
        r = _module(backend).ssm_scan(*floats, ids_, **kw)
        _record("ssm_scan", r, work)
        out = (r.y, r.states) if K is None else (r.y, r.states, r.snapshots)
        return tuple(np.asarray(o, work) for o in out)

    return jax.pure_callback(host, shapes, s, x, dt, A, B, C, ids, vmap_method="sequential")


def _fwd(backend, dt_softplus, work, K, s, x, dt, A, B, C, ids):
    return _forward(backend, dt_softplus, work, K, s, x, dt, A, B, C, ids), (s, x, dt, A, B, C, ids)


def _bwd(backend, dt_softplus, work, K, res, cotangents):
    s, x, dt, A, B, C, ids = res
    shapes = tuple(jax.ShapeDtypeStruct(a.shape, work) for a in (s, x, dt, A, B, C))
    kw = _kwargs(backend, dt_softplus, work)

    def host(*arrays):
        *floats, ids_, gy, gs = (np.asarray(a) for a in arrays[:9])
        # the snapshots' cotangent, when there are snapshots (the backend ignores its slots k > T)
        g_snap = {} if K is None else {"g_snapshots": np.asarray(arrays[9])}
        g = _module(backend).ssm_scan_back(*floats, ids_, gy, gs, **kw, **g_snap)
        _record("ssm_scan_back", g, work)
        return tuple(np.asarray(getattr(g, SCAN.grad_of[n]), work) for n in SCAN.float_inputs)

    grads = jax.pure_callback(host, shapes, s, x, dt, A, B, C, ids, *(c.astype(work) for c in cotangents),
                              vmap_method="sequential")
    return (*grads, None)


_scan.defvjp(_fwd, _bwd)


from ._mamba3 import mamba3_scan  # noqa: E402  (Mamba-3's scan, bridged the same way)
