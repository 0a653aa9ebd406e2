"""ssm_fast: the selective scan (ggml SSM_SCAN) and its backward as numba-parallel CPU kernels.

    import ssm_fast
    y, states = ssm_fast.ssm_scan(s, x, dt, A, B, C, ids)        # ScanResult, float32
    g = ssm_fast.ssm_scan_back(s, x, dt, A, B, C, ids, g_y, g_states)
    r = ssm_fast.ssm_scan(s, x, dt, A, B, C, ids, snapshots=4)   # r.snapshots (4,S,H,P,N)

Shapes (N d_state, P head_dim, H n_head, G n_group, T tokens, S sequences, R cache rows):
s (R,H,P,N), x (S,T,H,P), dt (S,T,H), A (H,) | (H,1) Mamba-2 or (H,N) Mamba-1,
B and C (S,T,G,N), ids (S,) integers in [0, R) or None; s=None for zero start states. The same functions, with the same
arguments, results and errors, are ``ssm_ref.ssm_scan`` (numpy reference) and ``ssm_vk.ssm_scan``.

Numerics: float32 storage and float32 arithmetic (docs/SPEC.md's contract); multiply-adds may be fused
and sums over n regrouped (config). float64 is used only where it costs nothing: the scalar
per-row sums of the backward (d_dt's sum over channels, Mamba-2's d_A over tokens) and the final
sums of d_A over sequences and channels. Results are bit-identical run to run and for any thread
count. Design, partition and measured costs: docs/FAST.md.

The kernels are compiled by numba on first use (tens of seconds) and cached on disk
(``__pycache__`` beside the modules, or ``NUMBA_CACHE_DIR``); :func:`warmup` compiles all of them.
"""

from __future__ import annotations

import numpy as np

import ssm_ref
from ssm_ref import (
    ScanGrads,
    ScanResult,
    Support,
    __version__,
    check_backward,
    check_dt_softplus,
    check_forward,
    check_op,
    check_update_cache,
)
from ssm_ref.checks import MISSING, write_cache_rows
from ssm_ref.scan import softplus, softplus_grad

from . import compiling, config, guard, pool, threads
from . import kernels_bwd as _kb
from . import kernels_fwd as _kf
from . import mamba3 as _m3
from .mamba3 import mamba3_scan, mamba3_scan_back

NAME = "ssm_fast"
WHERE = "CPU"
# K state snapshots (docs/SPEC.md section 3.1): every slot written, as ssm_ref's (docs/PORTING.md).
SNAPSHOTS = "all"

__all__ = ["NAME", "SNAPSHOTS", "__version__", "get_num_threads", "mamba3_scan", "mamba3_scan_back",
           "set_num_threads", "ssm_scan", "ssm_scan_back", "supports", "warmup"]

get_num_threads = threads.get_num_threads
set_num_threads = threads.set_num_threads


def __dir__():
    # The public names only; the kernels' modules (config, threads, pool, ...) are imported by
    # their path, e.g. ``import ssm_fast.config``.
    return sorted(__all__)

_F32 = np.float32
compiling.install()


def _steps(dt, form):
    """(what the kernels read for dt, whether they take it as the step itself) for the
    ``dt_softplus`` form: ggml's softplus is the kernels' own; the accurate log1p form is applied
    here (float32, ssm_ref.scan.softplus) and the kernels take its result as the step."""
    if form == "ggml":
        return dt, False
    if form is None:
        return dt, True
    return softplus(dt, "log1p"), True


def ssm_scan(s, x, dt, A, B, C=MISSING, ids=None, *, dt_softplus="ggml", update_cache=False, snapshots=1) -> ScanResult:
    """Forward selective scan on the CPU (numba, parallel).

    Args: s (R,H,P,N) or None (zero start states (S,H,P,N); ids then None), x (S,T,H,P), dt (S,T,H),
    A (H,)|(H,1)|(H,N), B and C (S,T,G,N),
    ids (S,) integers in [0, R) or None for arange(S); float inputs of any float dtype are
    converted to float32. Returns ScanResult(y (S,T,H,P), states (S,H,P,N), snapshots
    (K,S,H,P,N)) in float32, where="CPU", backend="ssm_fast". Raises TypeError / ValueError for
    bad input before any work (the checks of ssm_ref). Inputs are never written, unless
    ``update_cache=True`` asks for the final states in the cache rows s[ids] (as
    ssm_ref.ssm_scan; ``states`` is then None, and ``snapshots`` too when K = 1).
    ``dt_softplus``: "ggml" (default), "log1p" or True (mamba_ssm's), None or False, as in
    ssm_ref.ssm_scan. ``snapshots``: K >= 1 state slots as in ssm_ref.ssm_scan (slot k the state
    after T - k tokens, written by the kernels during the scan; slot T the start state, slots
    k > T NaN); with K = 1 the one slot is ``states[None]``, a view of ``states``. The result
    unpacks as ``y, states``.
    Same function: ssm_ref.ssm_scan, ssm_vk.ssm_scan.
    """
    dt_softplus = check_dt_softplus(dt_softplus)
    if guard.unusable():
        return _reference().ssm_scan(s, x, dt, A, B, C, ids, dt_softplus=dt_softplus, update_cache=update_cache,
                                     snapshots=snapshots)
    p = check_forward(s, x, dt, A, B, C, ids, dtype=_F32, snapshots=snapshots)
    update = check_update_cache(update_cache, s, p.ids)
    steps, identity = _steps(p.dt, dt_softplus)
    d = p.dims
    y = np.empty((d.S, d.T, d.H, d.P), dtype=_F32)
    states = np.empty((d.S, d.H, d.P, d.N), dtype=_F32)
    # The slots the kernels write (k <= T); none for K = 1, whose one slot is states itself.
    snaps = np.empty((d.K if d.K > 1 else 0, d.S, d.H, d.P, d.N), dtype=_F32)
    if d.K > d.T + 1:
        snaps[d.T + 1:] = np.nan                             # no state after a negative count of tokens
    if d.mamba1:
        size = config.LANES
        n_tasks = _kf.tasks_mamba1(p.x, d.G, size)
        kernel = _kf.forward_mamba1
    else:
        size = config.ROWS_FWD
        n_tasks = _kf.tasks_mamba2(p.x, size)
        kernel = _kf.forward_mamba2
    counter = np.zeros(1, dtype=np.int64)
    if d.mamba1:
        args = (counter, p.s, p.x, steps, identity, p.A, p.B, p.C, p.ids, size, n_tasks, y, states, snaps)
    else:
        direct = d.S * d.H * d.P * d.N * 4 <= config.DECODE_DIRECT_BYTES
        args = (counter, p.s, p.x, steps, identity, p.A, p.B, p.C, p.ids, size, n_tasks, direct, y, states, snaps)
    pool.run(kernel, args, threads.count(d, "fwd", n_tasks))
    if d.K == 1:
        snaps = states[None]
    if update:
        write_cache_rows(s, p.ids, states)
        states = None
        snaps = snaps if d.K > 1 else None
    return ScanResult(y=y, states=states, where=WHERE, backend=NAME, snapshots=snaps)


_warned: set[str] = set()


def _reference():
    """ssm_ref, for a process that must not launch the kernels (guard.unusable), said once."""
    why = guard.unusable()
    if why not in _warned:
        _warned.add(why)
        guard.log.warning("ssm_fast computes with ssm_ref, the numpy reference: %s", why)
    return ssm_ref


def backward_workspace(d, dtype) -> int:
    """Bytes the backward needs besides its inputs and outputs, for the host memory rule
    (ssm_ref.memory): dd (S, T, H, P) float32, dA_rows (S, H, P, 1|N) float64 and, when the rows
    of a group are cut into chunks, two (S, chunks, T, G, N) float32 slabs of d_B / d_C partials."""
    chunks = _chunks(d)
    slabs = 2 * d.S * chunks * d.T * d.G * d.N * 4 if chunks > 1 else 0
    return d.S * d.T * d.H * d.P * 4 + d.S * d.H * d.P * (d.N if d.mamba1 else 1) * 8 + slabs


def _chunks(d) -> int:
    """Chunks per (sequence, group) of the backward: a function of the shape only."""
    rows = d.heads_per_group * d.P
    want = -(-config.TASKS_BWD // (d.S * d.G))
    return max(1, min(rows, want))


def _segment(d, lanes: int) -> int:
    """Tokens per recompute segment: its buffers fit config.SEGMENT_BYTES."""
    # states of two rows (Mamba-2), or states and decays of ``lanes`` rows (Mamba-1)
    floats_per_token = max(1, d.N) * (2 * lanes if d.mamba1 else 2)
    seg = config.SEGMENT_BYTES // (4 * floats_per_token)
    return int(max(config.SEGMENT_MIN, min(seg, max(d.T, 1))))


def ssm_scan_back(s, x, dt, A, B, C=MISSING, ids=None, g_y=None, g_states=None, *, dt_softplus="ggml",
                  g_snapshots=None) -> ScanGrads:
    """Backward of :func:`ssm_scan` for the loss sum(y * g_y) + sum(states * g_states)
    + sum(snapshots * g_snapshots).

    g_y (S,T,H,P) and g_states (S,H,P,N), each None for zeros; g_snapshots (K,S,H,P,N) or None,
    the gradient of the forward's K state slots (slot k < T joins the kernels' carry at the state
    after T - k tokens, slot 0 with g_states, slot T adds to d_s0, slots k > T are ignored); or
    g_y as the packed 1-D forward layout (y, then K slots) with g_states and g_snapshots None;
    s=None, ids and dt_softplus as in :func:`ssm_scan`. Returns
    ScanGrads in float32 (a mapping by name): d_s (R,H,P,N) (d_s0 scatter-added into rows
    ids[i]; for s=None the gradient of the zero start states, (S,H,P,N)), d_s0 (S,H,P,N), d_x, d_dt,
    d_A (A's shape as given), d_B, d_C; where="CPU",
    backend="ssm_fast". Raises as ssm_ref. Bit-identical for any thread count (docs/FAST.md).
    Same function: ssm_ref.ssm_scan_back, ssm_vk.ssm_scan_back.
    """
    dt_softplus = check_dt_softplus(dt_softplus)
    if guard.unusable():
        return _reference().ssm_scan_back(s, x, dt, A, B, C, ids, g_y, g_states, dt_softplus=dt_softplus,
                                          g_snapshots=g_snapshots)
    p = check_backward(s, x, dt, A, B, C, ids, g_y, g_states, dtype=_F32, workspace=backward_workspace,
                       g_snapshots=g_snapshots)
    steps, identity = _steps(p.dt, dt_softplus)
    d = p.dims
    S, T, H, P, N, G = d.S, d.T, d.H, d.P, d.N, d.G
    lanes = config.LANES
    seg = _segment(d, lanes)
    chunks = _chunks(d)
    d_s0 = np.empty((S, H, P, N), dtype=_F32)
    d_x = np.empty((S, T, H, P), dtype=_F32)
    dd = np.empty((S, T, H, P), dtype=_F32)                  # per-row share of dL/d softplus(dt)
    dA_rows = np.empty((S, H, P, p.A.shape[1]), dtype=np.float64)
    d_B = np.zeros((S, T, G, N), dtype=_F32)
    d_C = np.zeros((S, T, G, N), dtype=_F32)
    if chunks == 1:                                          # the one slab is d_B / d_C itself
        part_B = d_B.reshape(S, 1, T, G, N)
        part_C = d_C.reshape(S, 1, T, G, N)
    else:
        part_B = np.zeros((S, chunks, T, G, N), dtype=_F32)
        part_C = np.zeros((S, chunks, T, G, N), dtype=_F32)
    g_snap = p.g_snapshots                                   # (K, S, H, P, N), read-only
    if g_snap is None:                                       # none: zero slots, of the same numba type
        g_snap = np.empty((0, S, H, P, N), dtype=_F32)
        g_snap.flags.writeable = False
    args = (p.s, p.x, steps, identity, p.A, p.B, p.C, p.ids, p.g_y, p.g_states, g_snap, seg, chunks)
    outs = (d_s0, d_x, dd, dA_rows, part_B, part_C)
    d_dt = np.empty((S, T, H), dtype=_F32)
    d_A = np.empty(p.A.shape, dtype=_F32)
    d_s = np.empty((d.R, H, P, N), dtype=_F32)
    n_tasks = S * G * chunks
    n = threads.count(d, "bwd", n_tasks)
    counter = np.zeros(2, dtype=np.int64)                    # the backward's tasks, finish's tasks
    if d.mamba1:
        pool.run(_kb.backward_mamba1, (counter[:1], *args, lanes, n_tasks, *outs), n)
    else:
        pool.run(_kb.backward_mamba2, (counter[:1], *args, n_tasks, *outs), n)
    fin = (counter[1:], steps, identity, p.ids, dd, dA_rows, part_B, part_C, d_s0, d_dt, d_A, d_B, d_C, d_s)
    pool.run(_kb.finish, fin, min(n, _kb.tasks_finish(dd, d_A, d_s)))
    if dt_softplus == "log1p":   # the kernels gave dL/d(step): times the step's derivative
        d_dt *= softplus_grad(p.dt, "log1p")
    return ScanGrads(d_s=d_s, d_s0=d_s0, d_x=d_x, d_dt=d_dt,
                     d_A=d_A.reshape(d.a_shape), d_B=d_B, d_C=d_C, where=WHERE, backend=NAME)


def supports(op, *args, **kw) -> Support:
    """Whether ssm_fast runs a case: every shape the reference accepts. ``op`` "ssm_scan" or
    "ssm_scan_back" takes the arguments of ssm_scan (every dt_softplus form and every K); "mamba3_scan"
    or "mamba3_scan_back" those of mamba3_scan (float32). Bad input raises as the function would."""
    if op in _m3.OPS:
        return _m3.supports(op, *args, **kw)
    if op not in ssm_ref.OPS:
        raise ValueError(f"op: expected one of 'ssm_scan', 'ssm_scan_back', 'mamba3_scan', 'mamba3_scan_back', "
                         f"got {op!r}")
    return _supports_scan(op, *args, **kw)


def _supports_scan(op, s, x, dt, A, B, C=MISSING, ids=None, *, dt_softplus="ggml", update_cache=False,
                   snapshots=1) -> Support:
    check_op(op)
    check_dt_softplus(dt_softplus)
    p = check_forward(s, x, dt, A, B, C, ids, snapshots=snapshots)
    check_update_cache(update_cache, s, p.ids, op=op)
    return Support(True, "numba CPU kernels run every shape")


def warmup() -> None:
    """Compile (or load from numba's on-disk cache) every kernel, on tiny inputs of both variants.

    The first call that needs a kernel compiles it anyway (a one-line message on stderr says so
    when that happens); warmup does all of it up front, e.g. when a server starts. The Mamba-3
    kernels: ssm_fast.mamba3.warmup()."""
    rng = np.random.default_rng(0)
    S, T, H, P, N, G = 1, 2, 2, 2, 3, 1
    for a_shape in ((H,), (H, N)):
        inp = dict(s=rng.standard_normal((S, H, P, N)), x=rng.standard_normal((S, T, H, P)),
                   dt=rng.standard_normal((S, T, H)), A=-rng.random(a_shape),
                   B=rng.standard_normal((S, T, G, N)), C=rng.standard_normal((S, T, G, N)))
        ssm_scan(**inp)
        ssm_scan_back(**inp, ids=None, g_y=np.ones((S, T, H, P)), g_states=np.ones((S, H, P, N)))
