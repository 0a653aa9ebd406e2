"""ssm_ref: the numpy reference of the Mamba selective scan (ggml SSM_SCAN) and its backward
(ggmlR SSM_SCAN_BACK) -- the executable spec every other backend is tested against.

    import ssm_ref
    y, states = ssm_ref.ssm_scan(s, x, dt, A, B, C, ids)     # float32, the contract
    o = ssm_ref.ssm_scan(s, x, dt, A, B, C, ids, dtype=np.float64)   # the oracle
    g = ssm_ref.ssm_scan_back(s, x, dt, A, B, C, ids, g_y, g_states)
    g = ssm_ref.ssm_scan_back(None, x, dt, A, B, C, g_y=g_y)  # zero start states, g_states zeros
    r = ssm_ref.ssm_scan(s, x, dt, A, B, C, ids, snapshots=4)  # r.snapshots[k]: after T - k tokens
    g["d_x"]                                                 # ScanGrads: a mapping by name

Shapes (N d_state, P head_dim, H n_head, G n_group, T tokens, S sequences, R cache rows):
s (R,H,P,N), x (S,T,H,P), dt (S,T,H), A (H,) | (H,1) Mamba-2 or (H,N) Mamba-1,
B and C (S,T,G,N), ids (S,) integer in [0, R). ``s=None``: zero start states (S,H,P,N), ids None.
``dt_softplus``: "ggml" (the default, ggml's form), "log1p" or True (mamba_ssm's), None or False.
See docs/SPEC.md and docs/API.md.

The same names exist in ``ssm_fast`` (numba, CPU) and ``ssm_vk`` (Vulkan).

Mamba-3 (docs/SPEC.md, "Mamba-3"):

    y, theta, h, k, v = ssm_ref.mamba3_scan(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta)  # SISO, zero start
    r = ssm_ref.mamba3_scan(x2, dt2, dA2, lam2, B2, C2, B_bias, C_bias, dtheta2, None, theta, h, k, v)  # go on
    g = ssm_ref.mamba3_scan_back(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, g_y=g_y)  # g["d_dtheta"], ...

MIMO of rank M: B, C (S,T,M,G,N), biases (H,M,N), psi (H,M,P); y per rank (S,T,M,H,P).
``rotation="halved"`` is the pairing of mamba_ssm's MIMO kernels, "interleaved" (the default) SISO's.

Also part of the spec: ``ssm_ref.tolerance`` (how close a float32 implementation must come to
the float64 oracle), ``ssm_ref.jvp`` (forward mode: tangents of y and states), ``ssm_ref.chunked``
(the chunked Mamba-2 form), ``ssm_ref.mamba3_chunked`` and ``ssm_ref.mamba3_chunked_back`` (the
chunked Mamba-3 forward and backward), ``ssm_ref.packing`` (ggml's 1-D layouts).

Testing an implementation against this spec (golden vectors, ``verify``, the properties, the
fuzzer): the kit ``ssm_ref.testing`` (docs/PORTING.md). It imports the spec; nothing here imports it.
"""

from __future__ import annotations

import numpy as np

from . import chunked, jvp, mamba3_chunked, mamba3_chunked_back, ops, packing, tolerance
from ._version import __version__
from .checks import (
    DT_SOFTPLUS,
    MISSING,
    Dims,
    Problem,
    check_backward,
    check_dt_softplus,
    check_dtype,
    check_forward,
    check_snapshots,
    check_update_cache,
    is_device_array,
    output_elems,
    write_cache_rows,
)
from .mamba3 import mamba3_scan, mamba3_scan_back
from .memory import host_memory_bytes
from .packing import pack_backward, pack_forward, unpack_backward, unpack_forward, unpack_snapshots
from .results import GRAD_NAMES, Mamba3Grads, Mamba3Result, ScanGrads, ScanResult, Support, Where
from .scan import backward as _backward
from .scan import backward_workspace, forward_workspace, scatter_rows
from .scan import forward as _forward

NAME = "ssm_ref"
WHERE = "CPU"
# The port interface's declaration (ssm_ref.testing.ports): snapshots=K, every slot as docs/SPEC.md 3.1.
SNAPSHOTS = "all"

__all__ = [
    "is_device_array",
    "DT_SOFTPLUS",
    "GRAD_NAMES",
    "NAME",
    "SNAPSHOTS",
    "OPS",
    "WHERE",
    "Dims",
    "Mamba3Grads",
    "Mamba3Result",
    "Problem",
    "ScanGrads",
    "ScanResult",
    "Support",
    "Where",
    "__version__",
    "check_backward",
    "check_dt_softplus",
    "check_dtype",
    "check_forward",
    "check_op",
    "check_snapshots",
    "check_update_cache",
    "pack_backward",
    "pack_forward",
    "chunked",
    "ops",
    "packing",
    "jvp",
    "mamba3_chunked",
    "mamba3_chunked_back",
    "mamba3_scan",
    "mamba3_scan_back",
    "tolerance",
    "scatter_rows",
    "ssm_scan",
    "ssm_scan_back",
    "supports",
    "host_memory_bytes",
    "unpack_backward",
    "unpack_forward",
    "unpack_snapshots",
]



def __dir__():
    # The public names only (its public submodules: chunked, jvp, mamba3_chunked,
    # mamba3_chunked_back, ops, packing, tolerance). The submodules that imports attach (checks,
    # scan, mamba3, mamba3_checks, results, memory, environ, testing) and numpy stay importable by
    # their path, e.g. ``import ssm_ref.checks``, but are not the API.
    return sorted(__all__)

OPS = ("ssm_scan", "ssm_scan_back")


def ssm_scan(s, x, dt, A, B, C=MISSING, ids=None, *, dtype=np.float32, dt_softplus="ggml", update_cache=False,
             snapshots=1) -> ScanResult:
    """Forward selective scan.

    Args: s (R,H,P,N) or None (zero start states (S,H,P,N), one per sequence; ``ids`` must then be
    None), x (S,T,H,P), dt (S,T,H), A (H,)|(H,1)|(H,N), B and C (S,T,G,N), ids (S,) integers in
    [0, R) or None for arange(S); float inputs of any float dtype.
    dtype: np.float32 (the contract: float32 storage and arithmetic) or np.float64 (the oracle).
    dt_softplus: how dt becomes the step d (docs/SPEC.md section 3): "ggml" (the default,
    log(1 + exp(dt)) as ggml computes it), "log1p" or True (log1p(exp(dt)), accurate far down the
    negative side: PyTorch's and mamba_ssm's softplus), or None or False (d = dt); both softplus
    forms are the identity above 20.

    update_cache: False (default: inputs are never written) or True: sequence i's final state is
    written into row ids[i] of s (a writeable numpy float array, not None; the ids distinct), and
    the result's ``states`` is None -- the decode loop's cache update without a copy of its own.

    snapshots: K >= 1 (default 1), ggml's state slots for rollback: the result's ``snapshots``
    (K,S,H,P,N) holds in slot k the state after T - k tokens (slot 0 = states, slot T the start
    state, slots k > T NaN). With update_cache=True and K > 1 only the final state is written to
    the cache; the K slots are returned.

    Returns ScanResult(y (S,T,H,P), states (S,H,P,N), snapshots (K,S,H,P,N)) in ``dtype``,
    where="CPU"; it unpacks as ``y, states = ssm_scan(...)``.
    Raises TypeError / ValueError for bad input before any work (a message naming the argument),
    ValueError for a problem beyond the host memory limit (ssm_ref.memory) before any allocation.
    Same function: ssm_fast.ssm_scan, ssm_vk.ssm_scan (every dt_softplus form on each).
    """
    dt_softplus = check_dt_softplus(dt_softplus)
    p = check_forward(s, x, dt, A, B, C, ids, dtype=dtype, workspace=forward_workspace, snapshots=snapshots)
    update = check_update_cache(update_cache, s, p.ids)
    y, states, snaps = _forward(p, dt_softplus)
    if p.dims.K == 1:
        snaps = states[None]   # the one slot is states, as on every backend (a view)
    if update:
        write_cache_rows(s, p.ids, states)
        states = None
        snaps = snaps if p.dims.K > 1 else None
    return ScanResult(y=y, states=states, where=WHERE, backend=NAME, snapshots=snaps)


def ssm_scan_back(s, x, dt, A, B, C=MISSING, ids=None, g_y=None, g_states=None, *, dtype=np.float32,
                  dt_softplus="ggml", g_snapshots=None) -> ScanGrads:
    """Backward of :func:`ssm_scan` for the loss sum(y * g_y) + sum(states * g_states)
    + sum(snapshots * g_snapshots).

    s, x, dt, A, B, C, ids as in :func:`ssm_scan` (``s=None``: zero start states, ids None).
    g_y (S,T,H,P) and g_states (S,H,P,N); either may be None for zeros of its shape (both None:
    every gradient is zero), so ``ssm_scan_back(s, x, dt, A, B, C, g_y=g_y)`` is the backward of
    a loss on y alone. g_snapshots (K,S,H,P,N) or None: the gradient of the forward's K state
    slots (``snapshots=K``); slot 0 adds to g_states, slot T to the start state, slots k > T are
    ignored (the forward's NaN slots depend on nothing). g_y may also be the packed 1-D forward
    layout (y, then K slots; K from its length) with g_states and g_snapshots None.
    Returns ScanGrads: d_s (R,H,P,N) (d_s0 scatter-added by ids; for ``s=None`` the gradient of
    the zero start states, (S,H,P,N), equal to d_s0), d_s0 (S,H,P,N), d_x, d_dt, d_A (A's shape),
    d_B, d_C, in ``dtype``; a mapping by name (``g["d_x"]``). ``dt_softplus`` as in
    :func:`ssm_scan` (d_dt is the derivative through that form: sigmoid(dt) for both softplus
    forms, 1 above 20 and for None). Raises as :func:`ssm_scan`; the host memory it needs
    includes the T+1 states of the recompute.
    Same function: ssm_fast.ssm_scan_back, ssm_vk.ssm_scan_back (every form on each).
    """
    dt_softplus = check_dt_softplus(dt_softplus)
    p = check_backward(s, x, dt, A, B, C, ids, g_y, g_states, dtype=dtype, workspace=backward_workspace,
                       g_snapshots=g_snapshots)
    g = _backward(p, dt_softplus)
    return ScanGrads(**g, where=WHERE, backend=NAME)


def check_op(op: str) -> str:
    """``op`` must be "ssm_scan" or "ssm_scan_back"."""
    if op not in OPS:
        raise ValueError(f"op: expected 'ssm_scan' or 'ssm_scan_back', got {op!r}")
    return op


def supports(op, s, x, dt, A, B, C=MISSING, ids=None, *, dt_softplus="ggml", update_cache=False,
             snapshots=1) -> Support:
    """The reference runs every valid case that fits the host memory limit (ssm_ref.memory).
    Takes the arguments of ssm_scan (``s=None``, every ``dt_softplus`` form and every K included).
    Bad input raises as in ssm_scan (a forward beyond the limit too; ``dt_softplus`` and
    ``update_cache`` checked as there); a backward beyond it -- the T+1 states -- is answered
    ``Support(False, reason)`` (ssm_scan_back would raise)."""
    check_op(op)
    check_dt_softplus(dt_softplus)
    p = check_forward(s, x, dt, A, B, C, ids, workspace=forward_workspace, snapshots=snapshots)
    check_update_cache(update_cache, s, p.ids, op=op)
    if op == "ssm_scan_back":
        f32 = np.dtype(np.float32)
        need = (output_elems(p.dims, True) + 2 * p.dims.S * p.dims.T * p.dims.H * p.dims.P) * 4 \
            + backward_workspace(p.dims, f32)
        have, source = host_memory_bytes()
        if need > have:
            return Support(False, f"the backward needs about {need} bytes of host memory (T+1 states), "
                                  f"more than the {have} bytes this process may use ({source})")
    return Support(True, "the reference runs every shape on the CPU")
