"""ssm_vk's shortcut past the validator for device-resident inputs (ssm_vk/validate.py: a call
whose float arguments are all float32 device arrays is looked up by its shapes once they passed
ssm_ref's validator): it must accept exactly what the validator accepts, hand back the same
Problem, and raise the same exception with the same message -- before any work -- for every
mistake, including those it cannot cache away (the ids' values, the host memory limit).

Each row of test_errors.py's table runs here with its float32 arrays made device arrays: once
with the shortcut's memory cleared (the validator) and once right after a valid call of the same
device shapes (the shortcut's look-up primed), through every entry point it concerns.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_errors import BAD, ENTRY_POINTS, FWD_ARGS, call, valid

import ssm_ref
import ssm_vk
from ssm_vk import config, replay_cache, validate
from ssm_vk import engine as vk_engine

pytestmark = pytest.mark.vulkan


def _on_device(a: dict) -> dict:
    """Every float32 array of ``a`` uploaded (zero-stride giants and other dtypes stay on the host)."""
    return {k: (ssm_vk.to_device(v) if isinstance(v, np.ndarray) and v.dtype == np.float32 and 0 not in v.strides
                else v) for k, v in a.items()}


def _raised(fn):
    try:
        fn()
    except Exception as e:
        return type(e), str(e)
    return None


DEVICE_ROWS = [pytest.param(bad, entry, id=f"{bad.id}-{entry}") for bad in BAD for entry in ENTRY_POINTS
               if (entry == "ssm_scan_back" or not bad.back_only) and not bad.id.startswith(("T-2^31", "R-2^31",
                                                                                             "N-2^31", "S-2^31",
                                                                                             "P-2^31"))]


@pytest.fixture(autouse=True)
def _host_memory_64_gib(monkeypatch):
    monkeypatch.setenv("SSM_HOST_MEMORY_BYTES", str(64 << 30))


@pytest.mark.parametrize("bad,entry", DEVICE_ROWS)
def test_a_bad_device_call_raises_as_the_full_path_does(bad, entry):
    good = _on_device(valid())
    args = _on_device(bad.args())
    validate._PASSED.clear()
    full = _raised(lambda: call(ssm_vk, entry, args))
    assert full is not None and full[0] is bad.exc, full
    vk_engine.current().replays.clear()  # else an earlier test's kept replay (the pool's buffers) skips the validator
    call(ssm_vk, entry, good)  # primes the shortcut with the valid shapes
    call(ssm_vk, "ssm_scan_back", good)
    assert validate._PASSED
    assert _raised(lambda: call(ssm_vk, entry, args)) == full


def _problems_equal(p: ssm_ref.Problem, q: ssm_ref.Problem) -> None:
    fields = {f.name for f in dataclasses.fields(ssm_ref.Problem)}
    assert not hasattr(ssm_ref.Problem, "__post_init__")  # the shortcut makes it without __init__
    assert set(vars(p)) == set(vars(q)) == fields  # the shortcut fills in every field
    assert p.dims == q.dims and p.dtype == q.dtype
    for k in ("s", "x", "dt", "B", "C"):
        assert getattr(p, k) is getattr(q, k), k  # the caller's device arrays, bound in place
    for k in ("A", "g_y", "g_states"):
        a, b = getattr(p, k), getattr(q, k)
        if a is None:
            assert b is None
            continue
        assert (a.shape, a.dtype, a.offset, a.buffer, a._base) == (b.shape, b.dtype, b.offset, b.buffer, b._base), k
    assert p.ids.dtype == q.ids.dtype == np.int64 and np.array_equal(p.ids, q.ids)
    assert not p.ids.flags.writeable and p.ids.flags.c_contiguous


@pytest.mark.parametrize("packed", [False, True], ids=["structured", "packed"])
@pytest.mark.parametrize("ids", [None, [2, 0], np.array([1, 1], np.int32)], ids=["none", "list", "int32"])
def test_the_shortcut_hands_back_the_validators_problem(packed, ids):
    a = _on_device(valid())
    if ids is None:
        a["s"] = ssm_vk.to_device(np.zeros((2, 4, 2, 5), np.float32))  # ids=None needs R >= S
    fwd = {k: a[k] for k in FWD_ARGS} | {"ids": ids}
    g = {"g_y": a["g_y"], "g_states": a["g_states"]}
    if packed:
        host = valid()
        g = {"g_y": ssm_vk.to_device(np.concatenate([host["g_y"].ravel(), host["g_states"].ravel()])),
             "g_states": None}
    validate._PASSED.clear()
    first_f = validate.check_forward(**fwd)
    first_b = validate.check_backward(**fwd, **g)
    assert len(validate._PASSED) == 2
    fast_f = validate.check_forward(**fwd)
    fast_b = validate.check_backward(**fwd, **g)
    assert fast_f.dims is first_f.dims and fast_b.dims is first_b.dims  # from the look-up
    for fast, full in ((fast_f, ssm_ref.check_forward(**fwd, keep_device=True)),
                       (fast_b, ssm_ref.check_backward(**fwd, **g, keep_device=True))):
        _problems_equal(fast, full)  # the validator's own Problem
    # the host backends copy device arrays to the host
    assert isinstance(ssm_ref.check_forward(**fwd).x, np.ndarray)


def test_ids_are_checked_on_every_call():
    a = _on_device(valid())
    ok = ssm_vk.ssm_scan(**{k: a[k] for k in FWD_ARGS})
    assert isinstance(ok.y, ssm_vk.DeviceArray)
    ids = np.array([2, 0])
    ssm_vk.ssm_scan(**{k: a[k] for k in FWD_ARGS[:-1]}, ids=ids)
    ids[1] = 3  # the same array, its values changed between calls
    with pytest.raises(ValueError, match=r"^ids: every id must be in \[0, R\) = \[0, 3\).*got 3$"):
        ssm_vk.ssm_scan(**{k: a[k] for k in FWD_ARGS[:-1]}, ids=ids)
    with pytest.raises(ValueError, match=r"^ids: every id must be in .*got -5$"):
        ssm_vk.ssm_scan_back(**{k: a[k] for k in FWD_ARGS[:-1]}, ids=[-5, 0], g_y=a["g_y"], g_states=a["g_states"])


def test_the_host_memory_limit_is_read_on_every_call(monkeypatch):
    a = _on_device(valid())
    fwd = {k: a[k] for k in FWD_ARGS}
    back = {**fwd, "g_y": a["g_y"], "g_states": a["g_states"]}

    def prime():  # ssm_vk's shortcut past the validator, and its lanes (which skip it when found)
        vk_engine.current().replays.clear()
        ssm_vk.ssm_scan(**fwd)
        ssm_vk.ssm_scan_back(**back)
        floats = tuple(fwd[k] for k in FWD_ARGS[:-1])
        assert validate._PASSED and replay_cache.find(False, floats, config.settings())[0] is not None

    prime()
    monkeypatch.setenv("SSM_HOST_MEMORY_BYTES", "15")  # ids as int64: 16 bytes
    for run in (lambda: ssm_vk.ssm_scan(**fwd), lambda: ssm_vk.ssm_scan_back(**back),
                lambda: ssm_vk.supports("ssm_scan", **fwd)):
        got = _raised(run)  # a lane's call for ssm_scan / ssm_scan_back
        vk_engine.current().replays.clear()
        assert got == _raised(run)  # the shortcut (validate.py)
        validate._PASSED.clear()
        assert got == _raised(run)  # the validator
        assert got[0] is ValueError and "needs 16 bytes of host memory (input copies 16)" in got[1], got
        assert got[1].endswith("nothing was allocated")
        monkeypatch.setenv("SSM_HOST_MEMORY_BYTES", str(64 << 30))
        prime()
        monkeypatch.setenv("SSM_HOST_MEMORY_BYTES", "15")
    monkeypatch.setenv("SSM_HOST_MEMORY_BYTES", "lots")
    got = _raised(lambda: ssm_vk.ssm_scan(**fwd))
    assert got == (ValueError, "SSM_HOST_MEMORY_BYTES: expected a number of bytes, got 'lots'")


@pytest.mark.parametrize("device", [False, True], ids=["host", "device"])
def test_results_have_every_field(device):
    # ssm_vk fills its frozen result dataclasses' fields directly (no __init__): all of them.
    a = _on_device(valid()) if device else valid()
    r = ssm_vk.ssm_scan(**{k: a[k] for k in FWD_ARGS})
    g = ssm_vk.ssm_scan_back(**{k: a[k] for k in FWD_ARGS}, g_y=a["g_y"], g_states=a["g_states"])
    for res, cls in ((r, ssm_ref.ScanResult), (g, ssm_ref.ScanGrads)):
        assert type(res) is cls and not hasattr(cls, "__post_init__")
        # (ScanResult.snapshots of a K = 1 call: made when first read, then kept)
        lazy = {"snapshots"} if cls is ssm_ref.ScanResult else set()
        assert set(vars(res)) | lazy == {f.name for f in dataclasses.fields(cls)}
        assert all(getattr(res, f.name) is not None for f in dataclasses.fields(cls))
        assert set(vars(res)) == {f.name for f in dataclasses.fields(cls)}
        assert res.where.startswith("Vulkan") and res.backend == "ssm_vk"
    assert isinstance(r.y, ssm_vk.DeviceArray) == device and isinstance(g.d_A, ssm_vk.DeviceArray) == device
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.d_x = None
