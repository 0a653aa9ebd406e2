"""Prepared calls (ssm_vk.prepare_scan / prepare_scan_back): each run gives the bits of the
ordinary call on the inputs as they are then, on every kernel family; inputs changed in place are
read; update_cache writes the rows; a flagged non-finite result is recomputed token by token as
the ordinary call's; bad input and misuse raise before any work; runs from several threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from problems import make_problem

import ssm_ref
import ssm_vk
from ssm_fast.oracle64 import scan64
from ssm_vk import config, engine
from ssm_vk import run as vk_run
from ssm_vk import runtime as rt
from ssm_vk.registry import plan
from ssm_vk.sizing import Limits

pytestmark = pytest.mark.vulkan

FAMILIES = {   # name: (problem, planner settings that put it on that family)
    "decode": (dict(S=3, T=1, H=4, P=5, N=16, G=2, ids="unused", R=7), {}),
    "sequential": (dict(S=2, T=9, H=3, P=4, N=8, G=1, ids="permutation"), {}),
    # (P and N of tests/vk/test_chunked_vk.py: its chunk kernels, compiled once in a session)
    "chunked": (dict(S=2, T=128, H=4, P=3, N=5, G=2, ids="identity"), {"CHUNK_MIN_T": 0}),
    "time-chunks": (dict(S=2, T=64, H=3, P=1, N=16, G=1, variant="mamba1", ids="identity"), {"TCHUNK": 16, "M1": 0}),
    "m1-threads": (dict(S=1, T=48, H=64, P=1, N=16, G=1, variant="mamba1", ids="identity"), {"M1": 1}),
}


def _case(name, seed=0):
    dims, tune = FAMILIES[name]
    return make_problem(np.random.default_rng(seed), **dims), tune


def _dev(case):
    return {k: ssm_vk.to_device(v) for k, v in case.args().items() if k != "ids"}


def _same(a, b):
    return np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_runs_give_the_ordinary_calls_bits_on_the_inputs_as_they_are_then(family):
    case, tune = _case(family)
    rng = np.random.default_rng(1)
    with config.configure(tune=tune):
        if family == "chunked":
            for backward in (False, True):
                lim = Limits.of(rt.get_context().info)
                assert plan(ssm_ref.check_forward(**case.args()).dims, lim, backward).family.name == "chunked", backward
        dev = _dev(case)
        with ssm_vk.prepare_scan(**dev, ids=case.ids) as fwd:
            for step in range(3):
                if step:   # new inputs written in place between runs
                    dev["x"].write(rng.uniform(-1, 1, dev["x"].shape))
                    dev["B"].write(rng.uniform(-0.5, 0.5, dev["B"].shape))
                r = fwd.run()
                want = ssm_vk.ssm_scan(**dev, ids=case.ids)
                assert r.where == want.where and r.where.startswith("Vulkan")
                assert _same(r.y.numpy(), want.y.numpy()) and _same(r.states.numpy(), want.states.numpy())
                o = scan64(**{k: v.numpy() for k, v in dev.items()}, ids=case.ids)
                np.testing.assert_allclose(r.y.numpy(), o.y, rtol=1e-4, atol=1e-5)
                np.testing.assert_allclose(r.states.numpy(), o.states, rtol=1e-4, atol=1e-5)
                assert vk_run.last_gpu_ns() is None or vk_run.last_gpu_ns() > 0


@pytest.mark.parametrize("family", ["sequential", "chunked", "m1-threads"])
def test_a_prepared_backward_gives_the_ordinary_backwards_bits(family):
    case, tune = _case(family, seed=2)
    with config.configure(tune=tune):
        dev = _dev(case)
        gy, gs = ssm_vk.to_device(case.g_y), ssm_vk.to_device(case.g_states)
        with ssm_vk.prepare_scan_back(**dev, ids=case.ids, g_y=gy, g_states=gs) as back:
            for step in range(2):
                if step:
                    gy.write(np.random.default_rng(step).uniform(-1, 1, gy.shape))
                g = back.run()
                ssm_vk.ssm_scan(**dev, ids=case.ids)   # (an ordinary forward between runs changes nothing)
                want = ssm_vk.ssm_scan_back(**{k: v.numpy() for k, v in dev.items()}, ids=case.ids,
                                            g_y=gy.numpy(), g_states=gs.numpy())
                for k in ssm_ref.GRAD_NAMES:
                    assert _same(getattr(g, k).numpy(), getattr(want, k)), k


def test_update_cache_writes_the_rows_each_run_like_a_decode_loop():
    rng = np.random.default_rng(3)
    S, R, H, P, N = 3, 6, 2, 4, 16
    s = rng.uniform(-0.5, 0.5, (R, H, P, N)).astype(np.float32)
    ids = np.array([4, 0, 2])
    cache = ssm_vk.to_device(s)
    A = ssm_vk.to_device(-rng.uniform(0.2, 1.0, H))
    x, dt, B, C = (ssm_vk.to_device(np.zeros(sh, np.float32))
                   for sh in ((S, 1, H, P), (S, 1, H), (S, 1, 1, N), (S, 1, 1, N)))
    want = s.astype(np.float64)
    with ssm_vk.prepare_scan(cache, x, dt, A, B, C, ids, update_cache=True) as step:
        for _ in range(5):
            host = {k: rng.uniform(-0.5, 0.5, a.shape) for k, a in (("x", x), ("dt", dt), ("B", B), ("C", C))}
            for k, a in (("x", x), ("dt", dt), ("B", B), ("C", C)):
                a.write(host[k])
            r = step.run()
            assert r.states is None
            f32 = {k: v.astype(np.float32) for k, v in host.items()}
            o = ssm_ref.ssm_scan(want, f32["x"], f32["dt"], A.numpy(), f32["B"], f32["C"], ids,
                                 dtype=np.float64, update_cache=True)
            np.testing.assert_allclose(r.y.numpy(), o.y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cache.numpy(), want, rtol=1e-5, atol=1e-6)
    assert np.array_equal(cache.numpy()[[1, 3, 5]], s[[1, 3, 5]])


@pytest.mark.parametrize("family", ["sequential", "chunked", "m1-threads"])
def test_update_cache_on_the_families_that_copy_the_rows_after_the_scan(family):
    case, tune = _case(family, seed=5)
    with config.configure(tune=tune):
        dev = _dev(case)
        plain = ssm_vk.ssm_scan(**dev, ids=case.ids).states.numpy()
        with ssm_vk.prepare_scan(**dev, ids=case.ids, update_cache=True) as fwd:
            r = fwd.run()
            assert r.states is None
        assert np.array_equal(dev["s"].numpy()[case.ids], plain)


@pytest.mark.parametrize("family", ["chunked", "time-chunks", "m1-threads"])
def test_a_flagged_non_finite_run_is_recomputed_as_the_ordinary_call(family):
    case, tune = _case(family, seed=4)
    args = case.args()
    args["x"][0, 20, 1, 0] = np.inf
    host = {k: v for k, v in args.items() if k != "ids"}
    with config.configure(tune=tune):
        dev = {k: ssm_vk.to_device(v) for k, v in host.items()}
        e = engine.engine_of(rt.get_context())
        with ssm_vk.prepare_scan(**dev, ids=case.ids) as fwd:
            reruns = e.reruns
            r = fwd.run()
            assert e.reruns == reruns + 1
            want = ssm_vk.ssm_scan(**host, ids=case.ids)
            assert _same(r.y.numpy(), want.y) and _same(r.states.numpy(), want.states)
            assert not np.isfinite(r.y.numpy()).all()
            dev["x"].write(np.where(np.isfinite(host["x"]), host["x"], 0))   # finite again: no rerun
            reruns = e.reruns
            r = fwd.run()
            assert e.reruns == reruns and np.isfinite(r.y.numpy()).all()


def test_bad_input_and_misuse_raise_clearly():
    case, _ = _case("decode")
    dev = _dev(case)
    host = case.args()
    with pytest.raises(TypeError, match=r"^prepare_scan: x must be a DeviceArray"):
        ssm_vk.prepare_scan(dev["s"], host["x"], dev["dt"], dev["A"], dev["B"], dev["C"], case.ids)
    with pytest.raises(ValueError, match="dt_softplus"):
        ssm_vk.prepare_scan(**dev, ids=case.ids, dt_softplus="relu")
    with pytest.raises(TypeError, match="update_cache"):
        ssm_vk.prepare_scan(**dev, ids=case.ids, update_cache="yes")
    with pytest.raises(ValueError, match=r"^ids"):
        ssm_vk.prepare_scan(**dev, ids=[0, 0, 1], update_cache=True)
    with pytest.raises(ValueError, match="x"):   # shapes: as ssm_scan
        ssm_vk.prepare_scan(dev["s"], dev["x"].reshape(3, 4, 5, 1), dev["dt"], dev["A"], dev["B"], dev["C"],
                            case.ids)
    with pytest.raises(TypeError, match=r"^prepare_scan_back: g_y must be a DeviceArray"):
        ssm_vk.prepare_scan_back(**dev, ids=case.ids, g_y=case.g_y, g_states=ssm_vk.to_device(case.g_states))
    ctx = rt.get_context()
    with ctx.seams.override_limits(max_storage_buffer_range=64):   # the device cannot run it: no silent CPU
        engine.clear(ctx)
        with pytest.raises(ValueError, match="cannot run"):
            ssm_vk.prepare_scan(**dev, ids=case.ids)
    engine.clear(ctx)
    with ssm_vk.prepare_scan(**dev, ids=case.ids) as fwd:
        fwd.run().y.release()
        with pytest.raises(RuntimeError, match="an output of this prepared ssm_scan was released"):
            fwd.run()
    fwd = ssm_vk.prepare_scan(**dev, ids=case.ids)
    y = fwd.run().y.numpy()
    dev["C"].release()
    with pytest.raises(RuntimeError, match="released"):
        fwd.run()
    fwd.close()
    fwd.close()
    with pytest.raises(RuntimeError, match="closed"):
        fwd.run()
    assert np.isfinite(y).all()
    with pytest.raises(ValueError, match="shape"):
        dev["x"].write(np.zeros((1, 2)))
    with pytest.raises(ValueError, match="dtype"):
        ssm_vk.to_device(np.arange(3)).write(np.ones(3))


def test_prepared_calls_run_from_several_threads():
    cases = [_case("decode", seed=10 + i)[0] for i in range(3)]
    devs = [_dev(c) for c in cases]
    wants = [ssm_vk.ssm_scan(**d, ids=c.ids).y.numpy() for c, d in zip(cases, devs, strict=True)]
    calls = [ssm_vk.prepare_scan(**d, ids=c.ids) for c, d in zip(cases, devs, strict=True)]
    shared = calls[0]
    errors = []

    def work(i):
        try:
            for _ in range(20):
                y = calls[i].run().y.numpy()
                if not np.array_equal(y, wants[i]):
                    errors.append((i, "own"))
                y = shared.run().y.numpy()   # one prepared call from every thread: its lock orders them
                if not np.array_equal(y, wants[0]):   # (the same bits whichever run wrote them last)
                    errors.append((i, "shared"))
        except Exception as e:   # reported by the assertion below
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for c in calls:
        c.close()
