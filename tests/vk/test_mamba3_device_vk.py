"""Mamba-3 on DeviceArrays (ssm_vk.mamba3_scan / mamba3_scan_back with ssm_vk.to_device inputs,
update_cache on DeviceArray caches, prepare_mamba3_scan / prepare_mamba3_scan_back, out=): the
same bits as the host call, results resident, the caches' rows written on the device and nothing
else, prepared runs that read their inputs as they are, and the errors -- the scan's guarantees
(docs/API.md). Every test runs under the validation layer (tests/conftest.py fails a test on any
message); nothing here assumes the device's subgroup size or limits (the offset alignment is
read from the device)."""

from __future__ import annotations

import numpy as np
import pytest

import ssm_ref
import ssm_vk
from ssm_ref import ops
from ssm_ref.testing import mamba3_cases
from ssm_vk import mamba3_api
from ssm_vk import runtime as rt

pytestmark = pytest.mark.vulkan

OP = ops.get("mamba3_scan")
TOL = OP.tol()
STATES = ("s_theta", "s_h", "s_k", "s_v")
FINALS = ("theta", "h", "k", "v")
SHAPES = {"siso": dict(S=2, T=3, H=2, P=3, N=4, G=1, F=2, R=4, ids="permutation"),
          "mimo": dict(S=2, T=3, H=2, P=3, N=6, G=1, M=2, F=1, R=4, ids="permutation", rotation="halved")}


def _host(name: str, seed: int = 3, **kw) -> dict:
    case = mamba3_cases.make_case(seed, **{**SHAPES[name], **kw})
    return {**case.args(), **case.keywords}, case.cotangents


def _dev(a: dict) -> dict:
    return {k: ssm_vk.to_device(v) if isinstance(v, np.ndarray) and k != "ids" else v for k, v in a.items()}


def _bits(a) -> bytes:
    return (a.numpy() if isinstance(a, ssm_vk.DeviceArray) else a).tobytes()


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_device_arrays_give_the_host_calls_bits_and_stay_resident(name):
    """Forward and backward of DeviceArrays (all of them, and some beside host arrays): the host
    call's bits; every result a DeviceArray of the open context, the call on the device."""
    a, cot = _host(name)
    host_f = ssm_vk.mamba3_scan(**a)
    host_g = ssm_vk.mamba3_scan_back(**a, **cot)
    ctx = rt.get_context()
    mixed = {k: ssm_vk.to_device(v) if k in ("x", "B", "s_h") else v for k, v in a.items()}
    for inputs in (_dev(a), mixed):
        r = ssm_vk.mamba3_scan(**inputs)
        assert r.where == ctx.info.where
        for want, got in zip(host_f, r, strict=True):
            assert isinstance(got, ssm_vk.DeviceArray) and got.ctx is ctx and got.shape == want.shape
            assert got.numpy().tobytes() == want.tobytes()
        g = ssm_vk.mamba3_scan_back(**inputs, **{k: ssm_vk.to_device(v) for k, v in cot.items()})
        for k in OP.grad_names:
            if host_g[k] is None:
                assert g[k] is None
                continue
            assert isinstance(g[k], ssm_vk.DeviceArray) and g[k].shape == host_g[k].shape, k
            assert g[k].numpy().tobytes() == host_g[k].tobytes(), k
    again = ssm_vk.mamba3_scan(**_dev(a))   # (a repeat: through the kept replay)
    assert all(_bits(x) == _bits(y) for x, y in zip(again, host_f, strict=True))


def test_views_at_offsets_the_device_cannot_bind_are_copied_on_the_device():
    """An input viewed one element into its buffer (not a multiple of the device's offset
    alignment): the same bits as the host call."""
    a, _ = _host("siso", seed=4)
    want = ssm_vk.mamba3_scan(**a)
    d = _dev(a)
    for k in ("x", "dtheta", "s_h"):
        big = ssm_vk.to_device(np.concatenate([np.ones(1, np.float32), a[k].ravel()]))
        d[k] = big.view(1, a[k].shape)
    assert rt.get_context().info.min_storage_buffer_offset_alignment > 4   # (else no copy is needed)
    r = ssm_vk.mamba3_scan(**d)
    assert all(_bits(x) == _bits(y) for x, y in zip(r, want, strict=True))


@pytest.mark.parametrize("rows", ["permutation", [1, 2]], ids=["permuted", "consecutive"])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_update_cache_on_device_arrays_writes_the_rows_ids_alone(name, rows):
    """Decode steps (T = 1) with update_cache=True on DeviceArray caches: the rows ids hold the
    final state of the float64 reference's call over the same tokens (within the op's tolerance)
    and the same bits as the host caches' update; every other row keeps its bits; y stays on the
    device and equals the host call's. Rows named in any order, and consecutive rows (one copy each
    part)."""
    a, _ = _host(name, seed=9, T=1, ids=rows)
    host = {k: a[k].copy() for k in STATES}
    dev = {k: ssm_vk.to_device(a[k]) for k in STATES}
    before = {k: a[k].copy() for k in STATES}
    ids = a["ids"]
    ref = ssm_ref.mamba3_scan(**a, dtype=np.float64)
    r_host = ssm_vk.mamba3_scan(**{**a, **host}, update_cache=True)
    r_dev = ssm_vk.mamba3_scan(**{**_dev(a), **dev}, update_cache=True)
    assert r_dev.where == rt.get_context().info.where
    assert r_dev.theta is None and r_dev.h is None and r_dev.k is None and r_dev.v is None
    assert isinstance(r_dev.y, ssm_vk.DeviceArray) and r_dev.y.numpy().tobytes() == r_host.y.tobytes()
    unread = np.setdiff1d(np.arange(a["s_h"].shape[0]), ids)
    for k, final in zip(STATES, FINALS, strict=True):
        got = dev[k].numpy()
        assert got.tobytes() == host[k].tobytes(), k
        assert got[unread].tobytes() == before[k][unread].tobytes(), k
        rows, want = got[ids], getattr(ref, final)
        if k == "s_theta":   # angles on the circle
            rows, want = np.cos(rows), np.cos(want)
        assert ssm_ref.tolerance.compare(final, rows, want, TOL[final]).ok, k
    ssm_vk.mamba3_scan(**{**_dev(a), **dev}, update_cache=True)   # a repeat (the kept replay): rows move on
    ssm_vk.mamba3_scan(**{**a, **host}, update_cache=True)
    assert all(dev[k].numpy().tobytes() == host[k].tobytes() for k in STATES)


@pytest.mark.parametrize("step", [1, 0], ids=["one-token", "token-sequential"])
def test_decode_steps_write_the_cache_rows_from_the_kernel_as_the_copies_would(monkeypatch, step):
    """update_cache on DeviceArray caches, where the kernel writes the final state into the rows
    itself (h and v; θ and k too with one block per head), the one-token kernel's and the
    token-sequential one's (M3_STEP): the bits of the host caches' update (the final states read
    back, written by the caller) and the float64 reference's rows, for heads of one and of several
    blocks and for caches viewed at an aligned offset into a larger array; a cache that shares its
    memory with an input (s_v over x's memory: x is read as it was before the call) is left to the
    copies and gives the same bits."""
    from ssm_vk import mamba3_run

    masks = []
    real = mamba3_run._in_place

    def spy(ws, bufs, caches):
        out = real(ws, bufs, caches)
        masks.append((ws.plan.npb, out[0]))
        return out

    monkeypatch.setattr(mamba3_run, "_in_place", spy)
    monkeypatch.setenv("SSM_VK_TUNE", f"M3_STEP={step}")
    align = rt.get_context().info.min_storage_buffer_offset_alignment // 4
    for seed, kw in ((21, dict(P=130, N=4, F=2)), (22, dict(P=5, N=8, F=2, M=2)), (24, dict(P=70, N=64, F=8))):
        a, _ = _host("mimo" if "M" in kw else "siso", seed=seed, T=1, **kw)
        ref = ssm_ref.mamba3_scan(**a, dtype=np.float64)
        host = {k: a[k].copy() for k in STATES}
        ssm_vk.mamba3_scan(**{**a, **host}, update_cache=True)
        for offset in (0, align):   # (views at an aligned offset are bound in place)
            dev = {}
            for k in STATES:
                big = ssm_vk.to_device(np.concatenate([np.full(offset, 7.0, np.float32), a[k].ravel()]))
                dev[k] = big.view(offset, a[k].shape)
            masks.clear()
            r = ssm_vk.mamba3_scan(**{**_dev(a), **dev}, update_cache=True)
            npb, mask = masks[-1]
            assert mask == (3 if npb == 1 else 1)
            assert r.y.numpy().tobytes() == ssm_vk.mamba3_scan(**a).y.tobytes()
            for k, final in zip(STATES, FINALS, strict=True):
                got = dev[k].numpy()
                assert got.tobytes() == host[k].tobytes(), (seed, offset, k)
                rows, want = got[a["ids"]], getattr(ref, final)
                if k == "s_theta":
                    rows, want = np.cos(rows), np.cos(want)
                assert ssm_ref.tolerance.compare(final, rows, want, TOL[final]).ok, k
    # s_v over x's memory (T = 1, R = S: rows ids[i] of s_v are x of other sequences)
    a, _ = _host("siso", seed=23, T=1, R=2, ids=[1, 0])
    a["s_v"] = a["x"][:, 0].copy()
    host = {k: a[k].copy() for k in STATES}
    want = ssm_vk.mamba3_scan(**{**a, **host}, update_cache=True)
    shared = ssm_vk.to_device(a["x"])
    d = {**_dev(a), "x": shared, "s_v": shared.view(0, a["s_v"].shape)}
    dev = {k: d[k] for k in STATES}
    masks.clear()
    r = ssm_vk.mamba3_scan(**{**d, **dev}, update_cache=True)
    assert masks[-1][1] & 1 == 0
    assert r.y.numpy().tobytes() == want.y.tobytes()
    assert all(dev[k].numpy().tobytes() == host[k].tobytes() for k in STATES)


def test_prepared_runs_equal_plain_calls_and_read_their_inputs_as_they_are():
    """prepare_mamba3_scan (update_cache too) and prepare_mamba3_scan_back: each run the bits of
    the plain call on the inputs as they are then (changed between runs with DeviceArray.write);
    the same result object every run; a closed call raises."""
    a, cot = _host("mimo", seed=12, T=1)
    d = _dev(a)
    gd = {k: ssm_vk.to_device(v) for k, v in cot.items()}
    rng = np.random.default_rng(0)
    with ssm_vk.prepare_mamba3_scan(**d) as fwd, ssm_vk.prepare_mamba3_scan_back(**d, **gd) as bwd:
        assert fwd.op == "mamba3_scan" and bwd.op == "mamba3_scan_back"
        for _ in range(2):
            for k in ("x", "dtheta", "B"):
                d[k].write(rng.uniform(-1, 1, d[k].shape))
            r = fwd.run()
            assert r is fwd.run()
            want = ssm_vk.mamba3_scan(**{k: _host_value(v) for k, v in d.items()})
            assert all(_bits(x) == _bits(y) for x, y in zip(r, want, strict=True))
            g = bwd.run()
            want_g = ssm_vk.mamba3_scan_back(**{k: _host_value(v) for k, v in {**d, **gd}.items()})
            for k in OP.grad_names:
                assert (g[k] is None) == (want_g[k] is None), k
                assert g[k] is None or _bits(g[k]) == _bits(want_g[k]), k
    with pytest.raises(RuntimeError, match="closed"):
        fwd.run()
    caches = {k: ssm_vk.to_device(a[k]) for k in STATES}
    host = {k: a[k].copy() for k in STATES}
    with ssm_vk.prepare_mamba3_scan(**{**d, **caches}, update_cache=True) as step:
        for _ in range(3):
            d["x"].write(rng.uniform(-1, 1, d["x"].shape))
            y = step.run().y.numpy()
            want = ssm_vk.mamba3_scan(**{**{k: _host_value(v) for k, v in d.items()}, **host}, update_cache=True)
            assert y.tobytes() == want.y.tobytes()
            assert all(caches[k].numpy().tobytes() == host[k].tobytes() for k in STATES)


def _host_value(v):
    return v.numpy() if isinstance(v, ssm_vk.DeviceArray) else v


def test_released_inputs_raise_as_the_scans_do():
    """A released input: RuntimeError from the plain call (also one that repeats a kept replay) and
    from a prepared call's run."""
    a, _ = _host("siso", seed=13)
    d = _dev(a)
    ssm_vk.mamba3_scan(**d)
    with ssm_vk.prepare_mamba3_scan(**d) as call:
        d["dt"].release()
        with pytest.raises(RuntimeError, match="released"):
            ssm_vk.mamba3_scan(**d)
        with pytest.raises(RuntimeError, match="released"):
            call.run()
    fresh = _dev(a)
    fresh["B"].release()
    with pytest.raises(RuntimeError, match="released"):
        ssm_vk.mamba3_scan_back(**fresh)


def test_bad_input_names_the_argument_before_any_work(monkeypatch):
    """DeviceArrays of a wrong shape, an integer DeviceArray, a host array given to a prepared call,
    update_cache with out=, an out of another shape, an out that is an input: TypeError / ValueError
    naming the argument, and no decision taken (the input left as it was)."""
    a, _ = _host("siso", seed=14)
    d = _dev(a)

    def no_device(*args, **kw):
        raise AssertionError("a Vulkan decision was taken for bad input")

    monkeypatch.setattr(mamba3_api, "decide", no_device)
    with pytest.raises(ValueError, match=r"^dt: expected shape"):
        ssm_vk.mamba3_scan(**{**d, "dt": ssm_vk.to_device(a["dt"][:, :2])})
    with pytest.raises(TypeError, match=r"^lam: expected a float array"):
        ssm_vk.mamba3_scan(**{**d, "lam": ssm_vk.to_device(np.zeros(a["lam"].shape, np.int32))})
    with pytest.raises(ValueError, match=r"^s_v: "):
        ssm_vk.mamba3_scan_back(**{**d, "s_v": ssm_vk.to_device(a["s_v"][:, :1])})
    with pytest.raises(TypeError, match=r"^prepare_mamba3_scan: C must be a DeviceArray"):
        ssm_vk.prepare_mamba3_scan(**{**d, "C": a["C"]})
    with pytest.raises(ValueError, match=r"^ids: "):
        ssm_vk.prepare_mamba3_scan(**{**d, "ids": np.array([0, 0])}, update_cache=True)
    outs = {k: ssm_vk.to_device(np.zeros(np.shape(v), np.float32)) for k, v in zip(
        ("y", "theta", "h", "k", "v"), ssm_ref.mamba3_scan(**a), strict=True)}
    with pytest.raises(ValueError, match=r"^out: not with update_cache"):
        ssm_vk.mamba3_scan(**d, update_cache=True, out=outs)
    with pytest.raises(ValueError, match=r"^out\['h'\]: shape"):
        ssm_vk.mamba3_scan(**d, out={**outs, "h": ssm_vk.to_device(np.zeros((1, 2), np.float32))})
    x_before = d["x"].numpy().tobytes()
    with pytest.raises(ValueError, match=r"^out\['y'\]: overlaps the input x "):
        ssm_vk.mamba3_scan(**d, out={**outs, "y": d["x"]})      # (SISO: y has x's shape)
    assert d["x"].numpy().tobytes() == x_before


def test_out_takes_the_callers_arrays():
    """out= writes the five outputs into the caller's DeviceArrays and returns them: the plain
    call's bits."""
    a, _ = _host("mimo", seed=15)
    want = ssm_vk.mamba3_scan(**a)
    out = {k: ssm_vk.to_device(np.zeros(v.shape, np.float32)) for k, v in zip(("y", *FINALS), want, strict=True)}
    r = ssm_vk.mamba3_scan(**_dev(a), out=out)
    assert r.y is out["y"] and r.h is out["h"] and r.v is out["v"]
    assert all(_bits(x) == _bits(y) for x, y in zip(r, want, strict=True))


@pytest.mark.parametrize(("name", "kw"), [("siso", {}), ("mimo", {"psi": False, "states": False, "ids": "none"}),
                                          ("siso", {"T": 70, "S": 1, "R": 2})])
def test_the_backwards_out_takes_the_callers_arrays(name, kw):
    """mamba3_scan_back's out= writes every gradient into the caller's DeviceArrays (d_psi only
    where psi is given; the start states' also without start states) and returns them: the plain
    call's bits (the token-sequential backward, and at 70 tokens the chunked one where it runs);
    an incomplete or foreign set of arrays is refused naming the array, before any work."""
    a, cot = _host(name, seed=16, **kw)
    want = ssm_vk.mamba3_scan_back(**a, **cot)
    names = [k for k in want.keys() if want[k] is not None]
    out = {k: ssm_vk.to_device(np.full(np.shape(want[k]), np.nan, np.float32)) for k in names}
    g = ssm_vk.mamba3_scan_back(**_dev(a), **cot, out=out)
    assert g.where == want.where
    for k in names:
        assert g[k] is out[k], k
        assert _bits(g[k]) == _bits(want[k]), k
    with pytest.raises(ValueError, match=r"^out\['d_x'\]: missing"):
        ssm_vk.mamba3_scan_back(**a, **cot, out={k: v for k, v in out.items() if k != "d_x"})
    if a["psi"] is None:
        extra = ssm_vk.to_device(np.zeros((2, 2, 3), np.float32))
        with pytest.raises(ValueError, match=r"^out\['d_psi'\]: not an output"):
            ssm_vk.mamba3_scan_back(**a, **cot, out={**out, "d_psi": extra})
    d = _dev(a)
    with pytest.raises(ValueError, match=r"^out\['d_x'\]: overlaps the input x"):
        ssm_vk.mamba3_scan_back(**d, **cot, out={**out, "d_x": d["x"]})


@pytest.mark.parametrize("stage", [16, 32])
def test_the_staging_batch_moves_values_only(stage):
    """M3_STAGE (the token-sequential forward's loads in flight as the state rows come in through
    shared memory) changes where values wait, not what they are: decode steps and a short forward
    of several channel blocks (P = 130, a partial last tile of rows) and of N = 128 (four pieces
    of columns) give the bits of the default, and the in-place cache rows too (the decode steps on
    the token-sequential kernel, M3_STEP = 0, as by default)."""
    for seed, kw in ((31, dict(P=130, N=6, F=2)), (32, dict(P=64, N=128, F=32)), (33, dict(T=5, P=40, N=20, F=4))):
        a, _ = _host("siso", seed=seed, **{"T": 1, **kw})
        with ssm_vk.config.configure(tune={"M3_STEP": 0}):
            want = ssm_vk.mamba3_scan(**a)
            host = {k: a[k].copy() for k in STATES}
            ssm_vk.mamba3_scan(**{**a, **host}, update_cache=True)
        with ssm_vk.config.configure(tune={"M3_STAGE": stage, "M3_STEP": 0}):
            got = ssm_vk.mamba3_scan(**a)
            dev = {k: ssm_vk.to_device(a[k]) for k in STATES}
            ssm_vk.mamba3_scan(**{**_dev(a), **dev}, update_cache=True)
        assert got.where.startswith("Vulkan"), got.where
        for k in ("y", *FINALS):
            assert _bits(getattr(got, k)) == _bits(getattr(want, k)), (seed, k)
        assert all(_bits(dev[k]) == host[k].tobytes() for k in STATES), seed
