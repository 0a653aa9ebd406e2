"""The plans of a Mamba-3 call on the token-sequential kernels (glsl/mamba3_scan.comp,
mamba3_step.comp, mamba3_scan_back.comp; :func:`plan_call`, an M3Plan: the workgroup size, the
channel blocks per head and the scratch), and the backward's joint outputs both families write
(:func:`joint_elems`). The chunked kernels' plans: mamba3_chunked_planner.py.

The forward runs one workgroup per (sequence, head, block of channels), one invocation per
channel: the workgroup size is the power of two at or above P, at least the device's subgroup
size and at most its workgroup limits (and FWD_WG_MAX); P beyond it takes several blocks. The
backward runs one workgroup per (sequence, head) with every channel of the head in it (its sums
over the channels are in the workgroup), so P must fit one workgroup of the device. Its work
buffer holds every token's keys and angles, the state at every ``seg``-th token (checkpoints),
one segment's states (recomputed from its checkpoint before the segment is walked back) and the
channels' parts of a token's sums. ``seg`` = ceil(sqrt(T)), which makes checkpoints and segment
together the least (about 2 sqrt(T) states per head instead of T); a problem whose work buffer
still exceeds one storage-buffer binding of the device does not fit (TooLarge: the call runs on
the CPU). A forward of one token (a decode step) runs on mamba3_step.comp (:func:`step_rows`).
Pure Python; reads M3_STAGE and M3_STEP (here only: tests/vk/test_knob_reads.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..sizing import TooLarge, binding_cap, grid

if TYPE_CHECKING:
    from ssm_ref.mamba3_checks import M3Dims

    from ..family import Request

__all__ = ["FWD_WG_MAX", "M3Plan", "plan_call", "scratch", "segment", "work_elems", "part_elems", "STEP_WG",
           "STEP_TILE", "step_rows", "step_shared", "window_elems", "joint_elems", "state_rows"]

# The forward's largest workgroup: more channels per head take several blocks (more workgroups
# to spread over the device) rather than one larger workgroup.
FWD_WG_MAX = 128
# The forward's loads in flight per invocation (M3_STAGE): 16 from this many workgroups, else 8.
# On an H100, decode at H = 32: 8 is faster at 1 and 16 sequences (25.8 against 26.1 us, 26.8
# against 29.0), 16 at 128 (220.6 against 236.5 us; 32 gives 220.9); the threshold lies between
# the measured 512 and 4096 workgroups (docs/KERNELS.md, "Mamba-3: the floor").
STAGE_DEEP_GROUPS = 2048


@dataclass(frozen=True)
class M3Plan:
    """``wg`` threads per workgroup, ``npb`` channel blocks per head (the backward: 1),
    ``groups`` workgroups of the scan kernel and their (gx, gy) grid; ``seg`` the backward's
    tokens per recomputed segment (the forward: 1); ``stage`` the forward's loads in flight per
    invocation as the state rows come in (M3_STAGE); ``step``: a forward of one token, on the
    one-token kernel (:func:`step_rows`)."""

    wg: int
    npb: int
    groups: int
    gx: int
    gy: int
    seg: int = 1
    stage: int = 8
    step: bool = False   # a forward of one token on mamba3_step.comp (npb: its blocks of rows per head)


# The one-token forward (glsl/mamba3_step.comp): workgroups of STEP_WG invocations (every Vulkan
# device takes 128), each updating up to STEP_TILE floats of a head's state rows at once and
# keeping them in shared memory for y (16 KiB: a row padded to N + 1 floats).
STEP_WG = 128
STEP_TILE = 4096


def step_rows(d: M3Dims) -> int:
    """The most state rows one workgroup of the one-token forward takes (mamba3_step.comp's
    ROWS_MAX)."""
    return max(1, STEP_TILE // (d.N + 1))


def step_shared(d: M3Dims) -> int:
    """Bytes of shared memory of mamba3_step.comp: the tile, v and v_prev of its rows, the
    token's keys, queries and the previous keys, the angles (mamba3_common.glsl)."""
    rows = step_rows(d)
    return 4 * (rows * (d.N + 1) + 2 * d.M * rows + 3 * d.M * d.N + 3 * (d.N // 2 + 1))


def _step_plan(d: M3Dims, lim, knobs) -> M3Plan | None:
    """The one-token forward's plan where M3_STEP = 1 (default 0: the one-token kernel has not
    been timed against the token-sequential one on a GPU), else None, and None where the device
    lacks its workgroup or shared memory: one workgroup per (sequence, head, block of rows)."""
    if d.T != 1 or knobs.knob("M3_STEP") != 1:
        return None
    if min(lim.max_workgroup_invocations, lim.max_workgroup_size[0]) < STEP_WG or lim.max_shared_memory < \
            step_shared(d):
        return None
    npb = max(1, -(-d.P // step_rows(d)))
    groups = d.S * d.H * npb
    gx, gy = grid(groups, lim)
    return M3Plan(wg=STEP_WG, npb=npb, groups=groups, gx=gx, gy=gy, step=True)


def _stage(groups: int, knobs) -> int:
    stage = knobs.knob("M3_STAGE")
    if stage is not None:
        return stage
    return 16 if groups >= STAGE_DEEP_GROUPS else 8


def _pow2_at_least(n: int) -> int:
    w = 1
    while w < n:
        w *= 2
    return w


def segment(T: int) -> int:
    """The backward's tokens per segment: ceil(sqrt(T)), at least 1."""
    k = max(1, math.isqrt(max(T, 0)))
    return k if k * k >= T else k + 1


def work_elems(d: M3Dims, seg: int | None = None) -> int:
    """Float32 elements of the backward's work buffer for segments of ``seg`` tokens (default
    :func:`segment`): the checkpoints (S,H,ceil(T/seg),P,N), a segment's states (S,H,seg+1,P,N),
    k_t (S,H,T+1,M,N), θ_t (S,H,T,F) and the channels' parts of a token's sums (S,H,P,3MN+3)."""
    seg = segment(d.T) if seg is None else seg
    SH = d.S * d.H
    MN = d.M * d.N
    nseg = -(-d.T // seg)
    return SH * ((nseg + seg + 1) * d.P * d.N + (d.T + 1) * MN + d.T * d.F + d.P * (3 * MN + 3))


def part_elems(d: M3Dims) -> int:
    """The backward's per-sequence parts of d_B_bias, d_C_bias, d_psi: (S, H, 2MN + MP)."""
    return d.S * d.H * (2 * d.M * d.N + d.M * d.P)


def plan_call(req: Request) -> M3Plan:
    """The plan of the call (family.Family.plan); TooLarge where the device cannot hold it."""
    d, lim = req.dims, req.lim
    if d.N < 1:   # (the kernels hold a state row in registers: an array of N >= 1 entries)
        raise TooLarge("the Mamba-3 kernels need a state size N >= 1, got N = 0")
    most = min(lim.max_workgroup_invocations, lim.max_workgroup_size[0])
    least = min(max(lim.subgroup_size, 1), most)
    if req.backward:
        wg = max(least, _pow2_at_least(d.P))
        if wg > most:
            raise TooLarge(f"the Mamba-3 backward holds a head's P = {d.P} channels in one workgroup, above this "
                           f"device's {most} invocations")
        npb = 1
        cap = binding_cap(lim)
        for what, n in (("work buffer (checkpoints, a segment's states, every token's keys)", work_elems(d)),
                        ("per-head d_B slab", d.S * d.T * d.M * d.H * d.N),
                        ("y gradient", d.S * d.T * d.M * d.H * d.P)):
            if n > cap:
                raise TooLarge(f"the Mamba-3 backward's {what} ({n * 4} bytes) exceeds one storage-buffer binding of "
                               f"this device ({cap * 4} bytes)")
    else:
        wg = min(max(least, _pow2_at_least(d.P)), max(least, min(most, FWD_WG_MAX)))
        npb = max(1, -(-d.P // wg))   # (P = 0: one block still writes θ and k)
        cap = binding_cap(lim)
        for what, n in (("y", d.S * d.T * d.M * d.H * d.P), ("B", d.S * d.T * d.M * d.G * d.N),
                        ("state h", d.R * d.H * d.P * d.N), ("final state h", d.S * d.H * d.P * d.N)):
            if n > cap:
                raise TooLarge(f"the Mamba-3 scan's {what} ({n * 4} bytes) exceeds one storage-buffer binding of this "
                               f"device ({cap * 4} bytes)")
        step = _step_plan(d, lim, req.knobs)
        if step is not None:
            return step
    groups = d.S * d.H * npb
    gx, gy = grid(groups, lim)
    return M3Plan(wg=wg, npb=npb, groups=groups, gx=gx, gy=gy, seg=segment(d.T) if req.backward else 1,
                  stage=_stage(groups, req.knobs))


def scratch(d: M3Dims, plan: M3Plan, backward: bool) -> dict:
    """The float32 elements of the scratch the recording requests, by name (family.Family.scratch)."""
    if not backward:
        return {}
    slab = d.S * d.T * d.M * d.H * d.N
    return {"m3_work": work_elems(d), "m3_dB_heads": slab, "m3_dC_heads": slab, "m3_parts": part_elems(d),
            **joint_elems(d, d.S)}


def joint_elems(d: M3Dims, Sw: int, windowed: bool = False) -> dict:
    """Float32 elements of the backward's joint outputs, which the workspace splits into the
    gradients (d_step and d_start of ``Sw`` sequences: :func:`window_elems`; d_parts (H, 2MN+MP),
    the parts summed over every sequence), and with ``windowed`` a window's copy of the final
    state's cotangents (g_state_w)."""
    out = {k: Sw * n for k, n in window_elems(d).items() if k != "g_state_w" or windowed}
    out["d_parts"] = d.H * (2 * d.M * d.N + d.M * d.P)
    return out


def window_elems(d: M3Dims) -> dict:
    """Float32 elements per sequence of the backward workspace's buffers that hold one window (the
    kernels' joint outputs, copied out after each window, and the final state's cotangents, copied
    in before it, "g_state_w"): d_step (3,S,T,H), d_start and g_state_w (S, the four parts of the
    state)."""
    rows = sum(state_rows(d))
    return {"d_step": 3 * d.T * d.H, "d_start": rows, "g_state_w": rows}


def state_rows(d: M3Dims) -> tuple:
    """Float32 elements of one sequence's (one cache row's) part of each part of the state: θ,
    h, k, v."""
    return (d.H * d.F, d.H * d.P * d.N, d.H * d.M * d.N, d.H * d.M * d.P)
