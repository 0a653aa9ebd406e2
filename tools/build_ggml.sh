#!/usr/bin/env bash
# Build ggml's shared libraries for ssm_ggml (docs/PORTING.md, "Testing ggml's SSM_SCAN").
#
#   tools/build_ggml.sh                          # ggml as vendored by the ggml-python 0.0.45 sdist, CPU backend
#   tools/build_ggml.sh --sdist llama-cpp-python==0.3.36   # the ggml llama-cpp-python vendors (has K)
#   tools/build_ggml.sh --tree ~/src/ggml        # a ggml checkout of yours (or an unpacked sdist)
#   tools/build_ggml.sh --source ~/src/ggml --vulkan --vulkan-headers ~/src/Vulkan-Headers --name vulkan
#   tools/build_ggml.sh --tree ~/src/ggml --cuda --name cuda   # CPU + CUDA backends (needs nvcc)
#
# Builds into build/ggml/<name>/ (default name: sdist-<version> or the source folder's name) and
# prints the folder that holds libggml*.so as its last line: export SSM_GGML_LIB=<that folder>.
# Running it again with the same source and options does nothing (stamp: ggml-build.json).
# Options:
#   --tree DIR            ggml sources: a folder with include/ggml.h, or one with vendor/ggml or
#                         vendor/llama.cpp/ggml (--source DIR: the same)
#   --sdist SPEC          a source distribution from PyPI that vendors ggml, downloaded with pip:
#                         VERSION for ggml-python's (vendor/ggml; default 0.0.45, ggml 0.15.3, whose
#                         ggml_ssm_scan has no K), or llama-cpp-python==VERSION (vendor/llama.cpp/ggml;
#                         0.3.36 vendors ggml 0.25.3, with ggml_ssm_scan(..., K)). Only the ggml
#                         folder is unpacked.
#   --out DIR             where builds go (default build/ggml, in the checkout)
#   --name NAME           the build's folder under --out
#   --vulkan              also build ggml's Vulkan backend (needs glslc, libvulkan, Vulkan-Hpp headers)
#   --vulkan-headers DIR  a Vulkan-Headers checkout (DIR/include), newer than your distribution's
#   --cuda                also build ggml's CUDA backend (needs the CUDA toolkit: nvcc on PATH or
#                         CUDACXX); its device is "CUDA0" (ssm-scan check --backend ssm_ggml:CUDA0)
#   --cuda-arch LIST      CMAKE_CUDA_ARCHITECTURES (default "native": the GPUs of this machine; e.g.
#                         90 for H100/H200)
#   --origin TEXT         what the sources are, for ggml-build.json (e.g. "ggml-org/ggml d99724f2"
#                         for an unpacked git archive, which has no .git to ask)
#   --spirv-headers DIR   a SPIRV-Headers checkout, for ggml versions whose Vulkan backend asks
#                         cmake for SPIRV-Headers (installed into --out/deps first; on Debian 12
#                         the spirv-headers package will do)
#   --vulkan-compat       add tools/vulkan-compat to the include path: the VK_EXT_layer_settings
#                         declarations ggml's Vulkan backend needs from headers older than 1.3.261
#                         (Debian 12's libvulkan-dev 1.3.239: enough for the sdist's ggml 0.15.3)
#   --native              -DGGML_NATIVE=ON (this machine's instruction set; default OFF: ggml's
#                         portable x86-64 set, AVX2/FMA/F16C on x86)
#   --jobs N              parallel compile jobs (default 2); the build runs under nice -n 19
# Needs cmake >= 3.14, a C and C++ compiler, and python3 with pip for --sdist.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
source_dir="" sdist="0.0.45" out="$here/build/ggml" name="" vulkan=0 vk_headers="" native=OFF jobs=2 origin_text="" spirv_headers=""
cuda=0 cuda_arch=native
while [ $# -gt 0 ]; do
  case "$1" in
    --source|--tree) source_dir="$2"; shift 2 ;;
    --sdist) sdist="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --name) name="$2"; shift 2 ;;
    --vulkan) vulkan=1; shift ;;
    --cuda) cuda=1; shift ;;
    --cuda-arch) cuda_arch="$2"; shift 2 ;;
    --vulkan-headers) vk_headers="$2"; shift 2 ;;
    --spirv-headers) spirv_headers="$2"; shift 2 ;;
    --native) native=ON; shift ;;
    --vulkan-compat) vk_compat=1; shift ;;
    --origin) origin_text="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^# Needs/p' "$0"; exit 0 ;;
    *) echo "build_ggml.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for tool in cmake c++; do
  command -v "$tool" >/dev/null || { echo "build_ggml.sh: $tool not found (apt-get install cmake g++)" >&2; exit 1; }
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"

origin=""
if [ -z "$source_dir" ]; then
  # A PyPI sdist that vendors a whole ggml tree; pip fetches it, only the ggml folder is unpacked.
  case "$sdist" in
    llama-cpp-python==*|llama_cpp_python==*)
      pkg="llama-cpp-python" ver="${sdist#*==}" vendored="vendor/llama.cpp/ggml" ;;
    ggml-python==*) pkg="ggml-python" ver="${sdist#*==}" vendored="vendor/ggml" ;;
    *==*) echo "build_ggml.sh: --sdist $sdist: expected VERSION (ggml-python), ggml-python==VERSION or llama-cpp-python==VERSION" >&2; exit 2 ;;
    *) pkg="ggml-python" ver="$sdist" vendored="vendor/ggml" ;;
  esac
  dist="${pkg//-/_}-$ver"
  if [ "$pkg" = ggml-python ]; then name="${name:-sdist-$ver}"; else name="${name:-sdist-$pkg-$ver}"; fi
  src_root="$out/src/$dist"
  if [ ! -f "$src_root/$vendored/include/ggml.h" ]; then
    py="${PYTHON:-python3}"
    mkdir -p "$out/src"
    [ -f "$out/src/$dist.tar.gz" ] || "$py" -m pip download -q --no-deps --no-binary :all: "$pkg==$ver" -d "$out/src"
    tar -xzf "$out/src/$dist.tar.gz" -C "$out/src" "$dist/$vendored"
  fi
  # llama-cpp-python's sdist leaves out ggml.pc.in, the pkg-config template a standalone ggml
  # configures (and installs, unused here): an empty one lets cmake configure.
  source_dir="$src_root/$vendored"
  [ -f "$source_dir/ggml.pc.in" ] || : >"$source_dir/ggml.pc.in"
  origin="$pkg $ver sdist ($vendored)"
else
  source_dir="$(cd "$source_dir" && pwd)"
  [ -f "$source_dir/vendor/ggml/include/ggml.h" ] && source_dir="$source_dir/vendor/ggml"
  [ -f "$source_dir/vendor/llama.cpp/ggml/include/ggml.h" ] && source_dir="$source_dir/vendor/llama.cpp/ggml"
  name="${name:-$(basename "$source_dir")}"
  origin="$source_dir"
  if [ -e "$source_dir/.git" ]; then
    origin="$origin (git $(git -C "$source_dir" rev-parse --short=8 HEAD))"
  fi
fi
[ -n "$origin_text" ] && origin="$origin_text ($source_dir)"
[ -f "$source_dir/include/ggml.h" ] && [ -f "$source_dir/CMakeLists.txt" ] || {
  echo "build_ggml.sh: $source_dir is no ggml source tree (no include/ggml.h and CMakeLists.txt)" >&2; exit 1; }

dest="$out/$name"
flags=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON "-DGGML_NATIVE=$native" -DGGML_CCACHE=OFF
       -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DGGML_BLAS=OFF
       "-DCMAKE_INSTALL_PREFIX=$dest" -DCMAKE_INSTALL_LIBDIR=lib)
if [ "$vulkan" = 1 ]; then
  flags+=(-DGGML_VULKAN=ON)
  if [ -n "$vk_headers" ]; then
    vk_headers="$(cd "$vk_headers" && pwd)"
    flags+=("-DVulkan_INCLUDE_DIR=$vk_headers/include")
    # Debian ships the loader as libvulkan.so.1 only (the .so link is in libvulkan-dev).
    loader="$(ldconfig -p 2>/dev/null | awk '/libvulkan\.so\.1 /{print $NF; exit}')"
    [ -n "$loader" ] && flags+=("-DVulkan_LIBRARY=$loader")
  fi
  if [ "${vk_compat:-0}" = 1 ]; then
    flags+=("-DCMAKE_CXX_FLAGS=-I$here/tools/vulkan-compat")
  fi
  if [ -n "$spirv_headers" ]; then
    spirv_prefix="$out/deps/spirv-headers"
    if [ ! -d "$spirv_prefix/share" ]; then
      cmake -S "$spirv_headers" -B "$out/deps/spirv-headers-build" "-DCMAKE_INSTALL_PREFIX=$spirv_prefix" \
        -DSPIRV_HEADERS_ENABLE_TESTS=OFF >/dev/null
      cmake --install "$out/deps/spirv-headers-build" >/dev/null
    fi
    flags+=("-DCMAKE_PREFIX_PATH=$spirv_prefix")
  fi
fi

if [ "$cuda" = 1 ]; then
  command -v "${CUDACXX:-nvcc}" >/dev/null || [ -x "${CUDACXX:-/usr/local/cuda/bin/nvcc}" ] || {
    echo "build_ggml.sh: --cuda needs the CUDA toolkit's nvcc (on PATH, or CUDACXX=/path/to/nvcc)" >&2; exit 1; }
  flags+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$cuda_arch")
fi

version="$(sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))/\2/p' "$source_dir/CMakeLists.txt" | paste -sd.)"
stamp_want="$(printf '%s\n' "$origin" "${flags[*]}" | sha256sum | cut -c1-16)"
if [ -f "$dest/ggml-build.json" ] && grep -q "\"key\": \"$stamp_want\"" "$dest/ggml-build.json" \
   && ls "$dest"/lib/libggml*.so >/dev/null 2>&1; then
  echo "ggml already built ($origin): $dest/ggml-build.json" >&2
  echo "$dest/lib"
  exit 0
fi

start=$(date +%s)
echo "building ggml $version from $origin into $dest (${flags[*]})" >&2
# ggml's CMakeLists asks git for its commit: without a .git of its own (an sdist, an archive) git
# must not walk up into an enclosing checkout (this one) and report that commit as ggml's.
export GIT_CEILING_DIRECTORIES="$(dirname "$source_dir")"
nice -n 19 cmake -S "$source_dir" -B "$dest/cmake" "${flags[@]}" >"$dest.configure.log" 2>&1 \
  || { tail -30 "$dest.configure.log" >&2; echo "build_ggml.sh: cmake configure failed ($dest.configure.log)" >&2; exit 1; }
nice -n 19 cmake --build "$dest/cmake" -j "$jobs" >"$dest.build.log" 2>&1 \
  || { tail -30 "$dest.build.log" >&2; echo "build_ggml.sh: build failed ($dest.build.log)" >&2; exit 1; }
cmake --install "$dest/cmake" >/dev/null
secs=$(( $(date +%s) - start ))
cat >"$dest/ggml-build.json" <<EOF
{"key": "$stamp_want", "ggml_version": "$version", "source": "$origin",
 "flags": "${flags[*]}", "built": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "seconds": $secs,
 "compiler": "$(c++ --version | head -1)"}
EOF
echo "built in $secs s: $dest/lib" >&2
echo "$dest/lib"
