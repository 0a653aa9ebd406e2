# The two entry points of the README. Both set themselves up on a fresh Debian 12 (root: apt;
# otherwise they expect the apt packages to be there) and are safe to run again.
PY       ?= python3
VENV     := .venv
VPY      := $(VENV)/bin/python
APT_PKGS := python3 python3-venv libvulkan1 mesa-vulkan-drivers glslc vulkan-validationlayers
STAMP    := $(VENV)/.installed
TEST_STAMP := $(VENV)/.test-extras

.PHONY: demo test setup apt lint dist wheel check-install clean

# info, a quick check against the float64 reference, a small benchmark with a plot (out/).
demo: setup
	$(VENV)/bin/ssm-scan demo

# ruff, the test suite, then the built sdist and wheel installed into fresh virtual environments
# outside the checkout and run from another directory (tests/install/run.sh).
test: setup $(TEST_STAMP)
	$(VPY) -m ruff check .
	$(VPY) -m pytest -q
	$(MAKE) check-install

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
# device (lavapipe will do: `make setup` installs it).
dist: setup
	$(VENV)/bin/ssm-scan build-shaders --subgroup-sizes local,8,16,32,64
	rm -rf dist
	$(VPY) -m build -q --sdist --wheel --outdir dist .

wheel: dist

check-install: dist
	PY=$(PY) bash tests/install/run.sh dist

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis out ssm_vk/spirv
