"""Runtime: binding guard, device listing and choice, context lifetime, limits seam, result codes."""

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ssm_vk import runtime as rt
from ssm_vk.runtime import binding, device

REPO = Path(__file__).resolve().parents[2]


def _info(index, type_, **kw):
    """A DeviceInfo for choice tests that need no Vulkan."""
    base = dict(index=index, name=f"dev{index}", type=type_, vendor_id=0, device_id=0, driver="", api_version=(1, 3, 0),
                subgroup_size=32, subgroup_ops=frozenset(), max_shared_memory=1 << 15,
                max_workgroup_size=(1024, 1024, 64), max_workgroup_invocations=1024,
                max_workgroup_count=(65535, 65535, 65535), max_storage_buffer_range=1 << 27,
                max_memory_allocation_size=1 << 31, max_push_constants_size=128,
                min_storage_buffer_offset_alignment=16, max_storage_buffers_per_stage=32, timestamp_period=1.0,
                timestamps=True, timestamp_valid_bits=64, device_local_bytes=1 << 31, float_atomics=False,
                shader_float64=False, shader_int64=False)
    return device.DeviceInfo(**{**base, **kw})


# -- without a device ------------------------------------------------------------------------------

def test_import_without_loader_reports_unavailable():
    # The binding raises OSError when libvulkan.so.1 is missing (docs/VULKAN.md, sharp edge 1);
    # a meta-path hook reproduces that in a fresh interpreter.
    code = textwrap.dedent("""
        import sys
        class NoLoader:
            def find_spec(self, name, path=None, target=None):
                if name == "vulkan" or name.startswith("vulkan."):
                    raise OSError("libvulkan.so.1: cannot open shared object file")
        sys.meta_path.insert(0, NoLoader())
        import ssm_vk
        import ssm_vk.runtime as rt
        ok, reason = rt.available()
        assert ok is False and "libvulkan.so.1" in reason, (ok, reason)
        try:
            rt.get_context()
        except rt.VulkanUnavailable as exc:
            print("unavailable:", exc)
        else:
            raise SystemExit("get_context() did not raise")
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert "unavailable: the Vulkan binding could not be loaded: OSError" in run.stdout


def test_choose_prefers_discrete_then_integrated_then_virtual_then_cpu(monkeypatch):
    monkeypatch.delenv(device.DEVICE_ENV, raising=False)
    devs = [_info(0, "cpu"), _info(1, "virtual"), _info(2, "integrated"), _info(3, "discrete")]
    assert device.choose(devs).index == 3
    assert device.choose(devs[:3]).index == 2
    assert device.choose(devs[:2]).index == 1
    assert device.choose(devs[:1]).index == 0
    monkeypatch.setenv(device.DEVICE_ENV, "1")
    assert device.choose(devs).index == 1
    assert device.choose(devs, 0).index == 0  # an explicit argument wins over the variable


@pytest.mark.parametrize("value", ["4", "-1", "gpu"])
def test_choose_rejects_a_bad_device_variable(monkeypatch, value):
    monkeypatch.setenv(device.DEVICE_ENV, value)
    with pytest.raises(ValueError, match=device.DEVICE_ENV):
        device.choose([_info(0, "cpu"), _info(1, "discrete")])


def test_choose_without_devices_is_unavailable():
    with pytest.raises(rt.VulkanUnavailable):
        device.choose([])


def test_lowered_limits_are_checked():
    info = _info(0, "cpu")
    assert device.lowered(info, info, max_workgroup_count=(4, 2, 1)).max_workgroup_count == (4, 2, 1)
    with pytest.raises(ValueError, match="unknown limit"):
        device.lowered(info, info, subgroup_size=4)
    with pytest.raises(ValueError, match="only be lowered"):
        device.lowered(info, info, max_storage_buffer_range=1 << 40)
    with pytest.raises(ValueError, match="3 positive ints"):
        device.lowered(info, info, max_workgroup_count=(4, 0, 1))


def test_versions():
    assert binding.split_version(binding.make_version(1, 3, 275)) == (1, 3, 275)
    assert binding.make_version(1, 1) == (1 << 22) | (1 << 12)


# -- with the binding -------------------------------------------------------------------------------

@pytest.mark.vulkan
def test_result_codes_are_total_and_signed_right():
    vk = binding.require()
    assert binding.exception_for_code(-1000069000) is vk.VkErrorOutOfPoolMemory  # the binding keyed it +1000069000
    assert issubclass(binding.exception_for_code(-1000161000), vk.VkError)      # VK_ERROR_FRAGMENTATION: absent
    assert issubclass(binding.exception_for_code(-123456), vk.VkError)
    for code, cls in [(-4, rt.DeviceLost), (-2, rt.OutOfDeviceMemory), (-1, rt.OutOfDeviceMemory),
                      (2, rt.VulkanTimeout), (-1000069000, rt.VulkanError)]:
        err = binding.to_package_error(binding.exception_for_code(code)(), "vkTest")
        assert type(err) is cls and err.result == code, (code, err)
    with pytest.raises(rt.DeviceLost, match="vkThing failed: VK_ERROR_DEVICE_LOST"), binding.translated("vkThing"):
        raise vk.VkErrorDeviceLost()


@pytest.mark.vulkan
def test_list_devices_copies_every_limit():
    devs = rt.list_devices()
    assert devs and all(isinstance(d, rt.DeviceInfo) for d in devs)
    for d in devs:
        for field in dataclasses.fields(d):
            value = getattr(d, field.name)
            assert not type(value).__module__.startswith("_cffi"), field.name  # no cdata (sharp edge 6)
        assert d.subgroup_size >= 1 and "basic" in d.subgroup_ops
        assert min(d.max_workgroup_count) >= 65535 and min(d.max_workgroup_size) >= 64  # guaranteed minima
        assert d.max_storage_buffer_range >= 1 << 27 and d.max_memory_allocation_size >= 1 << 30
        assert d.max_push_constants_size >= 128 and d.min_storage_buffer_offset_alignment >= 1
        assert d.type in ("discrete", "integrated", "virtual", "cpu", "other") and d.where == f"Vulkan{d.index}"


@pytest.mark.vulkan
def test_context_is_one_per_process_and_validated(ctx):
    assert rt.get_context() is ctx and rt.current_context() is ctx
    assert ctx.validation and ctx.info.name == rt.list_devices()[ctx.info.index].name
    with pytest.raises(RuntimeError, match="already open"):
        rt.Context()
    with pytest.raises(ValueError, match="validation"):
        rt.get_context(validation=False)


@pytest.mark.vulkan
def test_close_twice_then_a_new_context(ctx):
    buf = rt.Buffer(ctx, 64)
    ctx.close()
    ctx.close()
    assert buf.closed and ctx.live_allocations == rt.context.Allocations(0, 0)
    assert not ctx.validation_messages
    with pytest.raises(RuntimeError, match="closed"):
        rt.Buffer(ctx, 64)
    fresh = rt.get_context()
    assert fresh is not ctx and not fresh.closed
    rt.close()
    rt.close()
    assert rt.current_context() is None


@pytest.mark.vulkan
def test_override_limits_restores(ctx):
    real = ctx.info
    with ctx.seams.override_limits(max_workgroup_count=(2, 2, 2), max_storage_buffer_range=256):
        assert ctx.info.max_workgroup_count == (2, 2, 2) and ctx.info.max_storage_buffer_range == 256
        assert ctx.hardware_info is real
    assert ctx.info == real
    with pytest.raises(ValueError, match="only be lowered"):
        ctx.seams.override_limits(max_push_constants_size=real.max_push_constants_size + 4)
