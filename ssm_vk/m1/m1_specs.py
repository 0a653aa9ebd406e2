"""The Mamba-1 kernels with time in a workgroup's threads: their specs (glsl/m1_scan.comp,
m1_scan_back.comp), every kernel an M1Plan dispatches and this family's part of the packaged
matrix."""

from __future__ import annotations

from itertools import product
from typing import TYPE_CHECKING

from ssm_ref import Dims

from ..config import KNOBS, Settings
from ..kernel_specs import KernelSpec, carry_spec, defines_of, reduce_spec, softplus_constants
from .m1_planner import M1_SPS_TI_MIN, M1Plan, m1_plan

if TYPE_CHECKING:
    from ..sizing import Limits

__all__ = ["M1_PUSH", "M1_BACK_PUSH", "M1_PACKAGED_N", "m1_spec", "m1_back_spec", "m1_kernels", "kernels", "matrix",
           "packaged"]

# The Mamba-1 kernels with time in a workgroup's threads (ssm_vk/m1/glsl/m1_scan.comp, m1_scan_back.comp).
M1_PUSH = ("S", "T", "H", "G", "NCH", "NRB", "gx", "TI", "o_x", "o_dt", "o_A", "o_B", "o_C", "o_gy", "o_y", "o_init",
           "gather", "o_s", "o_ids", "scatter", "final_state", "keep_step")
M1_BACK_PUSH = ("S", "T", "H", "G", "NCH", "NRB", "gx", "o_x", "o_dt", "o_A", "o_B", "o_C", "o_gy", "o_init", "o_adj",
                "o_dx", "o_ddt", "gather", "o_s", "o_ids")

# The d_state values whose Mamba-1 kernels with time in threads the packaged matrix holds: every
# published Mamba-1 model (mamba-130m..2.8b, Falcon-Mamba, Jamba) has N = 16, and each variant
# is large (its loops over N and the slice's tokens unrolled).
M1_PACKAGED_N = (16,)


def m1_spec(d: Dims, mp: M1Plan, mode: int, adjoint: bool = False, softplus: int = 0) -> KernelSpec:
    """m1_scan.comp: the summary (``mode`` 0; with ``adjoint`` the backward's over time chunks), the
    final pass (1) or both in one pass (2, one time chunk) of the Mamba-1 forward with time in a
    workgroup's threads."""
    defs = dict(RW=mp.RW, NW=mp.NW, ND=d.N, MODE=mode, TB=mp.TB)
    if mp.SPS != 1:
        defs.update(SPS=mp.SPS)
    if adjoint:
        defs.update(ADJ=1)
    return KernelSpec("m1_scan", defines_of(**defs), 15, M1_PUSH, mp.WG, softplus_constants(softplus))


def m1_back_spec(d: Dims, mp: M1Plan, softplus: int = 0) -> KernelSpec:
    """m1_scan_back.comp: the Mamba-1 backward with time in a workgroup's threads."""
    defs = dict(RW=mp.RW, NW=mp.NW, ND=d.N, TI=mp.TI, NB=mp.NB)
    return KernelSpec("m1_scan_back", defines_of(**defs), 16, M1_BACK_PUSH, mp.WG, softplus_constants(softplus))


def kernels(d: Dims, mp: M1Plan, backward: bool) -> list[KernelSpec]:
    """:func:`m1_kernels` of a plan, in its step's form (family.Family.kernels)."""
    return m1_kernels(d, mp, backward, mp.softplus)


def m1_kernels(d: Dims, mp: M1Plan, backward: bool, softplus: int = 0) -> list[KernelSpec]:
    """Every kernel the time-in-threads recording of ``d`` dispatches (m1/m1_recording.py)."""
    over_time = [carry_spec(d)] if mp.NCH > 1 else []
    if not backward:
        if mp.NCH == 1:
            return [m1_spec(d, mp, 2, softplus=softplus)]
        return [m1_spec(d, mp, 0, softplus=softplus), *over_time, m1_spec(d, mp, 1, softplus=softplus)]
    if mp.NCH > 1:
        over_time = [m1_spec(d, mp.summary(), 0, adjoint=True, softplus=softplus), carry_spec(d),
                     carry_spec(d, reverse=True)]
    return [*over_time, m1_back_spec(d, mp, softplus), reduce_spec(0, no_dt=True), reduce_spec(1)]




def matrix(lim: Limits, n_values, knobs: Settings) -> list[KernelSpec]:
    """The variants of this family on a device of limits ``lim`` for the d_state values of
    ``n_values`` among M1_PACKAGED_N, in a stable order (the packaged matrix's part:
    ssm_vk.registry.matrix)."""
    out = []
    add = out.append
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
    return out


def packaged(limits_list, n_values, p_values, pn_values, knobs: Settings) -> list[KernelSpec]:
    """The family's part of the packaged matrix (family.Family.matrix): :func:`matrix` for each
    device profile of ``limits_list``."""
    return [spec for lim in limits_list for spec in matrix(lim, n_values, knobs)]
