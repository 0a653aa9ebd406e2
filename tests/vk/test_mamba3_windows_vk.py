"""The chunked Mamba-3 kernels in windows: of sequences, where the call's scratch (the rotated
queries and keys, the chunk states, the backward's cotangents of q and k) exceeds one binding but
its arrays fit -- the results bit for bit those of the call in one window (each sequence's work is
its own; d_B and d_C are summed over heads per window, the parameters' parts over every sequence
once, after the last window; the start-state gradients scattered once); and of one sequence's
tokens, where that sequence's scratch exceeds it -- each window from the state the one before it
left (the backward after a walk forward to each window's start state, taking each window's
start-state cotangent back to the one before), within float32 rounding of the call in one window.
Both within the op's tolerance of the float64 reference, on fixed and drawn problems.

The binding range is lowered (``ctx.seams.override_limits``) to where this device's own planning
gives such windows: searched, not assumed. Every test runs under the validation layer
(tests/conftest.py fails a test on any message)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from mamba3_chunks import args_of, reruns

import ssm_fast
import ssm_ref
import ssm_vk
from ssm_ref import ops
from ssm_ref.mamba3_checks import check_mamba3_backward
from ssm_ref.testing import mamba3_cases
from ssm_ref.tolerance import MAMBA3_F32_TOL, compare, scaled
from ssm_vk import config, mamba3_api
from ssm_vk.mamba3 import mamba3_chunked_planner

pytestmark = pytest.mark.vulkan

INPUTS = ops.get("mamba3_scan").float_inputs
OUTS = ("y", "theta", "h", "k", "v")
GRADS = ("d_x", "d_dt", "d_dA", "d_lam", "d_B", "d_C", "d_B_bias", "d_C_bias", "d_dtheta", "d_psi", "d_s_theta",
         "d_s_h", "d_s_k", "d_s_v")
# Chunks of 16 tokens from one chunk on (the last one partial): the chunked kernels take these small
# problems on any device. N well above P: a sequence's queries and keys outweigh its x and y, so
# some binding range holds the call's arrays but not the whole call's scratch.
TUNE = {"M3_CHUNK": 16, "M3_CHUNK_MIN_T": 1, "M3_CHUNK_BWD_MIN_T": 1}
SHAPE = dict(S=7, T=50, H=2, P=4, N=32, G=1, F=4, R=9, ids="duplicates")
# T H odd: a sequence of dt is 4 T H bytes, so on a device that aligns bindings to 16 bytes or more
# a window's first sequence is a multiple of 4 (mamba3_chunked_planner.granule)
ODD = dict(S=9, T=33, H=3, P=3, N=32, G=1, F=2, R=9, ids="permutation")


def _case(seed: int, shape: dict = SHAPE, **kw):
    case = mamba3_cases.make_case(seed, **{**shape, **kw})
    return args_of(case), dict(case.cotangents)


def _dims(args):
    return check_mamba3_backward(*(args[k] for k in INPUTS), args["ids"], rotation=args["rotation"],
                                 dtype=np.float32).dims


def _find(op: str, d, knobs, ctx, wanted):
    """The largest binding range (in steps of a 256th of one window's need, a multiple of 64
    bytes: far below a sequence's share of it) under which this device's planning of ``op`` runs
    the chunked kernels with a plan ``wanted(plan)`` accepts, and that plan; None where no range
    does, or where the device lacks the chunked kernels' limits."""
    room = mamba3_api.decide(op, d, knobs)
    if not room.sup or room.planned.first.family.name != "mamba3_chunked":
        return None
    assert not room.planned.first.plan.windowed
    top = 4 * max(mamba3_chunked_planner.chunk_scratch(d, room.planned.first.plan, op.endswith("back")).values())
    for rng in range(top, 0, -max(64, top // 256 // 64 * 64)):
        with ctx.seams.override_limits(max_storage_buffer_range=rng):
            dec = mamba3_api.decide(op, d, knobs)
        if not dec.sup or dec.planned.first.family.name != "mamba3_chunked":
            return None
        if wanted(dec.planned.first.plan):
            return rng, dec.planned.first.plan
    return None


def _needed(found, op: str, d, knobs, what: str):
    """``found`` (_find's), else skipped on a device without the chunked kernels' limits, else failed."""
    if found is None:
        room = mamba3_api.decide(op, d, knobs)
        if not room.sup or room.planned.first.family.name != "mamba3_chunked":
            pytest.skip("this device lacks the chunked kernels' limits (workgroup, shared memory, storage buffers)")
        pytest.fail(f"no binding range runs {op} of {d} in {what} on the chunked kernels")
    return found


def _windows(op: str, d, knobs, ctx, least: int = 3):
    """_find's range for ``least`` or more windows of sequences, the last one shorter where the
    shape allows it."""
    return _needed(_find(op, d, knobs, ctx, lambda plan: len(plan.windows) >= least and plan.Tw == d.T
                         and (d.S % plan.Sw or least > d.S // 2)), op, d, knobs, f"{least} windows of sequences")


def _get(r, name):
    a = r[name] if isinstance(r, dict) or hasattr(r, "keys") else getattr(r, name)
    return a.numpy() if isinstance(a, ssm_vk.DeviceArray) else a


def _same(got, want, names) -> None:
    for name in names:
        if _get(want, name) is None:
            assert _get(got, name) is None, name
            continue
        assert np.asarray(_get(got, name)).tobytes() == np.asarray(_get(want, name)).tobytes(), name


def _near(got, ref, names, T: int) -> None:
    tol = scaled(MAMBA3_F32_TOL, T)
    for name in names:
        if _get(ref, name) is None:
            continue
        cmp = compare(name, _get(ref, name), np.asarray(_get(got, name), np.float64), tol[name])
        assert cmp.ok, cmp.message()


@pytest.mark.parametrize("op", ["mamba3_scan", "mamba3_scan_back"])
@pytest.mark.parametrize("shape", [SHAPE, ODD], ids=["even", "odd"])
def test_the_call_in_windows_is_the_one_window_call(op, shape):
    # host arrays: the results bit for bit the call with room, within tolerance of float64; in
    # the backward, ids with repeats (SHAPE) add start-state gradients of sequences in different
    # windows into one row, in sequence order
    ctx = ssm_vk.runtime.get_context()
    args, cot = _case(1 if op == "mamba3_scan" else 2, shape)
    if op == "mamba3_scan":
        cot = {}
    d = _dims(args)
    call, names = getattr(ssm_vk, op), (OUTS if op == "mamba3_scan" else GRADS)
    with config.configure(tune=TUNE):
        rng, plan = _windows(op, d, config.settings(), ctx)
        want = call(**args, **cot)
        with ctx.seams.override_limits(max_storage_buffer_range=rng):
            got = call(**args, **cot)
    assert plan.windowed and got.where.startswith("Vulkan") and want.where.startswith("Vulkan")
    _same(got, want, names)
    _near(got, getattr(ssm_ref, op)(**args, **cot, dtype=np.float64), names, d.T)


@pytest.mark.parametrize("shape", [SHAPE, ODD], ids=["even", "odd"])
def test_every_window_starts_where_the_device_binds(shape):
    # each window's first sequence puts every array's sub-range at a multiple of the device's
    # minStorageBufferOffsetAlignment (else the binding is invalid: the validation layer says so)
    ctx = ssm_vk.runtime.get_context()
    args, _ = _case(3, shape)
    d = _dims(args)
    align = ctx.info.min_storage_buffer_offset_alignment
    with config.configure(tune=TUNE):
        for op in ("mamba3_scan", "mamba3_scan_back"):
            _, plan = _windows(op, d, config.settings(), ctx)
            assert [w.s0 for w in plan.windows] == list(range(0, d.S, plan.Sw))
            assert sum(w.n for w in plan.windows) == d.S
            for w in plan.windows:
                assert all((w.s0 * d.T + w.t0) * c * 4 % align == 0 for _, c in plan.per_token), (op, w.s0)
                assert all(w.s0 * c * 4 % align == 0 for _, c in plan.per_seq), (op, w.s0)
                assert all((w.s0 * plan.NC + w.t0 // plan.L) * c * 4 % align == 0 for _, c in plan.per_chunk), op


def test_device_arrays_and_update_cache_in_windows():
    # DeviceArray inputs and DeviceArray caches written in place by ids: the same bits as the call
    # in one window, the caches' other rows untouched
    ctx = ssm_vk.runtime.get_context()
    args, _ = _case(4, ids="permutation", R=7)
    d = _dims(args)

    def dev(a):
        return {k: ssm_vk.to_device(v) if isinstance(v, np.ndarray) and v.dtype == np.float32 else v
                for k, v in a.items()}

    with config.configure(tune=TUNE):
        rng, _ = _windows("mamba3_scan", d, config.settings(), ctx)
        want_args, got_args = dev(args), dev(args)
        want = ssm_vk.mamba3_scan(**want_args, update_cache=True)
        with ctx.seams.override_limits(max_storage_buffer_range=rng):
            got = ssm_vk.mamba3_scan(**got_args, update_cache=True)
    assert got.where.startswith("Vulkan")
    assert got.y.numpy().tobytes() == want.y.numpy().tobytes()
    for name in ("s_theta", "s_h", "s_k", "s_v"):
        assert got_args[name].numpy().tobytes() == want_args[name].numpy().tobytes(), name
    ref = ssm_ref.mamba3_scan(**args, dtype=np.float64)
    _near({"h": got_args["s_h"].numpy()[args["ids"]]}, {"h": ref.h}, ("h",), d.T)


def test_a_prepared_call_in_windows_replays_its_bits():
    # (the forward: a prepared backward in windows is refused wherever the token-sequential
    # recompute of a flagged call does not fit, as test_mamba3_host_rerun_vk.py checks)
    ctx = ssm_vk.runtime.get_context()
    args, _ = _case(5)
    d = _dims(args)
    dev = {k: ssm_vk.to_device(v) if isinstance(v, np.ndarray) and v.dtype == np.float32 else v
           for k, v in args.items()}
    with config.configure(tune=TUNE):
        rng, _ = _windows("mamba3_scan", d, config.settings(), ctx)
        want = ssm_vk.mamba3_scan(**args)
        with ctx.seams.override_limits(max_storage_buffer_range=rng):
            call = ssm_vk.prepare_mamba3_scan(**dev)
            first = {k: _get(call.run(), k) for k in OUTS}
            second = call.run()
    _same(first, want, OUTS)
    _same(second, want, OUTS)


def test_a_nonfinite_call_in_windows_is_computed_again():
    # nan in x of a sequence in the last window: the chunked kernels flag it and the call is
    # computed again on the token-sequential kernels (which bind the call's arrays whole), whose
    # inf and nan follow the spec: the bits of the token-sequential call, nan where ssm_fast has it
    ctx = ssm_vk.runtime.get_context()
    args, _ = _case(6)
    d = _dims(args)
    x = np.array(args["x"], copy=True)
    x[d.S - 1, d.T // 2, 0, 0] = np.nan
    args["x"] = x
    with config.configure(tune=TUNE):
        rng, _ = _windows("mamba3_scan", d, config.settings(), ctx)
        before = reruns()
        with ctx.seams.override_limits(max_storage_buffer_range=rng):
            got = ssm_vk.mamba3_scan(**args)
        assert reruns() == before + 1
    with config.configure(tune={"M3_CHUNK": 0}), ctx.seams.override_limits(max_storage_buffer_range=rng):
        want = ssm_vk.mamba3_scan(**args)
    _same(got, want, OUTS)
    fast = ssm_fast.mamba3_scan(**args)
    for name in OUTS:
        assert np.array_equal(np.isnan(getattr(got, name)), np.isnan(getattr(fast, name))), name


# One sequence whose queries and keys (H T N floats each) outweigh B (T N, one group): some binding
# range holds the call's arrays but not one sequence's scratch, and the forward runs in windows of
# its tokens, each from the state the one before it left. Two sequences of four heads likewise.
LONG = [dict(S=1, T=150, H=2, P=4, N=32, G=1, F=4, R=2, ids="permutation"),
        dict(S=2, T=100, H=4, P=4, N=16, G=1, F=2, R=3, ids="permutation")]


def _token_windows(op: str, d, knobs, ctx):
    """_find's range for windows of tokens, three or more per sequence, the last one shorter."""
    return _needed(_find(op, d, knobs, ctx, lambda plan: plan.Tw < d.T and -(-d.T // plan.Tw) >= 3 and d.T % plan.Tw),
                   op, d, knobs, "windows of tokens")


@pytest.mark.parametrize("shape", LONG, ids=["one", "two"])
def test_a_long_sequence_runs_forward_in_windows_of_its_tokens(shape):
    # host arrays, then DeviceArrays with update_cache (the caches' rows ids written, the others
    # kept) and a prepared call (the bits of the plain one, run twice): within tolerance of
    # float64 and of the call in one window
    ctx = ssm_vk.runtime.get_context()
    args, _ = _case(7, shape)
    d = _dims(args)
    with config.configure(tune=TUNE):
        rng, plan = _token_windows("mamba3_scan", d, config.settings(), ctx)
        want = ssm_vk.mamba3_scan(**args)
        dev = {k: ssm_vk.to_device(args[k]) for k in ("s_theta", "s_h", "s_k", "s_v")}
        before = {k: v.numpy() for k, v in dev.items()}
        with ctx.seams.override_limits(max_storage_buffer_range=rng):
            got = ssm_vk.mamba3_scan(**args)
            ssm_vk.mamba3_scan(**{**args, **dev}, update_cache=True)
            dev_args = {k: ssm_vk.to_device(v) if isinstance(v, np.ndarray) and v.dtype == np.float32 else v
                        for k, v in args.items()}
            prepared = ssm_vk.prepare_mamba3_scan(**dev_args)
            runs = [{k: _get(prepared.run(), k) for k in OUTS} for _ in range(2)]
    assert got.where.startswith("Vulkan") and plan.Sw == 1
    assert all(w.nt <= plan.Tw and w.t0 % plan.Tw == 0 for w in plan.windows)
    _near(got, ssm_ref.mamba3_scan(**args, dtype=np.float64), OUTS, d.T)
    _close(got, want, OUTS, d.T)
    for run in runs:   # (a prepared call: the same windows replayed)
        _same(run, got, OUTS)
    ids = args["ids"]
    for k, part in zip(("s_theta", "s_h", "s_k", "s_v"), OUTS[1:], strict=True):
        rows = dev[k].numpy()
        assert rows[ids].tobytes() == _get(got, part).tobytes(), k
        kept = np.setdiff1d(np.arange(rows.shape[0]), ids)
        assert rows[kept].tobytes() == before[k][kept].tobytes(), k


@pytest.mark.parametrize("shape", LONG, ids=["one", "two"])
def test_a_long_sequence_runs_backward_in_windows_of_its_tokens(shape):
    # the walk forward to each window's start state, then the windows back from the last, each
    # taking the start-state cotangent of the one after it: every gradient within tolerance of
    # float64 and of the call in one window; bit-identical reruns
    ctx = ssm_vk.runtime.get_context()
    args, cot = _case(8, shape)
    d = _dims(args)
    with config.configure(tune=TUNE):
        rng, plan = _token_windows("mamba3_scan_back", d, config.settings(), ctx)
        want = ssm_vk.mamba3_scan_back(**args, **cot)
        with ctx.seams.override_limits(max_storage_buffer_range=rng):
            got, again = (ssm_vk.mamba3_scan_back(**args, **cot) for _ in range(2))
    assert got.where.startswith("Vulkan") and plan.Sw == 1
    _near(got, ssm_ref.mamba3_scan_back(**args, **cot, dtype=np.float64), GRADS, d.T)
    _close(got, want, GRADS, d.T)
    _same(again, got, GRADS)


def _close(got, want, names, T: int) -> None:
    """Each output of ``got`` within the op's tolerance of ``want``'s (the call in one window)."""
    tol = scaled(MAMBA3_F32_TOL, T)
    for name in names:
        if _get(want, name) is None:
            continue
        one, windows = (np.asarray(_get(r, name), np.float64) for r in (want, got))
        cmp = compare(name, one, windows, tol[name])
        assert cmp.ok, cmp.message()


@st.composite
def _drawn(draw, tokens: bool):
    """A case whose queries and keys outweigh its arrays (more heads than groups, N above P), so
    that some binding range windows it: of one sequence's tokens where ``tokens`` (one sequence's
    scratch beyond all of B and y: H > S G, N > S P), else of its sequences."""
    S = draw(st.integers(1, 2) if tokens else st.integers(2, 4))
    G = 1 if tokens else draw(st.integers(1, 2))
    H = G * draw(st.integers(S + 1, S + 2) if tokens else st.integers(2, 3))
    P = draw(st.integers(1, 2))
    N = 2 * draw(st.integers(max(4, S * P + 1), 12))
    M = draw(st.sampled_from((None, 2)))
    case = mamba3_cases.make_case(draw(st.integers(0, 2**32 - 1)), S=S, T=draw(st.integers(33, 70)), H=H, P=P, N=N,
                                  G=G, M=M, F=draw(st.integers(0, N // 2)), R=S + 1,
                                  ids=draw(st.sampled_from(("permutation", "duplicates")[:S])),
                                  psi=draw(st.booleans()) if M else True,
                                  rotation=draw(st.sampled_from(("interleaved", "halved"))),
                                  regime=draw(st.sampled_from(("typical", "small_dA", "large_dt"))))
    return args_of(case), dict(case.cotangents)


@pytest.mark.parametrize("tokens", [False, True], ids=["sequences", "tokens"])
@given(data=st.data())
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_drawn_problems_in_windows_meet_the_float64_reference(tokens, data):
    # forward and backward of drawn problems (MIMO, groups, both rotations, repeated ids) in
    # windows: within the op's tolerance of float64 and of the call in one window
    args, cot = data.draw(_drawn(tokens))
    ctx = ssm_vk.runtime.get_context()
    d = _dims(args)
    with config.configure(tune={"M3_CHUNK": 8, "M3_CHUNK_MIN_T": 1, "M3_CHUNK_BWD_MIN_T": 1}):
        for op, kw, names in (("mamba3_scan", {}, OUTS), ("mamba3_scan_back", cot, GRADS)):
            found = _find(op, d, config.settings(), ctx, lambda plan: plan.windowed and (plan.Tw < d.T) == tokens)
            assume(found is not None)
            rng = found[0]
            call = getattr(ssm_vk, op)
            want = call(**args, **kw)
            with ctx.seams.override_limits(max_storage_buffer_range=rng):
                got = call(**args, **kw)
            assert got.where.startswith("Vulkan"), got.where
            _near(got, getattr(ssm_ref, op)(**args, **kw, dtype=np.float64), names, d.T)
            _close(got, want, names, d.T)
