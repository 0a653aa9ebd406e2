"""The support decision: whether a call runs on the device, and with which plan -- decided before
any allocation, by the same functions the call then uses, so that ``supports()`` and the call
cannot disagree.

A call runs on the device when a plan fits the device's limits (ssm_vk.limits), every buffer fits
its memory and allocation count (ssm_vk.budget), and every kernel of the plan can be had and taken
by the device: its SPIR-V is packaged, cached or compiled now (runtime.shaders), and its
bindings, push constants, workgroup size and shared memory (read from the SPIR-V itself) are
within the device's limits. When only the kernels of a family other than its op's fallback fail
that, the call is planned without them (the token-sequential kernels run the shape) and the
decision says so.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from ssm_ref import Support

from . import budget
from .family import Planned
from .registry import fallback_of, kernels_needed, plan
from .runtime import shaders
from .runtime.spirv import workgroup_memory_bytes
from .sizing import TooLarge, binding_cap

if TYPE_CHECKING:
    from .config import Settings
    from .family import FamilyPlan
    from .kernel_specs import KernelSpec
    from .sizing import Limits

__all__ = ["choose_plan_why", "decide", "kernel_problem", "kernels_problem", "snaps"]

_shared: dict = {}   # sha256 of a SPIR-V module -> bytes of shared memory it declares


def kernel_problem(lim: Limits, spec: KernelSpec) -> str:
    """Why the device of ``lim`` cannot run kernel ``spec`` ("" when it can): it needs more
    storage buffers, push-constant bytes or threads than the device offers, its SPIR-V cannot be
    had (no source, no glslc and nothing packaged or cached, glslc rejecting it), or it declares
    more shared memory than the device has."""
    if spec.n_bindings > lim.max_storage_buffers_per_stage:
        return (f"{spec.name} binds {spec.n_bindings} storage buffers, above maxPerStageDescriptorStorageBuffers "
                f"({lim.max_storage_buffers_per_stage})")
    if spec.push_size > lim.max_push_constants_size:
        return f"{spec.name} pushes {spec.push_size} bytes, above maxPushConstantsSize ({lim.max_push_constants_size})"
    if spec.wg > min(lim.max_workgroup_size[0], lim.max_workgroup_invocations):
        return (f"{spec.name} runs workgroups of {spec.wg} threads, above maxComputeWorkGroupSize[0] "
                f"({lim.max_workgroup_size[0]}) or maxComputeWorkGroupInvocations ({lim.max_workgroup_invocations})")
    why = shaders.unavailable(spec.name, dict(spec.defines))   # compiles it now if it must: the call's own work
    if why:
        return why
    spirv = shaders.compile_shader(spec.name, dict(spec.defines))  # served from the cache now
    key = hashlib.sha256(spirv).digest()
    shared = _shared.get(key)
    if shared is None:
        shared = _shared[key] = workgroup_memory_bytes(spirv)
    if shared > lim.max_shared_memory:
        return (f"{spec.name} declares {shared} bytes of shared memory, above maxComputeSharedMemorySize "
                f"({lim.max_shared_memory})")
    return ""


def kernels_problem(lim: Limits, kernels: list[KernelSpec]) -> str:
    """The first :func:`kernel_problem` of ``kernels`` ("" when none)."""
    for spec in kernels:
        why = kernel_problem(lim, spec)
        if why:
            return why
    return ""


def choose_plan_why(d, lim: Limits, backward: bool, knobs: Settings, softplus: int = 0, snap: bool = False,
                    op: str = "ssm_scan") -> tuple[FamilyPlan, str]:
    """(the plan a call runs, why it left out the family that registry.plan picked for the shape
    -- "<its title> cannot (<why>)": its SPIR-V cannot be had here, or the device does not take it;
    "" when it did not). Only a family other than the op's fallback is left out so (the fallback's
    kernels are every call's: the decision checks them with the rest, kernels_needed); the shape is
    then planned without it, or, where the family says so (``rerun_stands_in``), its recompute's
    plan runs it. ``softplus``: the step's form (kernel_specs.SOFTPLUS). ``snap``: the K state
    snapshots (registry.plan). Raises TooLarge when no plan fits."""
    fp = plan(d, lim, backward, knobs, softplus, snap=snap, op=op)
    fam = fp.family
    if fam is fallback_of(fam):
        return fp, ""
    why = kernels_problem(lim, fam.kernels(d, fp.plan, backward))
    if not why:
        return fp, ""
    dropped = f"{fam.title} cannot ({why})"
    if fam.rerun_stands_in:
        return fp.rerun, dropped
    return plan(d, lim, backward, knobs, softplus, snap=snap, without=(fam,), op=op), dropped


def snaps(p, backward: bool) -> bool:
    """Whether a call of problem ``p`` takes the snapshot kernels: a forward of K > 1 state
    snapshots, a backward given g_snapshots (of any K)."""
    return p.g_snapshots is not None if backward else p.dims.K > 1


def decide(ctx, lim: Limits, knobs: Settings, op: str, p, resident: frozenset,
           softplus: int = 0) -> tuple[Support, bool, Planned | None]:
    """(whether problem ``p`` runs on ``ctx`` for ``op`` with the step's form ``softplus``, whether
    the answer may be cached: a refusal for want of SPIR-V is not, as glslc on PATH or a warm
    cache may lift it later; the plans of an accepted call, else None). The one planning of
    the shape: registry.plan runs once (twice where a family's kernels cannot be had: the plan
    without them). ``op``: "ssm_scan" or its backward, "ssm_scan_back"."""
    scan = op.removesuffix("_back")
    backward = scan != op
    snap = snaps(p, backward)
    try:
        pl, dropped = choose_plan_why(p.dims, lim, backward, knobs, softplus=softplus, snap=snap, op=scan)
    except TooLarge as e:
        return Support(False, str(e)), True, None
    if snap:
        d = p.dims
        # the recording binds the K slots of a window's sequences at once (slot-major: across all S)
        n = d.K * d.S * d.H * d.P * d.N
        if n > binding_cap(lim):
            return Support(False, f"snapshots: the {d.K} state slots ({n * 4} bytes) exceed one storage-buffer "
                                  f"binding of this device ({binding_cap(lim) * 4} bytes)"), True, None
    if resident:   # a DeviceArray beyond one allocation is in pieces: counted as a copy the call may make
        resident = budget.whole(p.dims, lim, backward, resident)
    sizes = budget.buffers(p.dims, pl, lim, backward, resident)
    cut, why = budget.pieces(p.dims, pl, lim, backward, sizes)
    if why:
        return Support(False, why), True, None
    why = budget.check(ctx.info, sizes, ctx.live_allocations.count, cut)
    if why:   # (the allocations already made change: that refusal is decided anew)
        return Support(False, why), "maxMemoryAllocationCount" not in why, None
    why = kernels_problem(lim, kernels_needed(p.dims, pl, backward))
    if why:
        return Support(False, why), False, None
    planned = Planned(pl, p.dims, lim, backward, knobs, softplus, snap, dropped, cut)
    where = f"runs on {ctx.info.where} ({ctx.info.name})"
    if dropped:
        return Support(True, f"{where}; {pl.family.title} run it: {dropped}"), True, planned
    return Support(True, where), True, planned
