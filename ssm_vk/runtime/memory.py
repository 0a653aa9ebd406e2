"""Device memory: :class:`Buffer`, and the checks of a range of one that transfers and fills
make (transfer.py moves the bytes; pool.py reuses buffers).

Each Buffer owns one VkBuffer bound to one VkDeviceMemory (no sub-allocation). Its memory type is
the first device-local one without HOST_VISIBLE when the device has one (a discrete GPU: host-
visible memory is slow for bulk data there: docs/VULKAN.md), else a device-local host-visible coherent one
(lavapipe, integrated GPUs). Buffers of the second kind are mapped once for their whole life and
transfers copy straight through the mapping; the others go through a staging buffer and a copy
command. The mapping never leaves the runtime: every transfer (transfer.py) copies into or out
of it, so no numpy view can outlive it (docs/VULKAN.md, the binding's sharp edge 7).
"""

from __future__ import annotations

import itertools

import numpy as np

from . import binding
from .checks import check_int
from .context import Context

serials = itertools.count(1)  # unique per process: cache keys must not reuse a freed handle's value


class Buffer:
    """A storage buffer on the device: ``size`` bytes, usable as a shader binding and as the
    source or destination of copies and fills. Its contents start undefined.

    Lives until ``close()``, the end of a ``with`` block, or the close of its context.
    ``staging=True`` (internal) makes a host-visible transfer buffer instead.

    Raises TypeError/ValueError for a bad size; ValueError for a size above
    ``ctx.info.max_memory_allocation_size`` (checked before any Vulkan call, so callers can split)
    or whose memory requirement exceeds that limit or its heap (checked before allocating);
    OutOfDeviceMemory when the allocation fails; DeviceLost or RuntimeError when the context
    cannot be used.
    """

    def __init__(self, ctx: Context, nbytes: int, *, staging: bool = False):
        if not isinstance(ctx, Context):
            raise TypeError(f"ctx: expected a Context, got {type(ctx).__name__}")
        nbytes = check_int("nbytes", nbytes, 1)
        limit = ctx.info.max_memory_allocation_size
        if nbytes > limit:
            raise ValueError(f"Buffer of {nbytes} bytes exceeds max_memory_allocation_size = {limit} bytes of "
                             f"{ctx.info.name}; split the data over several buffers")
        ctx.check_usable()
        vk = binding.require()
        self.ctx = ctx
        self.size = nbytes
        self.serial = next(serials)
        self.staging = staging
        self.closed = False
        self.mappable = False
        self._buffer = self._memory = self._mapped = None
        device = ctx.handle
        usage = vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
        if not staging:
            usage |= vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT
        info = vk.VkBufferCreateInfo(size=nbytes, usage=usage, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE)
        with binding.translated("vkCreateBuffer"):
            self._buffer = vk.vkCreateBuffer(device, info, None)
        try:
            req = vk.vkGetBufferMemoryRequirements(device, self._buffer)
            self._alloc_size, type_bits = int(req.size), int(req.memoryTypeBits)
            type_index, self.mappable = memory_type(ctx, type_bits, staging)
            check_allocation(ctx, "Buffer", nbytes, self._alloc_size, type_index)
            alloc = vk.VkMemoryAllocateInfo(allocationSize=self._alloc_size, memoryTypeIndex=type_index)
            with binding.translated(f"vkAllocateMemory({self._alloc_size} bytes)"):
                self._memory = vk.vkAllocateMemory(device, alloc, None)
            ctx.track_allocation(self._alloc_size, +1)
            with binding.translated("vkBindBufferMemory"):
                vk.vkBindBufferMemory(device, self._buffer, self._memory, 0)
            if self.mappable:
                with binding.translated("vkMapMemory"):
                    self._mapped = vk.vkMapMemory(device, self._memory, 0, nbytes, 0)  # explicit size (sharp edge 3)
            ctx.owned.adopt(self)
        except BaseException:
            self._release()
            raise

    @property
    def handle(self):
        """The VkBuffer. Raises RuntimeError when the buffer is closed."""
        if self.closed:
            raise RuntimeError("this Buffer is closed")
        return self._buffer

    @property
    def mapping(self):
        """The host mapping of a host-visible buffer (a cffi buffer: np.frombuffer views it), or
        None. Valid while the buffer is open."""
        return self._mapped

    def peek(self, nbytes: int, offset: int = 0) -> bytes | None:
        """``nbytes`` read straight from the mapping of a host-visible buffer (no copy command: for
        a few bytes the GPU wrote before a wait, such as a flag); None when the buffer is not
        mapped (read it with transfer.download). A staging buffer is host memory on every device,
        so the ``force_staging`` seam leaves it mapped. Raises RuntimeError when it is closed."""
        if self.closed:
            raise RuntimeError("this Buffer is closed")
        if self._mapped is None or (self.ctx.seams.force_staging and not self.staging):
            return None
        return bytes(self._mapped[offset:offset + nbytes])

    def close(self) -> None:
        """Free the buffer and its memory (waits for submitted work first). Idempotent."""
        if self.closed:
            return
        ctx = self.ctx
        if not ctx.lost and not ctx.closed:
            ctx.wait_idle()  # work in flight may still read this memory
        self.closed = True
        ctx.buffer_closed(self.serial)
        ctx.owned.forget(self)
        self._release()

    def _release(self) -> None:
        vk = binding.require()
        device = self.ctx.handle
        if self._mapped is not None:
            self._mapped = None
            vk.vkUnmapMemory(device, self._memory)
        if self._buffer is not None:
            vk.vkDestroyBuffer(device, self._buffer, None)
            self._buffer = None
        if self._memory is not None:
            vk.vkFreeMemory(device, self._memory, None)
            self._memory = None
            self.ctx.track_allocation(self._alloc_size, -1)

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "staging" if self.staging else "mapped" if self.mappable else "device"
        return f"<Buffer #{self.serial} {self.size} B {kind}{' closed' if self.closed else ''}>"


def memory_type(ctx: Context, type_bits: int, staging: bool) -> tuple[int, bool]:
    """(memory type index, map it directly?) for a buffer whose requirements allow ``type_bits``.

    Raises OutOfDeviceMemory when no allowed type fits (a driver bug rather than a user error).
    """
    vk = binding.require()
    local, visible = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
    coherent, cached = vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT
    host = visible | coherent
    allowed = [(i, flags) for i, (flags, _) in enumerate(ctx.memory_types) if type_bits >> i & 1]
    if staging:
        # cached: downloads read this memory from the CPU, uncached reads are very slow there.
        ranked = [(not flags & cached, i) for i, flags in allowed if flags & host == host]
    else:
        ranked = [(bool(flags & visible), i) for i, flags in allowed if flags & local]
    if not ranked:
        raise binding.OutOfDeviceMemory(f"no {'host-visible coherent' if staging else 'device-local'} memory type "
                                        f"in memoryTypeBits {type_bits:#x}")
    index = min(ranked)[1]
    return index, ctx.memory_types[index][0] & host == host


def check_allocation(ctx: Context, what: str, nbytes: int, alloc_size: int, type_index: int) -> None:
    """Before allocating ``alloc_size`` bytes of memory type ``type_index`` for a buffer of
    ``nbytes`` (``what``: its kind, for the message): ValueError above the device's
    max_memory_allocation_size or the type's heap; the injected allocation fault
    (``seams.fail_allocations``) as OutOfDeviceMemory."""
    limit = ctx.info.max_memory_allocation_size
    heap_size = ctx.memory_heaps[ctx.memory_types[type_index][1]][0]
    if alloc_size > min(limit, heap_size):
        raise ValueError(f"{what} of {nbytes} bytes needs {alloc_size} bytes of memory, above "
                         f"max_memory_allocation_size = {limit} or the heap's {heap_size} bytes")
    if ctx.seams.take_allocation_fault():
        raise binding.OutOfDeviceMemory(f"vkAllocateMemory({alloc_size} bytes) failed: "
                                        "VK_ERROR_OUT_OF_DEVICE_MEMORY (injected by fail_allocations)", -2)


# ---------------------------------------------------------------------------------------------
# The ranges transfers and fills address (transfer.py, commands.py)

def check_range(buffer: Buffer, offset, nbytes: int, what: str) -> int:
    if not isinstance(buffer, Buffer):
        raise TypeError(f"{what}: expected a Buffer, got {type(buffer).__name__}")
    if buffer.closed:
        raise RuntimeError(f"{what}: the Buffer is closed")
    offset = check_int("offset", offset)
    if offset + nbytes > buffer.size:
        raise ValueError(f"{what}: {nbytes} bytes at offset {offset} do not fit in a Buffer of {buffer.size} bytes")
    buffer.ctx.check_usable()
    return offset


def fill_range(buffer: Buffer, value: int, offset: int, nbytes: int | None) -> tuple[int, int]:
    """Check the arguments of a fill; return (offset, nbytes). Raises as :func:`fill` does."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 0 <= int(value) < 2**32:
        raise ValueError(f"fill: value must be a 32-bit unsigned int, got {value!r}")
    if not isinstance(buffer, Buffer):
        raise TypeError(f"fill: expected a Buffer, got {type(buffer).__name__}")
    offset = check_int("offset", offset)
    if nbytes is None:
        nbytes = max(0, buffer.size - offset) // 4 * 4
    nbytes = check_int("nbytes", nbytes, 1)
    if offset % 4 or nbytes % 4:
        raise ValueError(f"fill: offset ({offset}) and nbytes ({nbytes}) must be multiples of 4")
    return check_range(buffer, offset, nbytes, "fill"), nbytes
