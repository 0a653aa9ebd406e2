#!/usr/bin/env bash
# Build ggmlR's CPU backward of SSM_SCAN (SSM_SCAN_BACK) into a shared library for
# benchmarks/ggmlr_back.py and benchmarks/cpu_targets.py (docs/BENCHMARKS.md, "ssm_fast against
# its CPU targets").
#
#   tools/build_ggmlr_back.sh --ggmlr-src ~/src/ggmlR/src/ggml-cpu/ops-ssm.cpp
#   export SSM_GGMLR_BACK_LIB=build/ggmlr/libssm_ggmlr_back.so      # the last line it prints
#
# ggmlR's file is not part of this repository and this script downloads nothing: take
# src/ggml-cpu/ops-ssm.cpp from https://github.com/Zabis13/ggmlR at commit
# 721b6c00c54be41f2fb66bb380037b990f73d0e2 (git clone, then git show <commit>:src/ggml-cpu/ops-ssm.cpp).
# The file is compiled unchanged against upstream ggml's CPU-backend headers, with a force-included
# shim (tools/ggmlr_back/shim.h: ten op declarations ggmlR keeps in its own ops.h), and linked
# with our harness (tools/ggmlr_back/harness.cpp) against the libggml-base / libggml-cpu of the
# same ggml, which supply the helpers it calls. The default ggml is the one tools/build_ggml.sh
# builds (the ggml-python 0.0.45 sdist's vendor/ggml, ggml 0.15.3): run that first.
# Options:
#   --ggmlr-src FILE     ggmlR's src/ggml-cpu/ops-ssm.cpp (required)
#   --ggmlr-commit SHA   the ggmlR commit FILE comes from, recorded in the stamp
#                        (default 721b6c00c54be41f2fb66bb380037b990f73d0e2)
#   --ggml-src DIR       ggml source tree to take headers from (default: the sdist tree that
#                        tools/build_ggml.sh unpacks, build/ggml/src/ggml_python-0.0.45/vendor/ggml)
#   --ggml-lib DIR       libggml-base.so and libggml-cpu.so of that ggml (default build/ggml/sdist-0.0.45/lib)
#   --out DIR            where the library and its stamp go (default build/ggmlr)
#   --native             -march=native (default: ggml's portable x86-64 set, as tools/build_ggml.sh)
# Writes DIR/libssm_ggmlr_back.so and DIR/ggmlr-build.json; prints the library's path last.
# Needs a C++17 compiler with OpenMP (g++). The compile runs under nice -n 19.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
src="" commit="721b6c00c54be41f2fb66bb380037b990f73d0e2" native=0
ggml_src="$here/build/ggml/src/ggml_python-0.0.45/vendor/ggml" ggml_lib="$here/build/ggml/sdist-0.0.45/lib"
out="$here/build/ggmlr"
while [ $# -gt 0 ]; do
  case "$1" in
    --ggmlr-src) src="$2"; shift 2 ;;
    --ggmlr-commit) commit="$2"; shift 2 ;;
    --ggml-src) ggml_src="$2"; shift 2 ;;
    --ggml-lib) ggml_lib="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --native) native=1; shift ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "build_ggmlr_back.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$src" ] || { echo "build_ggmlr_back.sh: --ggmlr-src FILE is required (see --help)" >&2; exit 2; }
[ -f "$src" ] || { echo "build_ggmlr_back.sh: $src: no such file" >&2; exit 1; }
grep -q "ggml_compute_forward_ssm_scan_back" "$src" || {
  echo "build_ggmlr_back.sh: $src has no ggml_compute_forward_ssm_scan_back (not ggmlR's ops-ssm.cpp?)" >&2; exit 1; }
[ -f "$ggml_src/src/ggml-cpu/ggml-cpu-impl.h" ] || {
  echo "build_ggmlr_back.sh: $ggml_src is no ggml source tree (no src/ggml-cpu/ggml-cpu-impl.h); run tools/build_ggml.sh or pass --ggml-src" >&2; exit 1; }
for lib in libggml-base.so libggml-cpu.so; do
  [ -f "$ggml_lib/$lib" ] || { echo "build_ggmlr_back.sh: $ggml_lib/$lib not found; run tools/build_ggml.sh or pass --ggml-lib" >&2; exit 1; }
done
command -v c++ >/dev/null || { echo "build_ggmlr_back.sh: c++ not found (apt-get install g++)" >&2; exit 1; }
mkdir -p "$out"
out="$(cd "$out" && pwd)"; ggml_lib="$(cd "$ggml_lib" && pwd)"; ggml_src="$(cd "$ggml_src" && pwd)"

# The CPU backend's own defines and flags (ggml's cmake for x86 with GGML_NATIVE=OFF), so the
# vector helpers from vec.h compile to what libggml-cpu has.
defs=(-DNDEBUG -DGGML_USE_OPENMP -D_GNU_SOURCE -D_XOPEN_SOURCE=600)
arch=()
if [ "$native" = 1 ]; then
  arch=(-march=native)
elif [ "$(uname -m)" = x86_64 ]; then
  defs+=(-DGGML_SSE42 -DGGML_F16C -DGGML_FMA -DGGML_BMI2 -DGGML_AVX -DGGML_AVX2)
  arch=(-msse4.2 -mf16c -mfma -mbmi2 -mavx -mavx2)
fi
incs=(-I"$ggml_src/src" -I"$ggml_src/src/ggml-cpu" -I"$ggml_src/include" -I"$here/tools/ggmlr_back")
cxx=(c++ -O3 -fPIC -fopenmp -std=gnu++17 "${defs[@]}" "${arch[@]}" "${incs[@]}")

nice -n 19 "${cxx[@]}" -include shim.h -c "$src" -o "$out/ops-ssm.o" 2>"$out/build.log" \
  || { cat "$out/build.log" >&2; echo "build_ggmlr_back.sh: compiling $src failed" >&2; exit 1; }
nice -n 19 "${cxx[@]}" -Wall -Wextra -Wno-unused-function -c "$here/tools/ggmlr_back/harness.cpp" -o "$out/harness.o" 2>>"$out/build.log" \
  || { cat "$out/build.log" >&2; echo "build_ggmlr_back.sh: compiling the harness failed" >&2; exit 1; }
# -Bsymbolic: the op's calls to ggml_barrier and to the ops this file also defines bind inside
# the library, not to libggml-cpu's copies.
nice -n 19 c++ -shared -fopenmp -Wl,-Bsymbolic -Wl,-z,defs -o "$out/libssm_ggmlr_back.so" \
  "$out/ops-ssm.o" "$out/harness.o" -L"$ggml_lib" -lggml-cpu -lggml-base -Wl,-rpath,"$ggml_lib" 2>>"$out/build.log" \
  || { cat "$out/build.log" >&2; echo "build_ggmlr_back.sh: linking failed" >&2; exit 1; }

ggml_stamp="$ggml_lib/../ggml-build.json"
ggml_version="$(sed -n 's/.*"ggml_version": "\([^"]*\)".*/\1/p' "$ggml_stamp" 2>/dev/null || true)"
cat >"$out/ggmlr-build.json" <<JSON
{"ggmlr_repo": "https://github.com/Zabis13/ggmlR", "ggmlr_commit": "$commit",
 "ggmlr_file": "src/ggml-cpu/ops-ssm.cpp", "ggmlr_file_sha256": "$(sha256sum "$src" | cut -d' ' -f1)",
 "ggml_headers": "$ggml_src", "ggml_lib": "$ggml_lib", "ggml_version": "${ggml_version:-?}",
 "flags": "${cxx[*]:1}", "compiler": "$(c++ --version | head -1)", "built": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"}
JSON
echo "built $out/libssm_ggmlr_back.so (ggmlR $commit, $(basename "$src"))" >&2
echo "$out/libssm_ggmlr_back.so"
