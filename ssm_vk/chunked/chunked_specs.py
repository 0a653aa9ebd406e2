"""The chunked Mamba-2 kernels' specs (glsl/chunk_*.comp): one push block and one binding table
for all, the variant each kernel takes under a ChunkPlan, every kernel a chunked plan dispatches
and this family's part of the packaged matrix."""

from __future__ import annotations

from dataclasses import replace
from itertools import product

from ssm_ref import Dims

from ..config import Settings
from ..kernel_specs import KernelSpec, defines_of, reduce_spec, rows_spec, softplus_constants
from .chunked_planner import GEMM_WG, KS, MAX_PN, PASS_BATCH, PASS_BATCHES, ChunkPlan

__all__ = ["CHUNK_PUSH", "CHUNK_BINDINGS", "chunk_spec", "PASS_WG", "PASS_BATCH", "PASS_BATCHES", "pass_batch",
           "pass_spec", "gemm_spec", "decay_spec", "finish_spec", "chunk_kernels", "matrix", "packaged"]

# The chunked kernels (ssm_vk/chunked/glsl/chunk_common.glsl): one push block and one binding table for all.
CHUNK_PUSH = ("S", "T", "H", "G", "NCH", "gx", "o_x", "o_dt", "o_B", "o_C", "o_gy", "o_out", "o_st", "o_A", "NCHA")
CHUNK_BINDINGS = ("x", "dt", "A", "B", "C", "gy", "hs", "gs", "cb", "mcb", "gu", "mgu", "dec", "out",
                  "sm", "st", "ddtp", "dAp", "flag")


def chunk_spec(name: str, d: Dims, CL: int, wg: int, softplus: int = 0, **defines) -> KernelSpec:
    """A chunked kernel (ssm_vk/chunked/glsl/<name>.comp): sizes P, N and the chunk length are compile-time;
    ``softplus``: the step's form, for the kernels that compute it."""
    defs = defines_of(WG=wg, CL=CL, PD=d.P, ND=d.N, **defines)
    return KernelSpec(name, defs, len(CHUNK_BINDINGS), CHUNK_PUSH, wg, softplus_constants(softplus))


# The chunked kernels' specs read what the plan resolved from the knobs when it was made (the
# GEMM tiles and threads, 16-byte loads and stores, the pass's batch): never a knob.
PASS_WG = 256


def pass_batch(cp: ChunkPlan) -> int:
    """Chunks whose loads the pass over ``cp``'s chunks issues together (chunked.chunked_planner.pass_batch,
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
    ks.append(decay_spec(d, cp, False, kept=True))   # token windows' starts: the decays alone
    ks += [pass_spec(d, cp, 1), finish_spec(d, cp), reduce_spec(1)]
    if cp.fold:
        ks.append(reduce_spec(2))
    if not cp.headloop:
        ks.append(reduce_spec(0))
    if d.S > 1:
        ks.append(rows_spec())
    return ks


def matrix(p_values, n_values, knobs: Settings) -> list[KernelSpec]:
    """The chunked kernels for every head_dim of ``p_values`` x d_state of ``n_values`` and chunk
    length, in a stable order (the packaged matrix's part: ssm_vk.registry.matrix; they depend on
    no device limit)."""
    out = []
    add = out.append
    for P in p_values:
        for N in n_values:
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
    return out


def packaged(limits_list, n_values, p_values, pn_values, knobs: Settings) -> list[KernelSpec]:
    """The family's part of the packaged matrix (family.Family.matrix): :func:`matrix` of the head_dims
    ``p_values`` x d_states ``pn_values``, whatever the device profiles."""
    return matrix(p_values, pn_values, knobs)
