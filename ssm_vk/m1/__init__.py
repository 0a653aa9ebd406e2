"""The Mamba-1 kernels with time in a workgroup's threads (Mamba-1 with one channel per head on a
GPU; glsl/m1_scan.comp, m1_scan_back.comp over m1_common.glsl). ``m1_planner``: the
M1Plan; ``m1_specs``: their specs; ``m1_recording``: the recording. Registered in ssm_vk.registry."""
