"""The buffer pool: :class:`BufferPool`, which reuses device buffers by size class so that a
loop of same-shaped calls allocates once, and keeps a buffer that a call in flight reads until
that call is done (``busy`` / ``idle``).
"""

from __future__ import annotations

import itertools
import math
import threading

from . import binding
from .checks import check_int
from .context import Context
from .memory import Buffer
from .pieces import Pieces


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
        ctx.owned.adopt(self)
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
        call's outputs: docs/ARCHITECTURE.md, "Repeated calls", says what it saves). On a failure
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
            still.update(p.serial for bufs in list(self._busy.values()) for b in bufs if type(b) is Pieces
                         for p in b.buffers)
            for serial in [s for s in self._deferred if s not in still]:
                self._take_back(self._deferred.pop(serial))

    def release(self, buffer: Buffer) -> None:
        """Give ``buffer`` back for reuse (once no call marked :meth:`busy` reads it). Raises
        ValueError if it is not out from this pool."""
        with self._lock:
            if not isinstance(buffer, Buffer) or buffer.serial not in self._out or buffer.serial in self._deferred:
                if type(buffer) is Pieces:   # an array in pieces: each piece given back
                    for b in buffer.buffers:
                        self._release_locked(b)
                    return
                raise ValueError(f"release: {buffer!r} was not acquired from this pool (or was released already)")
            if self._busy and any(buffer in bufs for bufs in list(self._busy.values())):
                self._deferred[buffer.serial] = buffer
                return
            self._take_back(buffer)

    def _release_locked(self, buffer: Buffer) -> None:
        """:meth:`release` of one piece of an array in pieces (the caller holds the lock). (Only
        the pieces of a DeviceArray's Pieces can be marked busy, through it: they are given back
        here, never one by one; a workspace's own pieces are no call's input.)"""
        if buffer.serial not in self._out or buffer.serial in self._deferred:
            raise ValueError(f"release: {buffer!r} was not acquired from this pool (or was released already)")
        if self._busy and (any(buffer in bufs for bufs in list(self._busy.values())) or _in_pieces(buffer, self._busy)):
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
        self.ctx.owned.forget(self)

    def __enter__(self) -> BufferPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _in_pieces(buffer: Buffer, busy: dict) -> bool:
    """Whether ``buffer`` is a piece of an array in pieces that a call in flight reads (the marks
    of :meth:`BufferPool.busy` name the array, not its pieces)."""
    return any(type(b) is Pieces and buffer in b.buffers for bufs in list(busy.values()) for b in bufs)
