"""The Mamba-3 token-sequential kernels' specs (glsl/mamba3_scan.comp, mamba3_step.comp,
mamba3_scan_back.comp, mamba3_reduce.comp): bindings, push constants in the order of the shaders'
PC blocks, every kernel a plan dispatches, and this family's part of the packaged matrix."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..kernel_specs import FLAT_WG, KernelSpec, defines_of
from .mamba3_planner import STEP_TILE, STEP_WG

if TYPE_CHECKING:
    from ssm_ref.mamba3_checks import M3Dims

    from ..config import Settings
    from .mamba3_planner import M3Plan

__all__ = ["SCAN_PUSH", "REDUCE_PUSH", "FWD_BINDINGS", "BWD_BINDINGS", "PACKAGED", "scan_spec", "step_spec",
           "forward_spec", "back_spec", "reduce_spec", "kernels", "packaged"]

# mamba3_common.glsl's PC block (both scan kernels), mamba3_reduce.comp's.
SCAN_PUSH = ("S", "T", "H", "P", "G", "F", "R", "gx", "NPB", "halved", "K", "IP")
REDUCE_PUSH = ("n_out", "INNER", "K", "gx", "o_in", "o_out")
# The scan kernels' bindings, in order (the shaders' headers).
INPUTS = ("x", "dt", "dA", "lam", "B", "C", "B_bias", "C_bias", "dtheta", "psi", "s_theta", "s_h", "s_k", "s_v",
          "ids")
FWD_BINDINGS = (*INPUTS, "y", "theta", "h", "k", "v")
BWD_BINDINGS = (*INPUTS, "g_y", "g_state", "d_x", "d_step", "d_dtheta", "m3_dB_heads", "m3_dC_heads", "m3_parts",
                "d_start", "m3_work")

# The (N, M) variants the packaged matrix holds: the state sizes of Mamba-3 models (the layer's
# default d_state 128; 64 and 256 beside it; 16 and 32 for small ones) at SISO and the MIMO ranks
# mamba_ssm's tests and configurations use (2, 4). Others compile with glslc on first use.
PACKAGED_N = (16, 32, 64, 128, 256)
PACKAGED_M = (1, 2, 4)
PACKAGED = tuple((n, m) for n in PACKAGED_N for m in PACKAGED_M)


def scan_spec(d: M3Dims, plan: M3Plan) -> KernelSpec:
    """mamba3_scan.comp for state size N and rank M, ``plan.wg`` threads, ``plan.stage`` loads in
    flight per invocation as the state rows come in."""
    return KernelSpec("mamba3_scan", defines_of(ND=d.N, MR=d.M, STG_BATCH=plan.stage), len(FWD_BINDINGS), SCAN_PUSH,
                      plan.wg)


def step_spec(d: M3Dims) -> KernelSpec:
    """mamba3_step.comp (a forward of one token) for state size N and rank M."""
    return KernelSpec("mamba3_step", defines_of(ND=d.N, MR=d.M, STEP_TILE=STEP_TILE, STEP_WG=STEP_WG),
                      len(FWD_BINDINGS), SCAN_PUSH, STEP_WG)


def forward_spec(d: M3Dims, plan: M3Plan) -> KernelSpec:
    """The forward's one kernel: mamba3_step.comp where the plan says so, else mamba3_scan.comp."""
    return step_spec(d) if plan.step else scan_spec(d, plan)


def back_spec(d: M3Dims, plan: M3Plan) -> KernelSpec:
    """mamba3_scan_back.comp for state size N and rank M, ``plan.wg`` threads (>= P)."""
    return KernelSpec("mamba3_scan_back", defines_of(ND=d.N, MR=d.M), len(BWD_BINDINGS), SCAN_PUSH, plan.wg)


def reduce_spec() -> KernelSpec:
    return KernelSpec("mamba3_reduce", defines_of(WG=FLAT_WG), 2, REDUCE_PUSH, FLAT_WG)


def kernels(d: M3Dims, plan: M3Plan, backward: bool) -> list[KernelSpec]:
    """Every kernel the recording of ``d`` under ``plan`` dispatches (family.Family.kernels)."""
    if not backward:
        return [forward_spec(d, plan)]
    return [back_spec(d, plan), reduce_spec()]


def packaged(limits_list, n_values, p_values, pn_values, knobs: Settings) -> list[KernelSpec]:
    """The family's part of the packaged matrix (family.Family.matrix): every (N, M) of
    :data:`PACKAGED` whose N is among ``n_values``, forward (at the planner's two staging depths)
    and backward, and the reduction. The
    workgroup size is a specialisation constant: one SPIR-V module serves every device."""
    from ssm_ref.mamba3_checks import M3Dims

    from .mamba3_planner import M3Plan

    out = []
    for n, m in PACKAGED:
        if n in n_values:
            d = M3Dims(S=1, T=1, H=1, P=1, N=n, G=1, M=m, F=0, R=1, mimo=m > 1)
            for stage in (8, 16):   # the planner's two (M3_STAGE's 32 compiles on first use)
                out.append(scan_spec(d, M3Plan(wg=64, npb=1, groups=1, gx=1, gy=1, seg=1, stage=stage)))
            out.append(step_spec(d))
            out.append(back_spec(d, M3Plan(wg=64, npb=1, groups=1, gx=1, gy=1, seg=1)))
    return [*out, reduce_spec()] if out else []
