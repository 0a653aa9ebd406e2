#!/usr/bin/env bash
# On the GPU machine (after `. benchmarks/gpu_env.sh`): the test files that drive a Vulkan device,
# run against that device under the validation layer (any message fails), results in $OUT; with
# them the tests of torch's CUDA tensors through ssm_vk, which must run there (SSM_REQUIRE_CUDA=1).
# Usage: [FILES=${FILES:-"tests/vk ..."] bash benchmarks/gpu_tests.sh [pytest args]
set -uo pipefail
OUT=${OUT:-/tmp/out}
export SSM_REQUIRE_VULKAN=1 SSM_REQUIRE_CUDA=1 SSM_VK_VALIDATION=${SSM_VK_VALIDATION:-1} SSM_FAST_QUIET=1
FILES=${FILES:-"tests/vk tests/api/test_threads.py tests/api/test_device_checks.py tests/api/test_resources.py tests/test_layers.py
       tests/pytorch/test_cuda_tensors.py"}
python3 -m pytest -q -p no:cacheprovider -o faulthandler_timeout=300 -rfE $FILES "$@" 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
