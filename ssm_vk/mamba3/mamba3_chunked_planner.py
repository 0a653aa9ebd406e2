"""The plans of a Mamba-3 call on the chunked kernels (forward: glsl/m3c_*.comp; backward:
glsl/m3b_*.comp after the forward's first four; :func:`chunk_plan_call`, an M3ChunkPlan: when
they run, the chunk length, the windows of sequences and their grids, the scratch). The
token-sequential kernels' plans, which take the rest: mamba3_planner.py.

A call whose arrays fit one binding but whose scratch (one window's rotated queries and keys, in
the backward their cotangents) does not runs in windows of whole sequences
(:func:`seq_elems`, :func:`granule`). Pure Python; reads M3_CHUNK, M3_CHUNK_MIN_T and
M3_CHUNK_BWD_MIN_T (here only: tests/vk/test_knob_reads.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..sizing import TooLarge, binding_cap, grid
from .mamba3_planner import joint_elems, window_elems

if TYPE_CHECKING:
    from ssm_ref.mamba3_checks import M3Dims

    from ..family import Request

__all__ = ["CHUNK_MIN_T", "CHUNK_MIN_T_CPU", "CHUNK_ROWS", "CHUNK_N_MAX", "CHUNK_WG", "CHUNK_SHARED", "M3ChunkPlan",
           "M3Window", "chunk_elems", "chunk_plan_call", "chunk_scratch", "CHUNK_BWD_MIN_T", "CHUNK_BWD_MIN_T_CPU",
           "CHUNK_BWD_SHARED", "CHUNK_BWD_BINDINGS", "chunk_bwd_elems", "seq_elems", "granule"]

# A chunk's rows (tokens x rank, L M) are one 64 x 64 tile of m3c_y.comp / m3c_states.comp.
CHUNK_ROWS = 64
# The state sizes the chunked kernels take (m3c_prep.comp holds F <= N/2 <= 128 angles).
CHUNK_N_MAX = 256
# Their workgroups: 256 invocations (the tile's 16 x 16 threads; m3c_pass.comp's entries).
CHUNK_WG = 256
# Shared memory of the largest (m3c_y.comp): A (64 x 64), the two operand slices (2 x 16 x 64),
# each row padded by 4 floats (m3c_tile.glsl's SLICE and SROW), four per-token tables (4 x 64),
# float32.
_PADDED = CHUNK_ROWS + 4
CHUNK_SHARED = 4 * (CHUNK_ROWS * _PADDED + 2 * 16 * _PADDED + 4 * CHUNK_ROWS)
# The shortest sequence the chunked forward takes (knob M3_CHUNK_MIN_T): below it the
# token-sequential walk is short and the chunked kernels' six dispatches and scratch cost more.
# On a GPU: 64 (as the Mamba-2 chunked kernels' forward), where the walk's few workgroups leave
# most of the device idle. On a CPU device (lavapipe, 2 cores) the chunked form does about the
# walk's multiply-adds and gains only from its tiles: measured there (P = 64, SISO and rank 2) it
# wins from 64 to 128 tokens at N = 128 and breaks even from 128 at N = 64 (docs/KERNELS.md).
CHUNK_MIN_T = 64
CHUNK_MIN_T_CPU = 128
# The shortest sequence the chunked backward takes (knob M3_CHUNK_BWD_MIN_T). The token-sequential
# backward walks every token twice per (sequence, head) with S H workgroups; on a GPU the chunked
# one replaces that chain by S NC H independent chunks from one chunk on. On a CPU device the
# chunked backward's products cost about what the walk does (docs/KERNELS.md measures both).
CHUNK_BWD_MIN_T = 64
CHUNK_BWD_MIN_T_CPU = 128
# Shared memory of the backward's largest kernel (m3b_chunk.comp): a 64 x 64 matrix, the two
# operand slices (2 x 16 x 64), rows padded as above, ten per-token tables (10 x 64) and two
# scalars, float32.
CHUNK_BWD_SHARED = 4 * (CHUNK_ROWS * _PADDED + 2 * 16 * _PADDED + 10 * CHUNK_ROWS + 2)
# Storage buffers the backward's kernels bind (m3b_common.glsl).
CHUNK_BWD_BINDINGS = 32


@dataclass(frozen=True)
class M3Window:
    """Sequences ``[s0, s0 + n)`` of a chunked call, run as one round of dispatches, and the (gx, gy)
    grid of each kernel at ``n`` sequences: ``prep`` (per sequence, chunk, head; also the backward's
    m3b_chunk and m3b_rot), ``angle`` (per sequence, head and 64 pairs; also m3b_angle), ``states``
    (per sequence, chunk, head and 64 x 64 tile of (p, n); also m3b_gstates), ``pass_`` (per
    sequence, head and 256 state entries; also m3b_gpass), ``y`` (per sequence, chunk, head and 64
    channels)."""

    s0: int
    n: int
    prep: tuple
    angle: tuple
    states: tuple
    pass_: tuple
    y: tuple


@dataclass(frozen=True)
class M3ChunkPlan:
    """The chunked kernels' plan: ``L`` tokens per chunk, ``NC`` chunks per sequence, ``Sw``
    sequences per window (S: one window) and the ``windows`` in order (M3Window). The scratch holds
    one window (:func:`chunk_scratch`); the arrays of the call are bound per window, each from its
    window's first sequence (:func:`seq_elems`), and the plan keeps every window's first sequence
    at an offset the device can bind (:func:`granule`)."""

    L: int
    NC: int
    Sw: int
    windows: tuple
    per_seq: tuple = ()   # (name, elements per sequence) of each array bound per window (seq_elems)

    @property
    def windowed(self) -> bool:
        """Whether the call runs in more than one window."""
        return len(self.windows) > 1


def seq_elems(d: M3Dims, L: int) -> dict:
    """Float32 elements per sequence of each array of the call that the chunked kernels bind from
    a window's first sequence (the inputs, outputs and cotangents of tokens and of the final
    state, and the backward's per-chunk parts, whose whole buffer is summed once after the last
    window), by the name the workspace binds it under."""
    T, H, P, N, G, M, F = d.T, d.H, d.P, d.N, d.G, d.M, d.F
    NC = -(-T // L)
    th, tokens = T * H, T * M * H * P
    return {"x": th * P, "dt": th, "dA": th, "lam": th, "B": T * M * G * N, "C": T * M * G * N, "dtheta": th * F,
            "y": tokens, "theta": H * F, "h": H * P * N, "k": H * M * N, "v": H * M * P, "g_y": tokens,
            "d_x": th * P, "d_dtheta": th * F, "m3b_parts": NC * H * (2 * M * N + M * P)}


def granule(d: M3Dims, L: int, align: int) -> int:
    """The least step in sequences at which every array of :func:`seq_elems` starts at a multiple
    of ``align`` bytes (minStorageBufferOffsetAlignment): a window's first sequence is one."""
    step = 1
    for c in seq_elems(d, L).values():
        if c:
            step = math.lcm(step, align // math.gcd(4 * c, align))
    return step


def _window_seqs(d: M3Dims, L: int, lim, backward: bool) -> int:
    """The sequences per window: S where the call fits one window, else the fewest windows of
    whole granules that fit and as even as granules allow (no short tail of a few sequences: a
    window's dispatches cost about the same however few its sequences); 0 where not even one
    granule's does. What must fit: every scratch buffer, window-sized buffer and window binding
    within one binding."""
    cap = binding_cap(lim)
    one = replace(d, S=1)
    per = dict(chunk_elems(one, L))
    per.pop("m3c_flag")
    if backward:
        per.update(chunk_bwd_elems(one, L))
        per.update(window_elems(d))
    per.update(seq_elems(d, L))
    most = min((cap // c for c in per.values() if c), default=d.S)
    if most >= d.S:
        return d.S
    step = granule(d, L, lim.min_storage_buffer_offset_alignment)
    most = most // step * step
    if most < 1:
        return 0
    count = -(-d.S // most)
    while True:   # (ends by count = ceil(S / step) at the latest: an even share of one granule)
        share = -(-d.S // count)
        even = -(-share // step) * step
        if even <= most:
            return even
        count += 1


def chunk_elems(d: M3Dims, L: int) -> dict:
    """Float32 elements of the chunked forward's scratch for chunks of ``L`` tokens, by name:
    the rotated queries and keys (S,H,T,M,N) each, the chunk states (S,H,NC,P,N), the chunks'
    decays (S,H,NC), angles (S,H,NC,F) and the non-finite flag (4)."""
    NC = -(-d.T // L)
    SH = d.S * d.H
    qk = SH * d.T * d.M * d.N
    return {"m3c_q": qk, "m3c_k": qk, "m3c_hz": SH * NC * d.P * d.N, "m3c_dch": SH * NC, "m3c_ang": SH * NC * d.F,
            "m3c_flag": 4}


def chunk_bwd_elems(d: M3Dims, L: int) -> dict:
    """Float32 elements of the chunked backward's own scratch for chunks of ``L`` tokens, by name
    (beside :func:`chunk_elems`, which its recompute of the forward fills): G per chunk and the
    chunks' angle cotangents (S,H,NC,PN + F), the cotangents of the rotated queries and keys
    (2,S,H,T,M,N), d_B and d_C per head (S,T,M,H,N) each, each chunk's parts of d_B_bias, d_C_bias,
    d_psi (S,NC,H,2MN+MP), the recompute's final state (S,H,F), (S,H,P,N), (S,H,M,N), (S,H,M,P)."""
    NC = -(-d.T // L)
    SH = d.S * d.H
    slab = d.S * d.T * d.M * d.H * d.N
    return {"m3b_gz": SH * NC * (d.P * d.N + d.F), "m3b_gqk": 2 * SH * d.T * d.M * d.N, "m3b_dBh": slab,
            "m3b_dCh": slab, "m3b_parts": d.S * NC * d.H * (2 * d.M * d.N + d.M * d.P), "m3b_th": SH * d.F,
            "m3b_h": SH * d.P * d.N, "m3b_k": SH * d.M * d.N, "m3b_v": SH * d.M * d.P}


def chunk_plan_call(req: Request) -> M3ChunkPlan | None:
    """The chunked kernels' plan of the call (family.Family.plan), or None where they do not take
    it: the recompute of a flagged result, the invariant mode, T below M3_CHUNK_MIN_T (a forward;
    default :data:`CHUNK_MIN_T`, on a CPU device :data:`CHUNK_MIN_T_CPU`) or M3_CHUNK_BWD_MIN_T (a
    backward; default :data:`CHUNK_BWD_MIN_T`, on a CPU device :data:`CHUNK_BWD_MIN_T_CPU`),
    M3_CHUNK = 0, a rank above 64, N outside 1..256, P = 0, a device without 256-invocation
    workgroups, the shared memory or (a backward) 32 storage buffers per stage, scratch beyond one
    binding. The token-sequential plan takes those."""
    d, lim, knobs = req.dims, req.lim, req.knobs
    if req.rerun or req.snap or knobs.invariant:
        return None
    min_t = knobs.knob("M3_CHUNK_BWD_MIN_T" if req.backward else "M3_CHUNK_MIN_T")
    L = knobs.knob("M3_CHUNK")
    L = CHUNK_ROWS // max(d.M, 1) if L is None else min(L, CHUNK_ROWS // max(d.M, 1))
    if min_t is None:
        if req.backward:
            min_t = CHUNK_BWD_MIN_T_CPU if lim.device_type == "cpu" else CHUNK_BWD_MIN_T
        else:
            min_t = CHUNK_MIN_T_CPU if lim.device_type == "cpu" else CHUNK_MIN_T
    if L < 1 or d.T < max(1, min_t):
        return None
    if not 1 <= d.N <= CHUNK_N_MAX or d.P < 1 or d.M > CHUNK_ROWS:
        return None
    shared, buffers = (CHUNK_BWD_SHARED, CHUNK_BWD_BINDINGS) if req.backward else (CHUNK_SHARED, 26)
    if (min(lim.max_workgroup_invocations, lim.max_workgroup_size[0]) < CHUNK_WG
            or lim.max_shared_memory < shared or lim.max_storage_buffers_per_stage < buffers):
        return None
    # the arrays bound whole: those the token-sequential plan (which recomputes a flagged call)
    # binds whole too, and the backward's per-chunk parts (summed once after the last window)
    whole = [d.S * d.T * d.M * d.H * d.P, d.S * d.T * d.M * d.G * d.N, d.R * d.H * d.P * d.N, d.S * d.H * d.P * d.N]
    if req.backward:
        whole.append(chunk_bwd_elems(d, L)["m3b_parts"])
    if max(whole) > binding_cap(lim):
        return None
    Sw = _window_seqs(d, L, lim, req.backward)
    if Sw < 1:
        return None
    NC = -(-d.T // L)
    tiles = -(-d.P // CHUNK_ROWS)
    try:
        windows = tuple(M3Window(s0, n, prep=grid(n * NC * d.H, lim), angle=grid(n * d.H * -(-d.F // 64), lim),
                                 states=grid(n * NC * d.H * tiles * -(-d.N // CHUNK_ROWS), lim),
                                 pass_=grid(n * d.H * -(-d.P * d.N // CHUNK_WG), lim),
                                 y=grid(n * NC * d.H * tiles, lim))
                        for s0, n in ((s0, min(Sw, d.S - s0)) for s0 in range(0, d.S, Sw)))
    except TooLarge:
        return None
    return M3ChunkPlan(L=L, NC=NC, Sw=Sw, windows=windows, per_seq=tuple(seq_elems(d, L).items()))


def chunk_scratch(d: M3Dims, plan: M3ChunkPlan, backward: bool) -> dict:
    """The chunked kernels' scratch, by name (family.Family.scratch): one window's (``plan.Sw``
    sequences) of the forward's tables, and for a backward its own beside them, whose per-chunk
    parts hold every sequence (summed once after the last window)."""
    dw = replace(d, S=plan.Sw)
    out = chunk_elems(dw, plan.L)
    if backward:
        out.update(chunk_bwd_elems(dw, plan.L))
        out["m3b_parts"] = chunk_bwd_elems(d, plan.L)["m3b_parts"]
        out.update(joint_elems(d, plan.Sw, plan.windowed))
    return out
