"""``out=`` of ssm_vk.ssm_scan / ssm_scan_back: the call writes its outputs into the caller's
DeviceArrays (whole arrays, or views at the start of a longer buffer) and returns them, with the bits
of the ordinary call and within the float32 bounds of the float64 oracle -- on every kernel family,
with snapshots, in the invariant mode, from host inputs, on the CPU fallback and through the
token-sequential recompute of a flagged non-finite result. Bad ``out`` raises, naming the entry,
before any work; the given arrays are never released, also when the call raises."""

from __future__ import annotations

import gc
import math
import types

import numpy as np
import pytest
from problems import make_problem
from registry import F32_TOL, Backend, assert_close, oracle_back, oracle_scan

import ssm_ref
import ssm_vk
from ssm_ref.tolerance import nonfinite_mismatch, scaled
from ssm_vk import config, engine
from ssm_vk import run as vk_run
from ssm_vk import runtime as rt
from ssm_vk.arrays import upload_to
from ssm_vk.registry import plan
from ssm_vk.sizing import Limits

pytestmark = pytest.mark.vulkan

GRADS = ssm_ref.GRAD_NAMES
FWD = ("s", "x", "dt", "A", "B", "C")
GAP = 3   # elements of a given buffer past its view

FAMILIES = {   # name: (problem, planner settings that put it on that family)
    "decode": (dict(S=3, T=1, H=4, P=5, N=16, G=2, ids="unused", R=7), {}),
    "sequential": (dict(S=2, T=9, H=3, P=4, N=8, G=1, ids="permutation"), {}),
    "sequential-mamba1": (dict(S=2, T=9, H=3, P=4, N=8, G=1, variant="mamba1", ids="duplicates", R=3), {}),
    # (P and N of tests/vk/test_chunked_vk.py, chunks of 16 as it forces: its kernels, compiled once)
    "chunked": (dict(S=2, T=40, H=4, P=3, N=5, G=2, ids="identity"), {"CHUNK": 16, "CHUNK_MIN_T": 1}),
    "time-chunks": (dict(S=2, T=64, H=3, P=1, N=16, G=1, variant="mamba1", ids="identity"), {"TCHUNK": 16, "M1": 0}),
    "m1-threads": (dict(S=1, T=48, H=64, P=1, N=16, G=1, variant="mamba1", ids="identity"), {"M1": 1}),
}


@pytest.fixture(autouse=True)
def _collected():
    """The arrays of a test (some held in cycles by the exceptions it caught) go back to the pool
    before the next test counts the pool's buffers."""
    yield
    gc.collect()


def vk(T: int) -> Backend:
    return Backend(name="ssm_vk", module=ssm_vk, where=r"Vulkan\d+", tol=scaled(F32_TOL, T))


def _case(name, seed=0):
    dims, tune = FAMILIES[name]
    return make_problem(np.random.default_rng(seed), **dims), tune


def _dev(case):
    d = {k: ssm_vk.to_device(v) for k, v in case.args().items() if k != "ids"}
    d["g_y"], d["g_states"] = ssm_vk.to_device(case.g_y), ssm_vk.to_device(case.g_states)
    return d


def _fwd(d):
    return {k: d[k] for k in FWD}


def _views(shapes: dict):
    """({name: the owner}, {name: a view}): for each output a view at 0 of a NaN-filled buffer
    GAP elements longer (NaN left past the view shows no write beyond it)."""
    owners = {k: ssm_vk.to_device(np.full(math.prod(s) + GAP, np.nan, np.float32)) for k, s in shapes.items()}
    return owners, {k: owners[k].view(0, s) for k, s in shapes.items()}


def _gaps_untouched(owners, out):
    for k, a in out.items():
        assert np.isnan(owners[k].numpy()[a.size:]).all(), f"{k}: a write beyond the given view"


def _whole(shapes: dict):
    return {k: ssm_vk.to_device(np.full(s, np.nan, np.float32)) for k, s in shapes.items()}


def _same(a, b):
    return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)


def _shapes(result, names):
    return {k: getattr(result, k).shape for k in names}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_given_arrays_get_the_ordinary_calls_bits(family):
    case, tune = _case(family)
    T = case.dims["T"]
    with config.configure(tune=tune):
        if family == "chunked":
            lim = Limits.of(rt.get_context().info)
            for backward in (False, True):
                assert plan(ssm_ref.check_forward(**case.args()).dims, lim, backward).family.name == "chunked", backward
        d = _dev(case)
        for _ in range(2):   # twice: a lane is kept for the plain call, which out= must not take
            plain = ssm_vk.ssm_scan(**_fwd(d), ids=case.ids)
        big, out = _views(_shapes(plain, ("y", "states")))
        r = ssm_vk.ssm_scan(**_fwd(d), ids=case.ids, out=out)
        assert r.y is out["y"] and r.states is out["states"] and r.where == plain.where
        assert _same(r.y.numpy(), plain.y.numpy()) and _same(r.states.numpy(), plain.states.numpy())
        _gaps_untouched(big, out)
        want = oracle_scan(**case.args())
        assert_close(vk(T), "y", r.y.numpy(), want.y, label=family)
        assert_close(vk(T), "states", r.states.numpy(), want.states, label=family)
        for _ in range(2):
            gplain = ssm_vk.ssm_scan_back(**d, ids=case.ids)
        gbig, gout = _views(_shapes(gplain, GRADS))
        g = ssm_vk.ssm_scan_back(**d, ids=case.ids, out=gout)
        assert g.where == gplain.where
        gwant = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
        for k in GRADS:
            assert getattr(g, k) is gout[k]
            assert _same(gout[k].numpy(), getattr(gplain, k).numpy()), k
            assert_close(vk(T), k, gout[k].numpy(), getattr(gwant, k), label=family)
        _gaps_untouched(gbig, gout)


def test_snapshots_into_given_arrays():
    case, _ = _case("sequential", seed=3)
    K, T = 4, case.dims["T"]
    d = _dev(case)
    plain = ssm_vk.ssm_scan(**_fwd(d), ids=case.ids, snapshots=K)
    out = _whole(_shapes(plain, ("y", "states", "snapshots")))
    r = ssm_vk.ssm_scan(**_fwd(d), ids=case.ids, snapshots=K, out=out)
    assert r.snapshots is out["snapshots"] and r.y is out["y"]
    for k in ("y", "states", "snapshots"):
        assert _same(out[k].numpy(), getattr(plain, k).numpy()), k
    want = oracle_scan(**case.args(), snapshots=K)
    assert_close(vk(T), "y", r.y.numpy(), want.y)
    for k in range(K):
        assert_close(vk(T), "states", r.snapshots.numpy()[k], want.snapshots[k], label=f"slot {k}")
    g_snap = np.random.default_rng(4).uniform(-1, 1, plain.snapshots.shape).astype(np.float32)
    gsn = ssm_vk.to_device(g_snap)
    gplain = ssm_vk.ssm_scan_back(**d, ids=case.ids, g_snapshots=gsn)
    gout = _whole(_shapes(gplain, GRADS))
    g = ssm_vk.ssm_scan_back(**d, ids=case.ids, g_snapshots=gsn, out=gout)
    gwant = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states, g_snapshots=g_snap)
    for k in GRADS:
        assert getattr(g, k) is gout[k] and _same(gout[k].numpy(), getattr(gplain, k).numpy()), k
        assert_close(vk(T), k, gout[k].numpy(), getattr(gwant, k))
    # K = 1: no snapshots entry; the result's snapshots is the one slot, a view of the given states
    r1 = ssm_vk.ssm_scan(**_fwd(d), ids=case.ids, out=_whole(_shapes(plain, ("y", "states"))))
    assert _same(r1.snapshots.numpy()[0], r1.states.numpy())


def test_invariant_mode_into_given_arrays():
    case, _ = _case("sequential", seed=5)
    T = case.dims["T"]
    d = _dev(case)
    plain = ssm_vk.ssm_scan(**_fwd(d), ids=case.ids, invariant=True)
    big, out = _views(_shapes(plain, ("y", "states")))
    r = ssm_vk.ssm_scan(**_fwd(d), ids=case.ids, invariant=True, out=out)
    assert _same(r.y.numpy(), plain.y.numpy()) and _same(r.states.numpy(), plain.states.numpy())
    _gaps_untouched(big, out)
    want = oracle_scan(**case.args())
    assert_close(vk(T), "y", r.y.numpy(), want.y)
    gplain = ssm_vk.ssm_scan_back(**d, ids=case.ids, invariant=True)
    gout = _whole(_shapes(gplain, GRADS))
    ssm_vk.ssm_scan_back(**d, ids=case.ids, invariant=True, out=gout)
    gwant = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    for k in GRADS:
        assert _same(gout[k].numpy(), getattr(gplain, k).numpy()), k
        assert_close(vk(T), k, gout[k].numpy(), getattr(gwant, k))


@pytest.mark.parametrize("family", ["sequential", "chunked"])
def test_host_inputs_into_given_arrays(family):
    # allowed: the host inputs are uploaded (or staged) as beside device ones, the outputs stay put
    case, tune = _case(family, seed=6)
    args = case.args()
    with config.configure(tune=tune):
        plain = ssm_vk.ssm_scan(**args)
        out = _whole(_shapes(plain, ("y", "states")))
        r = ssm_vk.ssm_scan(**args, out=out)
        assert r.y is out["y"] and r.where == plain.where
        assert _same(r.y.numpy(), plain.y) and _same(r.states.numpy(), plain.states)
        gplain = ssm_vk.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states)
        gout = _whole(_shapes(gplain, GRADS))
        g = ssm_vk.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states, out=gout)
        for k in GRADS:
            assert getattr(g, k) is gout[k] and _same(gout[k].numpy(), getattr(gplain, k)), k


@pytest.mark.parametrize("resident", [True, False])
def test_the_cpu_fallback_fills_the_given_arrays(resident):
    case, _ = _case("sequential", seed=7)
    T = case.dims["T"]
    ctx = rt.get_context()
    d = _dev(case) if resident else {**case.args(), "g_y": case.g_y, "g_states": case.g_states}
    d.pop("ids", None)
    shapes = {"y": case.inputs["x"].shape, "states": (case.dims["S"], *case.inputs["s"].shape[1:])}
    out = _whole(shapes)
    gout = _whole(_shapes(ssm_ref.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states), GRADS))
    with ctx.seams.override_limits(device_local_bytes=512):
        engine.clear()
        r = ssm_vk.ssm_scan(**_fwd(d), ids=case.ids, out=out)
        g = ssm_vk.ssm_scan_back(**d, ids=case.ids, out=gout)
    engine.clear()
    assert r.where == "CPU" and g.where == "CPU" and r.y is out["y"] and r.states is out["states"]
    want = oracle_scan(**case.args())
    assert_close(vk(T), "y", out["y"].numpy(), want.y)
    assert_close(vk(T), "states", out["states"].numpy(), want.states)
    gwant = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    for k in GRADS:
        assert getattr(g, k) is gout[k]
        assert_close(vk(T), k, gout[k].numpy(), getattr(gwant, k))


@pytest.mark.parametrize("family", ["chunked", "time-chunks"])
def test_a_flagged_non_finite_result_is_recomputed_into_the_given_arrays(family):
    case, tune = _case(family, seed=8)
    args = case.args()
    args["x"] = args["x"].copy()
    args["x"][1, 20, 1 % case.dims["H"], 0] = np.inf
    with config.configure(tune=tune):
        d = {k: ssm_vk.to_device(v) for k, v in args.items() if k != "ids"}
        d["g_y"], d["g_states"] = ssm_vk.to_device(case.g_y), ssm_vk.to_device(case.g_states)
        e = engine.engine_of(rt.get_context())
        plain = ssm_vk.ssm_scan(**_fwd(d), ids=case.ids)
        gplain = ssm_vk.ssm_scan_back(**d, ids=case.ids)
        big, out = _views(_shapes(plain, ("y", "states")))
        gbig, gout = _views(_shapes(gplain, GRADS))
        reruns = e.reruns
        r = ssm_vk.ssm_scan(**_fwd(d), ids=case.ids, out=out)
        g = ssm_vk.ssm_scan_back(**d, ids=case.ids, out=gout)
        assert e.reruns == reruns + 2
    assert r.y is out["y"] and not np.isfinite(out["y"].numpy()).all()
    ref = ssm_ref.ssm_scan(**args)
    refg = ssm_ref.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states)
    for k in ("y", "states"):
        assert _same(out[k].numpy(), getattr(plain, k).numpy()), k
        assert not nonfinite_mismatch(out[k].numpy(), getattr(ref, k)), k
    for k in GRADS:
        assert getattr(g, k) is gout[k] and _same(gout[k].numpy(), getattr(gplain, k).numpy()), k
        assert not nonfinite_mismatch(gout[k].numpy(), getattr(refg, k)), k
    _gaps_untouched(big, out)
    _gaps_untouched(gbig, gout)


def test_bad_out_raises_naming_it_before_any_work():
    case, _ = _case("sequential", seed=9)
    d = _dev(case)
    ctx = rt.get_context()
    fwd = _fwd(d)
    plain = ssm_vk.ssm_scan(**fwd, ids=case.ids)
    gplain = ssm_vk.ssm_scan_back(**d, ids=case.ids)
    yS, sS = plain.y.shape, plain.states.shape
    ok = _whole({"y": yS, "states": sS})
    gok = _whole(_shapes(gplain, GRADS))
    released = ssm_vk.to_device(np.zeros(yS, np.float32))
    released.release()
    elsewhere = types.SimpleNamespace(closed=False, info=ctx.info)   # another context, as its arrays see it
    big = ssm_vk.to_device(np.zeros(math.prod(yS) + math.prod(sS), np.float32))
    bad = [
        ([ok["y"], ok["states"]], TypeError,
         r"^out: a dict \{name: DeviceArray\} of every output of ssm_scan, got list"),
        ({"y": ok["y"]}, ValueError,
         r"^out\['states'\]: missing: out gives every output of this ssm_scan \(y, states\)"),
        ({**ok, "snapshots": ok["states"]}, ValueError, r"^out\['snapshots'\]: not an output of this ssm_scan"),
        ({**ok, "y": ok["y"].reshape(math.prod(yS))}, ValueError, r"^out\['y'\]: shape \(\d+,\), the output's is"),
        ({**ok, "y": ssm_vk.to_device(np.zeros(yS, np.int32))}, TypeError, r"^out\['y'\]: float32, got int32"),
        ({**ok, "y": np.zeros(yS, np.float32)}, TypeError, r"^out\['y'\]: a DeviceArray .*, got ndarray"),
        ({**ok, "y": released}, ValueError, r"^out\['y'\]: this DeviceArray was released"),
        ({**ok, "states": ssm_vk.DeviceArray(elsewhere, ok["states"].buffer, sS, owned=False)}, ValueError,
         r"^out\['states'\]: a DeviceArray of another Vulkan context"),
        ({**ok, "y": d["x"]}, ValueError, r"^out\['y'\]: overlaps the input x "),
        ({**ok, "states": big.view(1, sS)}, ValueError, r"^out\['states'\]: a view at element 1 of its buffer; "
                                                        r"an output starts its buffer"),
        ({**ok, "states": ssm_vk.DeviceArray(ctx, ok["y"].buffer, sS, owned=False)}, ValueError,   # y's memory
         r"^out\['states'\]: overlaps out\['y'\]"),
    ]
    before = {k: a.numpy() for k, a in ok.items()}
    for out, exc, text in bad:
        n = ctx.stats.submits
        with pytest.raises(exc, match=text):
            ssm_vk.ssm_scan(**fwd, ids=case.ids, out=out)
        assert ctx.stats.submits == n, text   # nothing ran
    with pytest.raises(ValueError, match=r"^out: not with update_cache"):
        ssm_vk.ssm_scan(**fwd, ids=case.ids, update_cache=True, out=ok)
    gbad = [
        ({k: v for k, v in gok.items() if k != "d_s0"}, ValueError, r"^out\['d_s0'\]: missing"),
        ({**gok, "d_x": d["g_y"]}, ValueError, r"^out\['d_x'\]: overlaps the input g_y"),
        ({**gok, "d_A": gok["d_dt"]}, ValueError, r"^out\['d_A'\]: shape"),
        ({**gok, "d_C": gok["d_B"]}, ValueError, r"^out\['d_C'\]: overlaps out\['d_B'\]"),
    ]
    for out, exc, text in gbad:
        n = ctx.stats.submits
        with pytest.raises(exc, match=text):
            ssm_vk.ssm_scan_back(**d, ids=case.ids, out=out)
        assert ctx.stats.submits == n, text
    for k, a in ok.items():   # the caller's arrays: live, unwritten
        assert a.live() and _same(a.numpy(), before[k]), k
    assert all(a.live() for a in gok.values())


def test_the_given_arrays_survive_a_call_that_raises(monkeypatch):
    case, _ = _case("sequential", seed=10)
    d = _dev(case)
    plain = ssm_vk.ssm_scan(**_fwd(d), ids=case.ids)
    gplain = ssm_vk.ssm_scan_back(**d, ids=case.ids)
    out = _whole(_shapes(plain, ("y", "states")))
    gout = _whole(_shapes(gplain, GRADS))

    def broken(*a, **k):
        raise RuntimeError("the recording failed")

    monkeypatch.setattr(vk_run, "recorded_sequence", broken)
    with pytest.raises(RuntimeError, match="the recording failed"):
        ssm_vk.ssm_scan(**_fwd(d), ids=case.ids, out=out)
    with pytest.raises(RuntimeError, match="the recording failed"):
        ssm_vk.ssm_scan_back(**d, ids=case.ids, out=gout)
    monkeypatch.undo()
    assert all(a.live() for a in (*out.values(), *gout.values()))
    d["x"].release()    # an input released: the call refuses it, the given arrays stay the caller's
    with pytest.raises(RuntimeError, match="released"):
        ssm_vk.ssm_scan(**_fwd(d), ids=case.ids, out=out)
    assert all(a.live() for a in out.values())
    d["x"] = ssm_vk.to_device(case.inputs["x"])
    r = ssm_vk.ssm_scan(**_fwd(d), ids=case.ids, out=out)   # and they still take a call
    assert _same(r.y.numpy(), plain.y.numpy())


def test_an_empty_output_takes_an_empty_array():
    case = make_problem(np.random.default_rng(11), S=2, T=0, H=2, P=3, N=4, G=1, ids="identity")
    d = {k: ssm_vk.to_device(v) for k, v in case.args().items() if k != "ids"}
    out = _whole({"y": case.inputs["x"].shape, "states": (2, 2, 3, 4)})
    r = ssm_vk.ssm_scan(**_fwd(d), ids=case.ids, out=out)
    assert r.y is out["y"] and r.y.size == 0
    assert _same(r.states.numpy(), ssm_ref.ssm_scan(**case.args()).states)


def test_upload_to_given_arrays_keeps_the_offset():
    # (the fallback's upload goes through DeviceArray.write: into a view at its offset, nothing else)
    ctx = rt.get_context()
    big = upload_to(ctx, np.zeros(10, np.float32))
    big.view(3, (4,)).write(np.arange(4))
    assert big.numpy().tolist() == [0, 0, 0, 0, 1, 2, 3, 0, 0, 0]
