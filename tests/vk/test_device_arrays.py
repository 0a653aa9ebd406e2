"""DeviceArray lifetimes: an owner's buffer goes back to the context's pool exactly once -- at
``release()``, when the last reference goes, or when a garbage collection finds it in a cycle --
and views keep their owner alive. The outputs a call makes straight from the pool
(``DeviceArray._from_pool``) behave as those ``DeviceArray(...)`` makes."""

import gc
import threading

import numpy as np
import pytest

import ssm_vk
from ssm_vk import arrays
from ssm_vk.arrays import DeviceArray, pool


@pytest.fixture
def counted(ctx, monkeypatch):
    """The buffers given back to the context's pool, in order."""
    p = pool(ctx)
    given = []
    real = p.release

    def release(buf):
        given.append(buf)
        real(buf)

    monkeypatch.setattr(p, "release", release)
    return p, given


def _made(ctx, how: str) -> DeviceArray:
    if how == "to_device":
        return ssm_vk.to_device(np.arange(12, dtype=np.float32))
    return DeviceArray._from_pool(ctx, pool(ctx).acquire(48), (3, 4))


@pytest.mark.parametrize("how", ["to_device", "_from_pool"])
def test_release_gives_the_buffer_back_once(ctx, counted, how):
    p, given = counted
    a = _made(ctx, how)
    buf, out = a.buffer, p.in_use
    assert not a.released and a._finalizer.alive
    v = a.view(2, (5,))
    a.release()
    assert a.released and v.released and not a._finalizer.alive and given == [buf] and p.in_use == out - 1
    a.release()
    v.release()
    del a, v
    gc.collect()
    assert given == [buf]
    b = _made(ctx, how)
    b.release()
    with pytest.raises(RuntimeError, match="released"):
        b.numpy()


@pytest.mark.parametrize("how", ["to_device", "_from_pool"])
def test_the_last_reference_gives_the_buffer_back(ctx, counted, how):
    _, given = counted
    a = _made(ctx, how)
    buf = a.buffer
    v = a.reshape(4, 3)  # a view keeps its owner alive
    del a
    assert given == []
    assert v.numpy().shape == (4, 3)
    del v
    assert given == [buf]


@pytest.mark.parametrize("how", ["to_device", "_from_pool"])
def test_an_owner_in_a_garbage_cycle_gives_its_buffer_back(ctx, counted, how):
    _, given = counted
    a = _made(ctx, how)
    buf = a.buffer
    a.cycle = a
    del a
    gc.collect()
    assert given == [buf]


def test_release_from_many_threads_runs_once(ctx, counted):
    _, given = counted
    for _ in range(20):
        a = _made(ctx, "_from_pool")
        go = threading.Barrier(8)

        def work(a=a, go=go):
            go.wait()
            a.release()

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert given[-1] is a.buffer and a.released
        del a
    assert len(given) == 20
    assert all(r.alive for r in arrays._pending.values())  # the registry holds only those still to run


def test_from_pool_makes_what_the_constructor_makes(ctx):
    buf = pool(ctx).acquire(48)
    fast = DeviceArray._from_pool(ctx, buf, (3, 4))
    slow = DeviceArray(ctx, buf, (3, 4), owned=False)
    for k in ("ctx", "buffer", "shape", "dtype", "offset", "_base", "size", "nbytes", "ndim", "where", "device"):
        assert getattr(fast, k) == getattr(slow, k), k
    assert DeviceArray._from_pool(ctx, None, (0, 4))._finalizer is None
    fast.release()


@pytest.mark.parametrize(("call", "error"), [
    (lambda a: a.reshape(-3, -4), ValueError),                  # negative dimensions, product 12
    (lambda a: a.reshape((2, -6)), ValueError),
    (lambda a: a.view(0, (-1, -12)), ValueError),
    (lambda a: a.view(0, (np.int64(2**62 + 25), np.int64(4))), ValueError),  # wraps in int64: not here
    (lambda a: a.reshape(np.int64(2**62), np.int64(4)), ValueError),
    (lambda a: a.view(-1, (2,)), ValueError),
    (lambda a: a.view(11, (2,)), ValueError),
    (lambda a: a.reshape(3.0, 4), TypeError),
    (lambda a: a.view(0, (True, 1)), TypeError),
    (lambda a: a.view(0.5, (2,)), TypeError),
])
def test_impossible_views_and_reshapes_are_refused(ctx, call, error):
    a = ssm_vk.to_device(np.arange(12, dtype=np.float32))
    with pytest.raises(error):
        call(a)


def test_views_and_reshapes_take_numpy_integers_exactly(ctx):
    a = ssm_vk.to_device(np.arange(12, dtype=np.float32))
    v = a.view(np.int64(2), (np.int32(2), np.int64(3)))
    assert v.shape == (2, 3) and all(type(n) is int for n in v.shape)
    np.testing.assert_array_equal(v.numpy(), np.arange(2, 8, dtype=np.float32).reshape(2, 3))
    r = a.reshape(np.int64(3), np.int64(4))
    assert r.shape == (3, 4) and all(type(n) is int for n in r.shape)
    assert a.reshape(12, 1, 1).shape == (12, 1, 1) and a.view(12, (0,)).shape == (0,)
