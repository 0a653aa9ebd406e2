"""Whether the PyTorch tests run: skipped with the reason when torch is not installed, failed
instead when SSM_REQUIRE_TORCH=1 (CI installs torch and sets it). The rule is tests/optional.py's,
shared with the tests of other folders that need torch or jax."""

from __future__ import annotations

import pytest
from optional import INSTALL, REQUIRE
from optional import need as _need
from optional import required as _required

REQUIRE_ENV = REQUIRE["torch"]
INSTALL = INSTALL["torch"]


def required() -> bool:
    return _required("torch")


def missing(reason: str):
    """Skip with ``reason``, or fail when the environment says the tests must run."""
    if required():
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1: these tests must run here)", pytrace=False)
    pytest.skip(reason)


def need_torch():
    """torch, or a module-level skip (a failure under SSM_REQUIRE_TORCH=1)."""
    return _need("torch")


def need(module: str, install: str):
    """Another module these tests use (transformers), like :func:`need_torch`."""
    return _need(module, "torch", install)
