"""ssm_vk.runtime.external: buffers whose memory is exported as a file descriptor
(VK_KHR_external_memory_fd), the device's UUID, and their errors.

The descriptor is checked by what an importer does with it: the test imports it back into the same
device (VkImportMemoryFdInfoKHR, what CUDA's cuImportExternalMemory does on an NVIDIA GPU) and reads
the bytes written through the exporting buffer. Devices that do not offer the extension (none in
CI: lavapipe does) skip the tests that need it, or fail them under SSM_REQUIRE_VULKAN=1.
"""

import os
import stat

import numpy as np
import pytest
from vkcheck import missing

from ssm_vk import runtime as rt
from ssm_vk.runtime import binding, device, external, memory

pytestmark = pytest.mark.vulkan


@pytest.fixture
def exporting(ctx):
    """The context, when its device exports memory."""
    ok, why = external.export_support(ctx)
    if not ok:
        missing(f"no exportable memory: {why}")
    return ctx


class ImportedBuffer(rt.Buffer):
    """A Buffer over the memory of ``fd``, exported by ``source`` on the same device (the test's
    importer; Vulkan owns ``fd`` once the allocation succeeded). Read through the staging path."""

    def __init__(self, ctx, source, fd):
        vk = binding.require()
        ffi = vk.ffi
        self.ctx, self.size, self.serial = ctx, source.size, next(memory.serials)
        self.staging = self.closed = self.mappable = False
        self._buffer = self._memory = self._mapped = None
        self._alloc_size = source.alloc_size
        usage = (vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
                 | vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT)
        ext = ffi.new("VkExternalMemoryBufferCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO, "handleTypes": external.OPAQUE_FD})
        self._buffer = vk.vkCreateBuffer(ctx.handle, vk.VkBufferCreateInfo(
            pNext=ext, size=source.size, usage=usage, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        chain = ffi.NULL
        if source.dedicated:
            chain = ffi.new("VkMemoryDedicatedAllocateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO, "buffer": self._buffer})
        imp = ffi.new("VkImportMemoryFdInfoKHR*", {"sType": vk.VK_STRUCTURE_TYPE_IMPORT_MEMORY_FD_INFO_KHR,
                                                   "pNext": chain, "handleType": external.OPAQUE_FD, "fd": fd})
        try:
            self._memory = vk.vkAllocateMemory(ctx.handle, vk.VkMemoryAllocateInfo(
                pNext=imp, allocationSize=source.alloc_size, memoryTypeIndex=source.memory_type), None)
        except BaseException:
            vk.vkDestroyBuffer(ctx.handle, self._buffer, None)
            raise
        ctx.track_allocation(self._alloc_size, +1)
        vk.vkBindBufferMemory(ctx.handle, self._buffer, self._memory, 0)
        ctx.owned.adopt(self)


def test_the_extension_is_enabled_exactly_when_offered(ctx):
    offered = device.device_extensions(external.physical_device(ctx))
    assert (external.EXTENSION in device.base_extensions(None, offered)) == (external.EXTENSION in offered)
    assert device.base_extensions("VK_EXT_calibrated_timestamps", frozenset()) == ["VK_EXT_calibrated_timestamps"]
    ok, why = external.export_support(ctx)
    if external.EXTENSION not in offered:
        assert not ok and external.EXTENSION in why


def test_the_uuid_is_16_bytes_and_the_listed_devices_one(ctx):
    uuid = external.device_uuid(ctx)
    assert isinstance(uuid, bytes) and len(uuid) == 16
    listed = external.device_uuids()
    assert len(listed) == len(rt.list_devices())
    assert listed[ctx.info.index] == uuid


def test_an_exported_descriptor_is_a_new_valid_fd_each_time(exporting):
    before = exporting.live_allocations
    with external.ExportableBuffer(exporting, 1000) as buf:
        assert buf.size == 1000 and buf.alloc_size >= 1000 and buf.memory_type >= 0
        assert exporting.live_allocations.count == before.count + 1
        fds = [buf.export_fd() for _ in range(2)]
        try:
            assert fds[0] != fds[1] and min(fds) >= 0
            for fd in fds:
                mode = os.fstat(fd).st_mode   # raises for a descriptor that is not open
                assert not stat.S_ISDIR(mode)
        finally:
            for fd in fds:
                os.close(fd)
        data = np.arange(250, dtype=np.float32)   # still an ordinary buffer: transfers, copies
        rt.upload(buf, data)
        assert np.array_equal(rt.download(buf, ((250,), np.float32)), data)
    assert exporting.live_allocations == before


@pytest.mark.parametrize("nbytes", [4, 4096, 1 << 20])
def test_an_importer_of_the_descriptor_sees_the_buffers_bytes(exporting, nbytes):
    rng = np.random.default_rng(nbytes)
    data = rng.integers(0, 2**32, nbytes // 4, dtype=np.uint32)
    with external.ExportableBuffer(exporting, nbytes) as buf:
        rt.upload(buf, data)
        fd = buf.export_fd()
        try:
            imported = ImportedBuffer(exporting, buf, fd)
        except BaseException:
            os.close(fd)
            raise
        with imported:
            assert np.array_equal(rt.download(imported, ((nbytes // 4,), np.uint32)), data)
            rt.fill(imported, 0x01020304)   # and the other way: the importer's writes reach the exporter
            assert np.all(rt.download(buf, ((nbytes // 4,), np.uint32)) == 0x01020304)


def test_the_context_closes_what_is_left(exporting):
    buf = external.ExportableBuffer(exporting, 64)
    assert buf in exporting.owned._children.values()
    buf.close()
    buf.close()   # idempotent
    assert buf not in exporting.owned._children.values()
    with pytest.raises(RuntimeError, match="closed"):
        buf.export_fd()


def test_errors(exporting, monkeypatch):
    with pytest.raises(TypeError, match="ctx: expected a Context"):
        external.ExportableBuffer("ctx", 16)
    with pytest.raises(TypeError, match="nbytes: expected an int"):
        external.ExportableBuffer(exporting, 1.5)
    with pytest.raises(ValueError, match="nbytes: expected an int >= 1"):
        external.ExportableBuffer(exporting, 0)
    limit = exporting.info.max_memory_allocation_size
    with pytest.raises(ValueError, match="exceeds max_memory_allocation_size"):
        external.ExportableBuffer(exporting, limit + 1)
    exporting.seams.fail_allocations(1)
    with pytest.raises(rt.OutOfDeviceMemory, match="injected"):
        external.ExportableBuffer(exporting, 64)


def test_a_device_without_the_extension_refuses_with_the_reason(ctx, monkeypatch):
    monkeypatch.setattr(device, "device_extensions", lambda physical: frozenset())
    s = external._support(ctx)
    assert not s.ok and s.reason == f"{ctx.info.name} does not offer {external.EXTENSION}" and len(s.uuid) == 16
    monkeypatch.setattr(external, "support", lambda c: s)
    with pytest.raises(ValueError, match=f"^exportable memory: .*does not offer {external.EXTENSION}$"):
        external.ExportableBuffer(ctx, 64)
    assert external.export_support(ctx) == (False, s.reason)
