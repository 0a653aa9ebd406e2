"""Device memory: :class:`Buffer`, host transfers (:func:`upload`, :func:`download`, :func:`fill`)
and :class:`BufferPool`.

Each Buffer owns one VkBuffer bound to one VkDeviceMemory (no sub-allocation). Its memory type is
the first device-local one without HOST_VISIBLE when the device has one (a discrete GPU: host-
visible memory is slow for bulk data there: docs/VULKAN.md), else a device-local host-visible coherent one
(lavapipe, integrated GPUs). Buffers of the second kind are mapped once for their whole life and
transfers copy straight through the mapping; the others go through a staging buffer and a copy
command. The mapping never leaves this module: every transfer copies into or out of it, so no
numpy view can outlive it (docs/VULKAN.md, the binding's sharp edge 7).

Transfers are synchronous. They do not wait for sequences submitted with ``wait=False``: do not
transfer into or out of a buffer that pending work uses.
"""

from __future__ import annotations

import itertools
import math
import threading

import numpy as np

from . import binding
from .checks import check_int
from .context import Context

_serials = itertools.count(1)  # unique per process: cache keys must not reuse a freed handle's value


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
        self.serial = next(_serials)
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
            type_index, self.mappable = _memory_type(ctx, type_bits, staging)
            heap_size = ctx.memory_heaps[ctx.memory_types[type_index][1]][0]
            if self._alloc_size > min(limit, heap_size):
                raise ValueError(f"Buffer of {nbytes} bytes needs {self._alloc_size} bytes of memory, above "
                                 f"max_memory_allocation_size = {limit} or the heap's {heap_size} bytes")
            if ctx.take_allocation_fault():
                raise binding.OutOfDeviceMemory(f"vkAllocateMemory({self._alloc_size} bytes) failed: "
                                                "VK_ERROR_OUT_OF_DEVICE_MEMORY (injected by fail_allocations)", -2)
            alloc = vk.VkMemoryAllocateInfo(allocationSize=self._alloc_size, memoryTypeIndex=type_index)
            with binding.translated(f"vkAllocateMemory({self._alloc_size} bytes)"):
                self._memory = vk.vkAllocateMemory(device, alloc, None)
            ctx.track_allocation(self._alloc_size, +1)
            with binding.translated("vkBindBufferMemory"):
                vk.vkBindBufferMemory(device, self._buffer, self._memory, 0)
            if self.mappable:
                with binding.translated("vkMapMemory"):
                    self._mapped = vk.vkMapMemory(device, self._memory, 0, nbytes, 0)  # explicit size (sharp edge 3)
            ctx.adopt(self)
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
        mapped (read it with transfer.download). Raises RuntimeError when it is closed."""
        if self.closed:
            raise RuntimeError("this Buffer is closed")
        if self._mapped is None or self.ctx.force_staging:
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
        ctx.forget(self)
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


def _memory_type(ctx: Context, type_bits: int, staging: bool) -> tuple[int, bool]:
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


# ---------------------------------------------------------------------------------------------
# Transfers

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


class BufferPool:
    """Reuses buffers by size class, so a loop of same-shaped calls allocates once.

    ``acquire(n)`` returns a Buffer of at least ``n`` bytes (its ``size`` is the class size: the
    next 2^k or 1.5·2^k, at least 256; when the driver is out of memory it frees the idle buffers
    and tries once more); ``release(buffer)`` takes it back for reuse; ``trim()``
    frees the buffers not in use; ``close()`` frees every buffer the pool made, in use or not.
    Reused buffers keep their identity, so the descriptor sets cached for them stay valid.
    ``reused`` counts acquisitions served without allocating; ``in_use`` the buffers out now.

    Thread safety: every method may be called from any thread, and ``release`` also from a
    garbage-collector finalizer that interrupts another pool call on the same thread. The pool's
    lock is re-entrant and a leaf: nothing else is locked while it is held (buffers are created and
    closed outside it), so it cannot deadlock with ``ctx.lock``.
    """

    def __init__(self, ctx: Context):
        if not isinstance(ctx, Context):
            raise TypeError(f"ctx: expected a Context, got {type(ctx).__name__}")
        ctx.adopt(self)
        self.ctx = ctx
        self.closed = False
        self.reused = 0
        self._lock = threading.RLock()
        self._free: dict[int, list[Buffer]] = {}
        self._made: dict[int, Buffer] = {}      # serial → every live buffer of this pool
        self._out: set[int] = set()             # serials acquired and not released
        self._classes: dict[int, int] = {}      # request → size_class(request), for those acquire() has seen
        self._reserved: set[int] = set()        # serials kept for acquire_set (reserve())
        self._kept: dict[int, Buffer] = {}      # reserved buffers that are free, by serial
        self._busy: dict[int, tuple] = {}       # token -> buffers a call in flight reads (busy())
        self._deferred: dict[int, Buffer] = {}  # released while busy: taken back when the call ends
        self._tokens = itertools.count(1)

    @staticmethod
    def size_class(nbytes: int) -> int:
        """The buffer size serving a request of ``nbytes``: at most a third more than asked."""
        if nbytes <= 256:
            return 256
        k = math.ceil(math.log2(nbytes))
        return 3 << (k - 2) if nbytes <= 3 << (k - 2) else 1 << k

    @property
    def in_use(self) -> int:
        """How many buffers are acquired and not released (for leak tests)."""
        with self._lock:
            return len(self._out)

    def acquire(self, nbytes: int) -> Buffer:
        """A buffer of at least ``nbytes``. Raises what :class:`Buffer` raises, RuntimeError when closed."""
        nbytes = check_int("nbytes", nbytes, 1)
        size = self.size_class(nbytes)
        if type(nbytes) is int and len(self._classes) < 1024:
            self._classes[nbytes] = size  # for acquire_all
        if size > self.ctx.info.max_memory_allocation_size >= nbytes:
            size = nbytes  # never round a legal request up past the limit
        with self._lock:
            self._check_open()
            free = self._free.get(size, [])
            while free and free[-1].closed:  # closed behind the pool's back
                self._made.pop(free.pop().serial, None)
            if free:
                buffer = free.pop()
                self.reused += 1
                self._out.add(buffer.serial)
                return buffer
        try:
            buffer = Buffer(self.ctx, size)  # outside the lock: allocating may take long, and wait
        except binding.OutOfDeviceMemory:
            # The driver is out of memory: give back the buffers this pool keeps idle, try once more.
            self.trim()
            buffer = Buffer(self.ctx, size)
        with self._lock:
            closed = self.closed
            if not closed:
                self._made[buffer.serial] = buffer
                self._out.add(buffer.serial)
        if closed:  # the pool closed meanwhile
            buffer.close()
            self._check_open()
        return buffer

    def acquire_all(self, sizes) -> list[Buffer]:
        """``[acquire(n) for n in sizes]``, the buffers the pool has free taken under one lock (a
        call's outputs: seven acquisitions one at a time cost ~15 us from Python). On a failure
        the buffers already taken go back and the exception is raised."""
        out: list = [None] * len(sizes)
        classes = self._classes
        limit = self.ctx.info.max_memory_allocation_size
        with self._lock:
            self._check_open()
            for i, n in enumerate(sizes):
                size = classes.get(n)
                if size is None:
                    break  # a request not seen before: acquire() checks it and works out its class
                if size > limit >= n:
                    size = n  # as acquire() does
                free = self._free.get(size)
                while free and free[-1].closed:  # closed behind the pool's back
                    self._made.pop(free.pop().serial, None)
                if free:
                    buffer = out[i] = free.pop()
                    self.reused += 1
                    self._out.add(buffer.serial)
        try:
            for i, n in enumerate(sizes):
                if out[i] is None:
                    out[i] = self.acquire(n)
        except BaseException:
            for buffer in out:
                if buffer is not None:
                    self.release(buffer)
            raise
        return out

    def reserve(self, buffers) -> None:
        """Keep ``buffers`` (out now) for :meth:`acquire_set`: once released they wait apart,
        and neither ``acquire`` nor ``acquire_all`` hands them out (``trim`` still frees them)."""
        with self._lock:
            for buffer in buffers:
                self._reserved.add(buffer.serial)

    def unreserve(self, buffers) -> None:
        """Give reserved ``buffers`` back to general use (the free ones to the free lists)."""
        with self._lock:
            for buffer in buffers:
                self._reserved.discard(buffer.serial)
                if self._kept.pop(buffer.serial, None) is not None and not buffer.closed:
                    self._free.setdefault(buffer.size, []).append(buffer)

    def acquire_set(self, candidates) -> list[Buffer] | None:
        """The first of ``candidates`` (lists of reserved buffers) whose buffers are all free,
        taken out of the pool at once; None when none is. A caller that records commands per set
        of buffers keeps replaying while it cycles through the sets it recorded for (a loop that
        holds its last results while it calls again needs two), and no other caller's
        acquisitions break a set up."""
        with self._lock:
            if self.closed:
                self._check_open()
            kept = self._kept
            for cand in candidates:
                for b in cand:   # (a loop, not all() of a generator: each call)
                    if b.serial not in kept or b.closed:
                        break
                else:
                    for b in cand:
                        del kept[b.serial]
                        self._out.add(b.serial)
                    self.reused += len(cand)
                    return list(cand)
        return None

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this BufferPool is closed")

    def busy(self, buffers: tuple) -> int:
        """Mark ``buffers`` as read by work in flight until :meth:`idle` of the returned token: a
        buffer released meanwhile (its DeviceArray released by another thread) is taken back only
        then, so no acquisition hands it out -- and no upload overwrites it -- under the GPU.

        No lock (each call, each input): a counter's next() and one dict store are atomic, and
        :meth:`release` reads a snapshot of the marks under the pool's lock. A release that did
        not see a mark yet happened before it; the caller checks its arrays' liveness after
        marking them, so it sees that release and refuses the call."""
        token = next(self._tokens)
        self._busy[token] = buffers
        return token

    def idle(self, token: int) -> None:
        """End :meth:`busy`: the buffers released while busy (and busy for no other call) are
        taken back now."""
        self._busy.pop(token, None)
        if not self._deferred:
            return
        with self._lock:
            still = {b.serial for bufs in list(self._busy.values()) for b in bufs}
            for serial in [s for s in self._deferred if s not in still]:
                self._take_back(self._deferred.pop(serial))

    def release(self, buffer: Buffer) -> None:
        """Give ``buffer`` back for reuse (once no call marked :meth:`busy` reads it). Raises
        ValueError if it is not out from this pool."""
        with self._lock:
            if not isinstance(buffer, Buffer) or buffer.serial not in self._out or buffer.serial in self._deferred:
                raise ValueError(f"release: {buffer!r} was not acquired from this pool (or was released already)")
            if self._busy and any(buffer in bufs for bufs in list(self._busy.values())):
                self._deferred[buffer.serial] = buffer
                return
            self._take_back(buffer)

    def _take_back(self, buffer: Buffer) -> None:
        """Back to the free lists (the caller holds the lock)."""
        serial = buffer.serial
        self._out.discard(serial)
        if buffer.closed:
            self._made.pop(serial, None)
        elif serial in self._reserved:
            self._kept[serial] = buffer
        else:
            free = self._free.get(buffer.size)
            if free is None:
                free = self._free[buffer.size] = []
            free.append(buffer)

    def trim(self) -> None:
        """Free every buffer not in use."""
        with self._lock:
            idle = [b for buffers in self._free.values() for b in buffers] + list(self._kept.values())
            self._free.clear()
            self._kept.clear()
            for buffer in idle:
                self._made.pop(buffer.serial, None)
        for buffer in idle:
            buffer.close()

    def close(self) -> None:
        """Free every buffer this pool made. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            made = list(self._made.values())
            self._made.clear()
            self._free.clear()
            self._out.clear()
            self._kept.clear()
            self._reserved.clear()
            self._busy.clear()
            self._deferred.clear()
        for buffer in made:
            buffer.close()
        self.ctx.forget(self)

    def __enter__(self) -> BufferPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
