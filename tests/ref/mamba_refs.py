"""mamba_ssm's own Mamba-3 reference functions, loaded at test time from the checkout named by the
environment variable SSM_MAMBA_REPO (a directory holding mamba_ssm's tests/ops/...); nothing of
mamba_ssm is part of this repository.

    siso = load_siso()   # mamba3_siso_step_ref, mamba3_siso_fwd_ref (tests/ops/triton/test_mamba3_siso.py)
    mimo = load_mimo()   # mamba3_MIMO_step_ref, mamba3_MIMO_chunk_ref (tests/ops/tilelang/test_mamba3_mimo.py)

Those test modules import triton and mamba_ssm's GPU kernels at the top; only their pure-torch
reference functions are used here, so the kernel modules are stood in for by empty modules while
the file is imported (and removed again afterwards).

``float64=True`` runs a reference in float64 throughout: some of them cast inputs or states with
``x.to(torch.float32)`` or allocate ``dtype=torch.float32`` (mamba3_siso_fwd_ref casts ADT and DT;
the step refs cast the start SSM state), which rounds a float64 comparison to float32. The module
is then given a ``torch`` whose ``float32`` is float64 -- the functions' code is unchanged.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest

SISO_PATH = "tests/ops/triton/test_mamba3_siso.py"
MIMO_PATH = "tests/ops/tilelang/test_mamba3_mimo.py"

# The modules the SISO test file imports at its top that a CPU machine lacks (its kernels).
_STUBS = {
    "triton": {},
    "mamba_ssm": {},
    "mamba_ssm.ops": {},
    "mamba_ssm.ops.triton": {},
    "mamba_ssm.ops.triton.mamba3": {},
    "mamba_ssm.ops.triton.mamba3.mamba3_siso_combined": {"mamba3_siso_combined": None},
    "mamba_ssm.ops.triton.mamba3.mamba3_siso_step": {"mamba3_siso_step": None},
}


def repo() -> Path:
    """The mamba_ssm checkout (SSM_MAMBA_REPO); the test is skipped, with the reason, without it."""
    where = os.environ.get("SSM_MAMBA_REPO")
    if not where:
        pytest.skip("SSM_MAMBA_REPO is not set (a checkout of mamba_ssm holding tests/ops/triton/"
                    "test_mamba3_siso.py and tests/ops/tilelang/test_mamba3_mimo.py)")
    path = Path(where)
    for rel in (SISO_PATH, MIMO_PATH):
        if not (path / rel).is_file():
            pytest.skip(f"SSM_MAMBA_REPO={where} has no {rel}")
    pytest.importorskip("torch")
    pytest.importorskip("einops")
    return path


def _importable(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):   # a parent package is missing
        return False


class _Float64Torch(types.ModuleType):
    """torch, except that ``float32`` is float64 (see the module docstring)."""

    def __init__(self, torch):
        super().__init__("torch")
        self._torch = torch
        self.float32 = torch.float64
        self.float = torch.float64

    def __getattr__(self, name):
        return getattr(self._torch, name)


def _load(rel: str, name: str, float64: bool):
    path = repo() / rel
    missing = {}
    for mod, attrs in _STUBS.items():
        if mod in sys.modules or _importable(mod):
            continue
        stub = types.ModuleType(mod)
        stub.__path__ = []   # a package, so the stubs below it import
        for k, v in attrs.items():
            setattr(stub, k, v)
        missing[mod] = stub
    saved = {k: sys.modules.get(k) for k in missing}
    sys.modules.update(missing)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    if float64:
        import torch

        module.torch = _Float64Torch(torch)
    return module


_CACHE: dict = {}


def load_siso(float64: bool = True):
    """The module of mamba3_siso_step_ref and mamba3_siso_fwd_ref."""
    key = ("siso", float64)
    if key not in _CACHE:
        _CACHE[key] = _load(SISO_PATH, f"_mamba_ssm_siso_ref_{int(float64)}", float64)
    return _CACHE[key]


def load_mimo(float64: bool = True):
    """The module of mamba3_MIMO_step_ref and mamba3_MIMO_chunk_ref."""
    key = ("mimo", float64)
    if key not in _CACHE:
        _CACHE[key] = _load(MIMO_PATH, f"_mamba_ssm_mimo_ref_{int(float64)}", float64)
    return _CACHE[key]
