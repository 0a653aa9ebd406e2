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


@pytest.fixture
def packaged_only(glslc, tmp_path, monkeypatch):
    """A wheel without glslc: ``packaged_only(n_values)`` builds the packaged matrix of this
    device for those d_state values (``ssm-scan build-shaders``' variants, no chunked ones) into
    a fresh package folder, then takes glslc off PATH, empties the disk cache and starts a fresh
    context, so that every kernel a call gets is the package's. Clears the engine's decisions
    before and after."""
    from faultcase import fresh_context

    from ssm_cli.build import variants
    from ssm_vk import engine
    from ssm_vk.runtime import shaders
    from ssm_vk.sizing import Limits

    def make(n_values):
        pkg = tmp_path / "pkg"
        monkeypatch.delenv("SSM_VK_TUNE", raising=False)
        shaders.build_all(variants([Limits.of(rt.get_context().info)], list(n_values), ()), pkg)
        monkeypatch.setenv("PATH", str(tmp_path))                          # no glslc
        monkeypatch.setenv("SSM_SCAN_CACHE", str(tmp_path / "empty-cache"))
        monkeypatch.setattr(shaders, "PACKAGED_SPIRV", pkg)
        engine.clear()
        assert fresh_context().validation                                  # nothing built
        return pkg

    yield make
    engine.clear()
