"""Host-memory copies and compares of the transfers, on several CPU threads when they are large.

A host-array call on a discrete GPU moves its data twice: the CPU copies it between the caller's
arrays and the staging memory, the GPU between the staging memory and its own. One CPU thread
copies at or below what the link moves (less into freshly allocated pages), so the CPU's copies
would at least double the transfer time; split over a few threads (numpy and libc release the GIL
while they copy or compare) they run at the memory's speed (benchmarks/host_floor.py measures
both; the figures of a GPU host: docs/TORCH.md, "On a GPU"). Small copies stay on the calling
thread, where starting threads would cost more than it saves.

    copy(dst, src)        # uint8 arrays of one length
    equal(a_ptr, b_ptr, n)   # memcmp of n bytes, True when equal

Threads: ``SSM_VK_COPY_THREADS`` (ssm_vk.config; default the CPUs this process may run on, at most
8; 1 copies on the calling thread alone). A pool made on first use, made again in a forked child.
Every piece is finished before a call returns or raises: the staging memory may be unmapped next.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import threading

import numpy as np

from .. import config

__all__ = ["copy", "equal", "threads", "PARALLEL_BYTES"]

PARALLEL_BYTES = 4 << 20   # copies from this size are split over the threads
_PIECE = 1 << 20           # ... in pieces of at least this many bytes
_MAX_THREADS = 8

_lock = threading.Lock()
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_threads = 0
_retired: list = []   # smaller pools a caller may still be submitting to: left to idle, never shut


def threads() -> int:
    """How many threads a large copy uses (``SSM_VK_COPY_THREADS``, else min(CPUs, 8))."""
    n = config.copy_threads()
    if n:
        return n
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, _MAX_THREADS))


def _executor(n: int) -> concurrent.futures.ThreadPoolExecutor:
    """A pool of at least ``n`` threads (made bigger when the setting grew; a copy uses as many
    pieces as the setting says, whatever the pool's size)."""
    global _pool, _pool_threads
    with _lock:
        if _pool is None or _pool_threads < n:
            if _pool is not None:
                _retired.append(_pool)
            _pool, _pool_threads = concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="ssm_vk-copy"), n
        return _pool


def _forget_pool() -> None:   # a forked child has the pool objects but none of their threads
    global _pool, _pool_threads
    _pool, _pool_threads = None, 0
    _retired.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _pieces(nbytes: int) -> list[tuple[int, int]]:
    """The (start, stop) ranges a job of ``nbytes`` is split into (one where it stays whole)."""
    n = min(threads(), nbytes // _PIECE) if nbytes >= PARALLEL_BYTES else 1
    if n <= 1:
        return [(0, nbytes)]
    step = -(-nbytes // n)
    step += -step % 64   # each piece starts on a cache line of its own
    return [(i, min(i + step, nbytes)) for i in range(0, nbytes, step)]


def _split(nbytes: int, piece) -> list:
    """``piece(start, stop)`` over the pieces of ``nbytes``: the first on the calling thread, the
    others on the pool; their results in order, once every piece has ended."""
    pieces = _pieces(nbytes)
    if len(pieces) == 1:
        return [piece(0, nbytes)]
    pool = _executor(len(pieces) - 1)
    jobs = [pool.submit(piece, lo, hi) for lo, hi in pieces[1:]]
    try:
        first = piece(*pieces[0])
    finally:
        concurrent.futures.wait(jobs)
    return [first, *(j.result() for j in jobs)]


def copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[:] = src`` for 1-D uint8 arrays (or buffers' views) of one length."""
    if dst.size != src.size:
        raise ValueError(f"copy: {src.size} bytes into {dst.size}")
    _split(src.size, lambda lo, hi: np.copyto(dst[lo:hi], src[lo:hi]))


def _libc_memcmp():
    """libc's memcmp through ctypes (which releases the GIL in the call), or None."""
    try:
        fn = ctypes.CDLL(None).memcmp
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    fn.restype = ctypes.c_int
    return fn


_memcmp = _libc_memcmp()


def equal(a: int, b: int, nbytes: int) -> bool | None:
    """Whether the ``nbytes`` bytes at addresses ``a`` and ``b`` are equal; None where there is
    no C library to compare with (the caller compares otherwise)."""
    if _memcmp is None:
        return None
    return all(r == 0 for r in _split(nbytes, lambda lo, hi: _memcmp(a + lo, b + lo, hi - lo)))
