"""The optional frameworks of the tests, torch and jax: a test (or a whole module) that needs one is
skipped with the reason where it is not installed -- and fails instead where SSM_REQUIRE_TORCH=1 /
SSM_REQUIRE_JAX=1 says it must run (CI sets both: .ci/run), so a CI image that lost a framework
cannot pass by skipping. Every test that needs torch or jax goes through :func:`need`, never
through a bare ``pytest.importorskip``."""

from __future__ import annotations

import importlib
import os

import pytest

REQUIRE = {"torch": "SSM_REQUIRE_TORCH", "jax": "SSM_REQUIRE_JAX"}
INSTALL = {"torch": "pip install torch==2.13.0 einops (the CPU build; a bare 'torch' pulls the CUDA one)",
           "jax": "pip install jax jaxlib"}


def required(framework: str) -> bool:
    """Whether the environment says the tests of ``framework`` ("torch" or "jax") must run."""
    return os.environ.get(REQUIRE[framework], "").strip() == "1"


def need(module: str, framework: str | None = None, install: str | None = None):
    """``module`` imported (a framework, or a module its tests use: transformers for torch's), else
    a skip naming it and how to install it -- at module level too. Under ``framework``'s require
    variable (``framework`` defaults to ``module``) the ImportError is raised instead: the test
    fails."""
    framework = framework or module
    try:
        return importlib.import_module(module)
    except ImportError:
        if required(framework):
            raise
        pytest.skip(f"{module} is not installed: {install or INSTALL[module]} "
                    f"({REQUIRE[framework]}=1 makes this a failure)", allow_module_level=True)
