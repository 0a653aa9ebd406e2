"""Moving data between the host and device buffers: :func:`upload`, :func:`download` and
:func:`fill`, straight through the mapping of a host-visible buffer or through a staging buffer
and the context's one-shot command sequence (device-local memory of a discrete GPU); and
:class:`Stage`, the staging slots of recorded work whose host inputs and outputs move in the
same submission as the work itself (:func:`direct` says which buffers need none), made within the
context's budget of host memory for them (:class:`StageBudget`).

Transfers are synchronous. They do not wait for sequences submitted with ``wait=False``: do not
transfer into or out of a buffer that pending work uses.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

from . import binding, hostcopy
from .checks import check_int
from .commands import oneshot
from .memory import Buffer, check_range, fill_range
from .owned import Slot
from .pieces import Pieces

if TYPE_CHECKING:
    from .context import Context

__all__ = ["upload", "download", "fill", "release_staging", "direct", "Stage", "StageBudget", "stage_budget"]


def direct(buffer: Buffer) -> bool:
    """Whether host transfers of ``buffer`` copy straight through its mapping (device-local memory
    the host can map: lavapipe, integrated GPUs), not through staging copies (a discrete GPU, or
    the ``force_staging`` seam)."""
    return buffer.mappable and not buffer.ctx.seams.force_staging


def upload(buffer: Buffer, array, offset: int = 0) -> None:
    """Copy the bytes of ``array`` (C order) into ``buffer`` at byte ``offset``.

    Raises TypeError (not a buffer; an object array), ValueError (does not fit), RuntimeError
    (buffer or context closed), DeviceLost, VulkanTimeout.
    """
    data = np.ascontiguousarray(array)
    if data.dtype.hasobject:
        raise TypeError("upload: object arrays have no byte representation")
    try:
        offset = check_range(buffer, offset, data.nbytes, "upload")
    except TypeError:
        if type(buffer) is not Pieces:   # (tested only here: a Buffer's upload pays nothing for pieces)
            raise
        raw = data.reshape(-1).view(np.uint8)
        for b, off, at, n in buffer.parts(check_int("offset", offset), raw.size):
            upload(b, raw[at:at + n], off)
        return
    if data.nbytes == 0:
        return
    stats = buffer.ctx.stats
    stats.uploads += 1
    stats.uploaded_bytes += data.nbytes
    raw = data.reshape(-1).view(np.uint8)
    if buffer.mappable and not buffer.ctx.seams.force_staging:
        hostcopy.copy(np.frombuffer(buffer.mapping, np.uint8, raw.size, offset), raw)
        return
    _through_staging(buffer, offset, raw.size, raw, None)


def download(buffer: Buffer, what, offset: int = 0) -> np.ndarray:
    """A new array with bytes of ``buffer`` from byte ``offset``.

    ``what`` is a byte count (the result is uint8 of that length) or ``(shape, dtype)``.
    Raises TypeError/ValueError for a bad ``what`` or a range outside the buffer, RuntimeError
    (buffer or context closed), DeviceLost, VulkanTimeout.
    """
    if isinstance(what, tuple) and len(what) == 2:
        shape, dtype = what
        shape = (shape,) if isinstance(shape, int | np.integer) else tuple(shape)
        for n in shape:
            check_int("shape", n)
        dtype = np.dtype(dtype)
        if dtype.hasobject:
            raise TypeError("download: object dtypes have no byte representation")
    else:
        shape, dtype = (check_int("nbytes", what),), np.dtype(np.uint8)
    out = np.empty(shape, dtype)
    try:
        offset = check_range(buffer, offset, out.nbytes, "download")
    except TypeError:
        if type(buffer) is not Pieces:   # (as upload)
            raise
        raw = out.reshape(-1).view(np.uint8)
        for b, off, at, n in buffer.parts(check_int("offset", offset), raw.size):
            raw[at:at + n] = download(b, n, off)
        return out
    if out.nbytes == 0:
        return out
    raw = out.reshape(-1).view(np.uint8)
    if buffer.mappable and not buffer.ctx.seams.force_staging:
        hostcopy.copy(raw, np.frombuffer(buffer.mapping, np.uint8, raw.size, offset))
        return out
    _through_staging(buffer, offset, raw.size, None, raw)
    return out


def _through_staging(buffer: Buffer, offset: int, nbytes: int, source, target) -> None:
    """Move ``nbytes`` between host bytes and ``buffer`` in chunks of the context's staging buffer."""

    ctx = buffer.ctx
    with ctx.lock:  # one staging buffer per context
        staging = _staging_buffer(ctx, min(nbytes, ctx.staging_chunk_bytes))
        window = memoryview(staging.mapping)
        for start in range(0, nbytes, staging.size):
            n = min(staging.size, nbytes - start)
            if source is not None:
                hostcopy.copy(np.frombuffer(window, np.uint8, n), source[start:start + n])
            with oneshot(ctx) as seq:
                if source is not None:
                    seq.copy(staging, buffer, n, dst_offset=offset + start)
                else:
                    seq.copy(buffer, staging, n, src_offset=offset + start)
            if target is not None:
                hostcopy.copy(target[start:start + n], np.frombuffer(window, np.uint8, n))


def _staging_buffer(ctx: Context, nbytes: int) -> Buffer:
    slot = ctx.owned.extension("staging", Slot)
    staging = slot.obj
    if staging is None or staging.closed or staging.size < nbytes:
        slot.clear()
        staging = slot.obj = Buffer(ctx, nbytes, staging=True)
    return staging


def fill(buffer: Buffer, value: int, offset: int = 0, nbytes: int | None = None) -> None:
    """Set ``nbytes`` bytes from ``offset`` to repeats of the 32-bit word ``value`` (vkCmdFillBuffer),
    e.g. 0 to zero a buffer or 0x7FC00000 to poison it with float32 NaN.

    ``nbytes`` defaults to the rest of the buffer rounded down to a multiple of 4. Raises
    ValueError when offset or nbytes is not a multiple of 4 or the range does not fit, TypeError,
    RuntimeError, DeviceLost, VulkanTimeout.
    """

    if type(buffer) is Pieces:
        with oneshot(buffer.ctx) as seq:
            seq.fill(buffer, value, offset, nbytes)
        return
    offset, nbytes = fill_range(buffer, value, offset, nbytes)
    with oneshot(buffer.ctx) as seq:
        seq.fill(buffer, value, offset, nbytes)


def release_staging(ctx: Context) -> None:
    """Free the context's staging buffer (it is made again on the next staged transfer)."""
    slot = ctx.owned.extension("staging")
    if slot is not None:
        with ctx.lock:
            slot.clear()


_SLOT_ALIGN = 64   # a cache line: each slot starts on its own
_BUDGET_SHARE = 16  # the Stages of a context hold at most this share of the host memory heap


class StageBudget:
    """The host memory a context's Stages hold together: at most ``limit`` bytes (the larger of
    ``ctx.staging_chunk_bytes`` and a sixteenth of the heap that host-visible staging memory
    comes from; docs/KERNELS.md, "Calls", gives a GPU host's), ``held`` of them now. A Stage is pinned
    host memory the size of a workspace's host data (a training step's: several hundred MB), kept
    while its workspace is; the budget bounds what the cached workspaces (engine.MAX_WORKSPACES)
    hold together. A workspace beyond it moves its arrays one at a time through the context's
    staging buffer instead (hostdata.py). ``limit`` may be set (the tests lower it)."""

    def __init__(self, ctx: Context):
        self.lock = threading.Lock()
        self.held = 0
        self.limit = max(ctx.staging_chunk_bytes, _host_heap_bytes(ctx) // _BUDGET_SHARE)

    def take(self, nbytes: int) -> bool:
        """Reserve ``nbytes``; False (nothing reserved) when they would pass the limit."""
        with self.lock:
            if self.held + nbytes > self.limit:
                return False
            self.held += nbytes
            return True

    def give(self, nbytes: int) -> None:
        with self.lock:
            self.held -= nbytes


def stage_budget(ctx: Context) -> StageBudget:
    """The context's :class:`StageBudget` (made on first use)."""
    return ctx.owned.extension("stage_budget", StageBudget)


def _host_heap_bytes(ctx: Context) -> int:
    """The size of the largest heap of a host-visible, coherent memory type, preferring heaps of
    host memory (not device-local: a discrete GPU's staging memory) -- where Stages come from."""
    vk = binding.require()
    host = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
    ranked = [(not flags & vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, ctx.memory_heaps[heap][0])
              for flags, heap in ctx.memory_types if flags & host == host]
    return max(ranked)[1] if ranked else 0


class Stage:
    """Named slots of one host-visible staging buffer (``staging=True``: cached where the device
    offers it), for recorded work that moves its host data in the same submission as its compute:
    :meth:`put` copies an input's bytes into its slot on the host, :meth:`copy_in` records the copy
    from the slot into a device buffer, :meth:`copy_out` the copy of an output into its slot, and
    :meth:`take` reads it back after the wait -- nothing in between waits, and one submission
    carries the data both ways. :meth:`holds` compares host bytes with a slot's (memcmp), so a
    caller can tell that a device buffer filled from the slot still holds those very bytes.

    ``sizes``: {name: bytes}. Made by :meth:`within_budget`; lives until ``close()`` or the close
    of its context. Raises what :class:`Buffer` raises.
    """

    def __init__(self, ctx: Context, sizes: dict):
        offsets, total = _layout(sizes)
        self.slots = offsets
        self._budget = None   # the StageBudget its bytes were reserved from (within_budget)
        self.buffer = Buffer(ctx, total, staging=True)
        # the mapping's address, for memcmp (read only while the buffer is open: _window checks)
        self._base = np.frombuffer(self.buffer.mapping, np.uint8, 1).ctypes.data

    @classmethod
    def within_budget(cls, ctx: Context, sizes: dict):
        """A Stage of ``sizes`` when its bytes fit what is left of the context's StageBudget and
        one allocation (max_memory_allocation_size) and the driver gives that memory; else None
        (the caller moves its arrays one at a time instead: the same bytes, more submissions).
        Raises what :class:`Buffer` raises otherwise (DeviceLost, ...)."""
        total = _layout(sizes)[1]
        budget = stage_budget(ctx)
        if total > ctx.info.max_memory_allocation_size or not budget.take(total):
            return None
        try:
            stage = cls(ctx, sizes)
        except binding.OutOfDeviceMemory:   # (host memory, here): the per-array path needs 64 MiB at most
            budget.give(total)
            return None
        except BaseException:
            budget.give(total)
            raise
        stage._budget = budget
        return stage

    @property
    def closed(self) -> bool:
        return self.buffer.closed

    def _window(self, name: str, nbytes: int) -> int:
        """The byte offset of slot ``name``; raises ValueError when ``nbytes`` exceeds it,
        RuntimeError when the stage is closed."""
        if self.buffer.closed:
            raise RuntimeError("this Stage is closed")
        offset, size = self.slots[name]
        if nbytes > size:
            raise ValueError(f"Stage: {nbytes} bytes do not fit the {size} bytes of slot {name!r}")
        return offset

    def fits(self, name: str, nbytes: int) -> bool:
        slot = self.slots.get(name)
        return slot is not None and nbytes <= slot[1]

    def put(self, name: str, data: np.ndarray) -> None:
        """Copy the bytes of C-contiguous ``data`` into slot ``name`` (host only)."""
        offset = self._window(name, data.nbytes)
        window = np.frombuffer(self.buffer.mapping, np.uint8, data.nbytes, offset)
        hostcopy.copy(window, data.reshape(-1).view(np.uint8))
        stats = self.buffer.ctx.stats
        stats.uploads += 1
        stats.uploaded_bytes += data.nbytes

    def holds(self, name: str, data: np.ndarray) -> bool:
        """Whether slot ``name`` starts with exactly the bytes of C-contiguous ``data``."""
        offset = self._window(name, data.nbytes)
        same = hostcopy.equal(self._base + offset, data.ctypes.data, data.nbytes)
        if same is not None:
            return same
        mine = np.frombuffer(self.buffer.mapping, np.uint8, data.nbytes, offset)
        return bool(np.array_equal(mine, data.reshape(-1).view(np.uint8)))

    def take(self, name: str, shape: tuple, dtype=np.float32) -> np.ndarray:
        """A new array of ``shape`` and ``dtype`` with the bytes at the start of slot ``name``."""
        out = np.empty(shape, dtype)
        offset = self._window(name, out.nbytes)
        hostcopy.copy(out.reshape(-1).view(np.uint8), np.frombuffer(self.buffer.mapping, np.uint8, out.nbytes, offset))
        return out

    def copy_in(self, seq, name: str, dst: Buffer, nbytes: int, dst_offset: int = 0) -> None:
        """Record the copy of ``nbytes`` from slot ``name`` into ``dst`` at ``dst_offset``."""
        seq.copy(self.buffer, dst, nbytes, src_offset=self._window(name, nbytes), dst_offset=dst_offset)

    def copy_out(self, seq, name: str, src: Buffer, nbytes: int, src_offset: int = 0) -> None:
        """Record the copy of ``nbytes`` of ``src`` from ``src_offset`` into slot ``name``."""
        seq.copy(src, self.buffer, nbytes, src_offset=src_offset, dst_offset=self._window(name, nbytes))

    def close(self) -> None:
        self.buffer.close()
        budget, self._budget = self._budget, None
        if budget is not None:
            budget.give(self.buffer.size)


def _layout(sizes: dict) -> tuple:
    """({name: (offset, bytes)}, total bytes) of slots of ``sizes``, each on a cache line."""
    offsets, total = {}, 0
    for name, n in sizes.items():
        offsets[name] = (total, int(n))
        total += -(-int(n) // _SLOT_ALIGN) * _SLOT_ALIGN
    return offsets, max(total, 16)
