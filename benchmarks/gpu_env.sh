# Source on the GPU machine (docs/VULKAN.md, "A GPU host without a package index"): unpack the
# carried Vulkan loader, glvnd and glslc (.gl/), install the carried wheels (.whl/), point the
# loader at NVIDIA's driver, and start a background log of the GPU's clocks, power and throttle
# reasons ($OUT/clocks.csv, every 100 ms) so that each timing can be read beside the clocks it ran
# at (rows carry t_start / t_end).
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null; done
ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/benchmarks
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
date +%s.%N > "$OUT/clock_epoch.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,pstate,clocks_event_reasons.active \
    --format=csv -lms 100 > "$OUT/clocks.csv" 2>&1 &
SMI_PID=$!
trap 'kill $SMI_PID 2>/dev/null' EXIT
