"""The Mamba-3 token-sequential kernels (op "mamba3_scan", forward and backward; docs/SPEC.md
section 14): glsl/mamba3_scan.comp, mamba3_scan_back.comp, mamba3_reduce.comp over
mamba3_common.glsl. ``mamba3_planner``: the M3Plan; ``mamba3_specs``: their specs;
``mamba3_recording``: the recording.

:data:`FAMILY` declares it (family.Family); ssm_vk.registry lists it as the op's one family
(its fallback). Its results are not flagged: inf and nan flow through as the spec says.
"""

from __future__ import annotations

from ..family import Family
from . import mamba3_planner, mamba3_recording, mamba3_specs

__all__ = ["FAMILY"]


def _never(plan) -> bool:
    return False


FAMILY = Family(
    name="mamba3", op="mamba3_scan", title="the Mamba-3 token-sequential kernels",
    plan=mamba3_planner.plan_call, kernels=mamba3_specs.kernels, scratch=mamba3_planner.scratch, flags=_never,
    record_forward=mamba3_recording.record_forward, record_backward=mamba3_recording.record_backward,
    matrix=mamba3_specs.packaged)
