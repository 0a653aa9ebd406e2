"""DeviceArray: a float32 (or int32) array that lives in a Vulkan buffer.

``to_device(array)`` uploads; ``DeviceArray.numpy()`` downloads. When any input of ``ssm_scan`` /
``ssm_scan_back`` is a DeviceArray, the results are DeviceArrays on the same device, so a training
loop pays no host round trips. A DeviceArray owns its buffer (or views another's); the buffer goes
back to the context's pool when the owner is released -- explicitly with ``release()``, or when
the last Python reference goes (a weak reference's callback, as ``weakref.finalize``; not ``__del__``).
An array larger than one allocation is held in pieces (an rt.Pieces of pool buffers, cut as the
planners cut its shape: sizing.even_cuts), given back together.
"""

from __future__ import annotations

import math
import operator
import weakref

import numpy as np

from . import runtime as rt
from .sizing import Limits, device_cuts, piece_sizes

__all__ = ["DeviceArray", "check_live", "to_device", "upload_to", "pool", "empty", "pieces"]

_F32 = np.dtype(np.float32)
_INTS = frozenset([int])  # the types of a shape of Python ints

def pool(ctx: rt.Context) -> rt.BufferPool:
    """The buffer pool of ``ctx``: one per context, made on first use, closed with it."""
    return ctx.owned.extension("pool", rt.BufferPool)


def _dims(what: str, shape) -> tuple:
    """``shape`` as a tuple of non-negative Python ints (numpy integers converted exactly, never
    wrapped); TypeError / ValueError naming ``what`` otherwise."""
    out = []
    for n in shape:
        if isinstance(n, bool):
            raise TypeError(f"{what}: dimensions must be integers, got {n!r}")
        try:
            n = operator.index(n)
        except TypeError:
            raise TypeError(f"{what}: dimensions must be integers, got {type(n).__name__} {n!r}") from None
        if n < 0:
            raise ValueError(f"{what}: dimensions must be >= 0, got {tuple(shape)}")
        out.append(n)
    return tuple(out)


# The _Releases not yet run, by their id. Holding them here keeps them (weak references) alive
# until they run, so an owner collected in a garbage cycle still gives its buffer back -- what
# weakref.finalize's registry guarantees.
_pending: dict[int, _Release] = {}


class _Release(weakref.ref):
    """A weak reference to an owning DeviceArray that gives the owner's buffer back to the pool,
    once: when ``release()`` runs it or when the owner is collected (its callback), whichever
    comes first. ``alive`` until then. Made by :func:`_track`.

    The part of ``weakref.finalize`` that DeviceArray used, at a fraction of its cost (a small
    backward makes seven DeviceArrays: docs/ARCHITECTURE.md, "Repeated calls"); the
    reference itself carries the buffer, so an output costs one object besides itself. Thread-
    safe as finalize: the registry's ``pop`` decides the one caller that runs it. Nothing runs at
    interpreter exit (finalize's atexit pass): the context's own atexit close frees every buffer.
    """

    __slots__ = ("_buf", "_pool", "alive")

    def run(self) -> None:
        self.alive = False  # False from the moment it starts running
        _collected(self)


def _collected(ref, _pending=_pending) -> None:
    # The callback of a _Release (any thread, from a garbage collection too), and what release()
    # runs: the registry's pop decides the one caller that gives the buffer back. The pool (closed
    # with its context) may be gone already. Bound as defaults: still callable while the
    # interpreter tears the module down.
    if _pending.pop(id(ref), None) is ref:
        ref.alive = False
        buffers, buf = ref._pool, ref._buf
        if buffers.closed or buf.closed:
            return
        try:
            buffers.release(buf)
        except ValueError:
            pass


def _track(owner, ctx, buf) -> _Release:
    """The _Release of ``owner``, an owning DeviceArray of ``buf``."""
    release = _Release(owner, _collected)
    release._pool = pool(ctx)
    release._buf = buf
    release.alive = True
    _pending[id(release)] = release
    return release


class DeviceArray:
    """An array in device memory. Attributes: ``shape``, ``dtype``, ``device`` (index), ``where``
    ("Vulkan<i>"), ``size``, ``nbytes``, ``ndim``. Methods: ``numpy()``, ``write(values)``,
    ``reshape()``, ``view(start, shape)``, ``release()``.

    Internal fields: ``buffer`` (a runtime Buffer; an rt.Pieces beyond one allocation; None when
    empty) and ``offset`` (elements from the start of the buffer).
    """

    _ssm_device_array = True
    _writes = 0   # an owner's count of writes from the host (write, _write_rows): see ``writes``

    def __init__(self, ctx, buffer, shape, dtype=np.float32, offset: int = 0, base=None, owned: bool = True):
        self.ctx = ctx
        self.buffer = buffer
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.offset = int(offset)
        self._base = base  # the owner a view keeps alive
        self._finalizer = None
        if base is None and buffer is not None and owned:
            self._finalizer = _track(self, ctx, buffer)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @classmethod
    def _from_pool(cls, ctx, buffer, shape: tuple, buffers=None) -> DeviceArray:
        """What ``DeviceArray(ctx, buffer, shape)`` makes, for a float32 ``buffer`` the caller
        just acquired from ``ctx``'s pool and a ``shape`` that is a tuple of Python ints: the
        per-call outputs of ssm_vk, without the argument conversions."""
        self = object.__new__(cls)
        self.ctx = ctx
        self.buffer = buffer
        self.shape = shape
        self.dtype = _F32
        self.offset = 0
        self._base = None
        if buffer is None:
            self._finalizer = None
            return self
        # _track(self, ctx, buffer), inlined (each output of each call)
        release = self._finalizer = _Release(self, _collected)
        release._pool = pool(ctx) if buffers is None else buffers
        release._buf = buffer
        release.alive = True
        _pending[id(release)] = release
        return self

    @property
    def size(self) -> int:
        return math.prod(self.shape)  # a tuple of Python ints (__init__)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def device(self) -> int:
        return self.ctx.info.index

    @property
    def where(self) -> str:
        return self.ctx.info.where

    @property
    def owner(self) -> DeviceArray:
        """The DeviceArray that owns the buffer: this one, or the one a view was taken of."""
        return self._base or self

    @property
    def writes(self) -> int:
        """How many times the host has written the owner's buffer (``write``, and a fallback's
        cache rows): what a forward's tables were computed from is stale once it has changed."""
        return self.owner._writes

    def _written(self) -> None:
        owner = self.owner
        owner._writes = owner._writes + 1

    def live(self) -> bool:
        """Whether the array may still be read: not released, its buffer and context open."""
        release = (self._base or self)._finalizer
        return not ((release is not None and not release.alive) or self.ctx.closed
                    or (self.buffer is not None and self.buffer.closed))

    @property
    def released(self) -> bool:
        owner = self._base or self
        return owner.buffer is not None and owner._finalizer is not None and not owner._finalizer.alive

    def _check_live(self) -> None:
        check_live((self,))

    def numpy(self) -> np.ndarray:
        """A host copy (a new, writable numpy array)."""
        if self.size == 0:
            return np.zeros(self.shape, dtype=self.dtype)
        self._check_live()
        ctx = self.ctx
        token = ctx.enter()
        try:
            out = rt.download(self.buffer, ((self.size,), self.dtype), self.offset * self.dtype.itemsize)
        finally:
            ctx.leave(token)
        return out.reshape(self.shape)

    def write(self, values) -> None:
        """Overwrite the array with ``values`` (its shape; real numbers, rounded to float32 as
        to_device does, or integers for an int32 array), uploaded from the host: the way to give a prepared call
        (``ssm_vk.prepare_scan``) new inputs in place. Raises ValueError for another shape or
        non-real values, RuntimeError when released."""
        data = np.asarray(values)
        if data.shape != self.shape:
            raise ValueError(f"write: values of shape {data.shape} into a DeviceArray of shape {self.shape}")
        if data.dtype.kind not in ("iub" if self.dtype.kind == "i" else "fiub"):
            raise ValueError(f"write: values of dtype {data.dtype} into a DeviceArray of {self.dtype}")
        self._check_live()
        if self.size == 0:
            return
        data = np.ascontiguousarray(data, dtype=self.dtype)
        self._written()
        ctx = self.ctx
        token = ctx.enter()
        try:
            rt.upload(self.buffer, data.reshape(-1), self.offset * self.dtype.itemsize)
        finally:
            ctx.leave(token)

    def _write_rows(self, rows, values) -> None:
        """self[rows[i]] = values[i] along the first axis, uploaded from the host (ssm_scan's
        update_cache when the call ran on the CPU). ``rows`` distinct and in range (checked by
        the caller); ``values`` (len(rows), *shape[1:]), rounded to float32."""
        self._check_live()
        data = np.ascontiguousarray(values, dtype=self.dtype)
        row = self.size // self.shape[0] if self.shape and self.shape[0] else 0
        if row == 0:
            return
        self._written()
        ctx = self.ctx
        token = ctx.enter()
        try:
            for i, r in enumerate(rows):
                rt.upload(self.buffer, data[i], (self.offset + int(r) * row) * self.dtype.itemsize)
        finally:
            ctx.leave(token)

    def reshape(self, *shape) -> DeviceArray:
        """The same elements in another shape (no copy). Raises TypeError for a dimension that is
        not an integer, ValueError for a negative one or another element count."""
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        if not _INTS.issuperset(map(type, shape)) or (shape and min(shape) < 0):
            shape = _dims("reshape", shape)  # numpy integers and the rest: checked, as Python ints
        if math.prod(shape) != math.prod(self.shape):
            raise ValueError(f"cannot reshape a DeviceArray of shape {self.shape} to {shape}")
        return self._int_view(shape, self.offset)

    def view(self, start: int, shape) -> DeviceArray:
        """Elements [start, start + prod(shape)) of this array (flattened), shaped; no copy.
        Raises TypeError for a start or dimension that is not an integer, ValueError for a
        negative one or a range outside the array."""
        shape = _dims("view", tuple(shape) if isinstance(shape, tuple | list) else (shape,))
        try:
            start = operator.index(start)
        except TypeError:
            raise TypeError(f"view: start must be an integer, got {type(start).__name__}") from None
        n = math.prod(shape)
        if start < 0 or start + n > self.size:
            raise ValueError(f"view [{start}, {start + n}) outside a DeviceArray of {self.size} elements")
        return self._int_view(shape, self.offset + start)

    def _int_view(self, shape: tuple, offset: int) -> DeviceArray:
        """``_view`` of a tuple of Python ints and an int offset."""
        v = object.__new__(DeviceArray)
        v.ctx = self.ctx
        v.buffer = self.buffer
        v.shape = shape
        v.dtype = self.dtype
        v.offset = offset
        v._base = self._base or self
        v._finalizer = None
        return v

    def release(self) -> None:
        """Give the buffer back to the pool now. Views of it become invalid. Idempotent."""
        owner = self._base or self
        if owner._finalizer is not None:
            owner._finalizer.run()

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, where={self.where!r})"


def check_live(arrays) -> None:
    """``a._check_live()`` for each DeviceArray of ``arrays`` (None entries skipped), in one call:
    the inputs of a call that came through a kept replay, each call."""
    for a in arrays:
        if a is None:
            continue
        release = (a._base or a)._finalizer
        if ((release is not None and not release.alive) or a.ctx.closed
                or (a.buffer is not None and a.buffer.closed)):
            raise RuntimeError("this DeviceArray was released (or its Vulkan context closed)")


def empty(ctx, shape, dtype=np.float32) -> DeviceArray:
    """An uninitialised DeviceArray from the pool (no buffer when it has no elements); beyond one
    allocation (maxMemoryAllocationSize, or the largest device-local heap), in pieces
    (rt.Pieces: cut as the planners cut, sizing.even_cuts)."""
    shape = tuple(int(s) for s in shape)
    itemsize = np.dtype(dtype).itemsize
    n = math.prod(shape) * itemsize
    # (beyond one allocation: cut as the token-sequential forward's windows would, each piece at
    # most one binding, token ranges a multiple of the checkpoint interval)
    starts = device_cuts(shape, itemsize, Limits.of(ctx.info))
    if starts is not None:
        return DeviceArray(ctx, pieces(ctx, n, starts), shape, dtype)
    buf = pool(ctx).acquire(n) if n else None
    return DeviceArray(ctx, buf, shape, dtype)


def pieces(ctx, nbytes: int, starts: tuple) -> rt.Pieces:
    """An rt.Pieces of ``nbytes`` cut at byte offsets ``starts``, its buffers from the pool (all of
    them given back when one cannot be had). The owner gives it back whole (BufferPool.release)."""
    buffers = pool(ctx)
    got = []
    try:
        for n in piece_sizes(nbytes, starts):
            got.append(buffers.acquire(n))
    except BaseException:
        for b in got:
            buffers.release(b)
        raise
    return rt.Pieces(got, starts, nbytes)


def to_device(array, device=None) -> DeviceArray:
    """Upload ``array`` to the Vulkan device (``device``: an index, default the process's device).

    Float arrays become float32, integer arrays int32 (for ids). Raises TypeError for other
    dtypes, ValueError when ``device`` is not the device in use, VulkanUnavailable without Vulkan.
    """
    ctx = rt.get_context()
    if device is not None and int(device) != ctx.info.index:
        raise ValueError(f"device: this process uses Vulkan device {ctx.info.index} ({ctx.info.name}); "
                         f"set SSM_VK_DEVICE before the first call to use another, got {device}")
    if isinstance(array, DeviceArray):
        return array
    return upload_to(ctx, array)


def upload_to(ctx, array) -> DeviceArray:
    """``to_device(array)`` on the context ``ctx`` (raises as to_device)."""
    a = np.asarray(array)
    if a.dtype.kind == "f":
        a = np.ascontiguousarray(a, dtype=np.float32)
    elif a.dtype.kind in "iu":
        if a.size and (a.min() < -(2**31) or a.max() >= 2**31):
            raise ValueError("to_device: integer values must fit in int32")
        a = np.ascontiguousarray(a, dtype=np.int32)
    else:
        raise TypeError(f"to_device: expected a float or integer array, got dtype {a.dtype}")
    token = ctx.enter()
    try:
        out = empty(ctx, a.shape, a.dtype)
        if a.size:
            rt.upload(out.buffer, a)
    finally:
        ctx.leave(token)
    return out
