"""The decode kernel (ssm_vk/sequential/glsl/ssm_decode.comp: one token, Mamba-2, the state in 16-byte loads,
a head's step, B and C shared by the rows its row slots walk) against the float64 oracle, under
the validation layer: drawn shapes and both step forms, every number of channels a slot takes in
turn (the same bits), the cache rows read and written in place, arrays whose windows do not start
at a multiple of four floats (its scalar path, the same bits), non-finite inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from problems import make_problem
from registry import F32_TOL, Backend, assert_close, oracle_scan
from test_update_cache_vk import _check as check_update_cache

import ssm_ref
import ssm_vk
from ssm_vk import config
from ssm_vk import runtime as rt
from ssm_vk.registry import plan
from ssm_vk.sizing import Limits

pytestmark = pytest.mark.vulkan

VK = Backend(name="ssm_vk", module=ssm_vk, where=r"Vulkan\d+", tol=F32_TOL)
# The decode kernel wherever it applies: by default a step of few threads (these small ones) keeps
# the ordinary kernel.
FORCE = {"DEC": 1}


@pytest.fixture(autouse=True)
def _decode_kernel_wherever_it_applies():
    with config.configure(tune=FORCE):
        yield


def layout(args, tune=FORCE):
    """The forward's lane layout for these arguments on this device, under ``tune``."""
    with config.configure(tune=tune):
        return plan(ssm_ref.check_forward(**args).dims, Limits.of(rt.get_context().info), False,
                    config.settings()).plan.layout


def decode_case(seed, S, H, P, N, G=1, R=None, ids="permutation"):
    return make_problem(seed, S=S, T=1, H=H, P=P, N=N, G=G, R=R, ids=ids)


@st.composite
def decode_problems(draw):
    """One-token Mamba-2 problems the decode kernel takes: N a multiple of 4, and workgroups small
    enough (WG) for P channels to fill their row slots."""
    N = draw(st.sampled_from([4, 8, 12, 16, 20, 32, 64, 128]))
    G = draw(st.sampled_from([1, 2]))
    H = G * draw(st.integers(1, 3))
    S = draw(st.integers(1, 5))
    ids = draw(st.sampled_from(["none", "permutation", "duplicates", "unused"] if S >= 2 else ["none", "unused"]))
    wg = draw(st.sampled_from([32, 64, 128]))
    seed = draw(st.integers(0, 2**31 - 1))
    return decode_case(seed, S=S, H=H, P=draw(st.integers(1, 72)), N=N, G=G, ids=ids), {"WG": wg, **FORCE}


@settings(max_examples=25, deadline=None)
@given(decode_problems(), st.sampled_from(["ggml", "log1p"]))
def test_drawn_decode_steps_match_the_oracle(drawn, form):
    case, tune = drawn
    args = case.args()
    with config.configure(tune=tune):
        r = ssm_vk.ssm_scan(**args, dt_softplus=form)
        plain = None
        if layout(args, tune).DEC:
            with config.configure(tune={**tune, "DEC": 0}):
                plain = ssm_vk.ssm_scan(**args, dt_softplus=form)
    assert r.where.startswith("Vulkan")
    o = ssm_ref.ssm_scan(**args, dtype=np.float64, dt_softplus=form)
    assert_close(VK, "y", r.y, o.y, label=repr(case))
    assert_close(VK, "states", r.states, o.states, label=repr(case))
    if plain is not None:   # the ordinary kernel on the same call: the same function
        assert_close(VK, "y", plain.y, o.y, label=repr(case))


def test_which_steps_take_the_decode_kernel():
    # What the planner gives a decode step on this device, whatever its subgroup size: the
    # benchmark's steps of 16 and 128 sequences by default, one sequence only when asked.
    for S, H, N, default in ((16, 80, 128, 1), (128, 48, 128, 1), (1, 80, 128, 0), (4, 8, 16, 0)):
        args = decode_case(0, S=S, H=H, P=64, N=N).args()
        assert layout(args, {}).DEC == default, (S, H, N)
        lay = layout(args)
        assert lay.DEC == 1 and lay.HB == 1 and lay.NPL % 4 == 0 and 4 * lay.LN * (lay.NPL // 4) >= N, lay
        assert lay.PB % lay.rows == 0 or lay.PB == 64
        assert layout(args, {"DEC": 0}).DEC == 0
    # never for Mamba-1, more than one token, N not a multiple of 4, or too few channels
    for kw in (dict(variant="mamba1", P=1), dict(T=2, P=64), dict(N=6, P=64), dict(P=1)):
        base = dict(S=2, T=1, H=4, P=64, N=16, G=1)
        base.update(kw)
        assert layout(make_problem(1, **base).args()).DEC == 0, kw


@pytest.mark.parametrize("N", [16, 128])
def test_every_number_of_turns_gives_the_same_bits(N):
    case = decode_case(3, S=3, H=4, P=64, N=N, G=2)
    args = case.args()
    its = [1, 2, 4, 8, 16, 64]
    got = []
    for it in its:
        assert layout(args, {"DEC_IT": it, **FORCE}).DEC == 1
        with config.configure(tune={"DEC_IT": it, **FORCE}):
            r = ssm_vk.ssm_scan(**args)
        got.append((r.y, r.states))
    o = oracle_scan(**args)
    assert_close(VK, "y", got[0][0], o.y)
    assert_close(VK, "states", got[0][1], o.states)
    for it, (y, s) in zip(its[1:], got[1:], strict=True):
        assert np.array_equal(y, got[0][0]) and np.array_equal(s, got[0][1]), it


def test_cache_rows_in_place_and_update_cache():
    # update_cache against the same call without it (test_update_cache_vk's check), on this kernel
    case = decode_case(5, S=4, H=3, P=64, N=32, ids="unused", R=9)
    args = case.args()
    assert layout(args).DEC == 1
    dev, r = check_update_cache(case, tune=FORCE)
    o = oracle_scan(**args)
    assert_close(VK, "y", r.y.numpy(), o.y)
    assert_close(VK, "states", dev["s"].numpy()[case.ids], o.states)


@pytest.mark.parametrize("shift", [1, 2, 3])
def test_windows_off_a_multiple_of_four_floats_give_the_same_bits(shift):
    # The states, the cache and B and C as views that start `shift` floats into a buffer: the
    # kernel's scalar loads and stores of the same four values.
    case = decode_case(7, S=3, H=2, P=64, N=16, ids="permutation", R=5)
    args = case.args()
    assert layout(args).DEC == 1
    aligned = ssm_vk.ssm_scan(**{k: ssm_vk.to_device(v) if k != "ids" else v for k, v in args.items()})

    def shifted(a):
        flat = np.concatenate([np.full(shift, 7.0, np.float32), a.reshape(-1), np.full(5, 9.0, np.float32)])
        return ssm_vk.to_device(flat).view(shift, a.shape)

    dev = {k: shifted(v) if k in ("s", "B", "C") else ssm_vk.to_device(v) for k, v in args.items() if k != "ids"}
    r = ssm_vk.ssm_scan(**dev, ids=case.ids)
    assert np.array_equal(r.y.numpy(), aligned.y.numpy())
    assert np.array_equal(r.states.numpy(), aligned.states.numpy())
    s_before = dev["s"].numpy()
    r2 = ssm_vk.ssm_scan(**dev, ids=case.ids, update_cache=True)   # the scalar stores into the cache
    s_after = dev["s"].numpy()
    assert np.array_equal(r2.y.numpy(), aligned.y.numpy())
    assert np.array_equal(s_after[case.ids], aligned.states.numpy())
    rest = np.setdiff1d(np.arange(s_after.shape[0]), case.ids)
    assert np.array_equal(s_after[rest], s_before[rest])


@pytest.mark.parametrize("regime", ["wide_dt", "overflow", "nonfinite"])
def test_non_finite_and_extreme_steps_as_the_reference(regime):
    case = make_problem(11, S=3, T=1, H=4, P=64, N=16, G=2, regime=regime)
    args = case.args()
    assert layout(args).DEC == 1
    r = ssm_vk.ssm_scan(**args)
    ref = ssm_ref.ssm_scan(**args)                    # float32 reference: the non-finite pattern
    for name in ("y", "states"):
        got, want = getattr(r, name), getattr(ref, name)
        assert np.array_equal(np.isnan(got), np.isnan(want)), name
        assert np.array_equal(np.isposinf(got), np.isposinf(want)) and np.array_equal(np.isneginf(got),
                                                                                        np.isneginf(want)), name
        fin = np.isfinite(want)
        if regime != "nonfinite":
            o = getattr(oracle_scan(**args), name)
            assert_close(VK, name, np.where(fin, got, 0), np.where(fin, o, 0))


@pytest.mark.parametrize("tune, N", [({"ROW_SUM": 0}, 64), ({"ROW_SUM": 2}, 64), ({"ROW_SUM": 3}, 64),
                                     ({}, 1024)])
def test_every_row_sum_and_rows_wider_than_a_subgroup(tune, N):
    # The row sums the planner may pick (shared memory, xor butterfly, subgroupAdd where the row
    # is a whole subgroup; each where the device offers it), and a row so long that its lanes
    # outnumber a subgroup's and sum through shared memory (N = 1024).
    case = decode_case(13, S=2, H=2, P=64, N=N)
    args = case.args()
    lay = layout(args, {**FORCE, **tune})
    assert lay.DEC == 1
    assert 4 * lay.LN * (lay.NPL // 4) >= N
    if lay.LN > rt.get_context().info.subgroup_size:   # (N = 1024 on a device of subgroups of 32 or fewer)
        assert lay.ROW_SUM == 0
    with config.configure(tune={**FORCE, **tune}):
        r = ssm_vk.ssm_scan(**args)
    o = oracle_scan(**args)
    assert_close(VK, "y", r.y, o.y)
    assert_close(VK, "states", r.states, o.states)
