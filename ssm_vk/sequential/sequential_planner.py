"""Launch planning for the token-sequential kernels: lane layout, workgroup shape, checkpoint
interval and the windows a problem is cut into so that every binding, allocation and grid fits
the device.

Pure Python (no Vulkan): the numbers here are what the shaders' defines and push constants get,
and they are unit-tested against small fake limits.

Windows: a problem is processed as a list of windows (i0, i1, t0, t1). Either a window holds
whole sequences (t0, t1 = 0, T) -- the usual case -- or, when one sequence alone is too large for
a binding, a single sequence and a range of tokens (a multiple of K long). Every array a kernel
reads or writes is contiguous inside a window in both cases.

One module of ~520 lines on purpose: the lane layout and the windows depend on each other (a
window's size follows from the layout's grid and checkpoint interval), and the family's planner
(:func:`plan_call`) chooses between the windows of whole sequences and the passes over time
chunks, which are planned as windows of the chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ssm_ref import Dims

from ..config import Settings, settings
from ..sizing import (
    DEFAULT_K,
    F32,
    FLAG_ELEMS,
    Limits,
    TooLarge,
    Window,
    binding_cap,
    input_shapes,
    most_that_fit,
    output_shapes,
    token_windows,
)

__all__ = ["Layout", "SequentialPlan", "plan_call", "scratch", "flags", "layout_for", "invariant_layout", "INVARIANT_T",
           "sequential_plan", "time_chunk_plan", "chunk_dims", "sequential_scratch",
           "time_chunk_scratch", "SCRATCH_BUDGET", "partials_budget",
           "MAX_NPL", "TCHUNK_BELOW", "TCHUNK_THREADS", "TCHUNK_MIN", "TCHUNK_BWD_BELOW", "TCHUNK_BWD_THREADS",
           "TCHUNK_BWD_MIN", "m1_forward_two_per_lane_from"]

SCRATCH_BUDGET = 256 << 20   # bytes of backward partials per window (kept modest on purpose)
# A backward over token windows keeps the checkpoints of every window of its sequence until its
# walk back, T H P N / K floats, as far as they fit a third of the device-local heap and what the
# call's arrays leave of it (counted twice: inputs may also be copied into pieces of the call's
# own). Beyond that it keeps the checkpoints of the last windows that fit and, for the windows
# before them, their starting states (several to a buffer), from which their checkpoints are
# recomputed just before their walk back (``SequentialPlan.recompute`` windows per sequence: one
# more forward pass over them, the same bits). A larger K would save the memory too, but the walk
# back holds a chunk's K states in registers: at K = 32 and 64 the 8 and 16 GiB backwards on an H200 ran at 0.47 and
# 0.77 of K = 8's rate (docs/API.md, "ssm_vk: device-resident arrays").
CKPT_HEAP_SHARE = 3

MAX_NPL = 16                 # state values per lane before rows spread over shared memory

# The decode kernel (one token) gives each row slot of a workgroup DEC_IT channels of a head in
# turn, so what a head's rows share (the step, B and C) is computed or loaded once per slot: as
# many turns as leave the step DEC_THREADS threads or more (about what an H200 holds at once).
# A step that has fewer threads than that at one channel per slot is latency-bound and stays on
# the ordinary kernel, whose loads all go out at once (measured: docs/KERNELS.md, "The planner's
# defaults").
DEC_THREADS = 1 << 18

# The forward parallel over time takes a scan of fewer than TCHUNK_BELOW threads and cuts its
# sequences into chunks until it has TCHUNK_THREADS (about twice what an H200 holds at once), with
# chunks of at least TCHUNK_MIN tokens. Its three passes do 1.7x the work, which pays where the
# scan by itself would leave the GPU idle and loses where it already has threads enough
# (docs/KERNELS.md, "Forward parallel over time (Mamba-1)").
TCHUNK_BELOW = 1 << 16
TCHUNK_THREADS = 1 << 19
TCHUNK_MIN = 32
# The backward parallel over time (five passes instead of two: summaries forward and backward,
# their carries, the checkpoint pass and the backward pass on the chunks) likewise, with its own
# thresholds: its token step is several times longer than the forward's. The threshold counts
# threads of the backward's layout (LN = 4 at N = 16), where the token-by-token backward stops
# losing to the chunks (measured: docs/KERNELS.md, "The planner's defaults").
TCHUNK_BWD_BELOW = 1 << 16
TCHUNK_BWD_THREADS = 1 << 20
TCHUNK_BWD_MIN = 32


@dataclass(frozen=True)
class Layout:
    """How state rows map onto lanes and workgroups (see ssm_vk/sequential/glsl/common.glsl)."""

    LN: int      # lanes per row (power of two)
    ROW_SUM: int  # how a row is summed (glsl/common.glsl): 0 shared, 1 clustered, 2 xor, 3 subgroupAdd
    NPL: int     # state values per lane
    WG: int      # threads per workgroup
    K: int       # checkpoint interval of the backward
    TB: int      # tokens per load block (forward)
    TBR: int     # tokens per shared-memory reduction round (backward)
    HB: int      # heads per workgroup
    PB: int      # channels per workgroup
    NHB: int     # head blocks
    NPB: int     # channel blocks
    SPREAD: int = 0  # 1 when a row's lanes share each token's step by subgroupShuffle
    HSUM: int = 0    # backward: 1 when a workgroup's HB heads (all of one group) share their d_B / d_C partials
    DEC: int = 0     # forward of one token: 1 for the decode kernel (ssm_decode.comp; HB = 1, its row
                     # slots walk the PB channels of a head, NPL a multiple of 4)
    EXACT: int = 0   # 1: the invariant mode's kernels (their state updates and sums `precise`: no
                     # contraction into fma, the same roundings in every kernel and unrolled copy)

    def partial_heads(self, H: int) -> int:
        """Heads of the backward's d_B / d_C partials per token: H, or H / HB with HSUM."""
        return H // self.HB if self.HSUM else H

    @property
    def rows(self) -> int:
        return self.WG // self.LN


@dataclass(frozen=True)
class SequentialPlan:
    """The token-sequential kernels' plan of a call: its layout and windows."""

    layout: Layout
    windows: tuple
    time_split: bool     # True: windows are token ranges of one sequence
    softplus: int = 0        # the step's form (kernel_specs.SOFTPLUS: 0 ggml's, 1 log1p, 2 none)
    tchunk: int = 0          # parallel over time: tokens per chunk (0: not); the windows and
                             # layout are then those of the chunks as sequences (time_chunk_plan)
    snap: bool = False       # the K state snapshots (a forward with K > 1, a backward given g_snapshots):
                             # the token-sequential kernels with SNAP, whole plan token by token
    recompute: int = 0       # a backward over token windows: its first windows (per sequence) whose
                             # checkpoints are recomputed from their starting states (CKPT_HEAP_SHARE)
    starts_per: int = 1      # starting states per buffer (as many as one binding holds)


def _pow2_at_most(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def m1_forward_two_per_lane_from(N: int) -> int:
    """The fewest state rows (S * H * P) from which Mamba-1's forward on a GPU holds two state
    values per lane (in load blocks of eight tokens) rather than four: where two per lane give the
    token-sequential scan its threads (layout_for, up to the rows where four per lane do too)."""
    return -(-TCHUNK_BELOW // max(1, _pow2_at_least(max(N, 1)) // 2))


def layout_for(d: Dims, lim: Limits, backward: bool, knobs: Settings | None = None) -> Layout:
    """Lane layout and workgroup size for problem ``d`` on a device with limits ``lim``, under
    the tuning ``knobs`` (ssm_vk.config; default: its settings of now)."""
    knobs = settings() if knobs is None else knobs
    sg = lim.subgroup_size
    ops = lim.subgroup_ops
    knob = knobs.knob
    want = _pow2_at_least(max(d.N, 1))
    m1_back = backward and d.mamba1 and d.T > 1 and "shuffle" in ops   # Mamba-1's backward, its steps shared
    m1_fwd = not backward and d.mamba1 and d.T > 1 and lim.device_type != "cpu" and "shuffle" in ops
    m1_tb = None
    if m1_back:
        # Four state values per lane, since a row's lanes share each token's step (SPREAD): one
        # round of sums per chunk instead of two, faster than LN = 2, 8 or 16 (docs/KERNELS.md,
        # "The planner's defaults").
        want = max(1, want // 4)
    elif m1_fwd:
        # Mamba-1's forward on a GPU: four state values per lane (fewer row-sum steps and less of
        # the token's scalar work per state) where that leaves threads enough token by token, or
        # where the scan goes over time chunks anyway; else two per lane, in load blocks of eight
        # tokens (more loads in flight per thread where few threads are resident). Measured:
        # docs/KERNELS.md, "Forward parallel over time (Mamba-1)".
        nrows = d.S * d.H * d.P
        if nrows * max(1, want // 4) >= TCHUNK_BELOW or nrows < m1_forward_two_per_lane_from(d.N):
            want = max(1, want // 4)
        else:
            want, m1_tb = max(1, want // 2), 8
    elif not backward:
        # At least two state values per lane forward: a lane that holds one spends most of its
        # time on the token's scalar work (the backward gains nothing so; docs/KERNELS.md, "The
        # planner's defaults").
        want = max(1, want // 2)
        if d.T == 1 and want >= 64:
            # A decode step is a pass over the state rows: more values per lane, more loads in
            # flight (docs/KERNELS.md, "The planner's defaults").
            want //= 4
    # (the decode kernel writes no snapshots: a forward with K > 1 takes the ordinary one)
    dec = (not backward and d.T == 1 and not d.mamba1 and d.N > 0 and d.N % 4 == 0 and knob("DEC") != 0
           and d.K == 1)
    if dec:
        want = min(want, _pow2_at_most(d.N // 4))   # the decode kernel: four values per lane at least
    if knob("LN") is not None:
        want = min(want, knob("LN"))
    if "basic" in ops and "shuffle" in ops:
        # xor butterfly: faster than clustered adds on a GPU (docs/KERNELS.md, "Layout")
        LN = min(want, sg)
        ROW_SUM = 3 if LN == sg and "arithmetic" in ops else 2
    elif "basic" in ops and "clustered" in ops:
        LN, ROW_SUM = min(want, sg), 1
    elif "basic" in ops and "arithmetic" in ops:
        LN, ROW_SUM = sg, 3
    else:
        LN, ROW_SUM = min(want, 32), 0
    if -(-d.N // LN) > MAX_NPL and knob("LN") is None:
        # A long row would need too many registers per lane: spread it over more lanes than a
        # subgroup has and sum through shared memory.
        LN, ROW_SUM = min(_pow2_at_least(-(-d.N // MAX_NPL)), 256), 0
    legal = {0: True, 1: "clustered" in ops, 2: "shuffle" in ops, 3: "arithmetic" in ops and LN == sg}
    if legal.get(knob("ROW_SUM"), False) and "basic" in ops and LN <= sg:
        ROW_SUM = knob("ROW_SUM")
    NPL = max(1, -(-d.N // LN))
    # Checkpoints every 8 tokens: 16 costs registers; Mamba-1's backward (shared steps) takes 4,
    # faster than 2 or 8 there (docs/KERNELS.md, "The planner's defaults").
    K = knob("K") or (4 if m1_back else DEFAULT_K)
    # Workgroup: up to 128 threads, a multiple of the subgroup size, within the shared memory
    # the backward's per-token reduction needs (2 * WG * NPL + WG / LN floats, plus WG floats
    # for the shared-memory row sums).
    WG = knob("WG")
    while WG > max(LN, sg):
        shared = (2 * WG * NPL + WG // LN) * F32 if backward else 0
        if ROW_SUM == 0:
            shared += WG * F32
        if WG <= lim.max_workgroup_invocations and shared <= lim.max_shared_memory:
            break
        WG //= 2
    WG = max(WG, LN, sg if ROW_SUM else 1)
    rows = WG // LN
    PB = max(1, min(d.P, rows))
    HB = max(1, min(d.H, rows // PB))
    NPB = max(1, -(-d.P // PB))
    NHB = max(1, -(-d.H // HB))
    # A decode step (one token) loads one block of one token: a longer block would only hold
    # registers for tokens that are not there. A Mamba-2 forward of few threads (a short sequence
    # token by token) waits on its loads: blocks of eight tokens keep more of them in flight
    # (both measured: docs/KERNELS.md, "The planner's defaults").
    few = not backward and not d.mamba1 and d.T >= 8 and d.S * d.H * d.P * LN < TCHUNK_BELOW and NPL <= 4
    TB = knob("TB") or (1 if d.T == 1 else m1_tb or (8 if few else max(1, min(4, 32 // NPL))))
    # Backward: contributions of TBR tokens share one round of barriers; each round needs
    # TBR * (2 * WG * NPL + WG / LN) floats of shared memory.
    per_tok = (2 * WG * NPL + WG // LN) * F32
    room = lim.max_shared_memory - (WG * F32 if ROW_SUM == 0 else 0)
    TBR = knob("TBR") or max(1, min(4, room // per_tok))
    while K % TBR:
        TBR -= 1
    # The forward's steps softplus(dt), one per token and row, computed once per row where the
    # row's lanes can swap values (instead of by each of its LN lanes; the accurate form's is
    # some 30 operations, on the path from a token's loads to its state update).
    # The backward's likewise (the K tokens of a checkpoint chunk), measured on Mamba-1 only and so
    # planned for it only (Mamba-2's long sequences take the chunked kernels).
    spread = int(ROW_SUM in (2, 3) and "shuffle" in ops and "basic" in ops and 2 <= TB <= LN
                 and (d.mamba1 or not backward) and knob("SPREAD") == 1)
    # Backward: a workgroup whose heads all read the same B and C (one group) sums their d_B and
    # d_C contributions itself, leaving HB times fewer partials to write and add up (Mamba-1,
    # whose every channel is a head of the one group: 16 heads per workgroup; Mamba-2's heads
    # of 64 channels fill a workgroup one at a time).
    hsum = int(backward and d.mamba1 and HB > 1 and d.G > 0 and d.H % d.G == 0 and (d.H // d.G) % HB == 0
               and knob("HSUM") == 1)
    dec_npl = 4 * -(-d.N // (4 * LN))   # the decode kernel's values per lane, in vec4
    if (dec and dec_npl <= MAX_NPL and d.P >= rows
            and (knob("DEC") == 1 or d.S * d.H * d.P * LN >= DEC_THREADS)):
        # The decode kernel: one head per workgroup, its row slots taking IT channels each in turn.
        turns = max(1, -(-d.P // rows))
        IT = knob("DEC_IT")
        if IT is None:
            IT = 1
            while IT * 2 <= turns and d.S * d.H * -(-d.P // (rows * IT * 2)) * WG >= DEC_THREADS:
                IT *= 2
        PB = min(d.P, rows * min(IT, turns))
        return Layout(LN=LN, ROW_SUM=ROW_SUM, NPL=dec_npl, WG=WG, K=K, TB=TB, TBR=TBR, HB=1, PB=PB,
                      NHB=max(1, d.H), NPB=-(-d.P // PB), DEC=1)
    if dec:   # the ordinary kernel after all (its lanes, without the cap above)
        return layout_for(d, lim, backward, knobs.with_knobs(DEC=0))
    return Layout(LN=LN, ROW_SUM=ROW_SUM, NPL=NPL, WG=WG, K=K, TB=TB, TBR=TBR, HB=HB, PB=PB, NHB=NHB, NPB=NPB,
                  SPREAD=spread, HSUM=hsum)


# The invariant mode (ssm_scan(..., invariant=True); docs/SPEC.md section 3.2) plans its layout for
# one sequence of INVARIANT_T tokens, whatever S and T the call has: every choice of layout_for that
# reads S or T (a decode step's lanes and kernel, Mamba-2's load blocks of few threads, Mamba-1's
# lanes by its rows) is then a function of (H, P, N, G, the variant) and the device alone. Two
# tokens: not a decode step (whose kernel rounds otherwise), and blocks of at most four tokens,
# which a decode step of the same kernel does not pay much for.
INVARIANT_T = 2


def invariant_layout(d: Dims, lim: Limits, backward: bool, knobs: Settings) -> Layout:
    """The invariant mode's layout for problems of ``d``'s (H, P, N, G, variant): that of one
    sequence of INVARIANT_T tokens, its kernels ``precise`` (Layout.EXACT), with as many lanes per
    row forward as backward (the fewer of the two directions' choices). The same lanes: the
    backward's checkpoint pass then holds a row's state as the forward does, so that a call
    starting from the forward's ``states`` starts from the bits the one long call's checkpoint
    holds (lavapipe, Mamba-1 at N = 8: four lanes forward and two backward gave a checkpoint one
    ulp off the forward's state in 1 of 8 rows, though both kernels are ``precise``)."""
    canon = replace(d, S=1, T=INVARIANT_T, R=1)
    ln_f = layout_for(canon, lim, False, knobs).LN
    ln_b = layout_for(canon, lim, True, knobs).LN
    if ln_f != ln_b:
        knobs = knobs.with_knobs(LN=min(ln_f, ln_b))
    return replace(layout_for(canon, lim, backward, knobs), EXACT=1)


def _per_window_elems(d: Dims, lay: Layout, Sw: int, Tw: int, backward: bool) -> dict:
    """Elements of every windowed binding for a window of Sw sequences x Tw tokens."""
    KA = d.N if d.mamba1 else 1
    nc = -(-Tw // lay.K)
    e = {
        "x": Sw * Tw * d.H * d.P, "dt": Sw * Tw * d.H, "B": Sw * Tw * d.G * d.N,
        "states": Sw * d.H * d.P * d.N,
    }
    if backward:
        e.update({
            "ck": Sw * d.H * d.P * nc * d.N,
            "dBp": Sw * Tw * lay.partial_heads(d.H) * lay.NPB * d.N, "ddtp": Sw * Tw * d.H * lay.NPB,
            "dAp": Sw * d.H * d.P * KA,
        })
    return e


def partials_budget(lay, lim: Limits) -> int:
    """Bytes of backward partials one window may take: SCRATCH_BUDGET; in the invariant mode
    (``lay.EXACT``) up to a sixteenth of the device's memory. That mode has no time chunks, so
    its only parallel work is its windows' rows: a sequence too long for the budget walks its
    token windows one sequence at a time (S times the forward's depth: docs/BENCHMARKS.md, "The
    invariant mode's cost"), where whole sequences side by side share one walk. Which sequences
    share a window changes no bit, nor where a sequence's token windows end (they carry the state,
    the adjoint and d_A's running sum exactly: the ends may follow to_device's pieces)."""
    if not lay.EXACT:
        return SCRATCH_BUDGET
    return max(SCRATCH_BUDGET, lim.device_local_bytes // 16)


def _fits(d, lay, lim, Sw, Tw, backward) -> bool:
    cap = binding_cap(lim)
    e = _per_window_elems(d, lay, Sw, Tw, backward)
    if any(v > cap for v in e.values()):
        return False
    if backward and (e["dBp"] * 2 + e["ddtp"]) * F32 > partials_budget(lay, lim):
        # a budget, not a limit: one token of one sequence always passes
        if Sw * Tw > 1:
            return False
    groups = Sw * lay.NHB * lay.NPB
    red = max(Sw * Tw * d.G * d.N, Sw * Tw * d.H)
    mx, my = lim.max_workgroup_count[0], lim.max_workgroup_count[1]
    return groups <= mx * my and -(-red // lay.WG) <= mx * my


def sequential_plan(d: Dims, lim: Limits, backward: bool, knobs: Settings | None = None) -> SequentialPlan:
    """The token-sequential kernels' plan: layout and windows; TooLarge when even one token of
    one sequence cannot fit. In the invariant mode (``knobs.invariant``) the layout is
    :func:`invariant_layout`'s; the windows hold whole sequences unless one sequence alone is too
    large for a binding (their length a function of T and the row's sizes; cut again where
    to_device's pieces of a token array end: sizing.device_piece_tokens), and a token window
    carries its state, adjoint and d_A's running sum in float32 buffers, as the registers hold
    them."""
    knobs = settings() if knobs is None else knobs
    lay = invariant_layout(d, lim, backward, knobs) if knobs.invariant else layout_for(d, lim, backward, knobs)
    if d.T == 0:
        return SequentialPlan(lay, (), False)
    # Whole sequences: as many per window as fit.
    Sw = most_that_fit(d.S, lambda s: _fits(d, lay, lim, s, d.T, backward))
    if Sw >= 1:
        wins = tuple(Window(i, min(i + Sw, d.S), 0, d.T) for i in range(0, d.S, Sw))
        return SequentialPlan(lay, wins, False)
    # One sequence per window, a range of tokens (a multiple of K when more than K fit).
    lo = most_that_fit(d.T, lambda t: _fits(d, lay, lim, 1, t, backward))
    if lo < 1:
        raise TooLarge(
            f"one token of one sequence does not fit the device's limits "
            f"(maxStorageBufferRange {lim.max_storage_buffer_range} bytes, "
            f"maxMemoryAllocationSize {lim.max_memory_allocation_size} bytes) at "
            f"H={d.H} P={d.P} N={d.N} G={d.G}")
    Tw = lo if lo < lay.K else (lo // lay.K) * lay.K
    wins = token_windows(d, lim, Tw)
    recompute = 0
    if backward:   # (which windows recompute changes no bit: the count may depend on S)
        ck_bytes = -(-Tw // lay.K) * d.H * d.P * d.N * F32      # one window's checkpoints
        arrays = sum(math.prod(v) for v in (*input_shapes(d, True).values(), *output_shapes(d, True).values())) * F32
        room = min(lim.device_local_bytes // CKPT_HEAP_SHARE, lim.device_local_bytes - 2 * arrays)
        kept = max(1, room // max(1, ck_bytes))
        recompute = max(0, len(wins) // d.S - kept)
    starts_per = max(1, binding_cap(lim) // max(1, d.H * d.P * d.N))
    return SequentialPlan(lay, wins, True, recompute=recompute, starts_per=starts_per)


def chunk_dims(d: Dims, tchunk: int) -> Dims:
    """The problem whose sequences are the time chunks of ``d``: S * (T / tchunk) sequences of
    tchunk tokens (sequence i's chunk c is sequence i * T / tchunk + c: the same memory)."""
    return replace(d, S=d.S * (d.T // tchunk), T=tchunk)


def _tokens_per_chunk(d: Dims, lim: Limits, lay: Layout, knobs: Settings, backward: bool) -> int:
    forced = knobs.knob("TCHUNK")
    if forced is not None:
        return forced if forced and d.T % forced == 0 and d.T // forced >= 2 else 0
    # Mamba-1 only: Mamba-2's long sequences take the chunked matrix kernels. Not on a CPU
    # implementation, whose few cores the token-sequential scan already fills: there the extra
    # pass would only cost.
    if not d.mamba1 or lim.device_type == "cpu":
        return 0
    below, enough, shortest = ((TCHUNK_BWD_BELOW, TCHUNK_BWD_THREADS, TCHUNK_BWD_MIN) if backward
                               else (TCHUNK_BELOW, TCHUNK_THREADS, TCHUNK_MIN))
    threads = d.S * d.H * d.P * lay.LN
    if threads >= below:
        return 0
    nch = 1
    while threads * nch < enough and d.T % (2 * nch) == 0 and d.T // (2 * nch) >= shortest:
        nch *= 2
    return d.T // nch if nch > 1 else 0


def time_chunk_plan(d: Dims, lim: Limits, backward: bool, knobs: Settings | None = None) -> SequentialPlan | None:
    """The plan of the forward or backward parallel over time, or None where it does not apply: a
    sequence that does not split into two or more chunks of ``TCHUNK`` tokens (or, by default, a
    Mamba-2 problem, a CPU device, or one with threads enough: ssm_vk/glsl/ssm_scan_carry.comp),
    chunks that would need token windows, or chunk tables beyond one binding."""
    knobs = settings() if knobs is None else knobs
    if d.T < 2 or d.H * d.P * d.N == 0:
        return None
    L = _tokens_per_chunk(d, lim, layout_for(d, lim, backward, knobs), knobs, backward)
    if not L:
        return None
    cd = chunk_dims(d, L)
    cap = binding_cap(lim)
    if cd.S * d.H * d.P * d.N > cap or cd.S * d.H * (d.N if d.mamba1 else 1) > cap:
        return None
    try:
        pl = sequential_plan(cd, lim, backward, knobs)
    except TooLarge:
        return None
    if pl.time_split:
        return None
    return replace(pl, tchunk=L)


def sequential_scratch(d: Dims, pl: SequentialPlan) -> dict[str, int]:
    """The token-sequential backward's scratch, as its recording requests it."""
    if not (pl.windows and d.H * d.P > 0):
        return {}
    lay = pl.layout
    row = d.H * d.P * d.N
    wmax = max(pl.windows, key=lambda w: w.S * w.T)
    nc_max = max(-(-w.T // lay.K) for w in pl.windows)
    sw_max = max(w.S for w in pl.windows)
    out = {"st": d.S * row, "dAp": d.S * d.H * d.P * (d.N if d.mamba1 else 1),
           "part_B": wmax.S * wmax.T * lay.partial_heads(d.H) * lay.NPB * d.N,
           "part_C": wmax.S * wmax.T * lay.partial_heads(d.H) * lay.NPB * d.N,
           "part_dt": wmax.S * wmax.T * d.H * lay.NPB}
    n_win = sum(1 for w in pl.windows if w.i0 == 0) if pl.time_split else 1
    for k in range(max(1, n_win - pl.recompute)):   # the kept windows' checkpoints
        out[f"ck{k}"] = sw_max * row * nc_max
    for k in range(0, pl.recompute, pl.starts_per):   # the starting states of the others
        out[f"starts{k // pl.starts_per}"] = min(pl.starts_per, pl.recompute - k) * row
    return out


def time_chunk_scratch(d: Dims, pl: SequentialPlan, backward: bool = False) -> dict[str, int]:
    """The scratch of the forward parallel over time, in the order its recording requests it:
    every chunk's contribution (then its initial state), every chunk's decay, the non-finite flag.
    The backward's: the chunks' initial states (b: also the running states of the checkpoint
    pass), their decays, their adjoint contributions (then the adjoint each starts from), the
    sequences' initial states, the flag, and then the token-sequential backward's of the chunks
    as sequences (but its running states, which are b)."""
    nch = d.T // pl.tchunk
    chunks = d.S * nch * d.H * d.P * d.N
    out = {"b": chunks, "dec": d.S * nch * d.H * (d.N if d.mamba1 else 1)}
    if backward:
        out.update(lam=chunks, st=d.S * d.H * d.P * d.N)
    out["flag"] = FLAG_ELEMS
    if backward:
        seq = sequential_scratch(chunk_dims(d, pl.tchunk), pl)
        out.update({f"seq:{k}": v for k, v in seq.items() if k != "st"})
    return out


# -- the family's interface (family.Family: plan, scratch, flags) --------------------------------

def plan_call(req) -> SequentialPlan:
    """The token-sequential plan of a call (family.Request); every call has one (TooLarge where not
    even one token of one sequence fits). Parallel over time chunks (time_chunk_plan) where that
    applies -- never for K > 1 snapshots (``req.snap``: the kernels with SNAP, whole sequences token
    by token), in the invariant mode (chosen by S and T, which the mode's bits may not depend on)
    or for a recompute (``req.rerun``: time chunks flag inf and nan themselves)."""
    d, lim, backward, knobs = req.dims, req.lim, req.backward, req.knobs
    if not (req.snap or req.rerun or knobs.invariant):
        tp = time_chunk_plan(d, lim, backward, knobs)
        if tp is not None:
            return replace(tp, softplus=req.softplus)
    return replace(sequential_plan(d, lim, backward, knobs), softplus=req.softplus, snap=req.snap)


def scratch(d: Dims, pl: SequentialPlan, backward: bool) -> dict[str, int]:
    """The scratch of a token-sequential plan's recording, by the memory budget's names: over time
    chunks ("tc:"), else the backward's ("seq:"; the forward takes none)."""
    if pl.tchunk:
        return {f"tc:{k}": n for k, n in time_chunk_scratch(d, pl, backward).items()}
    if backward:
        return {f"seq:{k}": n for k, n in sequential_scratch(d, pl).items()}
    return {}


def flags(pl: SequentialPlan) -> bool:
    """Whether the plan's results are flagged when non-finite: over time chunks (whose carry can
    turn an inf into nan), then computed again token by token."""
    return bool(pl.tchunk)
