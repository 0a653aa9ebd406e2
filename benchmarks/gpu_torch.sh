#!/usr/bin/env bash
# On the GPU machine: the PyTorch user's and the host-array user's paths (docs/TORCH.md, "On a GPU"),
# in one command of at most BUDGET_S seconds (default 560), results in $OUT/torch.tgz. Carry .gl, .whl,
# .peer and, for before/after timings in the same run, .base (benchmarks/gpu_carry.sh makes them).
#
#   [PHASE_SHAPES=..] [PATH_SHAPES=..] bash benchmarks/gpu_torch.sh [tests] [phases] [floor] [paths] [cuda] [hf]
#                                                               (default: all six, in order)
#
# tests: the GPU test files of host data, out= and CUDA tensors (validation layer
#        on, SSM_REQUIRE_CUDA=1); phases: torch_cuda.py --phases (where a CUDA-tensor call's time
#        goes); floor: benchmarks/host_floor.py; paths: torch_side_by_side.py at demo, mid, train,
#        long (every path, mamba_ssm beside), then .base's host and device paths; cuda:
#        torch_cuda.py from this tree and from .base in turn, twice; hf: hf_patch.py on CUDA.
# A step that would start with less than its share left is skipped and says so. SKIP_ENV=1: do not
# source gpu_env.sh (a machine whose Vulkan and Python are set up already: trying the script).
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
left() { echo $(( start + BUDGET_S - $(date +%s) )); }
if [ "${SKIP_ENV:-0}" = 1 ]; then export PYTHONPATH=$PWD:$PWD/benchmarks OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
else . benchmarks/gpu_env.sh; fi
export OMP_WAIT_POLICY=PASSIVE SSM_FAST_QUIET=1
R="$OUT/torch"; mkdir -p "$R"
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(tests phases floor paths cuda hf)
git log -1 --format='%H %s' > "$R/commit.txt" 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$R/commit.txt" 2>&1
# a command from .base's tree (its own modules and benchmarks): "${base[@]}" python3 ...
base=(env -C .base PYTHONPATH=/tmp/site:$PWD/.base:$PWD/.base/benchmarks)
step() {   # step NAME SECONDS CMD...: run CMD within min(SECONDS, what is left)
  local name=$1 want=$2; shift 2
  local have; have=$(left)
  if [ "$have" -lt 30 ]; then echo "== $name: skipped, ${have}s left" | tee -a "$R/summary.txt"; return; fi
  [ "$want" -gt "$have" ] && want=$have
  echo "== $name (at most ${want}s)" | tee -a "$R/summary.txt"
  local t0; t0=$(date +%s)
  timeout "$want" "$@" > "$R/$name.log" 2>&1; local rc=$?
  echo "   rc $rc in $(( $(date +%s) - t0 ))s" | tee -a "$R/summary.txt"
}
for s in "${steps[@]}"; do
  case "$s" in
    tests)
      step tests 200 env FILES="tests/vk/test_host_transfers_vk.py tests/vk/test_out_vk.py
        tests/vk/test_host_copies.py tests/pytorch/test_cuda_bridge.py tests/pytorch/test_cuda_tensors.py" \
        bash benchmarks/gpu_tests.sh
      grep -E "passed|failed|error" "$R/tests.log" | tail -3 | tee -a "$R/summary.txt" ;;
    phases)
      step phases 90 python3 benchmarks/torch_cuda.py --phases --shapes ${PHASE_SHAPES:-demo,mid,train,long} \
        --reps 10 --json "$R/phases.json" ;;
    floor)
      step floor 60 python3 benchmarks/host_floor.py --sizes 8,64,256 --reps 5 --json "$R/host_floor.json" ;;
    paths)
      step paths 240 python3 benchmarks/torch_side_by_side.py --backends ssm_vk --shapes ${PATH_SHAPES:-demo,mid,train,long} \
        --rounds 2 --reps 5 --no-counts --mamba-src .peer/mamba --json "$R/paths.json"
      [ -d .base ] && step paths-base 90 "${base[@]}" python3 benchmarks/torch_side_by_side.py --backends ssm_vk \
        --shapes mid,train --paths host,device --rounds 2 --reps 5 --no-counts --json "$R/paths-base.json" ;;
    cuda)
      for round in 1 2; do
        step "cuda-new-$round" 60 python3 benchmarks/torch_cuda.py --shapes demo,mid,train,long --rounds 1 --reps 15 \
          --json "$R/cuda-new-$round.json"
        [ -d .base ] && step "cuda-base-$round" 60 "${base[@]}" python3 benchmarks/torch_cuda.py --shapes demo,mid,train,long \
          --rounds 1 --reps 15 --json "$R/cuda-base-$round.json"
      done ;;
    hf)
      if python3 -c "import transformers" 2>/dev/null; then
        step hf 90 python3 benchmarks/hf_patch.py --device cuda --backend ssm_vk --rounds 3 --json "$R/hf.json"
      else
        echo "== hf: skipped, transformers is not installed here" | tee -a "$R/summary.txt"
      fi ;;
    *) echo "gpu_torch.sh: unknown step $s" >&2; exit 2 ;;
  esac
done
echo; cat "$R/summary.txt"
for f in phases floor paths paths-base cuda-new-1 cuda-base-1 cuda-new-2 cuda-base-2 hf; do
  [ -f "$R/$f.log" ] && { echo "---- $f"; tail -n 24 "$R/$f.log"; }
done
# `run` brings back at most 8 files: the results as one archive
tar -czf "$OUT/torch.tgz" -C "$OUT" torch && rm -rf "$R"
