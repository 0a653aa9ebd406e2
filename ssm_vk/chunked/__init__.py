"""The chunked Mamba-2 kernels (long enough Mamba-2 sequences): the scan as matrix products over
chunks of tokens (glsl/chunk_*.comp over chunk_common.glsl and the GEMM engine chunk_gemm.glsl).
``plan``: the ChunkPlan (chunk length, tiles, threads, resolved from the knobs); ``kernels``:
their specs; ``record``: the recording. Registered in ssm_vk.families."""
