"""The arena of ssm_torch/cuda.py: the exported Vulkan buffers through which CUDA tensors reach
ssm_vk, one per role (each input, each output), imported into the other side once per growth, and
what the last forward left in them (:attr:`Arena.held`). The side (CUDA, or the tests' host
stand-in) does the import, the views and the ordering; this module only keeps the buffers.
"""

from __future__ import annotations

import contextlib
import threading

from ssm_vk.runtime import external

__all__ = ["Arena", "arena"]


class Slot:
    """One exported buffer, its import, and the tensors over it by shape (made once: a view made
    through ``__cuda_array_interface__`` costs torch more than the copy of a small input)."""

    def __init__(self, buffer, imported):
        self.buffer, self.imported = buffer, imported
        self.views: dict = {}

    def view(self, side, shape: tuple):
        v = self.views.get(shape)
        if v is None:
            if len(self.views) >= 8:   # shapes that change from call to call: keep a few
                self.views.clear()
            v = self.views[shape] = side.view(self.imported, shape)
        return v


class Arena:
    """The exported buffers one side uses with one Vulkan context: a slot per role (each input,
    each output), grown when a call needs more, imported once per growth. ``lock`` serialises the
    calls that use it; ``event`` marks the last reads of its memory by the other side; ``held``:
    (the signature of the forward inputs its slots hold, {name: DeviceArray over the slot}) since
    the last forward, None once a slot is written otherwise or freed. Closed with the context (or
    by ssm_torch.cuda.release_memory)."""

    _MIN = 1 << 16

    def __init__(self, ctx, side):
        self.ctx, self.side = ctx, side
        self.lock = threading.Lock()
        self.slots: dict[str, Slot] = {}
        self.event = None
        self.held = None
        self.closed = False
        ctx.owned.adopt(self)

    def slot(self, role: str, nbytes: int) -> Slot:
        """The slot of ``role``, at least ``nbytes`` big (a bigger one made when it is not; the
        caller holds ``lock`` and has passed ``side.before_writes``)."""
        s = self.slots.get(role)
        if s is not None and s.buffer.size >= nbytes:
            return s
        if s is not None:
            self.side.drain(self)
            self.held = None
            self._free(self.slots.pop(role))
        size = max(self._MIN, nbytes + nbytes // 4) if s is not None else max(self._MIN, nbytes)
        size = min(size, max(nbytes, self.ctx.info.max_memory_allocation_size))
        buffer = external.ExportableBuffer(self.ctx, size)
        try:
            imported = self.side.attach(buffer)
        except BaseException:
            buffer.close()
            raise
        s = self.slots[role] = Slot(buffer, imported)
        return s

    def _free(self, s: Slot) -> None:
        self.side.detach(s.imported)
        s.buffer.close()

    def trim(self) -> None:
        """Free every slot (the caller holds ``lock``); the next call makes them again."""
        with contextlib.suppress(Exception):
            self.side.drain(self)
        self.held = None
        slots, self.slots = list(self.slots.values()), {}
        for s in slots:
            self._free(s)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.trim()
        self.ctx.owned.forget(self)


def arena(ctx, side) -> Arena:
    return ctx.owned.extension(f"torch-arena:{side.key}", lambda c: Arena(c, side))
