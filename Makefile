# The two entry points of the README. Both set themselves up on a fresh Debian 12 (apt, through sudo
# when not root) and are safe to run again (docs/INSTALL.md, "What `make` installs").
PY       ?= python3
VENV     := .venv
VPY      := $(VENV)/bin/python
APT_PKGS := python3 python3-venv libvulkan1 mesa-vulkan-drivers glslc vulkan-validationlayers cmake g++
STAMP    := $(VENV)/.installed
# pytest-xdist workers: one more than the cores, since many tests wait on a child process or on
# lavapipe's threads (on 2 cores: 3 workers, 265 s, against 292 s with one per core)
WORKERS  ?= $(shell echo $$(( $$(nproc) + 1 )))
TEST_STAMP := $(VENV)/.test-extras
# ggml's CPU backend, built from the sdist of ggml-python 0.0.45 (its vendored ggml 0.15.3, whose
# ggml_ssm_scan has no K), for ssm_ggml's tests and the check and fuzz below; and from the sdist of
# llama-cpp-python 0.3.36 (its vendored ggml 0.25.3: ggml_ssm_scan(..., K), the state snapshots),
# for the tests and the check and fuzz of K. tools/build_ggml.sh does nothing when one is built.
GGML_LIB := $(CURDIR)/build/ggml/sdist-0.0.45/lib
GGML_K_SDIST := llama-cpp-python==0.3.36
GGML_K_LIB := $(CURDIR)/build/ggml/sdist-llama-cpp-python-0.3.36/lib
GGML_ENV := SSM_GGML_LIB=$(GGML_LIB) SSM_GGML_K_LIB=$(GGML_K_LIB)
# The fuzz of ggml's CPU: the forward's properties, T >= 1. Left out: the empty scan (T = 0) and
# split_tokens (it splits at t = 0 too), where ggml's CPU leaves the final states unwritten, a
# known finding that tests/ggml asserts (docs/PORTING.md, "Testing ggml's SSM_SCAN").
GGML_PROPS := --min-T 1 --property oracle_forward --property permute_sequences \
             --property group_broadcast --property mamba2_as_mamba1 --property deterministic \
             --property nonfinite_pattern
GGML_FUZZ := --minutes 0.25 --seed 0 $(GGML_PROPS)
# On the K build the fuzzer also draws K = 1..5 state snapshots (slots k < T compared: ggml's).
GGML_K_FUZZ := --minutes 0.25 --seed 0 $(GGML_PROPS)

.PHONY: demo test setup apt lint dist wheel check-install clean ggml ggml-check warm

# info, a quick check against the float64 reference, a small benchmark with a plot (out/).
demo: setup
	$(VENV)/bin/ssm-scan demo

# ruff, the shaders and numba kernels compiled once (make warm), the test suite (pytest-xdist,
# WORKERS processes, work-stealing; ssm_ggml's tests against the ggml builds), ssm-scan check and a short fuzz of ggml's CPU backend, then the wheel built from the sdist
# installed into fresh virtual environments outside the checkout and run from another directory
# (tests/install/run.sh).
test: setup $(TEST_STAMP) ggml
	$(VPY) -m ruff check .
	$(MAKE) warm
	$(GGML_ENV) $(VPY) -m pytest -q -n $(WORKERS) --dist worksteal
	$(MAKE) ggml-check
	$(MAKE) check-install

# ggml's shared libraries (CPU backend) in build/ggml/, both builds (tools/build_ggml.sh --help:
# other sources, Vulkan).
ggml: setup
	PYTHON=$(VPY) bash tools/build_ggml.sh
	PYTHON=$(VPY) bash tools/build_ggml.sh --sdist $(GGML_K_SDIST)

# ggml's own SSM_SCAN against the float64 oracle, on each build: the quick check (K = 4 snapshots
# too on the K build), then a quarter of a minute of fuzzing (ssm-scan fuzz --minutes M: longer).
# The two builds side by side (each a single-threaded Python loop over small problems: two cores
# take both in the time of one), the output of each kept apart and printed in turn.
ggml-check: ggml
	@out=$$(mktemp -d); \
	( SSM_GGML_LIB=$(GGML_LIB) $(VENV)/bin/ssm-scan check --quick --backend ssm_ggml:CPU && \
	  SSM_GGML_LIB=$(GGML_LIB) $(VENV)/bin/ssm-scan fuzz --backend ssm_ggml:CPU $(GGML_FUZZ) ) >$$out/a 2>&1 & a=$$!; \
	( SSM_GGML_LIB=$(GGML_K_LIB) $(VENV)/bin/ssm-scan check --quick --backend ssm_ggml:CPU && \
	  SSM_GGML_LIB=$(GGML_K_LIB) $(VENV)/bin/ssm-scan fuzz --backend ssm_ggml:CPU $(GGML_K_FUZZ) ) >$$out/b 2>&1 & b=$$!; \
	wait $$a; ra=$$?; wait $$b; rb=$$?; \
	echo "== ggml $(GGML_LIB)"; cat $$out/a; echo "== ggml (K) $(GGML_K_LIB)"; cat $$out/b; rm -rf $$out; \
	[ $$ra = 0 ] && [ $$rb = 0 ]

# Before the test suite, side by side: the SPIR-V of the documented matrix (make dist's step, which
# then finds it built) and ssm_fast's numba kernels (numba's cache), each compiled once rather
# than by every pytest-xdist worker on first use (on 2 cores: about -20 s and -15 s of the suite).
warm: setup
	$(VENV)/bin/ssm-scan build-shaders --subgroup-sizes local,8,16,32,64 >/dev/null & a=$$!; \
	$(VPY) -c "import ssm_fast, ssm_fast.mamba3; ssm_fast.warmup(); ssm_fast.mamba3.warmup()"; b=$$?; \
	wait $$a && [ $$b = 0 ]

setup: apt $(STAMP)

# Install the Vulkan loader, lavapipe, glslc and the validation layer when any is missing.
apt:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	fi

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV) || { apt-get install -y -q python3-venv && $(PY) -m venv $(VENV); }
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The optional frameworks the tests of ssm_torch and ssm_jax need: torch's CPU build pinned (a bare
# requirement can pull a multi-GB CUDA build), transformers for the Hugging Face models, jax.
$(TEST_STAMP): $(STAMP)
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q einops transformers jax jaxlib
	touch $(TEST_STAMP)

lint: setup
	$(VPY) -m ruff check .

# The sdist and the wheel (dist/), both carrying the GLSL sources and the SPIR-V of the documented
# matrix (docs/INSTALL.md): this machine's Vulkan device and GPUs of subgroup size
# 8-64 go into ssm_vk/spirv/ (package data) first, so those shapes run without glslc. Needs a Vulkan
# device (lavapipe will do: `make setup` installs it). The wheel is built from the sdist (build's
# default without --sdist/--wheel), as pip builds one from it: check-install's wheel is the sdist's.
# Without build isolation: the backend (setuptools, wheel) is in the dev extras, so the two builds
# skip making an environment each and installing it there (about 10-30 s on 2 cores).
dist: setup
	$(VENV)/bin/ssm-scan build-shaders --subgroup-sizes local,8,16,32,64
	rm -rf dist
	$(VPY) -m build -q --no-isolation --outdir dist .

wheel: dist

check-install: dist
	PY=$(PY) bash tests/install/run.sh dist

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis out ssm_vk/spirv
