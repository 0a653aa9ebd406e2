"""Planning of the Mamba-1 kernels that spread time over a workgroup's threads
(ssm_vk/m1/glsl/m1_scan.comp, m1_scan_back.comp; the layout is described in m1_common.glsl).

A workgroup holds CW channels and one time chunk of NW * SPS slices x TI tokens: each of its NW
subgroups (RW lanes, the subgroup size) holds SPS slices of CW = RW / SPS lanes, one channel per
lane; each thread keeps its channel's N state values in registers. Long sequences are cut into
NCH chunks, composed by ssm_vk/glsl/ssm_scan_carry.comp between a summary pass and the final one.
A forward whose sequences fit one workgroup's slices of at most M1_ONE_TI tokens each is planned
with one chunk (NCH = 1), which runs as one dispatch: summary, composition and final walk in the
same workgroup. Where that leaves few threads (few sequences and channels), its subgroups take
several slices each (SPS > 1): fewer channels per workgroup, so more workgroups, and shorter
slices.

Pure Python (no Vulkan), unit-tested against small fake limits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ssm_ref import Dims

from ..config import Settings, settings
from ..sizing import F32, FLAG_ELEMS, Limits, binding_cap

__all__ = ["M1Plan", "plan_call", "scratch", "m1_plan", "m1_scratch", "M1_MAX_N", "M1_THREADS", "M1_FWD_TI_MIN",
           "M1_BWD_NB", "M1_NW",
           "M1_FWD_NW", "M1_ONE_NW", "M1_ONE_THREADS", "M1_SPS_TI_MIN"]

M1_MAX_N = 32          # state values a thread holds in registers, at most
# The forward cuts time until about M1_THREADS threads run (about what an H200 holds at once),
# with at least M1_FWD_TI_MIN tokens per slice; its tokens per slice are a push constant.
M1_THREADS = 1 << 18
M1_FWD_TI_MIN = 8
M1_NW = 16             # slices per workgroup of the backward, at most (a workgroup this large also
                       # keeps the compiler's registers per thread within what two of its slices
                       # per SM would leave: faster than 8 slices of 8 tokens, docs/KERNELS.md,
                       # "The planner's defaults")
M1_BWD_NB = 4          # the backward's state values per round of its walk back, at most
M1_FWD_NW = 4          # ... of the forward
# The forward in one pass: as many slices as the device's workgroup and shared memory take (at
# most M1_ONE_NW), where that leaves at most the knob M1_ONE_TI's tokens per slice.
M1_ONE_NW = 32
# ... and where it has fewer than M1_ONE_THREADS threads, slices per subgroup (SPS) double while the
# threads stay within M1_ONE_THREADS and the slices keep M1_SPS_TI_MIN tokens or more.
M1_ONE_THREADS = 1 << 17
M1_SPS_TI_MIN = 16


@dataclass(frozen=True)
class M1Plan:
    """How a Mamba-1 problem maps onto the time-in-threads kernels."""

    RW: int     # lanes per subgroup: the subgroup size
    NW: int     # subgroups per workgroup
    TI: int     # tokens per slice
    NB: int     # backward: state values per round of the walk back (divides N)
    NCH: int    # time chunks per sequence
    NRB: int    # channel blocks: H / CW
    TB: int = 8  # forward: tokens per block of loads
    SNW: int = 1  # backward over time chunks: slices per workgroup of its summary (each NW * TI / SNW tokens)
    SPS: int = 1  # forward: slices per subgroup (a power of two dividing RW; the backward's is 1)
    softplus: int = 0  # the step's form (kernel_specs.SOFTPLUS: 0 ggml's, 1 log1p, 2 none)

    def summary(self) -> M1Plan:
        """The plan of the backward's summary pass over the same chunks: SNW slices of L / SNW
        tokens (longer slices than the walk back's: the summary keeps no history per token)."""
        return replace(self, NW=self.SNW, TI=self.L // self.SNW)

    @property
    def CW(self) -> int:
        """Channels per workgroup (lanes per slice)."""
        return self.RW // self.SPS

    @property
    def L(self) -> int:
        """Tokens per chunk."""
        return self.NW * self.SPS * self.TI

    @property
    def WG(self) -> int:
        return self.RW * self.NW

    def groups(self, d: Dims) -> int:
        """Workgroups of one pass: (sequence, chunk, channel block)."""
        return d.S * self.NCH * self.NRB

    def agg_elems(self, d: Dims) -> int:
        """The forward's table of the slices' parts between its summary and final pass (one chunk,
        one pass: none, the parts stay in shared memory)."""
        return self.groups(d) * self.NW * self.SPS * (d.N + 1) * self.CW if self.NCH > 1 else 0


def shared_bytes(N: int, RW: int, NW: int, backward: bool) -> int:
    """Shared memory of a workgroup: one table of the slices' parts of the state (the backward:
    then of the adjoint in it) and their steps (the forward: also the sums of the steps before
    each slice)."""
    return (N + 1 if backward else N + 2) * NW * RW * F32


def applies(d: Dims, lim: Limits, knobs: Settings) -> str:
    """Why the time-in-threads kernels do not take ``d`` on a device of ``lim`` ("" when they do)."""
    forced = knobs.knob("M1")
    if forced == 0:
        return "M1=0"
    if not d.mamba1 or d.P != 1:
        return "not Mamba-1 with one channel per head"
    if d.T < 2 or d.S == 0 or d.H == 0 or d.N == 0:
        return "fewer than two tokens"
    if forced is None and lim.device_type == "cpu":
        return "a CPU device (the token-sequential kernels fill its cores)"
    if not {"basic", "shuffle"} <= set(lim.subgroup_ops):
        return "no subgroup shuffles"
    RW = lim.subgroup_size
    if RW < 2 or RW & (RW - 1):
        return "a subgroup size that is no power of two"
    if d.H % RW or (d.H // d.G) % RW:
        return f"channels per group not a multiple of the subgroup size {RW}"
    if d.N > M1_MAX_N:
        return f"N above {M1_MAX_N}"
    return ""


def _slices(d: Dims, lim: Limits, knobs: Settings, backward: bool, most: int = 0) -> int:
    """Slices per workgroup: the knob M1_NW, else ``most`` or the default of the direction, halved
    until the workgroup and its shared memory fit the device (0: not even one slice fits)."""
    RW = lim.subgroup_size
    NW = knobs.knob("M1_NW")
    if NW is None:
        NW = most or (M1_NW if backward else M1_FWD_NW)
    if backward and knobs.knob("M1_BNW") is not None:
        NW = knobs.knob("M1_BNW")
    most = min(lim.max_workgroup_invocations, lim.max_workgroup_size[0])
    while NW > 1 and (NW * RW > most or shared_bytes(d.N, RW, NW, backward) > lim.max_shared_memory):
        NW //= 2
    if NW * RW > most or shared_bytes(d.N, RW, NW, backward) > lim.max_shared_memory:
        return 0
    return NW


def _one_pass(d: Dims, lim: Limits, knobs: Settings) -> tuple[int, int, int] | None:
    """(NW, SPS, TI) of the forward in one pass, or None where its sequences do not fit one
    workgroup's slices of the knob M1_ONE_TI's tokens (or it is 0)."""
    most = knobs.knob("M1_ONE_TI")
    NW = _slices(d, lim, knobs, False, M1_ONE_NW)
    if not most or not NW or d.T > NW * most:
        return None
    SPS = knobs.knob("M1_SPS")
    if SPS is None:
        SPS = 1
        while (2 * SPS <= lim.subgroup_size and 2 * SPS * NW * d.S * d.H <= M1_ONE_THREADS
               and -(-d.T // (2 * SPS * NW)) >= M1_SPS_TI_MIN):
            SPS *= 2
    SPS = min(SPS, lim.subgroup_size)
    return NW, SPS, -(-d.T // (NW * SPS))


def m1_plan(d: Dims, lim: Limits, backward: bool, knobs: Settings | None = None) -> M1Plan | None:
    """The plan of the time-in-threads kernels for ``d``, or None where they do not apply
    (:func:`applies`), the workgroup does not fit the device, or an array is beyond one binding
    (those shapes keep the token-sequential kernels' windows). On a CPU device only with the
    knob M1=1 (the tests)."""
    knobs = settings() if knobs is None else knobs
    if applies(d, lim, knobs):
        return None
    RW = lim.subgroup_size
    NW = _slices(d, lim, knobs, backward)
    if not NW:
        return None
    if backward:
        SPS = 1                                               # the backward's slices: one per subgroup
        TI = knobs.knob("M1_TI")
        NB = knobs.knob("M1_NB")
        if NB is None:
            NB = M1_BWD_NB
            while d.N % NB:
                NB //= 2
        elif d.N % NB:
            NB = 1
    else:
        TI, NB = knobs.knob("M1_FTI") or 0, 1
        SPS = min(knobs.knob("M1_SPS") or 1, RW)
        one = _one_pass(d, lim, knobs) if not TI else None
        if one:
            NW, SPS, TI = one
        elif not TI:
            per_row = -(-M1_THREADS // (d.S * d.H))           # slices wanted per sequence and channel
            TI = max(M1_FWD_TI_MIN, -(-d.T // per_row))
        TI = min(TI, d.T)
    # tokens per block of loads: 8, fewer with more slices per subgroup (each lane holds a block's
    # TB * N values of B and of C over its slice's RW / SPS lanes)
    TB = knobs.knob("M1_TB") or max(1, 8 // SPS)
    NCH = -(-d.T // (NW * SPS * TI))
    plan = M1Plan(RW=RW, NW=NW, TI=TI, NB=NB, NCH=NCH, NRB=d.H // (RW // SPS), TB=TB,
                  SNW=min(NW, knobs.knob("M1_SNW")), SPS=SPS)
    cap = binding_cap(lim)
    per_chunk = d.S * NCH * d.H * d.N
    sizes = [d.S * d.T * d.H, d.S * d.T * d.G * d.N, d.R * d.H * d.N, per_chunk]
    if backward:
        sizes.append(d.S * d.T * plan.NRB * d.N)
    else:
        sizes.append(plan.agg_elems(d))
    if max(sizes) > cap:
        return None
    mx, my = lim.max_workgroup_count[0], lim.max_workgroup_count[1]
    if plan.groups(d) > mx * my:
        return None
    return plan


def m1_scratch(d: Dims, mp: M1Plan, backward: bool, softplus: int = 0) -> dict[str, int]:
    """The scratch of the Mamba-1 kernels with time in threads (m1/m1_recording.py), in the order its
    recording requests it. Forward: the flag, over time chunks the slices' parts (agg) and each
    chunk's contribution and decay (one chunk, one pass: none of them), and with the accurate step
    (``softplus`` 1) the steps the first walk keeps for the second. Backward: the flag, the
    sequences' initial states (when the cache rows are copied), over time chunks each chunk's
    contribution, decay and adjoint contribution, then the d_B / d_C partials per channel block
    and d_A's per chunk."""
    chunks = d.S * mp.NCH * d.H * d.N
    out = {"flag": FLAG_ELEMS}
    if not backward:
        if mp.NCH > 1:
            out.update(agg=mp.agg_elems(d), cb=chunks, cdec=chunks)
        if softplus == 1:
            out["step"] = d.S * d.T * d.H
        return out
    out["st"] = d.S * d.H * d.N
    if mp.NCH > 1:
        out.update(cb=chunks, cdec=chunks, cbl=chunks)
    part = d.S * d.T * mp.NRB * d.N
    out.update(part_B=part, part_C=part, dAp=chunks)
    return out


# -- the family's interface (family.Family: plan, scratch) ---------------------------------------

def plan_call(req) -> M1Plan | None:
    """The plan of a call on the time-in-threads kernels (family.Request), or None: never for K > 1
    snapshots (they keep the states of chunk ends only) or in the invariant mode (their slices are
    chosen by T); else :func:`m1_plan`'s, with the step's form."""
    if req.snap or req.knobs.invariant:
        return None
    mp = m1_plan(req.dims, req.lim, req.backward, req.knobs)
    return None if mp is None else replace(mp, softplus=req.softplus)


def scratch(d: Dims, mp: M1Plan, backward: bool) -> dict[str, int]:
    """:func:`m1_scratch` by the memory budget's names ("m1:")."""
    return {f"m1:{k}": n for k, n in m1_scratch(d, mp, backward, mp.softplus).items()}
