"""Planning for the chunked (matrix-form) Mamba-2 kernels (ssm_vk/chunked/glsl/chunk_*.comp): whether they
apply to a problem, the chunk length, the GEMM tiles, and windows of whole sequences that fit
the device -- or, where not even one sequence fits, windows of a token range of one sequence that
carry the state from one to the next (the backward keeps each window's starting state, from a
first pass over the sequence). Pure Python, like ssm_vk.sequential.sequential_planner. The knobs
(ssm_vk.config) are read once, when the plan is made: what its kernels and their recording need
of them (the GEMM tiles and threads, 16-byte loads and stores, the pass's batch) is resolved into
the ChunkPlan then, so that nothing after planning reads a knob.

The chunked kernels run a chunk of CL tokens as matrix products (ssm_ref/chunked.py), so they
are parallel over time; the token-sequential kernels (ssm_vk.sequential) cover every shape and stay
the choice for short sequences, Mamba-1, very wide rows and devices with small workgroups. The
crossover (``CHUNK_MIN_T``) and the other defaults: docs/KERNELS.md, "The planner's defaults".
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import accumulate

from ssm_ref import Dims

from ..config import DEFAULTS, KNOBS, Settings, settings
from ..sizing import (
    F32,
    FLAG_ELEMS,
    Limits,
    TooLarge,
    Window,
    binding_cap,
    grid,
    most_that_fit,
    piece_cap,
    token_windows,
)

__all__ = ["ChunkPlan", "plan_call", "scratch", "tables", "chunk_plan", "chunked_scratch", "gemm_tile",
           "scratch_elems", "GEMM_WG", "KS",
           "CHUNK_MIN_T", "CHUNK_MIN_ST", "MODES", "PER_GROUP", "NOT_SCRATCH", "why_not", "slice_len", "vec_out",
           "vec_in", "pass_batch", "PASS_BATCH", "PASS_BATCHES"]

GEMM_WG = KNOBS["GWG"].default   # threads of every chunk kernel but the pass: the GEMM kernels' default
# Contraction slice staged in shared memory, forward and backward: each direction's fastest
# (docs/KERNELS.md, "The planner's defaults").
KS = {False: 16, True: 8}
# Shortest sequence that takes the chunked kernels by default, forward and backward: where they
# start to beat the token-sequential kernels (docs/KERNELS.md, "The planner's defaults").
CHUNK_MIN_T = {False: 64, True: 32}
# ... and for the forward at least this many tokens in all: one sequence of 64 tokens is no
# slower token by token, several are (same section). Not applied when CHUNK_MIN_T is a knob.
CHUNK_MIN_ST = {False: 128, True: 0}
MAX_PN = 256       # P and N up to this (two column blocks of 128)
N_BINDINGS = 19    # storage buffers every chunked kernel declares (ssm_vk/chunked/glsl/chunk_common.glsl)
NSM = 12           # per-token scalars of the backward (ssm_vk/chunked/glsl/chunk_common.glsl)
HEADLOOP_MIN_GROUPS = 1024  # DB/DC workgroups per window below which they run per head
SCRATCH_BUDGET = 2 << 30   # bytes of chunk scratch per window (windows of fewer sequences beyond)

# the matrix products, each its kernel glsl/chunk_gemm_<name>.comp (ssm_vk/chunked/glsl/chunk_gemm.glsl)
MODES = ("CB", "GU", "ZF", "ZB", "Y", "GAM", "DB", "DC")
PER_GROUP = ("CB", "DB", "DC")   # modes with a workgroup per (sequence, chunk, group)


def _shape(mode: str, CL: int, P: int, N: int) -> tuple[int, int]:
    return {"CB": (CL, CL), "GU": (CL, CL), "ZF": (P, N), "ZB": (P, N), "Y": (CL, P), "GAM": (CL, P),
            "DB": (CL, N), "DC": (CL, N)}[mode]


def _up(n: int, m: int) -> int:
    return -(-n // m) * m


def gemm_threads(knobs: Settings | None = None) -> tuple[int, int]:
    """(threads, row groups) of the GEMM kernels' thread grid (knobs GWG, ROWG)."""
    knobs = settings() if knobs is None else knobs
    wg, rg = knobs.knob("GWG"), knobs.knob("ROWG")
    if wg % rg:
        raise ValueError(f"SSM_VK_TUNE: ROWG={rg} must divide GWG={wg}")
    return wg, rg


def gemm_tile(mode: str, CL: int, P: int, N: int, knobs: Settings | None = None) -> tuple[int, int, int, int]:
    """(RBLK, CBLK, NRB, NCBK) of a matrix product (glsl/chunk_gemm_*.comp): tiles of at most 64 x 128."""
    knobs = settings() if knobs is None else knobs
    wg, rg = gemm_threads(knobs)
    cg = wg // rg
    rows, cols = _shape(mode, CL, P, N)
    # Tiles of at most 64 x 128; DB and DC loop over a group's heads, so column blocks of 64 give
    # them more workgroups. Knobs: DBC_RBLK / DBC_CBLK (DB, DC), ZF_RBLK / ZF_CBLK (the chunk states).
    pre = {"DB": "DBC_", "DC": "DBC_", "ZF": "ZF_"}.get(mode)
    rb, cb = (knobs.knob(pre + "RBLK"), knobs.knob(pre + "CBLK")) if pre else (64, 128)
    RBLK = min(_up(rows, rg), max(rb, rg))
    CBLK = min(_up(cols, cg), max(cb, cg))
    return RBLK, CBLK, -(-rows // RBLK), -(-cols // CBLK)


def slice_len(backward: bool = False, knobs: Settings | None = None) -> int:
    """Contraction slice of the GEMM kernels (KS; knob KS)."""
    knobs = settings() if knobs is None else knobs
    ks = knobs.knob("KS")
    return KS[backward] if ks is None else ks


def vec_out(knobs: Settings | None = None) -> int:
    """1: the GEMM epilogues store 16 bytes at a time where the columns allow (knob VEC_OUT=0
    stores floats, for benchmarks)."""
    knobs = settings() if knobs is None else knobs
    return int(knobs.knob("VEC_OUT") != 0)


def _gemm_shared(CL: int, RBLK: int, CBLK: int, knobs: Settings) -> int:
    """Shared memory of a GEMM tile (glsl/chunk_gemm.glsl), at most: its operands' slices, the head's scalars and
    the row-sum table."""
    ks = max(slice_len(False, knobs), slice_len(True, knobs))
    wg, rg = gemm_threads(knobs)
    slices = ks * (RBLK + 4) + ks * (CBLK + 4)
    return (slices + 3 * CL + RBLK * (wg // rg)) * F32


# The modes that stage their operands with 16-byte loads: fewer instructions per staged element
# pay in Y, whose registers fall too; in ZF they cost registers and a workgroup per SM, so ZF
# keeps its float loads (docs/KERNELS.md, "The planner's defaults").
VEC_IN_MODES = ("Y",)


def vec_in(mode: str, P: int, N: int, CL: int, KS: int, knobs: Settings | None = None) -> bool:
    """Whether a matrix product stages its operands with 16-byte loads (knob VEC_IN, default on;
    VEC_IN_MODES): where P, N, the slice and the tile are multiples of 4. The shader still takes
    its float loads for a call whose inputs start off a multiple of 4 elements."""
    knobs = settings() if knobs is None else knobs
    if mode not in VEC_IN_MODES or not knobs.knob("VEC_IN"):
        return False
    RBLK, CBLK, _, _ = gemm_tile(mode, CL, P, N, knobs)
    return all(v % 4 == 0 for v in (P, N, KS, RBLK, CBLK))


PASS_BATCH = 32    # chunks whose loads the pass issues together (knob PASS_PB): more loads in flight
                   # (docs/KERNELS.md, "The planner's defaults")
# A pass over fewer chunks issues as many loads as it has chunks, from these batch sizes: the
# rest of a batch would load the last chunk again and hold registers for it (same section).
PASS_BATCHES = (2, 8, PASS_BATCH)


def pass_batch(NCH: int, knobs: Settings | None = None) -> int:
    """Chunks whose loads the pass over ``NCH`` chunks issues together: the knob PASS_PB, else
    the smallest of PASS_BATCHES that holds them all, else PASS_BATCH."""
    knobs = settings() if knobs is None else knobs
    forced = knobs.knob("PASS_PB")
    if forced is not None:
        return forced
    return next((pb for pb in PASS_BATCHES if NCH <= pb), PASS_BATCH)


def _hpart(d: Dims, headloop: bool, knobs: Settings, name: str) -> int:
    """Heads per part of d_B (``name`` DB_HPART) or d_C (DC_HPART) when they run per head (default
    1; 1 where the knob does not divide the heads of a group, and with HEADLOOP, which adds all of
    them)."""
    k = knobs.knob(name)
    return 1 if headloop or (d.H // d.G) % k else k


@dataclass(frozen=True)
class ChunkPlan:
    CL: int
    NCH: int             # chunks per window (the largest)
    windows: tuple       # Window(i0, i1, 0, T): whole sequences; or (i, i + 1, t0, t1): token ranges
    Sw: int              # sequences per window (the largest)
    headloop: bool = False   # DB, DC per group (heads added in the workgroup), else per head + reduce
    KS: int = 16             # contraction slice of the GEMM kernels
    keep: bool = True        # forward: leave its tables for the backward (knob KEEP_STATES=0: no)
    knobs: Settings = DEFAULTS  # the knobs the plan was made with (tiles, threads, stores)
    softplus: int = 0        # the step's form (kernel_specs.SOFTPLUS: 0 ggml's, 1 log1p, 2 none)
    fold: bool = False       # d_B, d_C take the chunk's own tokens once per group (M o GU summed over its heads)
    hpart_b: int = 1         # d_B per head (not headloop): heads added into each part
    hpart_c: int = 1         # ... d_C
    P: int = 1               # head_dim and d_state: the sizes of the GEMM products
    N: int = 1
    Tw: int = 0              # tokens per window (the largest): T, or a token range's
    # Token windows only: each window's first chunk within its sequence (the windows' chunks of a
    # sequence counted in order: d_A's parts of a sequence are (H, nch_seq), as in one window)
    chunk_at: tuple = ()
    nch_seq: int = 0         # chunks per sequence, all its windows' (= NCH for whole sequences)
    # Resolved from the above when the plan is made (also by dataclasses.replace): what the kernels
    # (ssm_vk.chunked.chunked_specs) and the recording (ssm_vk.chunked.chunked_recording) read instead of the knobs.
    tiles: tuple = field(init=False)        # per mode of MODES, in its order: (RBLK, CBLK, NRB, NCBK)
    threads: tuple = field(init=False)      # (threads, row groups) of the GEMM kernels (GWG, ROWG)
    vec_in: frozenset = field(init=False)   # the modes that stage their operands with 16-byte loads
    vec_out: int = field(init=False)        # 1: the GEMM epilogues store 16 bytes at a time
    pass_pb: int = field(init=False)        # chunks whose loads the pass issues together

    def __post_init__(self) -> None:
        knobs, CL, P, N = self.knobs, self.CL, self.P, self.N
        resolved = dict(tiles=tuple(gemm_tile(m, CL, P, N, knobs) for m in MODES), threads=gemm_threads(knobs),
                        vec_in=frozenset(m for m in MODES if vec_in(m, P, N, CL, self.KS, knobs)),
                        vec_out=vec_out(knobs), pass_pb=pass_batch(self.NCH, knobs))
        for k, v in resolved.items():
            object.__setattr__(self, k, v)   # (frozen)

    @property
    def tokens(self) -> bool:
        """Whether the windows are token ranges of one sequence (carrying the state)."""
        return bool(self.chunk_at)

    def hpart(self, mode: str) -> int:
        """Heads per part of DB and DC (1 for the other modes)."""
        return {"DB": self.hpart_b, "DC": self.hpart_c}.get(mode, 1)

    def tile(self, mode: str) -> tuple[int, int, int, int]:
        """(RBLK, CBLK, NRB, NCBK) of GEMM mode ``mode`` (gemm_tile, resolved)."""
        return self.tiles[MODES.index(mode)]


# Windowed bindings of the caller's arrays in scratch_elems: checked against the binding range,
# not allocated.
NOT_SCRATCH = ("x", "B", "states")


def scratch_elems(d: Dims, CL: int, Sw: int, backward: bool, headloop: bool = True, T: int | None = None) -> dict:
    """Elements of every scratch array (and, NOT_SCRATCH, of the largest windowed input bindings)
    for a window of Sw sequences of ``T`` tokens (default: d.T)."""
    T = d.T if T is None else T
    NCH = -(-T // CL)
    e = {
        "x": Sw * T * d.H * d.P, "B": Sw * T * d.G * d.N, "states": Sw * d.H * d.P * d.N,
        "hs": Sw * NCH * d.H * d.P * d.N, "cb": Sw * NCH * d.G * CL * CL,
        "mcb": Sw * NCH * d.H * CL * CL, "dec": Sw * NCH * d.H * (2 * CL + 1),
    }
    if backward:
        e.update(gs=e["hs"], gu=e["mcb"], mgu=e["mcb"], sm=Sw * T * d.H * NSM, dAp=Sw * d.H * NCH)
        if not headloop:   # per-head parts of d_B, d_C and d_dt, summed by the reduce kernel
            e.update(dBp=Sw * T * d.H * d.N, dCp=Sw * T * d.H * d.N, ddtp=Sw * T * d.H)
    return e


def _grids(d: Dims, CL: int, Sw: int, knobs: Settings, T: int) -> list[int]:
    NCH = -(-T // CL)
    out = [Sw * NCH * d.H, -(-(Sw * d.H * d.P * d.N) // GEMM_WG)]
    for m in MODES:
        _, _, nrb, ncb = gemm_tile(m, CL, d.P, d.N, knobs)
        out.append(Sw * NCH * (d.G if m == "CB" else d.H) * nrb * ncb)   # DB, DC: per head at most
    return out


def _fits(d: Dims, lim: Limits, CL: int, Sw: int, backward: bool, knobs: Settings, T: int | None = None) -> bool:
    """Whether a window of ``Sw`` sequences (or, ``T`` given, of ``T`` tokens of one) fits."""
    cap = binding_cap(lim)
    e = scratch_elems(d, CL, Sw, backward, headloop=False, T=T)   # the larger set
    if any(v > cap for v in e.values()):
        return False
    scratch = sum(v for k, v in e.items() if k not in NOT_SCRATCH) * F32
    if (Sw > 1 or T is not None) and scratch > SCRATCH_BUDGET:
        return False
    try:
        for n in _grids(d, CL, Sw, knobs, d.T if T is None else T):
            grid(n, lim)
    except TooLarge:
        return False
    return True


def why_not(d: Dims, lim: Limits, CL: int, knobs: Settings | None = None) -> str:
    """Why the chunked kernels cannot run this shape on this device ("" when they can)."""
    knobs = settings() if knobs is None else knobs
    if d.mamba1:
        return "Mamba-1 (A has a decay per state)"
    if d.T == 0 or d.S * d.H * d.P * d.N == 0:
        return "empty problem"
    if d.P > MAX_PN or d.N > MAX_PN:
        return f"P or N above {MAX_PN}"
    wg = max(GEMM_WG, gemm_threads(knobs)[0])
    if lim.max_workgroup_invocations < wg or lim.max_workgroup_size[0] < wg:
        return f"workgroups of {wg} threads not offered"
    if lim.max_storage_buffers_per_stage < N_BINDINGS:
        return f"{N_BINDINGS} storage buffers per shader stage needed"
    need = max(_gemm_shared(CL, 64, 128, knobs), CL * (CL + 1) * F32, (GEMM_WG + 3 * CL) * F32)
    if need > lim.max_shared_memory:
        return f"{need} bytes of shared memory needed"
    return ""


def _window_chunks(d: Dims, lim: Limits, CL: int, backward: bool, knobs: Settings) -> int:
    """The most chunks of one sequence a token window of ``backward``'s kernels holds (0: none)."""
    return most_that_fit(-(-d.T // CL), lambda c: _fits(d, lim, CL, 1, backward, knobs, T=c * CL))


def chunk_plan(d: Dims, lim: Limits, backward: bool, knobs: Settings | None = None) -> ChunkPlan | None:
    """The chunked plan for ``d``, or None when the token-sequential kernels should run it (by
    shape: short sequences, Mamba-1, ...; or because not even a window of one chunk fits)."""
    knobs = settings() if knobs is None else knobs
    # Chunks of 32 tokens for small problems (more workgroups), 64 beyond (half the chunk
    # states to pass along); the sweep: docs/BENCHMARKS.md at 5c2fe9b.
    CL = knobs.knob("CHUNK")
    if CL is None:
        CL = 32 if d.S * d.T <= 1024 else 64
    if CL <= 0 or CL % 16 or CL % slice_len(backward, knobs) or CL > 64:   # 0 disables
        return None
    min_t = knobs.knob("CHUNK_MIN_T")
    if min_t is not None:
        if d.T < min_t:
            return None
    elif d.T < CHUNK_MIN_T[backward] or d.S * d.T < CHUNK_MIN_ST[backward]:
        return None
    if why_not(d, lim, CL, knobs):
        return None
    lo = most_that_fit(d.S, lambda s: _fits(d, lim, CL, s, backward, knobs))
    Tw, chunk_at, keep = d.T, (), knobs.knob("KEEP_STATES") != 0
    if lo >= 1:
        wins = tuple(Window(i, min(i + lo, d.S), 0, d.T) for i in range(0, d.S, lo))
    else:   # token ranges of one sequence: the most whole chunks that fit, cut again where to_device's pieces end
        chunks = _window_chunks(d, lim, CL, backward, knobs)
        if chunks < 1:
            return None
        if not backward and keep:   # the backward's windows (fewer chunks fit it), whose starting states it keeps
            back = chunk_plan(d, lim, True, knobs)
            if back is not None and back.tokens and back.CL == CL and back.Tw <= chunks * CL:
                chunks = back.Tw // CL
            else:
                keep = False
        lo, Tw = 1, chunks * CL
        wins = token_windows(d, lim, Tw)
        if len(wins) * d.H * d.P * d.N * F32 > piece_cap(lim):   # every window's starting state: one buffer
            if backward:
                return None
            keep = False
        # a sequence's chunks before each of its windows (every sequence has the same windows)
        at = list(accumulate((-(-w.T // CL) for w in wins if w.i0 == 0), initial=0))
        if backward and d.H * at[-1] > binding_cap(lim):   # d_A's parts of one sequence: one binding
            return None
        chunk_at = tuple(at[:-1]) * d.S
    NCH = -(-Tw // CL)
    # DB and DC loop over a group's heads only where that still gives enough workgroups: with
    # fewer the GPU idles, and per head + the reduce is the faster (the scratch budget allows for
    # it anyway; docs/KERNELS.md, "The planner's defaults")
    ncb = gemm_tile("DB", CL, d.P, d.N, knobs)[3]
    headloop = knobs.knob("HEADLOOP")
    headloop = lo * NCH * d.G * ncb >= HEADLOOP_MIN_GROUPS if headloop is None else bool(headloop)
    return ChunkPlan(CL=CL, NCH=NCH, windows=wins, Sw=lo, headloop=headloop, KS=slice_len(backward, knobs),
                     keep=keep, knobs=knobs,
                     fold=d.H > d.G and bool(knobs.knob("DBC_FOLD")),
                     hpart_b=_hpart(d, headloop, knobs, "DB_HPART"),
                     hpart_c=_hpart(d, headloop, knobs, "DC_HPART"), P=d.P, N=d.N, Tw=Tw, chunk_at=chunk_at,
                     nch_seq=at[-1] if chunk_at else NCH)


def chunked_scratch(d: Dims, cp: ChunkPlan, backward: bool) -> dict[str, int]:
    """The chunked kernels' scratch, as their recording requests it (but the flag)."""
    e = scratch_elems(d, cp.CL, cp.Sw, backward, cp.headloop, T=cp.Tw)
    out = {k: v for k, v in e.items() if k not in NOT_SCRATCH}
    if backward:
        out.update(st=d.S * d.H * d.P * d.N, dAp=d.S * d.H * cp.nch_seq)
    if cp.tokens and (backward or cp.keep):   # each token window's starting state (kept for the backward)
        out["ck"] = len(cp.windows) * d.H * d.P * d.N
    return out


# -- the family's interface (family.Family: plan, scratch, tables) -------------------------------

def plan_call(req) -> ChunkPlan | None:
    """The chunked plan of a call (family.Request), or None: never for K > 1 snapshots (the
    chunked kernels keep the states of chunk ends only) or in the invariant mode (the matrix form
    rounds otherwise, and is chosen by S and T); else :func:`chunk_plan`'s, with the step's form."""
    if req.snap or req.knobs.invariant:
        return None
    cp = chunk_plan(req.dims, req.lim, req.backward, req.knobs)
    if cp is not None and req.softplus:
        cp = replace(cp, softplus=req.softplus)
    return cp


def scratch(d: Dims, cp: ChunkPlan, backward: bool) -> dict[str, int]:
    """The chunked recording's scratch and its non-finite flag, by the memory budget's names."""
    return {**chunked_scratch(d, cp, backward), "flag": FLAG_ELEMS}


def tables(cp: ChunkPlan, backward: bool) -> int | None:
    """The tag of the tables a chunked forward leaves for the backward of the same inputs (its chunk
    states, C.B and M o C.B: engine.KeptForward), the chunk length: a backward of the same chunk
    length binds them instead of recomputing them. A forward leaves them only in one window of
    sequences, and not with the knob KEEP_STATES=0. Over token windows (the forward's those of its
    backward) the tables are the windows' starting states instead, which the backward then does not
    walk the sequence for; it recomputes the chunk states window by window."""
    if cp.tokens:   # the windows' starting states, which the forward keeps over the backward's windows
        return ("starts", cp.CL, cp.Tw, cp.chunk_at) if backward or cp.keep else None
    if len(cp.windows) != 1:   # (a forward's tables are of one window of all the sequences, bound whole)
        return None
    return cp.CL if backward or cp.keep else None
