"""The chunked Mamba-3 kernels' specs: the forward's (glsl/m3c_prep.comp, m3c_angle.comp,
m3c_states.comp, m3c_pass.comp, m3c_y.comp over m3c_common.glsl) and the backward's
(glsl/m3b_gstates.comp, m3b_gpass.comp, m3b_chunk.comp, m3b_rot.comp, m3b_angle.comp over
m3b_common.glsl, which also runs the forward's first four and mamba3_reduce.comp): bindings and
push constants in the order of the shaders' headers, the kernels a plan dispatches and this
family's part of the packaged matrix.

Every size is a push constant, so each kernel is one SPIR-V module for every N, M, P and chunk
length: the family adds ten variants to a wheel."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..kernel_specs import KernelSpec, defines_of
from .mamba3_chunked_planner import CHUNK_N_MAX, CHUNK_WG
from .mamba3_specs import INPUTS, reduce_spec

if TYPE_CHECKING:
    from ssm_ref.mamba3_checks import M3Dims

    from ..config import Settings
    from .mamba3_chunked_planner import M3ChunkPlan

__all__ = ["PUSH", "BINDINGS", "SCRATCH", "BWD_SCRATCH", "BWD_BINDINGS", "RECOMPUTE_BINDINGS", "prep_spec",
           "angle_spec", "states_spec", "pass_spec", "y_spec", "gstates_spec", "gpass_spec", "chunk_spec", "rot_spec",
           "bangle_spec", "kernels", "packaged"]

# m3c_common.glsl's PC block.
PUSH = ("S", "T", "H", "P", "G", "F", "R", "N", "M", "L", "NC", "halved", "gx", "mode")
# The scratch the kernels bind (mamba3_chunked_planner.chunk_elems), in binding order after the outputs.
SCRATCH = ("m3c_q", "m3c_k", "m3c_hz", "m3c_dch", "m3c_ang", "m3c_flag")
BINDINGS = (*INPUTS, "y", "theta", "h", "k", "v", *SCRATCH)
# The backward's own scratch (mamba3_chunked_planner.chunk_bwd_elems): G per chunk and the angle cotangents
# (gz), the rotated queries' and keys' cotangents (gqk), d_B and d_C per head, each chunk's parts of
# d_B_bias, d_C_bias, d_psi; the final state its recompute of the forward writes (unread).
BWD_SCRATCH = ("m3b_gz", "m3b_gqk", "m3b_dBh", "m3b_dCh", "m3b_parts", "m3b_th", "m3b_h", "m3b_k", "m3b_v")
# m3b_common.glsl's bindings (32), and the forward's kernels' bindings in the backward's recompute.
BWD_BINDINGS = (*INPUTS, "g_y", "g_state", "d_x", "d_step", "d_dtheta", "m3b_dBh", "m3b_dCh", "m3b_parts", "d_start",
                "m3c_q", "m3c_k", "m3c_hz", "m3c_dch", "m3c_ang", "m3c_flag", "m3b_gz", "m3b_gqk")
RECOMPUTE_BINDINGS = (*INPUTS, "y", "m3b_th", "m3b_h", "m3b_k", "m3b_v", *SCRATCH)


def _spec(name: str, wg: int, n_bindings: int = len(BINDINGS), defines: tuple = ()) -> KernelSpec:
    return KernelSpec(name, defines, n_bindings, PUSH, wg)


def prep_spec() -> KernelSpec:
    return _spec("m3c_prep", 128)


def angle_spec() -> KernelSpec:
    return _spec("m3c_angle", 64)


def states_spec() -> KernelSpec:
    return _spec("m3c_states", CHUNK_WG)


def pass_spec() -> KernelSpec:
    return _spec("m3c_pass", CHUNK_WG)


def y_spec() -> KernelSpec:
    return _spec("m3c_y", CHUNK_WG)


def gstates_spec() -> KernelSpec:
    return _spec("m3b_gstates", CHUNK_WG, len(BWD_BINDINGS))


def gpass_spec() -> KernelSpec:
    return _spec("m3b_gpass", CHUNK_WG, len(BWD_BINDINGS))


def chunk_spec(half: int) -> KernelSpec:
    """m3b_chunk.comp's first or second half (``half`` 1, 2), run one after the other."""
    return _spec("m3b_chunk", CHUNK_WG, len(BWD_BINDINGS), defines_of(SPLIT=half))


def rot_spec() -> KernelSpec:
    return _spec("m3b_rot", 128, len(BWD_BINDINGS))


def bangle_spec() -> KernelSpec:
    return _spec("m3b_angle", 64, len(BWD_BINDINGS))


def kernels(d: M3Dims, plan: M3ChunkPlan, backward: bool) -> list[KernelSpec]:
    """Every kernel the recording of ``d`` under ``plan`` dispatches (family.Family.kernels)."""
    if backward:
        out = [prep_spec(), states_spec(), pass_spec(), gstates_spec(), gpass_spec(), chunk_spec(1), chunk_spec(2),
               rot_spec(), reduce_spec()]
        return [angle_spec(), bangle_spec(), *out] if d.F else out
    out = [prep_spec(), states_spec(), pass_spec(), y_spec()]
    return [angle_spec(), *out] if d.F else out


def packaged(limits_list, n_values, p_values, pn_values, knobs: Settings) -> list[KernelSpec]:
    """The family's part of the packaged matrix (family.Family.matrix): its eleven modules, wherever
    some d_state of ``n_values`` is one it takes (mamba3_reduce.comp is the token-sequential
    family's)."""
    if not any(1 <= n <= CHUNK_N_MAX for n in n_values):
        return []
    return [prep_spec(), angle_spec(), states_spec(), pass_spec(), y_spec(), gstates_spec(), gpass_spec(),
            chunk_spec(1), chunk_spec(2), rot_spec(), bangle_spec()]
