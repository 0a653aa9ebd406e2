"""benchmarks/host_floor.py's import of host pages (VK_EXT_external_memory_host): the device copies
straight from and into a numpy array's own memory. The benchmark measures what that costs on a
GPU; here, that the context enables the extension exactly where it is offered and that the bytes
such a buffer moves are the array's -- at offsets that are not page-aligned, and not one byte of
the pages around the array written. Lavapipe offers the extension; a device without it skips,
or fails under SSM_REQUIRE_VULKAN=1.
"""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from vkcheck import missing

from ssm_vk import runtime as rt
from ssm_vk.runtime import device
from ssm_vk.runtime.external import physical_device

pytestmark = pytest.mark.vulkan

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "host_floor.py"


@pytest.fixture(scope="module")
def host_floor():
    spec = importlib.util.spec_from_file_location("host_floor", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def align(ctx, host_floor):
    a = host_floor.import_alignment(ctx)
    if a is None:
        missing(f"{ctx.info.name} does not offer {device.HOST_MEMORY_EXTENSION}")
    return a


def test_the_extension_is_enabled_exactly_when_offered(ctx):
    offered = device.device_extensions(physical_device(ctx))
    enabled = device.base_extensions(None, offered)
    assert (device.HOST_MEMORY_EXTENSION in enabled) == (device.HOST_MEMORY_EXTENSION in offered)
    assert device.HOST_MEMORY_EXTENSION not in device.base_extensions(None, frozenset())


@pytest.mark.parametrize("start,n", [(0, 4096), (3, 1000), (4093, 70_001), (8191, 1)])
def test_an_imported_array_moves_its_own_bytes_both_ways(ctx, host_floor, align, start, n):
    rng = np.random.default_rng(start + n)
    whole = rng.integers(0, 256, start + n + 9000, dtype=np.uint8)
    source = whole[start:start + n]
    with rt.Buffer(ctx, n + 64) as dev:
        with host_floor.Imported(ctx, source, align) as src:
            assert src.offset == source.ctypes.data % align
            assert (src.offset + n) <= src.size and src.size % align == 0
            host_floor.gpu_copy(ctx, src, dev, n, src_offset=src.offset, dst_offset=64)
        assert np.array_equal(rt.download(dev, n, 64), source)

        target_whole = rng.integers(0, 256, start + n + 9000, dtype=np.uint8)
        before = target_whole.copy()
        target = target_whole[start:start + n]
        with host_floor.Imported(ctx, target, align) as dst:
            host_floor.gpu_copy(ctx, dev, dst, n, src_offset=64, dst_offset=dst.offset)
        assert np.array_equal(target, source)
        assert np.array_equal(target_whole[:start], before[:start])
        assert np.array_equal(target_whole[start + n:], before[start + n:])
    assert not ctx.validation_messages


def test_a_calls_data_moved_by_import_equals_the_staged_movement(ctx, host_floor, align, monkeypatch):
    monkeypatch.setitem(host_floor.CALLS, "tiny", (2, 9, 3, 5, 8))
    r = host_floor.call_movement(ctx, "tiny", 1, align, 1.0)   # raises where the two disagree
    assert r["bytes"] > 0 and r["staged"] > 0 and r["imported"] > 0
    assert not ctx.validation_messages
