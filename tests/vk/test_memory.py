"""Runtime memory: buffers, transfers (direct and staged), fills, the pool, allocation accounting."""

import numpy as np
import pytest

from ssm_vk import runtime as rt
from ssm_vk.runtime import transfer

pytestmark = pytest.mark.vulkan


@pytest.fixture(params=["direct", "staged"])
def transfer_ctx(request, ctx):
    """The context, transferring through its mapping or (forced) through a small staging buffer."""
    if request.param == "staged":
        ctx.seams.force_staging, ctx.staging_chunk_bytes = True, 40  # odd-sized chunks: several per transfer
    yield ctx
    ctx.seams.force_staging, ctx.staging_chunk_bytes = False, 64 << 20
    transfer.release_staging(ctx)


@pytest.mark.parametrize(("nbytes", "offset"), [(1, 0), (7, 3), (100, 13), (257, 0), (4096, 4)])
def test_round_trip_bytes(transfer_ctx, nbytes, offset):
    rng = np.random.default_rng(nbytes)
    with rt.Buffer(transfer_ctx, offset + nbytes + 5) as buf:
        filled = buf.size // 4 * 4
        rt.fill(buf, 0xA5A5A5A5, 0, filled)
        data = rng.integers(0, 256, nbytes, dtype=np.uint8)
        rt.upload(buf, data, offset)
        assert np.array_equal(rt.download(buf, nbytes, offset), data)
        whole = rt.download(buf, buf.size)
        assert np.all(whole[:offset] == 0xA5) and np.all(whole[offset + nbytes:filled] == 0xA5)  # neighbours kept


def test_round_trip_typed(transfer_ctx):
    x = np.arange(24, dtype=np.float64).reshape(2, 3, 4)[:, ::2]  # not contiguous: uploaded in C order
    with rt.Buffer(transfer_ctx, 256) as buf:
        rt.upload(buf, x, offset=16)
        back = rt.download(buf, (x.shape, x.dtype), offset=16)
        assert back.dtype == x.dtype and np.array_equal(back, x)
        assert rt.download(buf, (0, np.float32)).shape == (0,)


def test_fill_zero_and_poison(ctx):
    with rt.Buffer(ctx, 64) as buf:
        rt.fill(buf, 0)
        assert not rt.download(buf, 64).any()
        rt.fill(buf, 0x7FC00000, offset=16, nbytes=32)
        f = rt.download(buf, (16, np.float32))
        assert not f[:4].any() and np.isnan(f[4:12]).all() and not f[12:].any()


def test_transfer_arguments_are_checked_before_vulkan(ctx):
    with rt.Buffer(ctx, 16) as buf:
        writes = ctx.stats.submits
        with pytest.raises(ValueError, match="do not fit"):
            rt.upload(buf, np.zeros(5, np.float32))
        with pytest.raises(ValueError, match="do not fit"):
            rt.download(buf, 8, offset=9)
        with pytest.raises(ValueError, match="multiples of 4"):
            rt.fill(buf, 0, offset=2)
        with pytest.raises(ValueError, match="32-bit"):
            rt.fill(buf, -1)
        with pytest.raises(TypeError):
            rt.upload(buf, np.array([object()]))
        with pytest.raises(TypeError):
            rt.upload("not a buffer", np.zeros(1))
        assert ctx.stats.submits == writes
    with pytest.raises(RuntimeError, match="closed"):
        rt.download(buf, 4)


def test_allocation_above_the_limit_raises_before_allocating(ctx):
    start = ctx.live_allocations
    with pytest.raises(ValueError, match="max_memory_allocation_size"):
        rt.Buffer(ctx, ctx.info.max_memory_allocation_size + 1)
    with ctx.seams.override_limits(max_memory_allocation_size=1024):
        with pytest.raises(ValueError, match="max_memory_allocation_size = 1024"):
            rt.Buffer(ctx, 1025)
        rt.Buffer(ctx, 1024).close()
    assert ctx.live_allocations == start
    with pytest.raises(ValueError):
        rt.Buffer(ctx, 0)
    with pytest.raises(TypeError):
        rt.Buffer(ctx, 4.0)


def test_live_allocations_return_to_start(ctx):
    start = ctx.live_allocations
    bufs = [rt.Buffer(ctx, n) for n in (4, 100, 4096)]
    now = ctx.live_allocations
    assert now.count == start.count + 3 and now.nbytes >= start.nbytes + 4200
    for b in bufs:
        b.close()
        b.close()
    pool = rt.BufferPool(ctx)
    pool.release(pool.acquire(1000))
    pool.acquire(10)
    pool.close()
    assert ctx.live_allocations == start


def test_pool_reuses_by_size_class(ctx):
    assert [rt.BufferPool.size_class(n) for n in (1, 256, 257, 384, 385, 1000, 1024, 1025)] == \
        [256, 256, 384, 384, 512, 1024, 1024, 1536]
    with rt.BufferPool(ctx) as pool:
        a = pool.acquire(1000)
        assert a.size == 1024
        pool.release(a)
        b = pool.acquire(900)  # same class: the same buffer, so cached descriptor sets still apply
        assert b is a and pool.reused == 1
        c = pool.acquire(900)  # a is out: a new one
        assert c is not a and pool.reused == 1
        with rt.Buffer(ctx, 4) as stray, pytest.raises(ValueError, match="not acquired"):
            pool.release(stray)
        pool.release(b)
        with pytest.raises(ValueError):
            pool.release(b)
        before = ctx.live_allocations.count
        pool.trim()
        assert ctx.live_allocations.count == before - 1 and not c.closed
    assert c.closed


def test_pool_acquire_all_takes_what_acquire_would(ctx):
    # acquire_all (a call's outputs at once) hands out what acquire would, one request after
    # another: the free buffer of each request's class, LIFO, new ones for the rest.
    with rt.BufferPool(ctx) as pool:
        first = pool.acquire_all([1000, 100, 1000, 5000])  # requests not seen before: acquire() each
        assert [b.size for b in first] == [1024, 256, 1024, 6144] and pool.in_use == 4
        for b in first:
            pool.release(b)
        again = pool.acquire_all([1000, 100, 1000, 5000])
        assert again == [first[2], first[1], first[0], first[3]] and pool.reused == 4
        more = pool.acquire_all([900, 1000])                 # 900: same class, not seen before
        assert len({b.serial for b in again + more}) == 6 and pool.in_use == 6
        for b in again + more:
            pool.release(b)
        # (1280 = 5 x 256: what drivers allocate for it is the size itself -- NVIDIA rounds 1000 to 1008)
        with ctx.seams.override_limits(max_memory_allocation_size=1280):
            (small,) = pool.acquire_all([1280])             # its class (1536) would exceed the limit
            assert small.size == 1280
        pool.release(small)
        # a failure gives back what was taken and raises
        before = pool.in_use
        ctx.seams.fail_allocations(2)  # the allocation and its retry after a trim
        with pytest.raises(rt.OutOfDeviceMemory):
            pool.acquire_all([1000] * 5)  # four of that class are free: the fifth allocates
        assert pool.in_use == before
        ctx.seams.fail_allocations(0)
    with pytest.raises(RuntimeError, match="closed"):
        pool.acquire_all([1000])


def test_pool_reserved_sets_wait_apart_until_taken_whole(ctx):
    # A reserved buffer, once released, is handed out only by acquire_set and only with its whole
    # set; acquire / acquire_all allocate rather than break a set up; trim frees them; unreserve
    # gives them back to general use.
    with rt.BufferPool(ctx) as pool:
        a = pool.acquire_all([1000, 5000])
        b = pool.acquire_all([1000, 5000])
        pool.reserve(a)
        pool.reserve(b)
        assert pool.acquire_set([a, b]) is None                 # all out
        for buf in [*a, b[0]]:
            pool.release(buf)
        other = pool.acquire(1000)                               # a[0] is free but reserved
        assert other.serial not in {x.serial for x in a + b}
        assert pool.acquire_set([b, a]) == a and pool.in_use == 4   # b is not wholly free
        assert pool.acquire_set([a]) is None                     # taken already
        for buf in a:
            pool.release(buf)
        pool.unreserve(a)
        got = pool.acquire_all([1000, 5000])                     # general use again (LIFO)
        assert {x.serial for x in got} == {x.serial for x in a}
        pool.release(b[1])
        before = ctx.live_allocations.count
        pool.trim()                                              # b (reserved, free) is freed
        assert b[0].closed and b[1].closed and ctx.live_allocations.count == before - 2
        assert pool.acquire_set([b]) is None


def test_pool_respects_the_allocation_limit(ctx):
    # 1280 = 5 x 256 bytes: every driver's allocation for it is that size (NVIDIA rounds 1000 to 1008)
    with ctx.seams.override_limits(max_memory_allocation_size=1280), rt.BufferPool(ctx) as pool:
        assert pool.acquire(1280).size == 1280  # its class (1536) would exceed the limit
        with pytest.raises(ValueError, match="max_memory_allocation_size"):
            pool.acquire(1281)
