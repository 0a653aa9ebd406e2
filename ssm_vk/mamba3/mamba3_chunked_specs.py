"""The chunked Mamba-3 forward's specs (glsl/m3c_prep.comp, m3c_angle.comp, m3c_states.comp,
m3c_pass.comp, m3c_y.comp over m3c_common.glsl): bindings and push constants in the order of the
shaders' headers, the kernels a plan dispatches and this family's part of the packaged matrix.

Every size is a push constant, so each kernel is one SPIR-V module for every N, M, P and chunk
length: the family adds five variants to a wheel."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..kernel_specs import KernelSpec
from .mamba3_planner import CHUNK_N_MAX, CHUNK_WG
from .mamba3_specs import INPUTS

if TYPE_CHECKING:
    from ssm_ref.mamba3_checks import M3Dims

    from ..config import Settings
    from .mamba3_planner import M3ChunkPlan

__all__ = ["PUSH", "BINDINGS", "SCRATCH", "prep_spec", "angle_spec", "states_spec", "pass_spec", "y_spec", "kernels",
           "packaged"]

# m3c_common.glsl's PC block.
PUSH = ("S", "T", "H", "P", "G", "F", "R", "N", "M", "L", "NC", "halved", "gx", "mode")
# The scratch the kernels bind (mamba3_planner.chunk_elems), in binding order after the outputs.
SCRATCH = ("m3c_q", "m3c_k", "m3c_hz", "m3c_dch", "m3c_ang", "m3c_flag")
BINDINGS = (*INPUTS, "y", "theta", "h", "k", "v", *SCRATCH)


def _spec(name: str, wg: int) -> KernelSpec:
    return KernelSpec(name, (), len(BINDINGS), PUSH, wg)


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


def kernels(d: M3Dims, plan: M3ChunkPlan, backward: bool) -> list[KernelSpec]:
    """Every kernel the recording of ``d`` under ``plan`` dispatches (family.Family.kernels)."""
    if backward:
        return []
    out = [prep_spec(), states_spec(), pass_spec(), y_spec()]
    return [angle_spec(), *out] if d.F else out


def packaged(limits_list, n_values, p_values, pn_values, knobs: Settings) -> list[KernelSpec]:
    """The family's part of the packaged matrix (family.Family.matrix): its five kernels, one
    module each, wherever some d_state of ``n_values`` is one it takes."""
    if not any(1 <= n <= CHUNK_N_MAX for n in n_values):
        return []
    return [prep_spec(), angle_spec(), states_spec(), pass_spec(), y_spec()]
