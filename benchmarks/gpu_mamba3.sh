#!/usr/bin/env bash
# On the GPU machine, after `. benchmarks/gpu_env.sh` (which writes clocks.csv and clock_epoch.txt):
# the Mamba-3 and long-sequence runs of one session, most important first, each under a time limit
# of its own so that one slow step cannot take the others' share, and their output in four files
# (the device tool brings back at most eight from $OUT):
#   m3.log     vk_mamba3.py from this tree and (when carried) from .base and .base2 (at BASE_SHAPES,
#              default 8x2048), kernel by kernel, with the driver's compile statistics (registers per thread, spills)
#   tests.log  the Mamba-3 and pieces tests under the validation layer
#   long.log   vk_long.py (x of 1, 8 and 16 GiB, more arguments in LONG_ARGS, e.g. "--passes bwd
#              --no-ref"; its JSON is left out: the log has every row)
#   caps.log   (STEPS=...,caps) each device's cooperative-matrix and 16-bit float extensions
#   stage.log  (STEPS=...,stage) decode at M3_STAGE = 8, 16, 32, 8 (ssm_vk alone)
#   step.log   (STEPS=...,step) decode on the token-sequential kernel and on the one-token kernel,
#              M3_STEP = 0, 1, 0, 1 (ssm_vk alone)
#   vs.md      vs_mamba_ssm.py's Mamba-3 workloads beside mamba_ssm (STEPS=...,vs; needs .peer), and
#   vs.log     its output as it goes (a run cut short keeps what it printed)
# Usage: [STEPS=m3,tests,long,caps,stage,step,vs] [VS_WORKLOADS=...] [LONG_ARGS=...] [M3_BINDING=MiB,...]
#        bash benchmarks/gpu_mamba3.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
STEPS=${STEPS:-m3,tests,long}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
M3="--shapes 1x512,8x2048,1x16384 --pass both --no-sequential --stats --reps 10 --warm-s 1"
# what windows cost: the chunked kernels again under lowered bindings (e.g. M3_BINDING=256,192: at
# 8x2048 windows of sequences, at 1x16384 windows of tokens)
[ -n "${M3_BINDING:-}" ] && M3="$M3 --binding-mib $M3_BINDING"

if has m3; then
    {
        echo "== this tree"
        SSM_VK_PIPELINE_STATS=1 timeout 150 python3 benchmarks/vk_mamba3.py $M3
        echo "== MIMO, rank 4"
        timeout 60 python3 benchmarks/vk_mamba3.py --shapes 1x2048 --M 4 --pass both --no-sequential --reps 5
        # earlier trees (.base, then .base2 when carried): the training shape only, unless BASE_SHAPES
        for b in .base .base2; do
            if [ -d $b/ssm_vk ]; then
                echo "== $b ($(cat $b/COMMIT 2>/dev/null))"
                SSM_VK_PIPELINE_STATS=1 PYTHONPATH="/tmp/site:$PWD/$b" timeout 150 python3 benchmarks/vk_mamba3.py \
                    $M3 --shapes "${BASE_SHAPES:-8x2048}"
            fi
        done
    } > "$OUT/m3.log" 2>&1
fi
if has tests; then
    FILES="tests/vk/test_mamba3_vk.py tests/vk/test_mamba3_device_vk.py tests/vk/test_mamba3_chunked_vk.py
           tests/vk/test_mamba3_chunked_back_vk.py tests/vk/test_mamba3_windows_vk.py
           tests/vk/test_mamba3_host_rerun_vk.py tests/vk/test_pieces_vk.py tests/vk/test_mamba3_register_arrays.py" \
        timeout 300 bash benchmarks/gpu_tests.sh > /dev/null 2>&1
    mv "$OUT/gpu_tests.log" "$OUT/tests.log" 2>/dev/null
fi
if has long; then
    timeout 300 python3 benchmarks/vk_long.py --budget-s 240 ${LONG_ARGS:-} --json /tmp/long.json > "$OUT/long.log" 2>&1
fi
if has caps; then   # the devices' matrix-unit extensions (cooperative matrices), for the matrix-units issue
    python3 - > "$OUT/caps.log" 2>&1 <<'PY'
from ssm_vk.runtime import binding, device
vk = binding.require()
inst = device.create_instance()
for i, pd in enumerate(device.physical_devices(inst)):
    ext = sorted(e for e in device.device_extensions(pd) if "cooperative" in e or "float16" in e or "bfloat16" in e)
    print(i, vk.vkGetPhysicalDeviceProperties(pd).deviceName, ext)
vk.vkDestroyInstance(inst, None)
PY
fi
if has stage; then   # the decode kernel's loads in flight (M3_STAGE), ssm_vk alone
    for b in 8 16 32 8; do
        echo "== M3_STAGE=$b"
        SSM_VK_TUNE="M3_STAGE=$b" timeout 60 python3 benchmarks/vs_mamba_ssm.py --no-peer --processes 1 --rounds 2 \
            --reps 10 --workloads m3dec-1,m3dec-16,m3dec-128 --budget-s 50 --clocks "$OUT/clocks.csv" 2>&1 | grep -v "^\["
    done > "$OUT/stage.log" 2>&1
fi
if has step; then   # the one-token kernel against the walk for decode (M3_STEP), ssm_vk alone
    for b in 0 1 0 1; do
        echo "== M3_STEP=$b"
        SSM_VK_TUNE="M3_STEP=$b" timeout 60 python3 benchmarks/vs_mamba_ssm.py --no-peer --processes 1 --rounds 2 \
            --reps 10 --workloads m3dec-1,m3dec-16,m3dec-128 --budget-s 50 --clocks "$OUT/clocks.csv" 2>&1 | grep -v "^\["
    done > "$OUT/step.log" 2>&1
fi
if has vs; then
    # (its budget is the processes' shares; each process is killed past its share; the limit leaves 90 s for the table)
    timeout 590 python3 benchmarks/vs_mamba_ssm.py --mamba-src .peer/mamba --processes 3 --rounds 3 --reps 10 \
        --workloads ${VS_WORKLOADS:-m3-512,m3-train,m3-long,m3dec-1,m3dec-16,m3dec-128} --budget-s 500 \
        --clocks "$OUT/clocks.csv" --md "$OUT/vs.md" > "$OUT/vs.log" 2>&1
fi
tail -3 "$OUT"/tests.log 2>/dev/null
grep -h "^(S, T)\|^  chunked\|^== " "$OUT/m3.log" 2>/dev/null | cut -c1-400
tail -12 "$OUT/long.log" 2>/dev/null | cut -c1-300
true
