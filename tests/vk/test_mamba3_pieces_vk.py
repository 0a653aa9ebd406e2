"""Mamba-3 arrays beyond one allocation, held in pieces (runtime.Pieces) cut at the chunked
kernels' windows (mamba3_memory.pieces), and arrays of tokens beyond one binding, bound window by
window.

The device's limits are lowered (``ctx.seams.override_limits``): ``maxStorageBufferRange`` below
the arrays of tokens (x, y, g_y, d_x: P well above N, so they, not the scratch, set the windows),
then ``maxMemoryAllocationSize`` to that range too -- the windows, hence the arithmetic, are
those of the call with only the range lowered, and the call in pieces must equal that one bit for
bit (forward and backward; windows of sequences and of one sequence's tokens; host arrays,
DeviceArrays made in pieces, outputs in pieces, ``out=`` arrays cut elsewhere, DeviceArray caches
written by ids). ``supports()`` must agree with what runs. A flagged call (inf or nan) cannot be
computed again on the token-sequential kernels, which bind the arrays whole: it is computed on
ssm_fast, as supports() says. Every test runs under the validation layer (tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from mamba3_chunks import args_of

import ssm_fast
import ssm_ref
import ssm_vk
from ssm_ref import ops
from ssm_ref.mamba3_checks import check_mamba3_backward
from ssm_ref.testing import mamba3_cases
from ssm_ref.tolerance import MAMBA3_F32_TOL, compare, scaled
from ssm_vk import config, mamba3_api
from ssm_vk import runtime as rt
from ssm_vk.arrays import empty
from ssm_vk.mamba3_run import forward_shapes

pytestmark = pytest.mark.vulkan

INPUTS = ops.get("mamba3_scan").float_inputs
OUTS = ("y", "theta", "h", "k", "v")
TUNE = {"M3_CHUNK": 16, "M3_CHUNK_MIN_T": 1, "M3_CHUNK_BWD_MIN_T": 1}
# P well above N: x, y and their cotangents outweigh the queries and keys, so a range below x
# cuts the call into windows that bound x (of sequences; of one sequence's tokens)
SEQS = dict(S=6, T=40, H=2, P=16, N=8, G=1, F=2, R=8, ids="duplicates")
TOKENS = dict(S=1, T=200, H=2, P=16, N=8, G=1, F=2, R=2, ids="permutation")
OPS = ("mamba3_scan", "mamba3_scan_back")


def _case(seed: int, shape: dict):
    case = mamba3_cases.make_case(seed, **shape)
    return args_of(case), dict(case.cotangents)


def _dims(args):
    return check_mamba3_backward(*(args[k] for k in INPUTS), args["ids"], rotation=args["rotation"],
                                 dtype=np.float32).dims


def _range(d) -> int:
    """A binding range a third of x's bytes (a multiple of 256 bytes): three windows or more."""
    return d.S * d.T * d.H * d.P * 4 // 3 // 256 * 256


def _get(r, name):
    a = r[name] if hasattr(r, "keys") else getattr(r, name)
    return a.numpy() if isinstance(a, ssm_vk.DeviceArray) else a


def _names(op: str, r) -> tuple:
    return OUTS if op == "mamba3_scan" else tuple(k for k in r.keys() if r[k] is not None)


def _same(got, want, names) -> None:
    for name in names:
        assert np.asarray(_get(got, name)).tobytes() == np.asarray(_get(want, name)).tobytes(), name


def _near(got, args, cot, op: str, names, T: int) -> None:
    ref = getattr(ssm_ref, op)(**args, **cot, dtype=np.float64)
    tol = scaled(MAMBA3_F32_TOL, T)
    for name in names:
        cmp = compare(name, _get(ref, name), np.asarray(_get(got, name), np.float64), tol[name])
        assert cmp.ok, cmp.message()


def _pieced(op: str, d, rng: int, ctx) -> dict:
    """The decision's cuts with the range and the allocation lowered to ``rng``: every array of
    tokens beyond it in pieces, cut at the chunked kernels' windows."""
    with ctx.seams.override_limits(max_storage_buffer_range=rng, max_memory_allocation_size=rng):
        dec = mamba3_api.decide(op, d)
    assert dec.sup, dec.sup.reason
    assert dec.planned.first.family.name == "mamba3_chunked" and dec.planned.first.plan.windowed
    assert "x" in {k.rpartition(":")[2] for k in dec.planned.cuts}, dec.planned.cuts
    return dec.planned.cuts


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", [SEQS, TOKENS], ids=["sequences", "tokens"])
def test_a_call_in_pieces_is_the_call_in_the_same_windows(op, shape):
    # host arrays uploaded into pieces and outputs read back from pieces: the bits of the call in
    # the same windows with every array whole; supports() says yes and names the host recompute
    ctx = ssm_vk.runtime.get_context()
    args, cot = _case(11 if op == "mamba3_scan" else 12, shape)
    cot = cot if op == "mamba3_scan_back" else {}
    d = _dims(args)
    rng = _range(d)
    call = getattr(ssm_vk, op)
    with config.configure(tune=TUNE):
        cuts = _pieced(op, d, rng, ctx)
        assert all(len(starts) > 1 for starts in cuts.values())
        with ctx.seams.override_limits(max_storage_buffer_range=rng):
            want = call(**args, **cot)
        with ctx.seams.override_limits(max_storage_buffer_range=rng, max_memory_allocation_size=rng):
            sup = ssm_vk.supports(op, *(args[k] for k in INPUTS), args["ids"], rotation=args["rotation"])
            got = call(**args, **cot)
    assert sup.ok and "computed on the CPU" in sup.reason, sup.reason
    assert got.where.startswith("Vulkan") and want.where.startswith("Vulkan")
    names = _names(op, want)
    _same(got, want, names)
    _near(got, args, cot, op, names, d.T)


def _dev(args: dict) -> dict:
    return {k: ssm_vk.to_device(v) if isinstance(v, np.ndarray) and v.dtype == np.float32 else v
            for k, v in args.items()}


def _shifted(flat, shape):
    """``flat``'s elements from the second on, as an array of ``shape`` (a view)."""
    return flat.view(1, shape)


@pytest.mark.parametrize("shape", [SEQS, TOKENS], ids=["sequences", "tokens"])
def test_device_arrays_in_pieces_in_and_out(shape):
    # DeviceArrays made in pieces where to_device cuts them (not at the windows: copied into the
    # call's own pieces, or bound in place where every window lies in one piece), DeviceArray
    # caches written by ids, results in pieces, and out= arrays in pieces: the host call's bits
    ctx = ssm_vk.runtime.get_context()
    args, cot = _case(13, dict(shape, ids="permutation"))
    host_args = {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v for k, v in args.items()}
    d = _dims(args)
    per_seq = d.T * d.H * d.P * 4   # (x's bytes per sequence: four and a half of them, where S > 1)
    rng = per_seq * 9 // 2 if d.S > 4 else _range(d)
    with config.configure(tune=TUNE):
        _pieced("mamba3_scan", d, rng, ctx)
        with ctx.seams.override_limits(max_storage_buffer_range=rng):
            want = ssm_vk.mamba3_scan(**host_args, update_cache=True)
            want_all = ssm_vk.mamba3_scan(**args)
            want_back = ssm_vk.mamba3_scan_back(**args, **cot)
        with ctx.seams.override_limits(max_storage_buffer_range=rng, max_memory_allocation_size=rng):
            dev = _dev(args)
            assert type(dev["x"].buffer) is rt.Pieces
            got = ssm_vk.mamba3_scan(**dev, update_cache=True)
            assert type(got.y.buffer) is rt.Pieces
            # out= arrays in pieces cut where to_device cuts (whole sequences up to a binding: 4 +
            # 2 at SEQS, where the windows are 3 + 3: y computed into the call's own pieces and
            # copied in), and x a view one element in (every window starts where the device cannot
            # bind: copied into the call's pieces first)
            y_out = {k: empty(ctx, v) for k, v in forward_shapes(d).items()}
            shifted = dict(_dev(args), x=_shifted(ssm_vk.to_device(np.concatenate([[0], args["x"].ravel()])
                                                                  .astype(np.float32)), args["x"].shape))
            assert type(y_out["y"].buffer) is rt.Pieces and type(shifted["x"].buffer) is rt.Pieces
            given = ssm_vk.mamba3_scan(**shifted, out=y_out)
            back = ssm_vk.mamba3_scan_back(**_dev(args), **{k: ssm_vk.to_device(v) for k, v in cot.items()
                                                              if v is not None})
    assert got.where.startswith("Vulkan") and given.where.startswith("Vulkan") and back.where.startswith("Vulkan")
    assert got.y.numpy().tobytes() == want.y.tobytes()
    for name in ("s_theta", "s_h", "s_k", "s_v"):
        assert dev[name].numpy().tobytes() == host_args[name].tobytes(), name
    assert given.y is y_out["y"]
    _same(given, want_all, OUTS)
    _same(back, want_back, _names("mamba3_scan_back", want_back))


@pytest.mark.parametrize("op", OPS)
def test_a_nonfinite_call_in_pieces_is_computed_on_the_cpu(op):
    # nan in x: the chunked kernels flag it; the token-sequential recompute cannot bind the
    # arrays whole, so ssm_fast computes the call (supports() said so): its bits
    ctx = ssm_vk.runtime.get_context()
    args, cot = _case(14, SEQS)
    cot = cot if op == "mamba3_scan_back" else {}
    d = _dims(args)
    x = np.array(args["x"], copy=True)
    x[d.S - 1, d.T // 2, 0, 0] = np.nan
    args["x"] = x
    rng = _range(d)
    with config.configure(tune=TUNE):
        _pieced(op, d, rng, ctx)
        with ctx.seams.override_limits(max_storage_buffer_range=rng, max_memory_allocation_size=rng):
            got = getattr(ssm_vk, op)(**args, **cot)
    assert got.where == "CPU"
    want = getattr(ssm_fast, op)(**args, **cot)
    names = _names(op, want)
    for name in names:
        assert np.array_equal(_get(got, name), _get(want, name), equal_nan=True), name


def test_a_prepared_call_in_pieces_is_refused_with_the_reason():
    # a prepared call runs on the device every run: a shape whose flagged results the CPU would
    # compute is refused when prepared, naming why
    ctx = ssm_vk.runtime.get_context()
    args, _ = _case(15, SEQS)
    d = _dims(args)
    rng = _range(d)
    with config.configure(tune=TUNE), ctx.seams.override_limits(max_storage_buffer_range=rng,
                                                                max_memory_allocation_size=rng):
        with pytest.raises(ValueError, match="inf or nan would be computed on the CPU"):
            ssm_vk.prepare_mamba3_scan(**_dev(args))


def test_a_cache_beyond_one_allocation_is_refused_with_the_reason():
    # only arrays of tokens are held in pieces: a cache (read whole by ids) beyond one allocation
    # is computed on the CPU, as supports() says
    ctx = ssm_vk.runtime.get_context()
    args, _ = _case(16, dict(SEQS, R=64))
    d = _dims(args)
    cache = d.R * d.H * d.P * d.N * 4
    rng = cache // 2 // 256 * 256
    with config.configure(tune=TUNE), ctx.seams.override_limits(max_storage_buffer_range=rng,
                                                                max_memory_allocation_size=rng):
        sup = ssm_vk.supports("mamba3_scan", *(args[k] for k in INPUTS), args["ids"], rotation=args["rotation"])
        got = ssm_vk.mamba3_scan(**args)
    assert not sup.ok and "state h" in sup.reason, sup.reason
    assert got.where == "CPU"
    _same(got, ssm_fast.mamba3_scan(**args), OUTS)


@st.composite
def _drawn(draw):
    S = draw(st.integers(1, 5))
    shape = dict(S=S, T=draw(st.integers(17, 90) if S > 1 else st.integers(60, 200)), H=draw(st.integers(1, 3)),
                 P=draw(st.sampled_from([8, 16, 24])), N=draw(st.sampled_from([4, 8])), G=1,
                 F=draw(st.integers(0, 2)), R=S + draw(st.integers(0, 2)), ids="permutation")
    return shape, draw(st.sampled_from(OPS)), draw(st.integers(2, 5)), draw(st.integers(0, 2**16))


@given(_drawn())
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
def test_drawn_calls_in_pieces_are_the_calls_in_the_same_windows(drawn):
    # drawn shapes, ops and cut points (x cut into 2-5 parts' worth of range): where the decision
    # holds x in pieces, the bits of the call in the same windows with every array whole
    shape, op, parts, seed = drawn
    ctx = ssm_vk.runtime.get_context()
    args, cot = _case(seed, shape)
    cot = cot if op == "mamba3_scan_back" else {}
    d = _dims(args)
    rng = d.S * d.T * d.H * d.P * 4 // parts // 256 * 256
    assume(rng >= 1024)
    call = getattr(ssm_vk, op)
    with config.configure(tune=TUNE):
        with ctx.seams.override_limits(max_storage_buffer_range=rng, max_memory_allocation_size=rng):
            dec = mamba3_api.decide(op, d)
            assume(dec.sup and dec.planned.cuts)
            got = call(**args, **cot)
        with ctx.seams.override_limits(max_storage_buffer_range=rng):
            want = call(**args, **cot)
    assert got.where.startswith("Vulkan") and want.where.startswith("Vulkan")
    _same(got, want, _names(op, want))
