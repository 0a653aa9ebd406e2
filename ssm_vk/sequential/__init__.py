"""The token-sequential kernels, every shape's family: each thread walks its state rows token by
token (glsl/ssm_scan.comp, ssm_scan_back.comp, ssm_decode.comp over common.glsl). ``sequential_planner``:
the layout and windows (SequentialPlan) and the passes parallel over time chunks;
``sequential_specs``: their specs; ``sequential_recording``: the recording, which hands the passes
over time chunks to ``time_chunks``.

:data:`FAMILY` declares it (family.Family); ssm_vk.registry lists it last for the op "ssm_scan",
as the op's fallback: it takes every shape and mode, and recomputes the flagged results of the
others (and of its own time chunks) token by token.
"""

from __future__ import annotations

from ..family import Family
from . import sequential_planner, sequential_recording, sequential_specs

__all__ = ["FAMILY"]

FAMILY = Family(
    name="sequential", op="ssm_scan", title="the token-sequential kernels",
    plan=sequential_planner.plan_call, kernels=sequential_specs.sequential_kernels,
    scratch=sequential_planner.scratch, flags=sequential_planner.flags,
    record_forward=sequential_recording.record_forward, record_backward=sequential_recording.record_backward,
    matrix=sequential_specs.packaged, scatters=sequential_recording.scatters_in_place,
    samples=sequential_specs.sample_dims)
