"""The Mamba-1 kernels with time in a workgroup's threads (Mamba-1 with one channel per head on a
GPU; glsl/m1_scan.comp, m1_scan_back.comp over m1_common.glsl). ``plan``: the M1Plan;
``kernels``: their specs; ``record``: the recording. Registered in ssm_vk.families."""
