"""ssm_torch: the selective scan of ssm-scan as a differentiable PyTorch operator.

    import ssm_torch
    y, states = ssm_torch.ssm_scan(s, x, dt, A, B, C)                 # ssm_fast, ggml's softplus
    y, states = ssm_torch.ssm_scan(s, x, dt, A, B, C, backend="ssm_ref", dt_softplus=None)
    y, states = ssm_torch.ssm_scan(None, x, dt, A, B, C, dt_softplus=True)  # zero start, mamba_ssm's softplus
    y, states, snaps = ssm_torch.ssm_scan(s, x, dt, A, B, C, snapshots=4)  # snaps[k]: after T - k tokens
    ssm_torch.last_where()         # Where(op='ssm_scan', where='CPU', backend='ssm_ref', dtype='float32')
    y, theta, h, k, v = ssm_torch.mamba3_scan(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta)  # Mamba-3

Shapes as every backend takes them (docs/SPEC.md): s (R,H,P,N), x (S,T,H,P), dt (S,T,H),
A (H,) | (H,1) | (H,N), B and C (S,T,G,N), ids (S,) or None; s=None for zero start states.
``last_where()`` returns an ``ssm_ref.Where`` (the type ssm_jax.last_where returns). Differentiable in s, x, dt, A, B
and C, through every output (the snapshots too); registered with torch.library
(``torch.ops.ssm_scan.scan``, ``torch.ops.ssm_scan.scan_snapshots``), so torch.compile traces it
without a graph break. The drop-ins for mamba_ssm's functions are in :mod:`ssm_torch.mamba`.
Mamba-3's scan is :func:`mamba3_scan` (``torch.ops.ssm_scan.mamba3_scan``); its drop-ins for
mamba_ssm's Mamba-3 functions and its ``Mamba3`` layer are in :mod:`ssm_torch.mamba3`.
docs/TORCH.md is the user's guide.
"""

from __future__ import annotations

from ssm_ref.extras import install_hint
from ssm_ref.precision import check_precision

try:
    import torch
except ModuleNotFoundError as e:   # torch is an optional dependency of ssm-scan (its extra "torch")
    if e.name != "torch":
        raise
    raise ModuleNotFoundError("ssm_torch needs PyTorch (torch), which is not installed: "
                              + install_hint("torch", "torch"), name="torch") from e

import ssm_ref
from ssm_ref.backend_names import BACKENDS, lookup, resolve_backend
from ssm_ref.checks import MISSING, check_five_arrays
from ssm_ref.mamba3_checks import check_rotation
from ssm_ref.ops import MAMBA3, SCAN

from . import _common, _op
from ._common import Where, last_where

__all__ = ["BACKENDS", "Where", "last_where", "mamba3_scan", "ssm_scan"]


def __dir__():
    # The public names only (its public submodules: mamba, mamba3); the operators' modules are internal.
    return sorted(__all__)

_ARRAYS = SCAN.float_inputs


def _check_tensors(named: dict, backend=None) -> None:
    """Every array a tensor, all on the CPU (or all meta), or -- with backend="ssm_vk" -- all on
    one CUDA device (ssm_torch/cuda.py)."""
    device = None
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        kind = t.device.type
        if kind not in ("cpu", "meta") and not (kind == "cuda" and backend == "ssm_vk"):
            cuda = " (CUDA tensors: with backend='ssm_vk')" if kind == "cuda" else ""
            raise ValueError(f"{name}: expected a CPU tensor (ssm-scan's backends compute from host memory){cuda}, "
                             f"got one on {t.device}: move it with .cpu()")
        if device is None:
            device = t.device
        elif t.device != device:
            raise ValueError(f"{name}: on {t.device}, the other tensors on {device}")


def _check_ids(ids, device) -> None:
    """ids: a tensor on the CPU or on the other tensors' device."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"ids: expected a torch.Tensor, got {type(ids).__name__}")
    if ids.device.type != "cpu" and ids.device != device:
        raise ValueError(f"ids: on {ids.device}, the other tensors on {device}; ids may be on the CPU or on "
                         f"{device}")


def _as_ids(ids):
    """``ids`` as an int64 tensor (lists, tuples and ranges converted), or None."""
    if ids is None or isinstance(ids, torch.Tensor):
        return ids
    return torch.as_tensor(list(ids), dtype=torch.int64)


def ssm_scan(s, x, dt, A, B, C=MISSING, ids=None, *, backend: str = "ssm_fast", dt_softplus="ggml", invariant=False,
             snapshots=None, precision=None):
    """The forward selective scan, differentiable in s, x, dt, A, B and C.

    Args: tensors s (R,H,P,N) or None (zero start states (S,H,P,N) in x's dtype; ids must then
    be None), x (S,T,H,P), dt (S,T,H), A (H,) | (H,1) Mamba-2 or (H,N) Mamba-1,
    B and C (S,T,G,N), of any float dtype (float16, bfloat16, float32, float64), on the CPU --
    or, with backend="ssm_vk", all on the CUDA device that is the Vulkan device's GPU (no copy
    through the host: ssm_torch/cuda.py; a ValueError names a tensor on another GPU); ids (S,)
    integers in [0, R) or None (arange(S)), on the CPU or the tensors' device. backend: "ssm_fast" (numba, the default),
    "ssm_vk" (Vulkan) or "ssm_ref" (numpy), or their short names "fast", "vk", "ref"
    (ssm_ref.backend_names). dt_softplus: "ggml" (default, ggml's form), "log1p"
    or True (PyTorch's F.softplus, mamba_ssm's), None or False (dt is the step) (docs/SPEC.md
    section 3); every backend takes every form. invariant: True for batch- and split-invariant
    results (docs/SPEC.md section 3.2): ssm_vk's invariant mode; ssm_ref is invariant anyway;
    ssm_fast refuses it (ValueError).

    snapshots: None (default) or K, an integer >= 1: ggml's K state slots (docs/SPEC.md section
    3.1), passed to the backend as ``snapshots=K``.

    precision: the products' arithmetic, with torch's names: None (default: what
    ``torch.set_float32_matmul_precision`` set), "highest", "high" or "medium" (ValueError
    otherwise). Every backend computes at "highest" (float32 products) today, whatever is asked:
    ``last_where().precision`` says so (docs/SPEC.md section 15).

    Computed in float32 (float64 when backend="ssm_ref" and every float input is float64).
    Returns (y (S,T,H,P) in x's dtype, states (S,H,P,N) in s's dtype); with ``snapshots=K`` a
    third tensor, snapshots (K,S,H,P,N) in s's dtype: slot k is the state after T - k tokens
    (slot 0 equals states, slot T is the start state, slots k > T are NaN), differentiable as
    the other outputs (a NaN slot's gradient is ignored). Raises the backends' TypeError /
    ValueError for bad arguments before any work (docs/SPEC.md section 9).
    """
    check_five_arrays(x, C)
    if precision is not None:
        check_precision(precision)
    _check_tensors({k: t for k, t in zip(_ARRAYS, (s, x, dt, A, B, C), strict=True) if not (k == "s" and t is None)},
                   lookup(backend))
    ids = _as_ids(ids)
    if ids is not None:
        if x.device.type == "cuda":
            _check_ids(ids, x.device)
        else:
            _check_tensors({"ids": ids})
    backend = resolve_backend(backend)
    dt_softplus = ssm_ref.check_dt_softplus(dt_softplus)
    invariant = ssm_ref.checks.check_invariant(invariant, backend)
    K = None if snapshots is None else ssm_ref.check_snapshots(snapshots)
    if s is None:   # zero start states (S, H, P, N), N from B's last axis, as the shared checker makes them
        if ids is not None or x.dim() != 4 or B.dim() != 4:
            _common.check_shapes((None, x, dt, A, B, C, ids))   # raises what is wrong (ids given with s=None)
        # (from the shapes alone, no numpy: torch.compile traces this without a graph break)
        s = x.new_zeros((x.shape[0], x.shape[2], x.shape[3], B.shape[3]))
    if K is None:   # the two outputs of every caller that does not ask for snapshots
        return _op.scan(s, x, dt, A, B, C, ids, backend, _common.encode(dt_softplus, invariant))
    return _op.scan_snapshots(s, x, dt, A, B, C, ids, backend, _common.encode(dt_softplus, invariant), K)


def mamba3_scan(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi=None, s_theta=None, s_h=None, s_k=None,
                s_v=None, ids=None, *, rotation: str = "interleaved", backend=None, precision=None):
    """Mamba-3's scan (the op ``mamba3_scan``, docs/SPEC.md), differentiable in every float input,
    the start states included.

    SISO (B.ndim == 4): x (S,T,H,P), dt, dA, lam (S,T,H), B and C (S,T,G,N), B_bias and C_bias
    (H,N), dtheta (S,T,H,F), psi None; states s_theta (R,H,F), s_h (R,H,P,N), s_k (R,H,N), s_v
    (R,H,P). MIMO rank M (B.ndim == 5): B and C (S,T,M,G,N), biases (H,M,N), psi (H,M,P) or None
    (ones), s_k (R,H,M,N), s_v (R,H,M,P). The four states all None (zero start; ids must then be
    None) or all given; ids (S,) integers in [0, R) (a tensor, list or range) or None (arange(S)).
    dt is the step (positive, no softplus inside), dA = A*dt, lam after its sigmoid, dtheta the
    angle increment. rotation: "interleaved" (pairs (2j, 2j+1)) or "halved" (pairs (j, j + N/2)).
    backend: "ssm_fast", "ssm_vk", "ssm_ref" (or "fast", "vk", "ref"), or None: ssm_fast where it computes the op,
    else ssm_ref. Tensors of any float dtype on the CPU (or meta); computed in float32 (float64
    with backend="ssm_ref" when every float input is float64). precision: as :func:`ssm_scan`.

    Returns (y, theta, h, k, v): y (S,T,H,P) | (S,T,M,H,P) in x's dtype; the final states theta
    (S,H,F), h (S,H,P,N), k (S,H,N) | (S,H,M,N), v (S,H,P) | (S,H,M,P), each in its start state's
    dtype (without start states: theta in dtheta's, k in B's, h and v in x's). Registered as
    ``torch.ops.ssm_scan.mamba3_scan``: torch.compile traces it without a graph break.

    CUDA tensors (all on one GPU, the Vulkan device's) go with backend="ssm_vk": computed on that
    GPU without a trip through host memory, as :func:`ssm_scan`'s (ssm_torch/cuda.py); the other
    backends take CPU tensors.

    Raises TypeError for an argument that is not a tensor, ValueError for a tensor on a device
    the backend cannot read (a CUDA tensor with another backend than ssm_vk; tensors on two
    devices; CUDA tensors on another GPU than the Vulkan device's), for a backend that does not
    compute the op, and the backends' TypeError / ValueError naming the argument for shapes and
    dtypes (before any work); RuntimeError where CUDA tensors cannot reach the Vulkan device here
    (ssm_torch.cuda.available() says why).
    """
    from . import _mamba3_op

    if precision is not None:
        check_precision(precision)
    given = (x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v)
    be = _mamba3_op.default_backend() if backend is None else resolve_backend(backend)
    _check_tensors({a.name: t for a, t in zip(MAMBA3.inputs, given, strict=False) if t is not None
                    or not a.optional}, be)
    ids = _as_ids(ids)
    if ids is not None:
        if x.device.type == "cuda":
            _check_ids(ids, x.device)
        else:
            _check_tensors({"ids": ids})
    if not _mamba3_op.computes(be):
        raise ValueError(f"backend: {be} does not compute {MAMBA3.name}; use backend='ssm_fast', 'ssm_vk' or "
                         "'ssm_ref'")
    return _mamba3_op.scan(*given, ids, be, check_rotation(rotation))


# (the drop-ins call ssm_scan; Mamba-3's drop-ins and layer call mamba3_scan)
from . import mamba, mamba3  # noqa: E402

__all__ += ["mamba", "mamba3"]
