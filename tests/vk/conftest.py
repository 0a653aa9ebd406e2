"""Fixtures of the Vulkan runtime tests. The session-wide Vulkan setup (validation layer on,
fail on any message, skip-or-fail without a device) is in tests/conftest.py."""

import shutil
from pathlib import Path

import pytest
from vkcheck import missing

from ssm_vk import runtime as rt

TEST_GLSL = Path(__file__).resolve().parents[1] / "glsl"


@pytest.fixture
def ctx():
    """The process context, validated."""
    context = rt.get_context()
    assert context.validation, "the Vulkan tests must run under the validation layer"
    return context


@pytest.fixture
def glslc():
    path = shutil.which("glslc")
    if path is None:
        missing("glslc is not on PATH")
    return path


@pytest.fixture
def spirv_cache(tmp_path, monkeypatch):
    """A fresh, empty SPIR-V disk cache for this test."""
    cache = tmp_path / "spirv-cache"
    monkeypatch.setenv("SSM_SCAN_CACHE", str(cache))
    return cache
