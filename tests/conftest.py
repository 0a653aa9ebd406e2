"""Shared test configuration.

- hypothesis profiles: ``ci`` (default), ``dev`` and ``fuzz`` (HYPOTHESIS_PROFILE=...).
- Vulkan: every Vulkan context of the session runs under the Khronos validation layer, and any
  message it reports fails the test that caused it (every test, not only those under tests/vk:
  the backend registry runs ssm_vk everywhere). Tests marked ``vulkan`` are skipped without a
  Vulkan device, or fail when SSM_REQUIRE_VULKAN=1 (CI).
- Tests marked ``cuda`` (CUDA tensors through ssm_vk) are skipped unless torch has a CUDA device
  whose GPU is the Vulkan device and shares memory with it, or fail when SSM_REQUIRE_CUDA=1 (the
  GPU runs: benchmarks/gpu_tests.sh).
- SPIR-V compiled by the tests goes to a cache of the test runs, not the user's: kept across runs
  in pytest's cache of the checkout (or $SSM_TEST_CACHE/spirv), so a second run compiles only the
  shaders whose source or glslc changed; one of the session's own with ``-p no:cacheprovider``
  (shared by its pytest-xdist workers).
- Tests marked ``soak`` (long loops, huge arrays) run only when selected: ``-m soak`` or
  ``SSM_SOAK=1``; otherwise they are reported as skipped with that hint.
"""

import os
import shutil
from pathlib import Path

# Before any Vulkan context exists. On by default; a machine without the validation layer (a GPU
# host that only has the driver) may run the suite with SSM_VK_VALIDATION=0.
os.environ.setdefault("SSM_VK_VALIDATION", "1")

import pytest
from hypothesis import HealthCheck, settings
from vkcheck import drain, missing

from ssm_vk import runtime as rt

settings.register_profile("ci", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=100, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fuzz", max_examples=5000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SOAK_ENV = "SSM_SOAK"
CUDA_ENV = "SSM_REQUIRE_CUDA"


def _cuda_problem() -> str:
    """Why the tests of CUDA tensors through ssm_vk cannot run here ("" when they can)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    from ssm_torch import cuda

    ok, why = cuda.available("cuda")
    if not ok:
        return why
    ctx = rt.get_context()
    ok, why = cuda.shares_memory(ctx, torch.device("cuda", torch.cuda.current_device()))
    return "" if ok else why


def pytest_collection_modifyitems(config, items):
    """Soak tests run only when asked for (``-m soak``, or SSM_SOAK=1); otherwise they are
    deselected (a profile, like hypothesis's ``fuzz``), not skipped."""
    if os.environ.get(SOAK_ENV, "").strip() == "1" or "soak" in (config.getoption("markexpr") or ""):
        return
    soak = [item for item in items if "soak" in item.keywords]
    if soak:
        config.hook.pytest_deselected(items=soak)
        items[:] = [item for item in items if "soak" not in item.keywords]


@pytest.fixture(autouse=True)
def _vulkan_checked(request):
    """Skip or fail marked tests when Vulkan is missing; fail any test on a validation message."""
    if request.node.get_closest_marker("vulkan") is not None:
        ok, reason = rt.available()
        if not ok:
            missing(f"no Vulkan device: {reason}")
    if request.node.get_closest_marker("cuda") is not None:
        reason = _cuda_problem()
        if reason:
            if os.environ.get(CUDA_ENV, "").strip() == "1":
                pytest.fail(f"{CUDA_ENV}=1 but {reason}", pytrace=False)
            pytest.skip(reason)
    before = rt.current_context()
    yield
    messages = []
    for ctx in {before, rt.current_context()} - {None}:
        messages += drain(ctx)
    if messages:
        pytest.fail("the validation layer reported:\n" + "\n".join(messages), pytrace=False)


# Variants (folders of some 40 kB) the test runs' SPIR-V cache holds before it starts over (about
# 100 MB): a whole run makes some 1,000; edited shaders leave their old variants behind.
SPIRV_CACHE_CAP = 2500


def _test_spirv_cache(config, tmp_path_factory) -> Path:
    root = os.environ.get("SSM_TEST_CACHE")
    if root:
        return Path(root) / "spirv"
    if getattr(config, "cache", None) is not None:
        return Path(config.cache.mkdir("spirv"))
    # The session's own: under pytest-xdist one for all its workers (the parent of their base
    # folders), as the cache of the checkout is, not one per worker (each compiling the same variants).
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "spirv-cache"


@pytest.fixture(scope="session", autouse=True)
def _session_spirv_cache(request, tmp_path_factory):
    """Shaders compiled by the tests go to the test runs' cache, not the user's. Its entries are
    keyed by the variant's source (includes too) and glslc's version and checked on every load
    (ssm_vk.runtime.shaders), so a cached entry is what glslc would write now; tests of the cache
    itself use caches of their own (tests/vk/conftest.py, spirv_cache)."""
    cache = _test_spirv_cache(request.config, tmp_path_factory)
    cache.mkdir(parents=True, exist_ok=True)
    if sum(1 for _ in cache.iterdir()) > SPIRV_CACHE_CAP:
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True, exist_ok=True)
    saved = os.environ.get("SSM_SCAN_CACHE")
    os.environ["SSM_SCAN_CACHE"] = str(cache)
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
        messages = drain(ctx)
        assert not messages, "the validation layer reported at close:\n" + "\n".join(messages)


@pytest.fixture
def knobs():
    """Set ssm_vk's planner knobs for one test: ``knobs(CHUNK=16)`` adds to those set before,
    ``knobs.no_subgroup()`` turns subgroup operations off (ssm_vk.config.configure); all of it
    is undone after the test."""
    from ssm_vk import config

    current: dict = {}
    handles: list = []

    def set_knobs(**tune):
        current.update(tune)
        handles.append(config.configure(tune=dict(current)))

    set_knobs.no_subgroup = lambda: handles.append(config.configure(no_subgroup=True))
    set_knobs.current = current
    yield set_knobs
    for h in reversed(handles):
        h.restore()
