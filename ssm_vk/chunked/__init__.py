"""The chunked Mamba-2 kernels (long enough Mamba-2 sequences): the scan as matrix products over
chunks of tokens (glsl/chunk_*.comp over chunk_common.glsl and the GEMM engine chunk_gemm.glsl).
``chunked_planner``: the ChunkPlan (chunk length, tiles, threads, resolved from the knobs);
``chunked_specs``: their specs; ``chunked_recording``: the recording. Registered in ssm_vk.registry."""
