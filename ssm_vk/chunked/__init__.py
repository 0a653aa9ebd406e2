"""The chunked Mamba-2 kernels (long enough Mamba-2 sequences): the scan as matrix products over
chunks of tokens (glsl/chunk_*.comp over chunk_common.glsl and the GEMM engine chunk_gemm.glsl).
``chunked_planner``: the ChunkPlan (chunk length, tiles, threads, resolved from the knobs);
``chunked_specs``: their specs; ``chunked_recording``: the recording.

:data:`FAMILY` declares it (family.Family); ssm_vk.registry asks it first for the op "ssm_scan".
Its results are flagged when non-finite and computed again token by token; a forward leaves its
chunk tables for the backward of the same inputs.
"""

from __future__ import annotations

from ..family import Family, always
from . import chunked_planner, chunked_recording, chunked_specs

__all__ = ["FAMILY"]

FAMILY = Family(
    name="chunked", op="ssm_scan", title="the chunked kernels",
    plan=chunked_planner.plan_call, kernels=chunked_specs.chunk_kernels, scratch=chunked_planner.scratch,
    flags=always, record_forward=chunked_recording.record_forward,
    record_backward=chunked_recording.record_backward, matrix=chunked_specs.packaged,
    tables=chunked_planner.tables, rerun_stands_in=True)
