"""update_cache=True with the cache a DeviceArray: the decode step's scan writes the new states
into the cache rows itself; the other paths (chunked kernels, time chunks, token windows, the CPU
fallback) copy them there after the call; every one gives the bits of the call without it. A
backward never takes forward tables of a cache written since, and a call recomputed for inf or
nan starts from the cache as it was."""

from __future__ import annotations

import numpy as np
import pytest
from problems import make_problem

import ssm_ref
import ssm_vk
from ssm_vk import config, engine
from ssm_vk import runtime as rt

pytestmark = pytest.mark.vulkan


def _dev(case):
    return {k: ssm_vk.to_device(v) for k, v in case.args().items() if k != "ids"}


def _check(case, tune=None, expect_where=r"Vulkan"):
    """update_cache on device arrays against the same call without it: y and the written rows bit
    for bit, the rows no sequence names untouched."""
    ids = case.ids
    with config.configure(tune=tune or {}):
        dev = _dev(case)
        plain = ssm_vk.ssm_scan(**dev, ids=ids)
        before = dev["s"].numpy()
        r = ssm_vk.ssm_scan(**dev, ids=ids, update_cache=True)
    assert r.states is None and r.where.startswith(expect_where), r.where
    after = dev["s"].numpy()
    assert np.array_equal(r.y.numpy(), plain.y.numpy())
    assert np.array_equal(after[ids], plain.states.numpy())
    rest = np.setdiff1d(np.arange(after.shape[0]), ids)
    assert np.array_equal(after[rest], before[rest])
    return dev, r


@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
@pytest.mark.parametrize("N", [4, 16, 128])
def test_a_decode_step_writes_its_cache_rows(variant, N):
    case = make_problem(np.random.default_rng(N), S=3, T=1, H=4, P=5, N=N, G=2, variant=variant, ids="unused", R=7)
    _check(case)


def test_a_decode_loop_in_place_follows_the_oracle():
    rng = np.random.default_rng(11)
    S, R, H, P, N, steps = 3, 5, 2, 4, 16, 6
    s = rng.uniform(-0.5, 0.5, (R, H, P, N)).astype(np.float32)
    A = -rng.uniform(0.2, 1.0, H).astype(np.float32)
    ids = np.array([4, 0, 2])
    cache = ssm_vk.to_device(s)
    want = s.astype(np.float64)
    for _ in range(steps):
        x = rng.uniform(-1, 1, (S, 1, H, P)).astype(np.float32)
        dt = rng.uniform(-0.5, 0.5, (S, 1, H)).astype(np.float32)
        B, C = (rng.uniform(-0.5, 0.5, (S, 1, 1, N)).astype(np.float32) for _ in range(2))
        r = ssm_vk.ssm_scan(cache, x, dt, A, B, C, ids, update_cache=True)
        o = ssm_ref.ssm_scan(want, x, dt, A, B, C, ids, dtype=np.float64, update_cache=True)
        np.testing.assert_allclose(r.y.numpy(), o.y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cache.numpy(), want, rtol=1e-5, atol=1e-6)
    assert np.array_equal(cache.numpy()[[1, 3]], s[[1, 3]])


def test_the_chunked_kernels_copy_the_states_into_the_rows():
    case = make_problem(np.random.default_rng(3), S=2, T=256, H=2, P=8, N=16, G=1, ids="unused", R=4)
    with config.configure(tune={"CHUNK_MIN_T": 0}):
        _check(case, tune={"CHUNK_MIN_T": 0})


def test_time_chunks_copy_the_states_into_the_rows():
    case = make_problem(np.random.default_rng(8), S=2, T=64, H=3, P=1, N=16, G=1, variant="mamba1",
                        ids="unused", R=5)
    _check(case, tune={"TCHUNK": 16})


def test_token_windows_copy_the_states_into_the_rows():
    ctx = rt.get_context()
    case = make_problem(np.random.default_rng(9), S=2, T=40, H=2, P=2, N=8, G=1, ids="unused", R=4)
    align = ctx.info.min_storage_buffer_offset_alignment
    with ctx.seams.override_limits(max_storage_buffer_range=max(1024, 4 * align)):
        engine.clear(ctx)
        _check(case)


def test_the_cpu_fallback_uploads_the_rows():
    ctx = rt.get_context()
    case = make_problem(np.random.default_rng(10), S=2, T=3, H=4, P=4, N=16, G=1, ids="unused", R=4)
    dev = _dev(case)
    plain_host = ssm_vk.ssm_scan(**case.args())
    with ctx.seams.override_limits(max_storage_buffer_range=64):   # not even one token fits: the CPU computes it
        engine.clear(ctx)
        assert not ssm_vk.supports("ssm_scan", **dev, ids=case.ids, update_cache=True)
        r = ssm_vk.ssm_scan(**dev, ids=case.ids, update_cache=True)
    assert r.where == "CPU" and r.states is None and isinstance(r.y, ssm_vk.DeviceArray)
    got = dev["s"].numpy()
    np.testing.assert_allclose(got[case.ids], plain_host.states, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(r.y.numpy(), plain_host.y, rtol=1e-6, atol=1e-7)


def test_a_backward_never_takes_the_tables_of_a_cache_written_since():
    case = make_problem(np.random.default_rng(12), S=1, T=256, H=2, P=8, N=16, G=1, ids="identity")
    with config.configure(tune={"CHUNK_MIN_T": 0}):
        dev = _dev(case)
        e = engine.engine_of(rt.get_context())
        ssm_vk.ssm_scan(**dev)                                   # chunked: keeps its tables for a backward
        ssm_vk.ssm_scan(**dev, update_cache=True)                # writes s: those tables are of the old s
        reused = e.states_reused
        g = ssm_vk.ssm_scan_back(**dev, ids=None, g_y=ssm_vk.to_device(case.g_y),
                                 g_states=ssm_vk.to_device(case.g_states))
        assert e.states_reused == reused
        host = {k: v.numpy() for k, v in dev.items()}
        want = ssm_vk.ssm_scan_back(**host, ids=None, g_y=case.g_y, g_states=case.g_states)
    for k in ssm_ref.GRAD_NAMES:
        assert np.array_equal(getattr(g, k).numpy(), getattr(want, k)), k


def test_a_call_recomputed_for_inf_starts_from_the_cache_as_it_was():
    case = make_problem(np.random.default_rng(13), S=2, T=64, H=3, P=1, N=16, G=1, variant="mamba1",
                        ids="unused", R=4)
    args = case.args()
    args["x"][1, 30, 2, 0] = np.inf
    host = {k: v for k, v in args.items() if k != "ids"}
    with config.configure(tune={"TCHUNK": 0}):
        want = ssm_vk.ssm_scan(**host, ids=case.ids)
    e = engine.engine_of(rt.get_context())
    reruns = e.reruns
    with config.configure(tune={"TCHUNK": 16}):
        dev = {k: ssm_vk.to_device(v) for k, v in host.items()}
        r = ssm_vk.ssm_scan(**dev, ids=case.ids, update_cache=True)
    assert e.reruns == reruns + 1
    assert np.array_equal(r.y.numpy(), want.y, equal_nan=True)
    assert np.array_equal(dev["s"].numpy()[case.ids], want.states, equal_nan=True)


def test_a_repeated_decode_step_takes_its_lane_and_still_checks_its_ids():
    from ssm_vk import replay_cache

    rng = np.random.default_rng(14)
    S, R, H, P, N = 2, 4, 2, 3, 16
    cache = ssm_vk.to_device(rng.uniform(-0.5, 0.5, (R, H, P, N)).astype(np.float32))
    A = ssm_vk.to_device(-rng.uniform(0.2, 1.0, H).astype(np.float32))
    x, dt, B, C = (ssm_vk.to_device(rng.uniform(-0.5, 0.5, sh).astype(np.float32))
                   for sh in ((S, 1, H, P), (S, 1, H), (S, 1, 1, N), (S, 1, 1, N)))
    host = cache.numpy().astype(np.float64)
    for ids in ([3, 0], [3, 0], [1, 2]):
        r = ssm_vk.ssm_scan(cache, x, dt, A, B, C, ids, update_cache=True)
        o = ssm_ref.ssm_scan(host, x.numpy(), dt.numpy(), A.numpy(), B.numpy(), C.numpy(), ids,
                             dtype=np.float64, update_cache=True)
        np.testing.assert_allclose(r.y.numpy(), o.y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cache.numpy(), host, rtol=1e-5, atol=1e-6)
    lane, _ = replay_cache.find(False, (cache, x, dt, A, B, C), config.settings(), 0, update=True)
    assert lane is not None
    before = cache.numpy()
    with pytest.raises(ValueError, match=r"^ids: update_cache=True .* row 1 is named more than once"):
        ssm_vk.ssm_scan(cache, x, dt, A, B, C, [1, 1], update_cache=True)
    assert np.array_equal(cache.numpy(), before)
