"""The host side of the transfers (ssm_vk.runtime.hostcopy): large copies and compares split over
threads give exactly what one thread gives, a difference in any piece is found, every piece has
ended when a call returns or raises, the thread count's default (its checks: test_vk_settings.py), and a staged
transfer of more than one piece per thread round-trips through a Vulkan buffer."""

from __future__ import annotations

import itertools
import os
import threading

import numpy as np
import pytest

from ssm_vk import runtime as rt
from ssm_vk.runtime import hostcopy, transfer

BIG = hostcopy.PARALLEL_BYTES * 2 + 4099   # several pieces, the last one short and odd


@pytest.fixture(params=[1, 3, 8])
def copy_threads(request, monkeypatch):
    monkeypatch.setenv("SSM_VK_COPY_THREADS", str(request.param))
    return request.param


def test_a_split_copy_writes_every_byte_and_no_other(copy_threads):
    rng = np.random.default_rng(copy_threads)
    src = rng.integers(0, 256, BIG, dtype=np.uint8)
    dst = np.full(BIG + 128, 0xA5, np.uint8)
    hostcopy.copy(dst[64:64 + BIG], src)
    assert np.array_equal(dst[64:64 + BIG], src)
    assert np.all(dst[:64] == 0xA5) and np.all(dst[64 + BIG:] == 0xA5)


def test_the_pieces_cover_the_copy_once():
    for n in (hostcopy.PARALLEL_BYTES - 1, hostcopy.PARALLEL_BYTES, BIG, 64 << 20):
        pieces = hostcopy._pieces(n)
        if len(pieces) == 1:
            assert n < hostcopy.PARALLEL_BYTES or hostcopy.threads() == 1
        assert pieces[0][0] == 0 and pieces[-1][1] == n
        assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
        assert len(pieces) <= hostcopy.threads()


@pytest.mark.parametrize("where", [0, hostcopy.PARALLEL_BYTES + 17, BIG - 1])
def test_a_split_compare_finds_one_byte_anywhere(copy_threads, where):
    a = np.arange(BIG, dtype=np.int64).astype(np.uint8)
    b = a.copy()
    assert hostcopy.equal(a.ctypes.data, b.ctypes.data, BIG) is True
    b[where] ^= 1
    assert hostcopy.equal(a.ctypes.data, b.ctypes.data, BIG) is False


def test_a_failed_copy_raises_after_its_pieces_ended(monkeypatch):
    monkeypatch.setenv("SSM_VK_COPY_THREADS", "4")
    src = np.ones(BIG, np.uint8)
    running = []
    real = np.copyto

    def slow(dst, s):   # the pool's pieces still running when the caller's own piece fails
        if threading.current_thread() is threading.main_thread():
            raise MemoryError("the caller's piece")
        running.append(1)
        try:
            threading.Event().wait(0.05)
            real(dst, s)
        finally:
            running.pop()

    monkeypatch.setattr(hostcopy.np, "copyto", slow)
    with pytest.raises(MemoryError, match="the caller's piece"):
        hostcopy.copy(np.empty(BIG, np.uint8), src)
    assert running == []
    with pytest.raises(ValueError, match="copy: 10 bytes into 9"):
        hostcopy.copy(np.empty(9, np.uint8), np.ones(10, np.uint8))


def test_the_default_is_the_usable_cpus_at_most_eight(monkeypatch):
    monkeypatch.delenv("SSM_VK_COPY_THREADS", raising=False)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert hostcopy.threads() == max(1, min(cpus, 8))


@pytest.mark.vulkan
def test_a_large_staged_round_trip(ctx, copy_threads):
    ctx.seams.force_staging, ctx.staging_chunk_bytes = True, BIG - 4096   # two chunks, each split
    try:
        data = np.random.default_rng(5).integers(0, 256, BIG + 8, dtype=np.uint8)
        with rt.Buffer(ctx, BIG + 16) as buf:
            rt.upload(buf, data, 8)
            assert np.array_equal(rt.download(buf, data.size, 8), data)
        stage = rt.Stage(ctx, {"a": BIG, "b": 16})
        try:
            f = data[:BIG].view(np.uint8)
            stage.put("a", f)
            assert stage.holds("a", f)
            assert np.array_equal(stage.take("a", (BIG,), np.uint8), f)
            g = f.copy()
            g[-1] ^= 0xFF
            assert not stage.holds("a", g)
        finally:
            stage.close()
    finally:
        ctx.seams.force_staging, ctx.staging_chunk_bytes = False, 64 << 20
        transfer.release_staging(ctx)


def test_copies_from_several_threads_at_once(monkeypatch):
    # callers on four threads share the pool (and one of them grows it midway)
    import concurrent.futures

    monkeypatch.setenv("SSM_VK_COPY_THREADS", "3")
    rng = np.random.default_rng(9)
    sources = [rng.integers(0, 256, BIG + k, dtype=np.uint8) for k in range(8)]

    def work(k):
        if k == 4:
            monkeypatch.setenv("SSM_VK_COPY_THREADS", "6")
        dst = np.empty_like(sources[k])
        hostcopy.copy(dst, sources[k])
        same = hostcopy.equal(dst.ctypes.data, sources[k].ctypes.data, dst.size)
        return bool(np.array_equal(dst, sources[k])) and same

    with concurrent.futures.ThreadPoolExecutor(4) as callers:
        assert all(callers.map(work, range(8)))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork: POSIX only")
def test_a_forked_child_copies_on_threads_of_its_own(monkeypatch):
    # the parent's pool exists before the fork; the child has its object but none of its threads
    import time

    monkeypatch.setenv("SSM_VK_COPY_THREADS", "4")
    src = np.random.default_rng(3).integers(0, 256, BIG, dtype=np.uint8)
    hostcopy.copy(np.empty_like(src), src)
    pid = os.fork()
    if pid == 0:   # the child: a split copy must finish (not wait for the parent's threads)
        code = 2
        try:
            dst = np.empty_like(src)
            hostcopy.copy(dst, src)
            code = 0 if np.array_equal(dst, src) else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's copy did not finish in 60 s")
        time.sleep(0.01)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
