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
and backward are ``jax.pure_callback`` calls of a numpy backend on the host (one mechanism for
every op, driven by its declaration: ssm_jax/_bridge.py), so it works under ``jax.jit``,
``jax.grad`` / ``jax.vjp`` and ``jax.vmap`` (a vmapped call runs the backend once per batch
element). docs/JAX.md is the user's guide.
"""

from __future__ import annotations

from ssm_ref.extras import install_hint
from ssm_ref.precision import check_precision

try:
    import jax  # noqa: F401  (ssm_jax/_bridge.py uses it)
except ModuleNotFoundError as e:   # jax is an optional dependency of ssm-scan (its extra "jax")
    if e.name != "jax":
        raise
    raise ModuleNotFoundError(f"ssm_jax needs jax, which is not installed: {install_hint('jax', 'jax')}",
                              name="jax") from e
import jax.numpy as jnp

import ssm_ref
import ssm_ref.checks
from ssm_ref.backend_names import BACKENDS, resolve_backend
from ssm_ref.checks import MISSING, check_five_arrays
from ssm_ref.ops import SCAN
from ssm_ref.results import Where

from ._bridge import Bridge, backend_module, ids_for_check, last_where, standin

__all__ = ["BACKENDS", "Where", "last_where", "mamba3_scan", "ssm_scan"]


def __dir__():
    # The public names only; jax, numpy and the helpers are not the API.
    return sorted(__all__)


def _check(arrays, ids, snapshots=1) -> ssm_ref.Dims:
    """The shared checker on shapes and dtypes (and ids' values when they are concrete); K as
    ``snapshots``."""
    return ssm_ref.checks.check_shapes(*map(standin, arrays), ids_for_check(ids), snapshots=snapshots)


def ssm_scan(s, x, dt, A, B, C=MISSING, ids=None, *, backend: str = "ssm_fast", dt_softplus="ggml", invariant=False,
             snapshots=None, precision=None):
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

    precision: the products' arithmetic, with PyTorch's names: None (default) or "highest", "high",
    "medium" (ValueError otherwise). Every backend computes at "highest" (float32 products) today,
    whatever is asked: ``last_where().precision`` says so (docs/SPEC.md section 15).
    """
    check_five_arrays(x, C)
    if precision is not None:
        check_precision(precision)
    backend = resolve_backend(backend)
    backend_module(backend)
    statics = (backend, ssm_ref.check_dt_softplus(dt_softplus), ssm_ref.checks.check_invariant(invariant, backend))
    K = None if snapshots is None else ssm_ref.check_snapshots(snapshots)
    if s is None:   # the shared checker's zero start states (it raises for ids given with them)
        x_ = jnp.asarray(x)
        d = _check((None, x_, *(jnp.asarray(a) for a in (dt, A, B, C))), ids)
        s = jnp.zeros((d.S, d.H, d.P, d.N), x_.dtype)
    arrays = tuple(jnp.asarray(a) for a in (s, x, dt, A, B, C))
    _check(arrays, ids, 1 if K is None else K)
    if K is None:
        return _SCAN((*arrays, ids), statics)
    return _SNAPSHOTS((*arrays, ids), (*statics, K))


# The bridges' static arguments: (backend, dt_softplus, invariant), and K for the snapshots.

def _keywords(statics) -> dict:
    """The backend call's keywords: the form (every backend takes the three), ssm_vk's invariant
    mode when asked for, ``snapshots=K``."""
    backend, dt_softplus, invariant, *K = statics
    kw = {"dt_softplus": dt_softplus}
    if invariant and backend == "ssm_vk":
        kw["invariant"] = True
    if K:
        kw["snapshots"] = K[0]
    return kw


_X, _S = SCAN.input_names.index("x"), SCAN.input_names.index("s")


def _shapes(inputs, statics) -> tuple:
    """y (S,T,H,P), states (S,H,P,N) [, snapshots (K,S,H,P,N)]."""
    S, T, H, P = inputs[_X].shape
    N, K = inputs[_S].shape[3], statics[3:]
    return ((S, T, H, P), (S, H, P, N), *(((K[0], S, H, P, N),) if K else ()))


# y in x's dtype, the states (and the snapshots) in s's (the start state of the declared pair)
_PARTS = {"keywords": _keywords, "shapes": _shapes, "like": {"y": "x", "states": "x"}}
_SCAN = Bridge(SCAN, **_PARTS)
_SNAPSHOTS = Bridge(SCAN, forward_only=1, extra=(("snapshots", "s"),), **_PARTS)


from ._mamba3 import mamba3_scan  # noqa: E402  (Mamba-3's scan, bridged the same way)
