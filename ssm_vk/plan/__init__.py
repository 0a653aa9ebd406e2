"""Planning: how a problem runs on a device, decided in pure Python before any Vulkan call.

- :mod:`.limits`: the device limits (``Limits.of(info)``), grids, binding ranges, windows;
- :mod:`.sequential`: the token-sequential kernels' layout and windows (every shape), and the
  forward and backward parallel over time (time chunks as sequences);
- :mod:`.chunked`: the chunked Mamba-2 kernels' plan (long enough Mamba-2 sequences);
- :mod:`.m1`: the Mamba-1 kernels with time in a workgroup's threads (Mamba-1 on a GPU);
- :mod:`.sizes`: the one table of the arrays a call binds, and of its scratch;
- :mod:`.budget`: whether a call's buffers fit the device's memory.

:func:`plan` combines the two planners under the knobs of ssm_vk.config.
"""

from __future__ import annotations

from dataclasses import replace

from ssm_ref import Dims

from ..config import Settings, settings
from .chunked import ChunkPlan, chunk_plan
from .limits import F32, Limits, TooLarge, Window, binding_cap, grid
from .m1 import M1Plan, m1_plan
from .sequential import Layout, Plan, chunk_dims, layout_for, sequential_plan, time_chunk_plan

__all__ = ["F32", "ChunkPlan", "Layout", "Limits", "M1Plan", "Plan", "TooLarge", "Window", "binding_cap", "chunk_plan",
           "chunk_dims", "grid", "layout_for", "m1_plan", "plan", "sequential_plan", "time_chunk_plan"]


def plan(d: Dims, lim: Limits, backward: bool, knobs: Settings | None = None, softplus: int = 0,
         time_chunks: bool = True, m1: bool = True) -> Plan:
    """Cut the problem into windows that fit; raise TooLarge when even one token cannot. The
    plan carries the chunked kernels' plan (plan.chunked) where they take the shape, else, for a
    forward or backward that the token-sequential scan would leave the device mostly idle on, the
    plan parallel over time (plan.tchunk; not when ``time_chunks`` is False). ``knobs``: ssm_vk.config's settings
    (default: those of now). ``softplus``: the step's form, which the plan hands to its kernels (it
    changes no size or window). ``m1`` False: not the Mamba-1 kernels with time in threads (their
    SPIR-V cannot be had)."""
    knobs = settings() if knobs is None else knobs
    cp = chunk_plan(d, lim, backward, knobs)
    if cp is not None and softplus:
        cp = replace(cp, softplus=softplus)
    mp = m1_plan(d, lim, backward, knobs) if time_chunks and m1 and cp is None else None
    if mp is not None:   # (the token-sequential plan beside it recomputes a call with inf or nan)
        return replace(sequential_plan(d, lim, backward, knobs), m1=mp, softplus=softplus)
    tp = time_chunk_plan(d, lim, backward, knobs) if time_chunks and cp is None else None
    if tp is not None:
        return replace(tp, softplus=softplus)
    return replace(sequential_plan(d, lim, backward, knobs), chunked=cp, softplus=softplus)
