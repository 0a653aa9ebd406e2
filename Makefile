# The two entry points of the README. Both set themselves up on a fresh Debian 12 (root: apt;
# otherwise they expect the apt packages to be there) and are safe to run again.
PY       ?= python3
VENV     := .venv
VPY      := $(VENV)/bin/python
APT_PKGS := python3 python3-venv libvulkan1 mesa-vulkan-drivers glslc vulkan-validationlayers
STAMP    := $(VENV)/.installed

.PHONY: demo test setup apt lint wheel clean

# info, a quick check against the float64 reference, a small benchmark with a plot (out/).
demo: setup
	$(VENV)/bin/ssm-scan demo

test: setup
	$(VPY) -m ruff check .
	$(VPY) -m pytest -q

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

lint: setup
	$(VPY) -m ruff check .

# A wheel that runs the common shapes without glslc: SPIR-V for this machine's Vulkan device and
# for GPUs of subgroup size 8-64 goes into ssm_vk/spirv/ (package data) first.
wheel: setup
	$(VENV)/bin/ssm-scan build-shaders --subgroup-sizes local,8,16,32,64
	$(VPY) -m pip wheel -q --no-deps -w dist .

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis out ssm_vk/spirv
