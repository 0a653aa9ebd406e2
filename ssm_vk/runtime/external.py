"""Vulkan memory another API on the same GPU can use: buffers whose memory is exported as a POSIX
file descriptor (VK_KHR_external_memory_fd, handle type OPAQUE_FD), and the device's UUID
(VkPhysicalDeviceIDProperties), which says which GPU of another API is the same one.

This is what CUDA's ``cuImportExternalMemory`` takes (ssm_torch/cuda.py imports these buffers so
torch's CUDA tensors reach ssm_vk without a trip through host memory). Nothing here runs for a
call that does not ask for it: the context enables the extension when the device offers it
(device.base_extensions), and only an :class:`ExportableBuffer` allocates memory with an export request.

    ok, why = export_support(ctx)          # (False, the reason) without the extension or the handle type
    uuid = device_uuid(ctx)                # 16 bytes; device_uuids() for every listed device
    buf = ExportableBuffer(ctx, nbytes)    # a Buffer: binds, copies and transfers as any other
    fd = buf.export_fd()                   # a new descriptor each call; the caller owns it
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from . import binding, device, instance
from .checks import check_int
from .context import Context
from .memory import Buffer, check_allocation, memory_type, serials

EXTENSION = device.EXTERNAL_MEMORY_FD_EXTENSION
OPAQUE_FD = 0x1            # VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT
_FEATURE_DEDICATED_ONLY = 0x1   # VkExternalMemoryFeatureFlagBits
_FEATURE_EXPORTABLE = 0x2


@dataclass(frozen=True)
class ExportSupport:
    """What a context's device says of exporting a storage buffer's memory as OPAQUE_FD."""

    ok: bool
    reason: str                # why not ("" when ok)
    dedicated_only: bool       # such memory must be a dedicated allocation
    uuid: bytes                # the device's UUID (16 bytes)


def physical_device(ctx: Context):
    """The VkPhysicalDevice of ``ctx`` (the context keeps only its logical device)."""
    return device.physical_devices(instance.process_instance(ctx.validation))[ctx.info.index]


def _uuid_of(physical) -> bytes:
    vk = binding.require()
    ffi = vk.ffi
    ids = ffi.new("VkPhysicalDeviceIDProperties*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES})
    props = ffi.new("VkPhysicalDeviceProperties2*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                                     "pNext": ids})
    vk.vkGetPhysicalDeviceProperties2(physical, props)
    return bytes(ffi.buffer(ids.deviceUUID, vk.VK_UUID_SIZE))   # copied at once (sharp edge 6)


def _usage(vk) -> int:
    return (vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
            | vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT)


def _support(ctx: Context) -> ExportSupport:
    vk = binding.require()
    ffi = vk.ffi
    physical = physical_device(ctx)
    uuid = _uuid_of(physical)
    if EXTENSION not in device.device_extensions(physical):   # offered means enabled (device.base_extensions)
        return ExportSupport(False, f"{ctx.info.name} does not offer {EXTENSION}", False, uuid)
    query = ffi.new("VkPhysicalDeviceExternalBufferInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_BUFFER_INFO, "usage": _usage(vk),
        "handleType": OPAQUE_FD})
    answer = ffi.new("VkExternalBufferProperties*", {"sType": vk.VK_STRUCTURE_TYPE_EXTERNAL_BUFFER_PROPERTIES})
    vk.lib.vkGetPhysicalDeviceExternalBufferProperties(physical, query, answer)
    props = answer.externalMemoryProperties
    features, compatible = int(props.externalMemoryFeatures), int(props.compatibleHandleTypes)
    if not features & _FEATURE_EXPORTABLE or not compatible & OPAQUE_FD:
        why = (f"{ctx.info.name} cannot export a storage buffer's memory as an opaque file descriptor "
               f"(features {features:#x}, compatible handle types {compatible:#x})")
        return ExportSupport(False, why, False, uuid)
    return ExportSupport(True, "", bool(features & _FEATURE_DEDICATED_ONLY), uuid)


def support(ctx: Context) -> ExportSupport:
    """Whether ``ctx``'s device exports buffer memory as OPAQUE_FD, and its UUID; asked once per
    context. Raises DeviceLost / RuntimeError when the context is not usable."""
    ctx.check_usable()
    return ctx.owned.extension("external-memory", _support)


def export_support(ctx: Context) -> tuple[bool, str]:
    """(True, "") when :class:`ExportableBuffer` works on ``ctx``, else (False, the reason)."""
    s = support(ctx)
    return s.ok, s.reason


def device_uuid(ctx: Context) -> bytes:
    """The 16-byte deviceUUID of ``ctx``'s device (VkPhysicalDeviceIDProperties): the UUID CUDA
    reports for the same GPU (cuDeviceGetUuid)."""
    return support(ctx).uuid


@functools.cache
def _listed_uuids() -> tuple[bytes, ...]:
    inst = device.create_instance()
    try:
        return tuple(_uuid_of(pd) for pd in device.physical_devices(inst))
    finally:
        binding.require().vkDestroyInstance(inst, None)


def device_uuids() -> list[bytes]:
    """The deviceUUID of every Vulkan device, in ``list_devices()`` order (index = SSM_VK_DEVICE);
    read once per process. Raises VulkanUnavailable without a loader or driver."""
    return list(_listed_uuids())


class ExportableBuffer(Buffer):
    """A storage buffer (see :class:`Buffer`) whose memory can be exported: :meth:`export_fd`.

    A dedicated allocation when the driver asks for one (``dedicated``; an importer must be told,
    e.g. CUDA_EXTERNAL_MEMORY_DEDICATED). ``alloc_size``: the size of the memory object, the size
    an importer gives; ``memory_type``: its memory type index (a Vulkan importer's). Never goes
    to a BufferPool (it is not one of the pool's size classes).

    Raises ValueError when the device cannot export (:func:`export_support` says why) or for a
    size above its limits; OutOfDeviceMemory when the allocation fails; as Buffer otherwise.
    """

    def __init__(self, ctx: Context, nbytes: int):
        if not isinstance(ctx, Context):
            raise TypeError(f"ctx: expected a Context, got {type(ctx).__name__}")
        nbytes = check_int("nbytes", nbytes, 1)
        sup = support(ctx)
        if not sup.ok:
            raise ValueError(f"exportable memory: {sup.reason}")
        limit = ctx.info.max_memory_allocation_size
        if nbytes > limit:
            raise ValueError(f"ExportableBuffer of {nbytes} bytes exceeds max_memory_allocation_size = {limit} bytes "
                             f"of {ctx.info.name}")
        vk = binding.require()
        ffi = vk.ffi
        lib = vk.lib
        self.ctx = ctx
        self.size = nbytes
        self.serial = next(serials)   # the process's one counter: cache keys never repeat
        self.staging = False
        self.closed = False
        self.mappable = False
        self.dedicated = False
        self.memory_type = -1
        self._buffer = self._memory = self._mapped = None
        device_ = ctx.handle
        external = ffi.new("VkExternalMemoryBufferCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO, "handleTypes": OPAQUE_FD})
        info = vk.VkBufferCreateInfo(pNext=external, size=nbytes, usage=_usage(vk),
                                     sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE)
        with binding.translated("vkCreateBuffer (exportable)"):
            self._buffer = vk.vkCreateBuffer(device_, info, None)
        try:
            dedicated_req = ffi.new("VkMemoryDedicatedRequirements*", {
                "sType": vk.VK_STRUCTURE_TYPE_MEMORY_DEDICATED_REQUIREMENTS})
            req = ffi.new("VkMemoryRequirements2*", {"sType": vk.VK_STRUCTURE_TYPE_MEMORY_REQUIREMENTS_2,
                                                     "pNext": dedicated_req})
            which = ffi.new("VkBufferMemoryRequirementsInfo2*", {
                "sType": vk.VK_STRUCTURE_TYPE_BUFFER_MEMORY_REQUIREMENTS_INFO_2, "buffer": self._buffer})
            lib.vkGetBufferMemoryRequirements2(device_, which, req)
            self._alloc_size = int(req.memoryRequirements.size)
            type_bits = int(req.memoryRequirements.memoryTypeBits)
            self.dedicated = bool(sup.dedicated_only or dedicated_req.requiresDedicatedAllocation
                                  or dedicated_req.prefersDedicatedAllocation)
            type_index, self.mappable = memory_type(ctx, type_bits, False)
            self.memory_type = type_index   # an importer of the same device allocates this type
            check_allocation(ctx, "ExportableBuffer", nbytes, self._alloc_size, type_index)
            chain = ffi.NULL
            if self.dedicated:
                chain = ffi.new("VkMemoryDedicatedAllocateInfo*", {
                    "sType": vk.VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO, "buffer": self._buffer})
            export = ffi.new("VkExportMemoryAllocateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_EXPORT_MEMORY_ALLOCATE_INFO, "pNext": chain, "handleTypes": OPAQUE_FD})
            alloc = vk.VkMemoryAllocateInfo(pNext=export, allocationSize=self._alloc_size, memoryTypeIndex=type_index)
            with binding.translated(f"vkAllocateMemory({self._alloc_size} bytes, exportable)"):
                self._memory = vk.vkAllocateMemory(device_, alloc, None)
            ctx.track_allocation(self._alloc_size, +1)
            with binding.translated("vkBindBufferMemory"):
                vk.vkBindBufferMemory(device_, self._buffer, self._memory, 0)
            if self.mappable:   # (lavapipe, integrated GPUs) transfers go straight through it, as for a Buffer
                with binding.translated("vkMapMemory"):
                    self._mapped = vk.vkMapMemory(device_, self._memory, 0, nbytes, 0)
            ctx.owned.adopt(self)
        except BaseException:
            self._release()
            raise

    @property
    def alloc_size(self) -> int:
        """Bytes of the exported memory object (at least ``size``): the size to give an importer."""
        return self._alloc_size

    def export_fd(self) -> int:
        """A new file descriptor of this buffer's memory (vkGetMemoryFdKHR, OPAQUE_FD). The caller
        owns it: an importer that succeeds takes it over (CUDA does); otherwise close it with
        os.close. Raises RuntimeError when the buffer is closed, VulkanError when the driver
        refuses."""
        if self.closed:
            raise RuntimeError("this ExportableBuffer is closed")
        self.ctx.check_usable()
        vk = binding.require()
        get_fd = _get_fd(self.ctx)
        info = vk.ffi.new("VkMemoryGetFdInfoKHR*", {"sType": vk.VK_STRUCTURE_TYPE_MEMORY_GET_FD_INFO_KHR,
                                                    "memory": self._memory, "handleType": OPAQUE_FD})
        with binding.translated("vkGetMemoryFdKHR"):
            return int(get_fd(self.ctx.handle, info))

    def __repr__(self) -> str:
        return (f"<ExportableBuffer #{self.serial} {self.size} B{' dedicated' if self.dedicated else ''}"
                f"{' closed' if self.closed else ''}>")


class _Functions:
    """The extension's function, loaded once per context (vkGetDeviceProcAddr through the binding,
    which wraps it: it returns the descriptor and raises on a failed VkResult)."""

    def __init__(self, ctx: Context):
        self.get_fd = binding.require().vkGetDeviceProcAddr(ctx.handle, "vkGetMemoryFdKHR")


def _get_fd(ctx: Context):
    return ctx.owned.extension("external-memory-functions", _Functions).get_fd

