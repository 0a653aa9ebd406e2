"""A chunked Mamba-3 backward whose token-sequential recompute does not fit the device (its work
buffer beyond one binding, where the chunked kernels' scratch fits): the call runs on the device,
and only a call whose result the chunked kernels flag as non-finite is computed on the host
(ssm_fast, ``where == "CPU"``, the reason logged); a prepared call of such a shape is refused.

The binding range is lowered (``ctx.seams.override_limits``) to where this device's own planning
puts the one plan and not the other, searched, not assumed. Every test runs under the validation
layer (tests/conftest.py fails a test on any message)."""

from __future__ import annotations

import numpy as np
import pytest
from mamba3_chunks import args_of, reruns

import ssm_fast
import ssm_ref
import ssm_vk
from ssm_ref import ops
from ssm_ref.mamba3_checks import check_mamba3_backward
from ssm_ref.testing import mamba3_cases
from ssm_ref.tolerance import MAMBA3_F32_TOL, compare, scaled
from ssm_vk import config, mamba3_api, support
from ssm_vk.family import OnHost
from ssm_vk.mamba3 import mamba3_planner

pytestmark = pytest.mark.vulkan

INPUTS = ops.get("mamba3_scan").float_inputs
GRADS = ("d_x", "d_dt", "d_dA", "d_lam", "d_B", "d_C", "d_B_bias", "d_C_bias", "d_dtheta", "d_psi", "d_s_theta",
         "d_s_h", "d_s_k", "d_s_v")
# A head's work buffer (every token's keys and angles, sqrt(T) checkpoints) is about three times
# the chunked backward's largest scratch here (the queries' and keys' cotangents)
SHAPE = dict(S=3, T=64, H=2, P=16, N=16, G=1, F=4, R=4, ids="permutation")


def _case(seed=3):
    case = mamba3_cases.make_case(seed, **SHAPE)
    return args_of(case), dict(case.cotangents)


def _dims(args):
    return check_mamba3_backward(*(args[k] for k in INPUTS), args["ids"], rotation=args["rotation"],
                                 dtype=np.float32).dims


@pytest.fixture
def narrow():
    """The backward on the chunked kernels (from one token), under a binding range where their
    scratch fits and the token-sequential work buffer does not: the largest range, in 256-byte
    steps below the work buffer's bytes, at which this device's planning gives a chunked plan whose
    recompute is OnHost. Yields the limits' override arguments."""
    ctx = ssm_vk.runtime.get_context()
    args, _ = _case()
    d = _dims(args)
    with config.configure(tune={"M3_CHUNK_BWD_MIN_T": 1}):
        knobs = config.settings()
        room = mamba3_api.decide("mamba3_scan_back", d, knobs)
        if not room.sup or room.planned.first.family.name != "mamba3_chunked":
            pytest.skip("this device lacks the chunked backward's limits (workgroup, shared memory, storage buffers)")
        found = None
        for rng in range(4 * mamba3_planner.work_elems(d), 0, -256):
            with ctx.seams.override_limits(max_storage_buffer_range=rng):
                dec = mamba3_api.decide("mamba3_scan_back", d, knobs)
            if not dec.sup:
                break
            if isinstance(dec.planned.first.rerun, OnHost):
                found = rng
                break
        assert found is not None, "no binding range takes the chunked backward without its recompute"
        yield dict(max_storage_buffer_range=found)


def test_it_runs_on_the_device_as_it_does_with_room(narrow):
    # supports() says yes (it said no while the chunked plan needed the token-sequential one too)
    # and that a non-finite result would be computed on the CPU; the call runs on the device, its
    # gradients the bits of the same call with room (the same chunked kernels) and within the
    # op's tolerance of the float64 reference
    ctx = ssm_vk.runtime.get_context()
    args, cot = _case()
    want = ssm_vk.mamba3_scan_back(**args, **cot)
    with ctx.seams.override_limits(**narrow):
        sup = ssm_vk.supports("mamba3_scan_back", **args)
        got = ssm_vk.mamba3_scan_back(**args, **cot)
    assert sup.ok, sup.reason
    assert "a result holding inf or nan is computed on the CPU" in sup.reason, sup.reason
    assert got.where.startswith("Vulkan") and want.where.startswith("Vulkan")
    ref = ssm_ref.mamba3_scan_back(**args, **cot, dtype=np.float64)
    tol = scaled(MAMBA3_F32_TOL, SHAPE["T"])
    for name in GRADS:
        if want[name] is None:
            assert got[name] is None
            continue
        assert np.asarray(got[name]).tobytes() == np.asarray(want[name]).tobytes(), name
        cmp = compare(name, ref[name], np.asarray(got[name], np.float64), tol[name])
        assert cmp.ok, cmp.message()


@pytest.mark.parametrize("device_arrays", [False, True])
def test_a_nonfinite_call_is_computed_on_the_host_with_the_reason(narrow, device_arrays):
    # nan in x: the chunked kernels flag it, and the token-sequential recompute cannot run here, so
    # ssm_fast computes the call (where "CPU", its gradients bit for bit; DeviceArrays in give
    # DeviceArrays out) and the reason is logged (once in the process: support.log_once)
    ctx = ssm_vk.runtime.get_context()
    args, cot = _case(seed=5 + device_arrays)
    x = np.array(args["x"], copy=True)
    x.reshape(-1)[x.size // 2] = np.nan
    args["x"] = x
    want = ssm_fast.mamba3_scan_back(**args, **cot)
    if device_arrays:
        args = {k: ssm_vk.to_device(v) if isinstance(v, np.ndarray) and v.dtype == np.float32 else v
                for k, v in args.items()}
    before = reruns()
    with ctx.seams.override_limits(**narrow):
        got = ssm_vk.mamba3_scan_back(**args, **cot)
    assert got.where == "CPU"
    assert reruns() == before   # (not counted, nor logged, as a recompute on the token-sequential kernels)
    assert any("cannot recompute a result holding inf or nan" in m for m in support._logged)
    for name in GRADS:
        if want[name] is None:
            assert got[name] is None
            continue
        g = got[name]
        assert isinstance(g, ssm_vk.DeviceArray) == device_arrays, name
        g = g.numpy() if device_arrays else g
        assert np.asarray(g).tobytes() == np.asarray(want[name]).tobytes(), name


def test_a_repeated_call_that_turns_nonfinite_is_computed_on_the_host(narrow):
    # every array a DeviceArray: the repeated call runs through the replay kept for the first; the
    # same arrays again with nan written into x
    ctx = ssm_vk.runtime.get_context()
    args, cot = _case(seed=11)
    dev = {k: ssm_vk.to_device(v) if isinstance(v, np.ndarray) and v.dtype == np.float32 else v
           for k, v in {**args, **cot}.items()}
    with ctx.seams.override_limits(**narrow):
        wheres = [ssm_vk.mamba3_scan_back(**dev).where for _ in range(2)]   # (the second: the kept replay)
        x = np.array(args["x"], copy=True)
        x.reshape(-1)[3] = np.nan
        dev["x"].write(x)
        got = ssm_vk.mamba3_scan_back(**dev)
    assert all(w.startswith("Vulkan") for w in wheres), wheres
    assert got.where == "CPU"
    want = ssm_fast.mamba3_scan_back(**{**args, "x": x}, **cot)
    for name in GRADS:
        if want[name] is not None:
            assert got[name].numpy().tobytes() == np.asarray(want[name]).tobytes(), name


def test_a_prepared_call_of_such_a_shape_is_refused(narrow):
    # a prepared call runs on the device every time: one whose non-finite results would be
    # computed on the host is refused when prepared, the reason given
    ctx = ssm_vk.runtime.get_context()
    args, cot = _case()
    dev = {k: ssm_vk.to_device(v) if isinstance(v, np.ndarray) and v.dtype == np.float32 else v
           for k, v in {**args, **cot}.items()}
    with ctx.seams.override_limits(**narrow), pytest.raises(ValueError, match="inf or nan would be computed on"):
        ssm_vk.prepare_mamba3_scan_back(**dev)
