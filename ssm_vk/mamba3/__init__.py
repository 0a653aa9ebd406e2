"""The Mamba-3 kernels (op "mamba3_scan"; docs/SPEC.md section 14), two families:

- :data:`FAMILY`, the token-sequential kernels (forward and backward): glsl/mamba3_scan.comp,
  mamba3_step.comp (a forward of one token), mamba3_scan_back.comp, mamba3_reduce.comp over
  mamba3_common.glsl. ``mamba3_planner``: the M3Plan; ``mamba3_specs``: their specs;
  ``mamba3_recording``: the recording. The op's fallback:
  it takes every call. Its results are not flagged: inf and nan flow through as the spec says.
- :data:`CHUNKED`, the chunked forward and backward (the matrix forms, ssm_ref/mamba3_chunked.py
  and mamba3_chunked_back.py): glsl/m3c_*.comp, and glsl/m3b_*.comp after the forward's first
  kernels for the backward. ``mamba3_chunked_planner``: the M3ChunkPlan (sequences of
  M3_CHUNK_MIN_T tokens or more forward, M3_CHUNK_BWD_MIN_T backward); ``mamba3_chunked_specs``,
  ``mamba3_chunked_recording``. Its results are flagged when an input, a cotangent or an output
  is not finite, and such a call is computed again on the token-sequential kernels -- or, where
  their plan does not fit the device (a backward whose work buffer exceeds one binding), on the
  host (``host_rerun``).

ssm_vk.registry lists them in the planner's order: CHUNKED, then FAMILY.
"""

from __future__ import annotations

from ..family import Family, always
from . import (
    mamba3_chunked_planner,
    mamba3_chunked_recording,
    mamba3_chunked_specs,
    mamba3_planner,
    mamba3_recording,
    mamba3_specs,
)

__all__ = ["FAMILY", "CHUNKED"]


def _never(plan) -> bool:
    return False


FAMILY = Family(
    name="mamba3", op="mamba3_scan", title="the Mamba-3 token-sequential kernels",
    plan=mamba3_planner.plan_call, kernels=mamba3_specs.kernels, scratch=mamba3_planner.scratch, flags=_never,
    record_forward=mamba3_recording.record_forward, record_backward=mamba3_recording.record_backward,
    matrix=mamba3_specs.packaged)

CHUNKED = Family(
    name="mamba3_chunked", op="mamba3_scan", title="the Mamba-3 chunked kernels",
    plan=mamba3_chunked_planner.chunk_plan_call, kernels=mamba3_chunked_specs.kernels,
    scratch=mamba3_chunked_planner.chunk_scratch,
    flags=always, record_forward=mamba3_chunked_recording.record_forward,
    record_backward=mamba3_chunked_recording.record_backward, matrix=mamba3_chunked_specs.packaged,
    host_rerun=True)
