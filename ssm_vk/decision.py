"""The support decision: whether a call runs on the device, and with which plan -- decided before
any allocation, by the same functions the call then uses, so that ``supports()`` and the call
cannot disagree.

A call runs on the device when a plan fits the device's limits (ssm_vk.limits), every buffer fits
its memory and allocation count (ssm_vk.budget), and every kernel of the plan can be had and taken
by the device: its SPIR-V is packaged, cached or compiled now (runtime.shaders), and its
bindings, push constants, workgroup size and shared memory (read from the SPIR-V itself) are
within the device's limits. When only the chunked Mamba-2 kernels or the Mamba-1 kernels with
time in threads fail that, the token-sequential kernels run the shape and the decision says so.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

from ssm_ref import Support

from . import budget
from . import kernel_specs as specs
from .config import Settings
from .limits import Limits, TooLarge, binding_cap
from .registry import CHUNKED, M1, kernels_needed, plan
from .runtime import shaders
from .runtime.spirv import workgroup_memory_bytes
from .sequential.sequential_planner import Plan

__all__ = ["Planned", "choose_plan", "choose_plan_why", "decide", "kernel_problem", "kernels_problem", "snaps"]

_shared: dict = {}   # sha256 of a SPIR-V module -> bytes of shared memory it declares


def kernel_problem(lim: Limits, spec: specs.KernelSpec) -> str:
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


def kernels_problem(lim: Limits, kernels: list[specs.KernelSpec]) -> str:
    """The first :func:`kernel_problem` of ``kernels`` ("" when none)."""
    for spec in kernels:
        why = kernel_problem(lim, spec)
        if why:
            return why
    return ""


def choose_plan_why(d, lim: Limits, backward: bool, knobs: Settings, chunked: bool = True,
                    softplus: int = 0, snap: bool = False) -> tuple[Plan, str]:
    """(the plan a call runs, why it left out the chunked kernels or the Mamba-1 kernels with time
    in threads that registry.plan picked for the shape -- their SPIR-V cannot be had here, or the
    device does not take them; "" when it did not). ``chunked`` False: never the chunked kernels,
    the time-in-threads ones nor the time chunks (the recompute of a non-finite result).
    ``softplus``: the step's form (kernel_specs.SOFTPLUS). ``snap``: the K state snapshots (registry.plan).
    Raises TooLarge when no plan fits."""
    pl = plan(d, lim, backward, knobs, softplus, time_chunks=chunked, snap=snap)
    if pl.m1 is not None:
        why = kernels_problem(lim, M1.kernels(d, pl, backward))
        if why:   # the plan the shape would have without them (time chunks, or token by token)
            return plan(d, lim, backward, knobs, softplus, time_chunks=chunked, m1=False), why
        return pl, ""
    if pl.chunked is None:
        return pl, ""
    why = kernels_problem(lim, CHUNKED.kernels(d, pl, backward)) if chunked else ""
    if not chunked or why:
        pl = replace(pl, chunked=None)
    return pl, why


def choose_plan(d, lim: Limits, backward: bool, knobs: Settings, chunked: bool = True,
                softplus: int = 0, snap: bool = False) -> Plan:
    """The plan of :func:`choose_plan_why`."""
    return choose_plan_why(d, lim, backward, knobs, chunked, softplus, snap)[0]


class Planned:
    """The plans of one decided problem shape, made by the decision and only read after it: the
    plan a call runs (``first``, whose kernels the decision checked) and, through
    :meth:`plan`, the token-sequential plan that recomputes a result the first one flagged as
    non-finite -- made the first time a call needs it, then kept here (with the cached decision),
    so no call plans. Also what the plans were made for: ``dims``, ``backward``, the planner's
    ``lim`` and ``knobs``, the step's form ``softplus``, ``snap`` (the K state snapshots:
    registry.plan); ``key`` (all of them; ``snap`` only when set) keys the workspace of the shape
    (engine.Engine.workspace)."""

    __slots__ = ("_rerun", "backward", "dims", "first", "key", "knobs", "lim", "snap", "softplus")

    def __init__(self, first: Plan, dims, lim: Limits, backward: bool, knobs: Settings, softplus: int = 0,
                 snap: bool = False):
        self.first, self.dims, self.lim, self.backward = first, dims, lim, backward
        self.knobs, self.softplus, self.snap = knobs, softplus, snap
        # (a backward given g_snapshots of one slot has the Dims of one without: ``snap`` tells them apart)
        self.key = (dims, backward, lim, knobs.key, softplus, "snap") if snap else (dims, backward, lim, knobs.key,
                                                                                    softplus)
        # a plan that flags nothing is never recomputed, and without the chunked kernels, the time
        # chunks and the Mamba-1 kernels with time in threads it is its own recompute's plan
        self._rerun = None if first.flags_nonfinite else first

    def plan(self, chunked: bool = True) -> Plan:
        """``first``; with ``chunked`` False the recompute's plan (choose_plan(chunked=False)),
        made once. (Two threads that both make it make the same plan; either is kept.)"""
        if chunked:
            return self.first
        pl = self._rerun
        if pl is None:
            pl = self._rerun = choose_plan(self.dims, self.lim, self.backward, self.knobs, chunked=False,
                                           softplus=self.softplus, snap=self.snap)
        return pl


def snaps(p, backward: bool) -> bool:
    """Whether a call of problem ``p`` takes the snapshot kernels: a forward of K > 1 state
    snapshots, a backward given g_snapshots (of any K)."""
    return p.g_snapshots is not None if backward else p.dims.K > 1


def decide(ctx, lim: Limits, knobs: Settings, op: str, p, resident: frozenset,
           softplus: int = 0) -> tuple[Support, bool, Planned | None]:
    """(whether problem ``p`` runs on ``ctx`` for ``op`` with the step's form ``softplus``, whether
    the answer may be cached: a refusal for want of SPIR-V is not, as glslc on PATH or a warm
    cache may lift it later; the plans of an accepted call, else None). The one planning of
    the shape: plan.plan runs once (twice where the Mamba-1 kernels with time in threads cannot
    be had: the plan without them)."""
    backward = op == "ssm_scan_back"
    snap = snaps(p, backward)
    try:
        pl, dropped = choose_plan_why(p.dims, lim, backward, knobs, softplus=softplus, snap=snap)
    except TooLarge as e:
        return Support(False, str(e)), True, None
    if snap:
        d = p.dims
        # the recording binds the K slots of a window's sequences at once (slot-major: across all S)
        n = d.K * d.S * d.H * d.P * d.N
        if n > binding_cap(lim):
            return Support(False, f"snapshots: the {d.K} state slots ({n * 4} bytes) exceed one storage-buffer "
                                  f"binding of this device ({binding_cap(lim) * 4} bytes)"), True, None
    sizes = budget.buffers(p.dims, pl, lim, backward, resident)
    why = budget.check(ctx.info, sizes, ctx.live_allocations.count)
    if why:   # (the allocations already made change: that refusal is decided anew)
        return Support(False, why), "maxMemoryAllocationCount" not in why, None
    why = kernels_problem(lim, kernels_needed(p.dims, pl, backward))
    if why:
        return Support(False, why), False, None
    planned = Planned(pl, p.dims, lim, backward, knobs, softplus, snap)
    where = f"runs on {ctx.info.where} ({ctx.info.name})"
    if dropped:
        which = "the Mamba-1 kernels with time in threads" if p.dims.mamba1 else "the chunked kernels"
        note = f"the token-sequential kernels run it: {which} cannot ({dropped})"
        return Support(True, f"{where}; {note}"), True, planned
    return Support(True, where), True, planned
