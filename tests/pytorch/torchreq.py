"""Whether the PyTorch tests run: skipped with the reason when torch is not installed, failed
instead when SSM_REQUIRE_TORCH=1 (CI installs torch and sets it)."""

from __future__ import annotations

import os

import pytest

REQUIRE_ENV = "SSM_REQUIRE_TORCH"
INSTALL = "pip install torch==2.13.0 einops (the CPU build; a bare 'torch' pulls the CUDA one)"


def required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip() == "1"


def missing(reason: str):
    """Skip with ``reason``, or fail when the environment says the tests must run."""
    if required():
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1: these tests must run here)", pytrace=False)
    pytest.skip(reason)


def need_torch():
    """torch, or a module-level skip (a failure under SSM_REQUIRE_TORCH=1)."""
    try:
        import torch
    except ImportError:
        if required():
            raise
        pytest.skip(f"torch is not installed: {INSTALL}", allow_module_level=True)
    return torch


def need(module: str, install: str):
    """Another module these tests use (transformers), like :func:`need_torch`."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        if required():
            raise
        pytest.skip(f"{module} is not installed: {install}", allow_module_level=True)
