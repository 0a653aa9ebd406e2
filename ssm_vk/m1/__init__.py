"""The Mamba-1 kernels with time in a workgroup's threads (Mamba-1 with one channel per head on a
GPU; glsl/m1_scan.comp, m1_scan_back.comp over m1_common.glsl). ``m1_planner``: the M1Plan;
``m1_specs``: their specs; ``m1_recording``: the recording.

:data:`FAMILY` declares it (family.Family); ssm_vk.registry asks it after the chunked kernels for
the op "ssm_scan". Its results are flagged when non-finite (or run on a subgroup size other than
the plan's) and computed again token by token.
"""

from __future__ import annotations

from ..family import Family, always
from . import m1_planner, m1_recording, m1_specs

__all__ = ["FAMILY"]

FAMILY = Family(
    name="m1", op="ssm_scan", title="the Mamba-1 kernels with time in threads",
    plan=m1_planner.plan_call, kernels=m1_specs.kernels, scratch=m1_planner.scratch, flags=always,
    record_forward=m1_recording.record_forward, record_backward=m1_recording.record_backward,
    matrix=m1_specs.packaged)
