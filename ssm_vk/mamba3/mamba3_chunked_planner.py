"""The plans of a Mamba-3 call on the chunked kernels (forward: glsl/m3c_*.comp; backward:
glsl/m3b_*.comp after the forward's first four; :func:`chunk_plan_call`, an M3ChunkPlan: when
they run, the chunk length, the windows of sequences and their grids, the scratch). The
token-sequential kernels' plans, which take the rest: mamba3_planner.py.

A call whose arrays fit one binding but whose scratch (the rotated queries and keys, in the
backward their cotangents) does not runs in windows of whole sequences (:func:`granule`), and
where one sequence's scratch does not fit, in windows of that sequence's tokens (the state each
window starts from in a slot of scratch: M3ChunkPlan.starts). Pure Python; reads M3_CHUNK, M3_CHUNK_MIN_T and
M3_CHUNK_BWD_MIN_T (here only: tests/vk/test_knob_reads.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..sizing import TooLarge, binding_cap, grid
from .mamba3_planner import joint_elems, state_rows, window_elems

if TYPE_CHECKING:
    from ssm_ref.mamba3_checks import M3Dims

    from ..family import Request

__all__ = ["CHUNK_MIN_T", "CHUNK_MIN_T_CPU", "CHUNK_ROWS", "CHUNK_N_MAX", "CHUNK_WG", "CHUNK_SHARED", "M3ChunkPlan",
           "M3Window", "chunk_elems", "chunk_plan_call", "chunk_scratch", "CHUNK_BWD_MIN_T", "CHUNK_BWD_MIN_T_CPU",
           "CHUNK_BWD_SHARED", "CHUNK_BWD_BINDINGS", "chunk_bwd_elems", "token_elems", "state_elems",
           "chunk_part_elems", "granule", "CARRIED"]

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
    """Sequences ``[s0, s0 + n)``, tokens ``[t0, t0 + nt)`` of each, of a chunked call, run as one
    round of dispatches (``NC`` chunks per sequence), and the (gx, gy) grid of each kernel there:
    ``prep`` (per sequence, chunk, head; also the backward's m3b_chunk and m3b_rot), ``angle`` (per
    sequence, head and 64 pairs; also m3b_angle), ``states`` (per sequence, chunk, head and 64 x 64
    tile of (p, n); also m3b_gstates), ``pass_`` (per sequence, head and 256 state entries; also
    m3b_gpass), ``y`` (per sequence, chunk, head and 64 channels). A window of tokens after a
    sequence's first (``t0 > 0``) starts from the state the window before it left."""

    s0: int
    n: int
    t0: int
    nt: int
    NC: int
    prep: tuple
    angle: tuple
    states: tuple
    pass_: tuple
    y: tuple


@dataclass(frozen=True)
class M3ChunkPlan:
    """The chunked kernels' plan: ``L`` tokens per chunk, ``NC`` chunks per sequence, ``Sw``
    sequences and ``Tw`` tokens per window (S and T: one window; a window of tokens holds one
    sequence) and the ``windows`` in order (M3Window). The scratch holds one window
    (:func:`chunk_scratch`); the arrays of the call are bound per window, from its first sequence
    and token (``per_token``: elements per token of the arrays of tokens, :func:`token_elems`;
    ``per_chunk``: per chunk of the backward's parts, :func:`chunk_part_elems`; ``per_seq``: per
    sequence of the final state, :func:`state_elems`), and the plan keeps every window's start at
    an offset the device can bind (:func:`granule`)."""

    L: int
    NC: int
    Sw: int
    windows: tuple
    Tw: int = 0
    per_token: tuple = ()
    per_chunk: tuple = ()
    per_seq: tuple = ()
    # windows of tokens: (scratch name, slot stride in floats) of each part of the state (CARRIED's
    # order), a slot per window of a sequence: the state the window starts from (slot 0 unused: the
    # cache rows); and the backward's two buffers of a window's start-state cotangent, by turns
    starts: tuple = ()
    carried: tuple = ()

    @property
    def windowed(self) -> bool:
        """Whether the call runs in more than one window."""
        return len(self.windows) > 1


# The final state's parts, which a window of tokens leaves for the next (chunk_scratch).
CARRIED = ("theta", "h", "k", "v")


def token_elems(d: M3Dims) -> dict:
    """Float32 elements per token of each array of tokens of the call (inputs, outputs,
    cotangents), by the name the workspace binds it under: a window binds them from its first
    sequence and token."""
    H, P, N, G, M, F = d.H, d.P, d.N, d.G, d.M, d.F
    return {"x": H * P, "dt": H, "dA": H, "lam": H, "B": M * G * N, "C": M * G * N, "dtheta": H * F,
            "y": M * H * P, "g_y": M * H * P, "d_x": H * P, "d_B": M * G * N, "d_C": M * G * N, "d_dtheta": H * F}


def state_elems(d: M3Dims) -> dict:
    """Float32 elements per sequence of the final state's four parts, which a window binds from
    its first sequence."""
    return dict(zip(CARRIED, state_rows(d), strict=True))


def chunk_part_elems(d: M3Dims) -> dict:
    """Float32 elements per chunk of the backward's per-chunk parts of d_B_bias, d_C_bias, d_psi
    (whose whole buffer is summed once after the last window), which a window binds from its first
    chunk."""
    return {"m3b_parts": d.H * (2 * d.M * d.N + d.M * d.P)}


def _step(counts, align: int) -> int:
    """The least multiple at which arrays of ``counts`` float32 elements each start at a multiple
    of ``align`` bytes."""
    step = 1
    for c in counts:
        if c:
            step = math.lcm(step, align // math.gcd(4 * c, align))
    return step


def granule(d: M3Dims, L: int, align: int) -> int:
    """The least step in sequences at which every array of the call starts at a multiple of
    ``align`` bytes (minStorageBufferOffsetAlignment): a window's first sequence is one."""
    NC = -(-d.T // L)
    return _step([d.T * c for c in token_elems(d).values()] + [NC * c for c in chunk_part_elems(d).values()]
                 + list(state_elems(d).values()), align)


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
    per.update({k: d.T * c for k, c in token_elems(d).items()})
    per.update({k: -(-d.T // L) * c for k, c in chunk_part_elems(d).items()})
    per.update(state_elems(d))
    most = min((cap // c for c in per.values() if c), default=d.S)
    if most >= d.S:
        return d.S
    return _even(d.S, most, granule(d, L, lim.min_storage_buffer_offset_alignment))


def _even(total: int, most: int, step: int) -> int:
    """The size of the fewest windows of at most ``most``, each a multiple of ``step``, that cover
    ``total``, as even as ``step`` allows; 0 where not one step fits."""
    most = most // step * step
    if most < 1:
        return 0
    count = -(-total // most)
    while True:   # (ends by count = ceil(total / step) at the latest: an even share of one step)
        share = -(-total // count)
        even = -(-share // step) * step
        if even <= most:
            return even
        count += 1


def _window_tokens(d: M3Dims, L: int, lim, backward: bool) -> int:
    """Tokens per window of one sequence, where one sequence's scratch exceeds a binding: whole
    chunks whose scratch and bindings fit, a multiple of the step at which every array of tokens
    (and the backward's per-chunk parts) starts at a bindable offset, in as few and as even
    windows as that allows; 0 where not even one such step fits, or where the sequences
    themselves do not start at bindable offsets."""
    align = lim.min_storage_buffer_offset_alignment
    if d.S > 1 and granule(d, L, align) != 1:
        return 0
    cap = binding_cap(lim)
    chunk = replace(d, S=1, T=L)
    per = dict(chunk_elems(chunk, L))   # (one chunk's)
    per.pop("m3c_flag")
    per.update({k: L * c for k, c in token_elems(d).items()})
    step = math.lcm(L, _step(token_elems(d).values(), align))
    if backward:
        per.update(chunk_bwd_elems(chunk, L))
        per["d_step"] = window_elems(chunk)["d_step"]
        step = math.lcm(step, L * _step(chunk_part_elems(d).values(), align))
    chunks = min((cap // c for c in per.values() if c), default=0)
    return _even(d.T, chunks * L, step)


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
    workgroups, the shared memory or (a backward) 32 storage buffers per stage, an array of the
    call beyond one binding, or a scratch that not even one window (of sequences, or of one
    sequence's chunks) fits. The token-sequential plan takes those."""
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
    # the arrays bound or copied whole: the cache (read by ids), the final state's parts and the
    # backward's per-chunk parts (summed once after the last window). The arrays of tokens are
    # bound window by window (token_elems), so they may exceed a binding -- and one allocation,
    # held in pieces cut at the windows (sizing.window_cuts) -- where a flagged call's recompute, which
    # binds them whole, is then the host's (Family.host_rerun)
    whole = [d.R * d.H * d.P * d.N, d.S * d.H * d.P * d.N]
    if req.backward:
        whole.append(chunk_bwd_elems(d, L)["m3b_parts"])
    if max(whole) > binding_cap(lim):
        return None
    NC = -(-d.T // L)
    Sw, Tw = _window_seqs(d, L, lim, req.backward), d.T
    if Sw < 1:   # (one sequence's scratch beyond a binding: windows of its tokens)
        Sw, Tw = 1, _window_tokens(d, L, lim, req.backward)
    if Sw < 1 or Tw < 1:
        return None
    tiles = -(-d.P // CHUNK_ROWS)
    spans = [(s0, min(Sw, d.S - s0), t0, min(Tw, d.T - t0)) for s0 in range(0, d.S, Sw) for t0 in range(0, d.T, Tw)]
    try:
        windows = tuple(M3Window(s0, n, t0, nt, nc, prep=grid(n * nc * d.H, lim),
                                 angle=grid(n * d.H * -(-d.F // 64), lim),
                                 states=grid(n * nc * d.H * tiles * -(-d.N // CHUNK_ROWS), lim),
                                 pass_=grid(n * d.H * -(-d.P * d.N // CHUNK_WG), lim),
                                 y=grid(n * nc * d.H * tiles, lim))
                        for s0, n, t0, nt, nc in ((*span, -(-span[3] // L)) for span in spans))
    except TooLarge:
        return None
    starts, carried = (), ()
    if Tw < d.T:
        granules = [-(-4 * row // lim.min_storage_buffer_offset_alignment) * lim.min_storage_buffer_offset_alignment
                    // 4 for row in state_rows(d)]
        starts = tuple((f"m3c_start_{part}", g) for part, g in zip(CARRIED, granules, strict=True))
        carried = ("m3b_gcarry0", "m3b_gcarry1") if req.backward else ()
    return M3ChunkPlan(L=L, NC=NC, Sw=Sw, windows=windows, Tw=Tw, per_token=tuple(token_elems(d).items()),
                       per_chunk=tuple(chunk_part_elems(d).items()), per_seq=tuple(state_elems(d).items()),
                       starts=starts, carried=carried)


def chunk_scratch(d: M3Dims, plan: M3ChunkPlan, backward: bool) -> dict:
    """The chunked kernels' scratch, by name (family.Family.scratch): one window's (``plan.Sw``
    sequences) of the forward's tables, and for a backward its own beside them, whose per-chunk
    parts hold every sequence (summed once after the last window)."""
    dw = replace(d, S=plan.Sw, T=plan.Tw or d.T)
    out = chunk_elems(dw, plan.L)
    slots = -(-d.T // plan.Tw) if plan.Tw else 1
    out.update({name: slots * stride for name, stride in plan.starts})   # (windows of tokens)
    if backward:
        out.update(chunk_bwd_elems(dw, plan.L))
        out["m3b_parts"] = chunk_bwd_elems(d, plan.L)["m3b_parts"]
        out.update(joint_elems(dw, plan.Sw, plan.windowed))
        out.update({name: sum(state_rows(d)) for name in plan.carried})
    return out
