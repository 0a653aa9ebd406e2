"""The token-sequential kernels, every shape's family: each thread walks its state rows token by
token (glsl/ssm_scan.comp, ssm_scan_back.comp, ssm_decode.comp over common.glsl). ``sequential_planner``:
the layout and windows (the Plan every call carries) and the passes parallel over time chunks;
``sequential_specs``: their specs; ``sequential_recording``: the recording, which hands the passes
over time chunks to ``time_chunks``. Registered in ssm_vk.registry."""
