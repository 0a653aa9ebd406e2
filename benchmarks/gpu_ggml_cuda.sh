#!/usr/bin/env bash
# On the GPU machine (after `. benchmarks/gpu_env.sh`): build ggml's CUDA backend from a ggml source
# tree and hold its SSM_SCAN to the float64 oracle (benchmarks/ggml_oracle.py), then fuzz it, all
# within one command's time (docs/PORTING.md, "ggml's CUDA backend"). Results in $OUT/ggml-cuda/:
# build.log, env.txt, ggml_oracle.md / .json, fuzz-*.log, findings/.
#
#   bash benchmarks/gpu_ggml_cuda.sh GGML_TREE [--origin TEXT] [--build-only] [-- ggml_oracle.py args]
#
# GGML_TREE: an unpacked `git archive` of github.com/ggml-org/ggml (or any ggml source tree;
# --origin names it in ggml-build.json, e.g. "ggml-org/ggml d99724f2": an archive has no .git).
# Time: everything ends within BUDGET_S seconds (default 540) of the start: the build gets at most
# BUILD_S (default 330; tools/build_ggml.sh --cuda --cuda-arch 90 --jobs 16), the oracle's table
# what is left after the fuzz's share (FUZZ_MINUTES, default 3, shrunk to leave the table at least
# TABLE_MIN_S, default 150). A build cut short by BUILD_S stops here (exit 3): the same command
# again continues it (cmake's folder, build/ggml/ggml-cuda/cmake, stays on a warm machine), as
# does --build-only, a command of its own; once built, a run skips the build (tools/build_ggml.sh's
# stamp), so a second run on the same machine gets the whole fuzz. Exit code: that of
# ggml_oracle.py (0 when it measured, whatever ggml's errors), 3 when the build or the time ran
# out first (the same command again goes on), 1 for a failed build.
set -uo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
[ $# -ge 1 ] || { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
tree="$1"; shift
origin="" build_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --origin) origin="$2"; shift 2 ;;
    --build-only) build_only=1; shift ;;
    --) shift; break ;;
    *) echo "gpu_ggml_cuda.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -d "$tree" ] || { echo "gpu_ggml_cuda.sh: $tree: no such folder (a ggml source tree)" >&2; exit 2; }

start=$(date +%s)
BUDGET_S=${BUDGET_S:-540} BUILD_S=${BUILD_S:-330} FUZZ_MINUTES=${FUZZ_MINUTES:-3} TABLE_MIN_S=${TABLE_MIN_S:-150}
left() { echo $(( start + BUDGET_S - $(date +%s) )); }
OUT=${OUT:-/tmp/out}
res="$OUT/ggml-cuda"
mkdir -p "$res"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if ! command -v nvcc >/dev/null && [ -z "${CUDACXX:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "checkout: $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "ggml tree: $tree ${origin:+($origin)}"
  echo "nvcc: $("${CUDACXX:-nvcc}" --version 2>/dev/null | tail -1)"
  if command -v nvidia-smi >/dev/null; then
    echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1)"
  else
    echo "gpu: no nvidia-smi"
  fi
  echo "cores: $(nproc)"
} > "$res/env.txt"
cat "$res/env.txt"

# numba compiles ssm_fast.oracle64 on first use (seconds): do it beside the build, on one core.
if [ "$build_only" = 0 ]; then
  nice -n 5 "$PY" -c "
import numpy as np
from ssm_ref.testing.cases import make_problem
from ssm_fast.oracle64 import scan64
c = make_problem(0, S=1, T=3, H=2, P=2, N=4, G=1, ids='none', K=2)
scan64(**c.args(), snapshots=2)
" > "$res/warm.log" 2>&1 &
  warm_pid=$!
  trap 'kill "$warm_pid" 2>/dev/null' EXIT
fi

build_limit=$BUILD_S
[ "$(( $(left) - TABLE_MIN_S - 30 ))" -lt "$build_limit" ] && build_limit=$(( $(left) - TABLE_MIN_S - 30 ))
[ "$build_only" = 1 ] && build_limit=$(( $(left) - 10 ))
echo "building ggml with CUDA (at most $build_limit s)"
timeout "$build_limit" tools/build_ggml.sh --tree "$tree" --cuda --cuda-arch 90 --jobs 16 --name ggml-cuda \
  ${origin:+--origin "$origin"} > "$res/build.log" 2>&1
rc=$?
tail -5 "$res/build.log"
if [ "$rc" = 124 ]; then
  echo "gpu_ggml_cuda.sh: the build did not finish within $build_limit s; the same command again continues it" >&2
  exit 3
elif [ "$rc" != 0 ]; then
  echo "gpu_ggml_cuda.sh: the build failed (exit $rc; $res/build.log)" >&2
  exit 1
fi
lib="$(tail -1 "$res/build.log")"
cp "$(dirname "$lib")/ggml-build.json" "$res/" 2>/dev/null
[ "$build_only" = 1 ] && { echo "built: $lib"; exit 0; }
wait

# What is left: the fuzz's share (two runs, each with up to 45 s past its minutes for shrinking),
# then the table (its last problem may start up to ~60 s before the budget ends).
avail=$(( $(left) - 20 ))
fuzz_s=$(( FUZZ_MINUTES * 60 ))
[ $(( avail - fuzz_s - 90 - 60 )) -lt "$TABLE_MIN_S" ] && fuzz_s=$(( avail - 90 - 60 - TABLE_MIN_S ))
[ "$fuzz_s" -lt 30 ] && fuzz_s=0
table_s=$(( avail - fuzz_s - (fuzz_s > 0 ? 90 : 0) - 60 ))
fuzz_min=$(awk "BEGIN {printf \"%.2f\", $fuzz_s / 60}")
run_s=$(( $(left) - 5 ))
if [ "$run_s" -lt 60 ]; then
  echo "gpu_ggml_cuda.sh: $run_s s left after the build: run the same command again (the build is done)" >&2
  exit 3
fi
echo "oracle table: $table_s s; fuzz: $fuzz_min min; $(left) s left in all"
timeout "$run_s" "$PY" benchmarks/ggml_oracle.py --backend ssm_ggml:CUDA0 --lib "$lib" --out "$res" \
  --budget-s "$table_s" --fuzz-minutes "$fuzz_min" "$@" 2>&1 | tee "$res/ggml_oracle.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 124 ] && echo "gpu_ggml_cuda.sh: ggml_oracle.py stopped at the time budget; $res holds what it finished" >&2
exit "$rc"
