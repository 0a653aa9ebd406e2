#!/usr/bin/env bash
# The installed package, as a user gets it: the wheel that `make dist` built from the sdist (as pip
# builds one from it), installed into a fresh virtual environment outside the checkout, and from
# another directory tests/install/smoke.py three times: with glslc on PATH (then the API's tests,
# tests/api/test_api_defaults.py, on the installed package), without glslc (its packaged SPIR-V
# is what runs), without the `vulkan` binding. Usage: tests/install/run.sh [DIST_DIR]   (default
# dist/, as `make dist` leaves it)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
dist=${1:-$repo/dist}
py=${PY:-python3}
work=$(mktemp -d /tmp/ssm-scan-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
smoke=$repo/tests/install/smoke.py

wheel=$(ls "$dist"/ssm_scan-*.whl | tail -n 1)
sdist=$(ls "$dist"/ssm_scan-*.tar.gz | tail -n 1)
[ -s "$sdist" ] || { echo "install check: no sdist in $dist"; exit 1; }

# A PATH like this machine's, without glslc: every other program of /usr/bin and /bin stays.
nog=$work/no-glslc-bin
mkdir -p "$nog"
for d in /usr/local/bin /usr/bin /bin; do
  for f in "$d"/*; do
    name=$(basename "$f")
    [ "$name" = glslc ] || [ -e "$nog/$name" ] || ln -s "$f" "$nog/$name"
  done
done

status=0
run() {  # run VENV MODE PATH
  local venv=$1 mode=$2 path=$3 home=$work/run-$(basename "$1")-$2
  mkdir -p "$home"
  echo "== $(basename "$venv"): $mode"
  # A fresh shader cache per run, so each mode meets what it would on a new machine.
  (cd "$home" && env PATH="$venv/bin:$path" SSM_SCAN_CACHE="$home/spirv-cache" \
     "$venv/bin/python" "$smoke" --mode "$mode" --readme "$repo/README.md") || status=1
}

api_tests() {  # api_tests VENV: the API's tests (tests/api/test_api_defaults.py: every default on
  # every backend against the float64 oracle) on the installed package, from a copy of tests/
  # outside the checkout, so that nothing of the checkout can be imported
  local venv=$1 copy=$work/tests-copy
  echo "== $(basename "$venv"): the API's tests on the installed package"
  rm -rf "$copy" && mkdir -p "$copy" && (cd "$repo/tests" && tar -c --exclude=__pycache__ .) | tar -x -C "$copy"
  (cd "$work" && env -u PYTHONPATH SSM_SCAN_CACHE="$work/api-spirv-cache" "$venv/bin/python" -c \
     "import ssm_ref, sys; sys.exit(0 if 'site-packages' in ssm_ref.__file__ else 'ssm_ref from ' + ssm_ref.__file__)" \
   && env -u PYTHONPATH SSM_SCAN_CACHE="$work/api-spirv-cache" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
     --rootdir "$copy" -k "not ssm_torch and not ssm_jax and not bridges" "$copy/api/test_api_defaults.py") \
   || status=1   # (the bridges' tests need torch and jax, which this environment leaves out: make test runs them)
}

venv=$work/wheel
echo "== installing $(basename "$wheel") into a fresh virtual environment"
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "$wheel[vulkan]" pytest hypothesis
run "$venv" glslc "$PATH"
api_tests "$venv"
run "$venv" no-glslc "$nog"
"$venv/bin/python" -m pip uninstall -q -y vulkan
run "$venv" no-binding "$PATH"
[ $status = 0 ] && echo "install check: the wheel (built from the sdist) passes in every mode" || echo "install check: FAILED"
exit $status
