"""The scan kernels' host-side table: which GLSL file, which defines, how many bindings and the
push-constant layout of each -- the same order and names as the PC blocks in ssm_vk/glsl/*.comp --
and the one list of the variants a plan dispatches (:func:`kernels_needed`), which the support
decision checks, the recordings dispatch and ``ssm-scan build-shaders`` precompiles (:func:`matrix`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from itertools import product

from ssm_ref import Dims

from . import runtime as rt
from .config import DEFAULTS, KNOBS, Settings
from .plan import ChunkPlan, Layout, Limits, Plan, layout_for
from .plan.chunked import GEMM_WG, KS, MAX_PN, PASS_BATCH, PASS_BATCHES
from .plan.m1 import M1_SPS_TI_MIN, M1Plan, m1_plan
from .plan.sequential import TCHUNK_BELOW, m1_forward_two_per_lane_from

__all__ = ["KernelSpec", "fwd_spec", "bwd_spec", "carry_spec", "reduce_spec", "rows_spec", "chunk_spec", "pack_push",
           "kernel", "kernel_cached", "gemm_spec", "decay_spec", "finish_spec", "pass_spec", "chunk_kernels",
           "kernels_needed", "matrix", "m1_spec", "m1_back_spec", "m1_kernels", "M1_PUSH", "M1_BACK_PUSH",
           "FWD_PUSH", "BWD_PUSH", "CARRY_PUSH", "RED_PUSH", "ROWS_PUSH", "CHUNK_PUSH",
           "CHUNK_BINDINGS", "PASS_WG", "PASS_BATCH", "PASS_BATCHES", "pass_batch", "SOFTPLUS"]

# Push-constant fields, in the order of the PC block of each shader (all uint32).
FWD_PUSH = ("S", "T", "H", "P", "N", "G", "HB", "PB", "NHB", "NPB", "gx", "NC", "c0",
            "o_x", "o_dt", "o_B", "o_C", "o_y", "o_st", "o_ck", "gather", "o_s", "o_ids", "scatter", "o_A")
BWD_PUSH = ("S", "T", "H", "P", "N", "G", "HB", "PB", "NHB", "NPB", "gx", "NC", "c0",
            "o_x", "o_dt", "o_B", "o_C", "o_gy", "o_lam", "o_ck", "o_dx", "o_dA", "o_A")
CARRY_PUSH = ("S", "H", "P", "N", "NCH", "gx", "gather", "o_s", "o_ids", "o_st")
RED_PUSH = ("S", "T", "H", "P", "N", "G", "NPB", "KA", "gx", "o_0", "o_3", "o_4", "o_5", "acc", "HS", "HSC")
ROWS_PUSH = ("L", "n_pairs", "gx", "o_src", "o_dst")
# The Mamba-1 kernels with time in a workgroup's threads (ssm_vk/glsl/m1_scan.comp, m1_scan_back.comp).
M1_PUSH = ("S", "T", "H", "G", "NCH", "NRB", "gx", "TI", "o_x", "o_dt", "o_A", "o_B", "o_C", "o_gy", "o_y", "o_init",
           "gather", "o_s", "o_ids", "scatter", "final_state", "keep_step")
M1_BACK_PUSH = ("S", "T", "H", "G", "NCH", "NRB", "gx", "o_x", "o_dt", "o_A", "o_B", "o_C", "o_gy", "o_init", "o_adj",
                "o_dx", "o_ddt", "gather", "o_s", "o_ids")
# The chunked kernels (ssm_vk/glsl/chunk_common.glsl): one push block and one binding table for all.
CHUNK_PUSH = ("S", "T", "H", "G", "NCH", "gx", "o_x", "o_dt", "o_B", "o_C", "o_gy", "o_out", "o_st", "o_A")
CHUNK_BINDINGS = ("x", "dt", "A", "B", "C", "gy", "hs", "gs", "cb", "mcb", "gu", "mgu", "dec", "out",
                  "sm", "st", "ddtp", "dAp", "flag")

# The d_state values whose Mamba-1 kernels with time in threads the packaged matrix holds: every
# published Mamba-1 model (mamba-130m..2.8b, Falcon-Mamba, Jamba) has N = 16, and each variant
# is large (its loops over N and the slice's tokens unrolled).
M1_PACKAGED_N = (16,)

# Threads per workgroup of the element-wise kernels (reduce, rows).
FLAT_WG = 64


# The dt_softplus forms -> the kernels' specialisation constant SOFTPLUS (ssm_vk/glsl/math.glsl).
# One SPIR-V module serves every form: the form is set when the pipeline is made.
SOFTPLUS = {"ggml": 0, "log1p": 1, None: 2}


@dataclass(frozen=True)
class KernelSpec:
    name: str            # ssm_vk/glsl/<name>.comp
    defines: tuple       # ((key, value), ...) sorted, hashable
    n_bindings: int
    push: tuple          # field names
    wg: int              # threads per workgroup
    constants: tuple = ()  # specialisation constants 3, 4, ...: (SOFTPLUS,) for a form other than ggml's

    @property
    def push_size(self) -> int:
        return 4 * len(self.push)


def _defs(**kw) -> tuple:
    return tuple(sorted((k, int(v)) for k, v in kw.items()))


def _common(d: Dims, lay: Layout) -> dict:
    return dict(WG=lay.WG, LN=lay.LN, NPL=lay.NPL, ROW_SUM=lay.ROW_SUM, MAMBA1=int(d.mamba1))


def _softplus(code: int) -> tuple:
    """The specialisation constants of a kernel that computes the step, for form ``code``
    (none for ggml's, the shaders' default: the same pipelines as a call without the keyword)."""
    return (code,) if code else ()


def fwd_spec(d: Dims, lay: Layout, checkpoint: bool, softplus: int = 0, summary: bool = False) -> KernelSpec:
    """ssm_scan.comp: the forward (y and final states), the backward's checkpoint pass
    (``checkpoint``) or the first pass of the forward parallel over time (``summary``);
    ssm_decode.comp for a layout of the decode kernel (``lay.DEC``: one token), same bindings and
    push constants."""
    defs = _common(d, lay)
    if lay.DEC and not checkpoint and not summary:   # one token: the decode kernel
        return KernelSpec("ssm_decode", _defs(**defs), 10, FWD_PUSH, lay.WG, _softplus(softplus))
    defs.update(CKPT=int(checkpoint), K=lay.K, TB=lay.TB)
    if lay.SPREAD:
        defs.update(SPREAD=1)
    if summary:
        defs.update(SUMMARY=1)
    return KernelSpec("ssm_scan", _defs(**defs), 10, FWD_PUSH, lay.WG, _softplus(softplus))


def carry_spec(d: Dims, reverse: bool = False) -> KernelSpec:
    """ssm_scan_carry.comp: the middle pass of the forward (or, ``reverse``, the backward) parallel
    over time."""
    defs = dict(WG=FLAT_WG, MAMBA1=int(d.mamba1))
    if reverse:
        defs.update(REVERSE=1)
    return KernelSpec("ssm_scan_carry", _defs(**defs), 6, CARRY_PUSH, FLAT_WG)


def bwd_spec(d: Dims, lay: Layout, softplus: int = 0, summary: bool = False) -> KernelSpec:
    """ssm_scan_back.comp: the backward pass, or (``summary``) the first backward pass over time
    chunks."""
    defs = _common(d, lay)
    defs.update(K=lay.K, TBR=lay.TBR)
    if lay.SPREAD:
        defs.update(SPREAD=1)
    if summary:
        defs.update(BSUM=1, TB=lay.TB)
    elif lay.HSUM:
        defs.update(HSUM=1)
    return KernelSpec("ssm_scan_back", _defs(**defs), 13, BWD_PUSH, lay.WG, _softplus(softplus))


def reduce_spec(mode: int, no_dt: bool = False) -> KernelSpec:
    """ssm_scan_reduce.comp: MODE 0 sums the d_B / d_C (and, unless ``no_dt``, d_dt) partials,
    MODE 1 d_A's, MODE 2 the chunked backward's M o GU over each group's heads (in place)."""
    defs = dict(WG=FLAT_WG, MODE=mode)
    if no_dt:
        defs.update(NODT=1)
    return KernelSpec("ssm_scan_reduce", _defs(**defs), 6, RED_PUSH, FLAT_WG)


def m1_spec(d: Dims, mp: M1Plan, mode: int, adjoint: bool = False, softplus: int = 0) -> KernelSpec:
    """m1_scan.comp: the summary (``mode`` 0; with ``adjoint`` the backward's over time chunks), the
    final pass (1) or both in one pass (2, one time chunk) of the Mamba-1 forward with time in a
    workgroup's threads."""
    defs = dict(RW=mp.RW, NW=mp.NW, ND=d.N, MODE=mode, TB=mp.TB)
    if mp.SPS != 1:
        defs.update(SPS=mp.SPS)
    if adjoint:
        defs.update(ADJ=1)
    return KernelSpec("m1_scan", _defs(**defs), 15, M1_PUSH, mp.WG, _softplus(softplus))


def m1_back_spec(d: Dims, mp: M1Plan, softplus: int = 0) -> KernelSpec:
    """m1_scan_back.comp: the Mamba-1 backward with time in a workgroup's threads."""
    defs = dict(RW=mp.RW, NW=mp.NW, ND=d.N, TI=mp.TI, NB=mp.NB)
    return KernelSpec("m1_scan_back", _defs(**defs), 16, M1_BACK_PUSH, mp.WG, _softplus(softplus))


def m1_kernels(d: Dims, mp: M1Plan, backward: bool, softplus: int = 0) -> list[KernelSpec]:
    """Every kernel the time-in-threads recording of ``d`` dispatches (record/m1.py)."""
    over_time = [carry_spec(d)] if mp.NCH > 1 else []
    if not backward:
        if mp.NCH == 1:
            return [m1_spec(d, mp, 2, softplus=softplus)]
        return [m1_spec(d, mp, 0, softplus=softplus), *over_time, m1_spec(d, mp, 1, softplus=softplus)]
    if mp.NCH > 1:
        over_time = [m1_spec(d, mp.summary(), 0, adjoint=True, softplus=softplus), carry_spec(d),
                     carry_spec(d, reverse=True)]
    return [*over_time, m1_back_spec(d, mp, softplus), reduce_spec(0, no_dt=True), reduce_spec(1)]


def rows_spec() -> KernelSpec:
    return KernelSpec("rows", _defs(WG=FLAT_WG), 3, ROWS_PUSH, FLAT_WG)


def chunk_spec(name: str, d: Dims, CL: int, wg: int, softplus: int = 0, **defines) -> KernelSpec:
    """A chunked kernel (ssm_vk/glsl/<name>.comp): sizes P, N and the chunk length are compile-time;
    ``softplus``: the step's form, for the kernels that compute it."""
    defs = _defs(WG=wg, CL=CL, PD=d.P, ND=d.N, **defines)
    return KernelSpec(name, defs, len(CHUNK_BINDINGS), CHUNK_PUSH, wg, _softplus(softplus))


def pack_push(fields: tuple, values: dict) -> bytes:
    """Pack push constants in field order; every field must be given and fit in uint32."""
    missing = [f for f in fields if f not in values]
    if missing:
        raise KeyError(f"push constants missing: {missing}")
    vals = [int(values[f]) for f in fields]
    for f, v in zip(fields, vals, strict=True):
        if not 0 <= v < 2**32:
            raise OverflowError(f"push constant {f} = {v} does not fit in uint32")
    return struct.pack(f"<{len(vals)}I", *vals)


# -- kernels of a context, by spec ---------------------------------------------------------------

def _kernel_args(spec: KernelSpec) -> dict:
    return dict(bindings=spec.n_bindings, push_size=spec.push_size, local_size=(spec.wg, 1, 1),
                spec=spec.constants, defines=dict(spec.defines))


def kernel_cached(ctx, spec: KernelSpec) -> bool:
    """Whether ``ctx`` holds the kernel of ``spec`` already."""
    return rt.Kernel.cached(ctx, spec.name, **_kernel_args(spec)) is not None


def kernel(ctx, spec: KernelSpec) -> rt.Kernel:
    return rt.Kernel.get(ctx, spec.name, **_kernel_args(spec))



# -- the chunked kernels of a plan ----------------------------------------------------------------

# The chunked kernels' specs read what the plan resolved from the knobs when it was made (the
# GEMM tiles and threads, 16-byte loads and stores, the pass's batch): never a knob.
PASS_WG = 256


def pass_batch(cp: ChunkPlan) -> int:
    """Chunks whose loads the pass over ``cp``'s chunks issues together (plan.chunked.pass_batch,
    resolved in the plan)."""
    return cp.pass_pb


def pass_spec(d, cp: ChunkPlan, mode: int) -> KernelSpec:
    return chunk_spec("chunk_pass", d, cp.CL, PASS_WG, MODE=mode, PB=cp.pass_pb)


def gemm_spec(d, cp: ChunkPlan, mode: str) -> KernelSpec:
    """The kernel of matrix product ``mode`` under ``cp`` (glsl/chunk_gemm_<mode>.comp)."""
    RBLK, CBLK, _, _ = cp.tile(mode)
    wg, rg = cp.threads
    # defined only where not the shader's default, so the default variants keep their SPIR-V
    extra = {}
    if mode in cp.vec_in:
        extra["VEC_IN"] = 1
    if cp.fold and mode in ("DB", "DC"):
        extra["FOLD"] = 1
    if cp.hpart(mode) > 1:     # DB, DC (1 with headloop)
        extra["HPART"] = cp.hpart(mode)
    return chunk_spec("chunk_gemm_" + mode.lower(), d, cp.CL, wg, cp.softplus, RBLK=RBLK, CBLK=CBLK,
                      KS=cp.KS, ROWG=rg, HEADLOOP=int(cp.headloop and mode in ("DB", "DC")),
                      VEC_OUT=cp.vec_out, **extra)


def decay_spec(d, cp: ChunkPlan, backward: bool, kept: bool = False) -> KernelSpec:
    return chunk_spec("chunk_decay", d, cp.CL, GEMM_WG, cp.softplus, MODE=int(backward), KEPT=int(kept))


def finish_spec(d, cp: ChunkPlan) -> KernelSpec:
    nbp = cp.tile("GAM")[3]
    nbn = cp.tile("DC")[3]
    return chunk_spec("chunk_finish", d, cp.CL, GEMM_WG, cp.softplus, NBP=nbp, NBN=nbn)


def chunk_kernels(d, cp: ChunkPlan, backward: bool) -> list[KernelSpec]:
    """Every kernel the chunked recording of ``d`` dispatches."""
    ks = [gemm_spec(d, cp, "CB"), decay_spec(d, cp, backward), gemm_spec(d, cp, "ZF"), pass_spec(d, cp, 0)]
    if not backward:
        return [*ks, gemm_spec(d, cp, "Y")]
    ks += [gemm_spec(d, cp, m) for m in ("GU", "ZB", "GAM", "DB", "DC")]
    ks.append(decay_spec(d, cp, True, kept=True))    # after a forward whose tables are still there
    ks += [pass_spec(d, cp, 1), finish_spec(d, cp), reduce_spec(1)]
    if cp.fold:
        ks.append(reduce_spec(2))
    if not cp.headloop:
        ks.append(reduce_spec(0))
    if d.S > 1:
        ks.append(rows_spec())
    return ks


def kernels_needed(d, pl: Plan, backward: bool) -> list[KernelSpec]:
    """The kernels the recording of a problem of dims ``d`` under plan ``pl`` may dispatch (the
    d_s scatter's counted whenever ids could repeat), so that the support decision can tell,
    before any work, whether their SPIR-V can be had and the device takes them."""
    if pl.chunked is not None:
        # the chunked kernels, and the sequential ones that recompute a call with inf or nan
        return chunk_kernels(d, pl.chunked, backward) + kernels_needed(d, replace(pl, chunked=None), backward)
    if pl.m1 is not None:
        # likewise the Mamba-1 kernels with time in threads
        return m1_kernels(d, pl.m1, backward, pl.softplus) + kernels_needed(d, replace(pl, m1=None), backward)
    if not (pl.windows and d.H * d.P > 0):
        kernels = []
    elif not backward and pl.tchunk:
        # the three passes over time chunks; the plain forward also recomputes a call with inf or nan
        return [fwd_spec(d, pl.layout, checkpoint=False, softplus=pl.softplus, summary=True), carry_spec(d),
                fwd_spec(d, pl.layout, checkpoint=False, softplus=pl.softplus)]
    elif not backward:
        return [fwd_spec(d, pl.layout, checkpoint=False, softplus=pl.softplus)]
    else:
        kernels = [fwd_spec(d, pl.layout, checkpoint=True, softplus=pl.softplus),
                   bwd_spec(d, pl.layout, pl.softplus), reduce_spec(0)]
        if pl.tchunk:
            # the summaries and carries over time chunks before the same walk back (which also
            # recomputes a call with inf or nan)
            kernels += [fwd_spec(d, pl.layout, checkpoint=False, softplus=pl.softplus, summary=True),
                        bwd_spec(d, pl.layout, pl.softplus, summary=True), carry_spec(d), carry_spec(d, reverse=True)]
        if d.H * d.P * (d.N if d.mamba1 else 1):
            kernels.append(reduce_spec(1))
    if backward and d.R * d.H * d.P * d.N and d.S > 1:
        kernels.append(rows_spec())  # ids may repeat: rows added by the scatter kernel
    return kernels


def matrix(limits_list: list[Limits], n_values, p_values=(), chunked_n=None,
           knobs: Settings = DEFAULTS) -> list[tuple[str, dict]]:
    """Every (shader, defines) the forward and backward request for these device profiles and
    d_state values, for both Mamba variants, and the chunked kernels for every head_dim of
    ``p_values`` x d_state of ``chunked_n`` (default ``n_values``) and chunk length, in a stable
    order without duplicates: what ``ssm-scan build-shaders`` packages."""
    seen: dict = {}

    def add(spec) -> None:
        seen.setdefault((spec.name, spec.defines), None)

    for lim in limits_list:
        for N, T, mamba1 in product(n_values, (1, 64), (False, True)):
            # H and P mostly set how rows are spread over workgroups (push constants), not the
            # defines; T whether it is a decode step (one token: TB = 1) or not. Mamba-1's forward
            # on a GPU takes one of two layouts by its number of rows: both are here.
            d = Dims(S=1, T=T, H=8, P=1 if mamba1 else 64, N=N, G=1, R=1, mamba1=mamba1,
                     a_shape=(8, N) if mamba1 else (8,))
            fwds = [d]
            if T == 1 and not mamba1:   # the ordinary kernel where P is too small for the decode kernel
                fwds.append(replace(d, P=1))
            if mamba1 and T > 1:
                H = max(8, m1_forward_two_per_lane_from(N))
                fwds.append(replace(d, H=H, a_shape=(H, N)))
            if not mamba1 and T > 1:   # Mamba-2 token by token: few threads (blocks of eight tokens) and many
                fwds.append(replace(d, H=TCHUNK_BELOW, a_shape=(TCHUNK_BELOW,)))
            for df in fwds:
                fwd = layout_for(df, lim, False, knobs)
                add(fwd_spec(df, fwd, checkpoint=False))   # ssm_scan (or ssm_decode)
                if T == 1 and not mamba1:                  # the decode kernel of a step with more sequences
                    add(fwd_spec(df, layout_for(df, lim, False, knobs.with_knobs(DEC=1)), checkpoint=False))
                if T > 1:                                  # parallel over time: first and middle pass
                    add(fwd_spec(df, fwd, checkpoint=False, summary=True))
                    add(carry_spec(df))
            bwd = layout_for(d, lim, True, knobs)
            add(fwd_spec(d, bwd, checkpoint=True))         # ssm_scan_back: checkpoint pass
            add(bwd_spec(d, bwd))                          # ssm_scan_back: backward pass
            if mamba1:   # with and without the heads' shared partials: which one depends on H and G
                add(bwd_spec(d, replace(bwd, HSUM=1 - bwd.HSUM)))
            if T > 1 and mamba1:                           # the backward parallel over time (Mamba-1's
                add(fwd_spec(d, bwd, checkpoint=False, summary=True))   # plans; TCHUNK forces it for both)
                add(bwd_spec(d, bwd, summary=True))
                add(carry_spec(d, reverse=True))
        for N in sorted(set(n_values) & set(M1_PACKAGED_N)):
            # the Mamba-1 kernels with time in threads (a GPU's default where they apply), for the
            # d_state of Mamba-1 models; other N compile them on first use where glslc is, else run
            # the token-sequential kernels (decision.py)
            H = 48 * lim.subgroup_size
            for T, backward in product((64, 4096), (False, True)):
                d = Dims(S=1, T=T, H=H, P=1, N=N, G=1, R=1, mamba1=True, a_shape=(H, N))
                mp = m1_plan(d, lim, backward, knobs)
                if mp is not None:
                    for spec in m1_kernels(d, mp, backward):
                        add(spec)
            # the forward in one pass with several slices per subgroup, as the plan takes it for few
            # sequences and channels: every SPS its rule can reach (slices of M1_SPS_TI_MIN tokens
            # or more within the knob M1_ONE_TI's default)
            RW = lim.subgroup_size
            one_ti = KNOBS["M1_ONE_TI"].default
            d = Dims(S=1, T=one_ti, H=RW, P=1, N=N, G=1, R=1, mamba1=True, a_shape=(RW, N))
            SPS = 2
            while SPS <= min(RW, one_ti // M1_SPS_TI_MIN):
                mp = m1_plan(d, lim, False, knobs.with_knobs(M1_SPS=SPS))
                if mp is not None:
                    add(m1_spec(d, mp, 2))
                SPS *= 2
    for spec in (reduce_spec(0), reduce_spec(1), reduce_spec(2), rows_spec()):
        add(spec)
    for P in p_values:
        for N in n_values if chunked_n is None else chunked_n:
            if P > MAX_PN or N > MAX_PN:
                continue
            d = Dims(S=2, T=64, H=8, P=P, N=N, G=1, R=2, mamba1=False, a_shape=(8,))
            for CL in (32, 64):
                for backward in (False, True):
                    for headloop, fold in product((False, True), (False, True)):   # fold: H > G
                        cp = ChunkPlan(CL=CL, NCH=1, windows=(), Sw=1, headloop=headloop, KS=KS[backward],
                                       knobs=knobs, fold=fold and backward, P=P, N=N)
                        for spec in chunk_kernels(d, cp, backward):
                            add(spec)
                    for nch in PASS_BATCHES:   # the pass for every number of chunks (headloop aside)
                        add(pass_spec(d, replace(cp, NCH=nch), int(backward)))
    return [(name, dict(defines)) for name, defines in seen]
