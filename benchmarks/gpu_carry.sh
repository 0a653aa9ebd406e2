#!/usr/bin/env bash
# On a machine with apt and pip, in the checkout: collect what the GPU machine cannot download into
# folders that git ignores and `run`'s carry takes along (docs/VULKAN.md, "A GPU host without a
# package index"): .gl/ (the Vulkan loader, glvnd, glslc, the validation layer), .whl/ (the vulkan
# binding for the GPU host's Python 3.12), .peer/mamba (state-spaces/mamba's source from its sdist,
# for vs_mamba_ssm.py and torch_side_by_side.py --mamba-src) and, with BASE=<commit>, .base/ (that
# commit's tree, for timings before and after in one run: benchmarks/gpu_torch.sh, gpu_mamba3.sh;
# BASE2=<commit>: .base2/, a second earlier tree for gpu_mamba3.sh).
#
# mamba_ssm's sdist comes through pip, run by a Python that has torch (its setup.py imports it, even
# with MAMBA_SKIP_CUDA_BUILD=TRUE): $PYTHON, by default the checkout's .venv/bin/python, the virtual
# environment `make test` creates (with torch's CPU build).
#
#   [BASE=66453d7] [BASE2=...] [PYTHON=.venv/bin/python] bash benchmarks/gpu_carry.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for d in /.gl/ /.whl/ /.peer/ /.base/ /.base2/; do
  grep -qxF "$d" .git/info/exclude || echo "$d" >> .git/info/exclude
done
if [ ! -d .gl ] || [ -z "$(ls .gl 2>/dev/null)" ]; then
  mkdir -p .gl /tmp/apt-amd64/partial
  opts='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/apt-amd64'
  apt-get $opts update -qq
  (cd .gl && apt-get $opts download -qq libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libgles2 libopengl0 \
      glslc libshaderc1 vulkan-validationlayers)
fi
if [ ! -d .whl ] || [ -z "$(ls .whl 2>/dev/null)" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .whl vulkan==1.3.275.1 cffi pycparser
fi
if [ ! -d .peer/mamba/mamba_ssm ]; then
  PYTHON=${PYTHON:-.venv/bin/python}
  "$PYTHON" -c 'import torch' 2>/dev/null || {
    echo "gpu_carry.sh: $PYTHON cannot import torch, which mamba_ssm's setup.py needs: run make test" \
         "(it creates .venv with torch) or set PYTHON to a Python that has torch" >&2; exit 1; }
  sdist=$(mktemp -d)
  # the sdist itself (no binary, no dependencies; pip checks it against the index's hash); its
  # setup.py runs for the metadata only, without building CUDA
  MAMBA_SKIP_CUDA_BUILD=TRUE "$PYTHON" -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
      mamba-ssm==2.3.2.post1 -d "$sdist"
  rm -rf .peer/mamba && mkdir -p .peer
  tar -xzf "$sdist"/mamba_ssm-2.3.2.post1.tar.gz -C "$sdist"
  mv "$sdist"/mamba_ssm-2.3.2.post1 .peer/mamba
  rm -rf "$sdist"
fi
for b in BASE BASE2; do   # .base, .base2
  commit=${!b:-}
  [ -n "$commit" ] || continue
  dir=.$(echo $b | tr A-Z a-z)
  rm -rf $dir && mkdir $dir && git archive "$commit" | tar -x -C $dir
  echo "$commit" > $dir/COMMIT
done
du -sh .gl .whl .peer ${BASE:+.base} ${BASE2:+.base2} | tr '\n' ' '; echo
