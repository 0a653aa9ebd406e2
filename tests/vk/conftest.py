"""Vulkan test session: validation on everywhere, any validation message fails the test.

Tests marked ``vulkan`` are skipped only when this machine has no Vulkan device (or glslc, for
those that compile). With ``SSM_REQUIRE_VULKAN=1`` (set by CI) the skip becomes a failure, so a
CI image that lost its driver cannot pass by skipping.
"""

import os
import shutil
from pathlib import Path

import pytest

# Before any context exists: every context of this session runs under the validation layer.
os.environ["SSM_VK_VALIDATION"] = "1"

from ssm_vk import runtime as rt

TEST_GLSL = Path(__file__).resolve().parents[1] / "glsl"
REQUIRE_ENV = "SSM_REQUIRE_VULKAN"


def _missing(reason: str):
    if os.environ.get(REQUIRE_ENV, "").strip() == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
    pytest.skip(reason)


def _drain(ctx) -> list[str]:
    messages = list(ctx.validation_messages)
    ctx.validation_messages.clear()
    return messages


@pytest.fixture(autouse=True)
def _vulkan_checked(request):
    """Skip or fail when Vulkan is missing; fail on any validation message the test caused."""
    if request.node.get_closest_marker("vulkan") is None:
        yield
        return
    ok, reason = rt.available()
    if not ok:
        _missing(f"no Vulkan device: {reason}")
    before = rt.current_context()
    yield
    messages = []
    for ctx in {before, rt.current_context()} - {None}:
        messages += _drain(ctx)
    if messages:
        pytest.fail("the validation layer reported:\n" + "\n".join(messages), pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _session_spirv_cache(tmp_path_factory):
    """Shaders compiled by the tests go to a cache of this session, not the user's."""
    saved = os.environ.get("SSM_SCAN_CACHE")
    os.environ["SSM_SCAN_CACHE"] = str(tmp_path_factory.mktemp("spirv-cache"))
    yield
    if saved is None:
        os.environ.pop("SSM_SCAN_CACHE", None)
    else:
        os.environ["SSM_SCAN_CACHE"] = saved


@pytest.fixture(scope="session", autouse=True)
def _close_at_end():
    """Close the last context under validation: objects still alive at vkDestroyDevice are reported."""
    yield
    ctx = rt.current_context()
    if ctx is not None:
        ctx.close()
        messages = _drain(ctx)
        assert not messages, "the validation layer reported at close:\n" + "\n".join(messages)


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
        _missing("glslc is not on PATH")
    return path


@pytest.fixture
def spirv_cache(tmp_path, monkeypatch):
    """A fresh, empty SPIR-V disk cache for this test."""
    cache = tmp_path / "spirv-cache"
    monkeypatch.setenv("SSM_SCAN_CACHE", str(cache))
    return cache
