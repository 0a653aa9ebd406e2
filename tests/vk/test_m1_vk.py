"""The Mamba-1 kernels with time in a workgroup's threads (ssm_vk/m1/glsl/m1_scan.comp,
m1_scan_back.comp; m1/m1_recording.py) against the float64 oracle: drawn shapes, slice and chunk sizes,
ids patterns and input regimes, forward and backward; reruns bit for bit; device-resident inputs
and the cache rows read in place; inf and nan as the token-by-token scan gives them; and the
planner, whose default takes them on a GPU only (here they are forced with the knob M1=1).

Channel counts are multiples of the device's subgroup size (the kernels' rule), read from the
device: the tests assume no particular size."""

from __future__ import annotations

import numpy as np
import plans
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from registry import F32_TOL, Backend, assert_close, oracle_back, oracle_scan

import ssm_vk
from ssm_ref import GRAD_NAMES, check_backward, check_forward
from ssm_ref.testing.cases import make_problem
from ssm_vk import config, engine, registry
from ssm_vk import runtime as rt
from ssm_vk.sizing import Limits

pytestmark = pytest.mark.vulkan

VK = Backend(name="ssm_vk", module=ssm_vk, where=r"Vulkan\d+", tol=F32_TOL)
FORCE = {"M1": 1}


def limits() -> Limits:
    return Limits.of(rt.get_context().info)


def m1_case(seed, S, T, blocks, N, G=1, ids="identity", regime="typical", R=None):
    """A Mamba-1 problem of ``blocks`` subgroups' worth of channels (P = 1)."""
    H = blocks * limits().subgroup_size
    return make_problem(int(seed), S=S, T=T, H=H, P=1, N=N, G=G, R=R, ids=ids, variant="mamba1", regime=regime)


def planned(case, tune: dict, backward: bool):
    with config.configure(tune=tune):
        if backward:
            d = check_backward(**case.args(), g_y=case.g_y, g_states=case.g_states).dims
        else:
            d = check_forward(**case.args()).dims
        return plans.of(registry.plan(d, limits(), backward), "m1")


def run_both(case, tune: dict, resident: bool = False):
    args = {**case.args()}
    grads = {"g_y": case.g_y, "g_states": case.g_states}
    if resident:
        args = {k: (v if k == "ids" else ssm_vk.to_device(v)) for k, v in args.items()}
        grads = {k: ssm_vk.to_device(v) for k, v in grads.items()}
    with config.configure(tune=tune):
        r = ssm_vk.ssm_scan(**args)
        g = ssm_vk.ssm_scan_back(**args, **grads)
    host = (lambda a: a.numpy()) if resident else np.asarray
    fwd = {k: host(getattr(r, k)) for k in ("y", "states")}
    bwd = {k: host(getattr(g, k)) for k in GRAD_NAMES}
    return r, g, fwd, bwd


def assert_matches_oracle(case, fwd: dict, bwd: dict, label: str) -> None:
    o = oracle_scan(**case.args())
    for k in ("y", "states"):
        assert_close(VK, k, fwd[k], getattr(o, k), label=label)
    og = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    for k in GRAD_NAMES:
        assert_close(VK, k, bwd[k], getattr(og, k), label=label)


# Slice and chunk layouts the drawn tests take (each a set of shader variants to compile, on a CPU
# device at some seconds each: a few layouts, every drawn shape in each): the defaults; short
# slices and many chunks, two slices per subgroup in the forward; one state value per round and
# one slice per workgroup.
TUNES = (dict(FORCE), dict(FORCE, M1_NW=2, M1_FTI=3, M1_TI=4, M1_NB=2, M1_SNW=1, M1_SPS=2),
         dict(FORCE, M1_NW=1, M1_FTI=5, M1_TI=2, M1_NB=1, M1_SNW=1))


@st.composite
def m1_problems(draw):
    S = draw(st.integers(1, 3))
    T = draw(st.integers(2, 90))
    blocks = draw(st.integers(1, 2))
    N = draw(st.sampled_from((2, 3, 16, 17)))   # (N = 1: A (H, 1) is Mamba-2's form)
    G = draw(st.sampled_from((1, blocks)))
    ids = draw(st.sampled_from(("identity", "permutation", "duplicates" if S > 1 else "identity", "unused")))
    regime = draw(st.sampled_from(("typical", "typical", "wide_dt", "small_A", "long_decay")))
    tune = draw(st.sampled_from(TUNES))
    seed = draw(st.integers(0, 2**31 - 1))
    return m1_case(seed, S, T, blocks, N, G, ids, regime), tune


@settings(max_examples=15, deadline=None)
@given(m1_problems())
def test_drawn_problems_match_the_oracle(drawn):
    case, tune = drawn
    assert planned(case, tune, False) is not None and planned(case, tune, True) is not None
    e = engine.engine_of(rt.get_context())
    before = e.reruns
    r, g, fwd, bwd = run_both(case, tune)
    assert r.where.startswith("Vulkan") and g.where.startswith("Vulkan")
    assert e.reruns == before, "finite inputs took the token-by-token recompute"
    assert_matches_oracle(case, fwd, bwd, f"{case!r} {tune}")


@pytest.mark.parametrize("resident", [False, True])
@pytest.mark.parametrize(("tune", "N"), [(dict(FORCE), 16), (dict(FORCE, M1_NW=2, M1_FTI=4, M1_TI=4), 32)])
def test_one_and_many_chunks_match_the_oracle_and_rerun_bit_for_bit(resident, tune, N):
    case = m1_case(3, S=3, T=150, blocks=2, N=N, ids="duplicates", R=5)
    fp, bp = planned(case, tune, False), planned(case, tune, True)
    assert bp is not None and fp.NCH == (1 if tune == FORCE else 19)   # the forward in one pass, or not
    _, _, fwd, bwd = run_both(case, tune, resident)
    _, _, fwd2, bwd2 = run_both(case, tune, resident)
    assert_matches_oracle(case, fwd, bwd, f"{tune} N={N} resident={resident}")
    for k in fwd:
        assert np.array_equal(fwd[k], fwd2[k]), k
    for k in bwd:
        assert np.array_equal(bwd[k], bwd2[k]), k


def test_many_chunks_are_planned_where_time_is_long():
    case = m1_case(4, S=1, T=200, blocks=1, N=16)
    tune = dict(FORCE, M1_NW=2, M1_FTI=8, M1_TI=4)
    assert planned(case, tune, False).NCH == 13 and planned(case, tune, True).NCH == 25


@pytest.mark.parametrize("over_chunks", [False, True])
@pytest.mark.parametrize("sps", ["2", "all"])
def test_slices_sharing_a_subgroup_match_the_oracle_and_rerun_bit_for_bit(sps, over_chunks):
    # several slices per subgroup (the forward's SPS; "all": one channel per workgroup, as many
    # slices per subgroup as lanes), with T cut so that a subgroup's slices end partway (a short
    # slice beside full ones) and past T (slices with no tokens): the lanes of those run the full
    # slice's steps as identity steps and write nothing
    SPS = 2 if sps == "2" else limits().subgroup_size
    tune = dict(FORCE, M1_SPS=SPS, M1_NW=2, M1_TB=2)
    if over_chunks:
        tune.update(M1_FTI=2, M1_ONE_TI=0)
    for T in (6 * SPS + 1, 5 * SPS + 1):
        case = m1_case(11 + T, S=2, T=T, blocks=1, N=16, ids="permutation", R=3)
        mp = planned(case, tune, False)
        assert (mp.SPS, mp.CW, mp.NCH > 1) == (SPS, mp.RW // SPS, over_chunks), mp
        assert mp.NRB == SPS                     # one subgroup of channels: SPS workgroups of CW
        with config.configure(tune=tune):
            r = ssm_vk.ssm_scan(**case.args())
            r2 = ssm_vk.ssm_scan(**case.args())
        o = oracle_scan(**case.args())
        for k in ("y", "states"):
            assert_close(VK, k, np.asarray(getattr(r, k)), getattr(o, k), label=f"{tune} T={T}")
            assert np.array_equal(np.asarray(getattr(r, k)), np.asarray(getattr(r2, k))), k


def test_the_cache_rows_copied_give_the_same_bits_as_read_in_place(monkeypatch):
    case = m1_case(5, S=2, T=40, blocks=1, N=16, ids="permutation", R=4)
    for tune in (dict(FORCE), dict(FORCE, M1_NW=2, M1_FTI=4, M1_TI=4)):
        _, _, in_place, in_place_b = run_both(case, tune)
        from ssm_vk.m1 import m1_recording as m1
        with monkeypatch.context() as m:
            m.setattr(m1, "cache_rows", lambda ws, p, s_at: None)
            engine.clear(rt.get_context())
            _, _, copied, copied_b = run_both(case, tune)
        engine.clear(rt.get_context())
        for k in in_place:
            assert np.array_equal(in_place[k], copied[k]), k
        for k in in_place_b:
            assert np.array_equal(in_place_b[k], copied_b[k]), k


def test_update_cache_writes_the_final_states_into_the_rows():
    case = m1_case(6, S=2, T=33, blocks=1, N=16, ids="permutation", R=3)
    args = case.args()
    s = ssm_vk.to_device(args["s"])
    with config.configure(tune=FORCE):
        r = ssm_vk.ssm_scan(**{**args, "s": s}, update_cache=True)
    o = oracle_scan(**args)
    assert_close(VK, "y", np.asarray(r.y), o.y)
    rows = s.numpy()
    for i, row in enumerate(args["ids"]):
        assert_close(VK, "states", rows[row], o.states[i])


def token_by_token_and_rerun(fn, args: dict, tune: dict):
    """``fn(**args)`` by the token-sequential kernels, then by the time-in-threads ones, whose
    non-finite result must be recomputed token by token: exactly one rerun."""
    with config.configure(tune={"M1": 0, "TCHUNK": 0}):
        want = fn(**args)
    e = engine.engine_of(rt.get_context())
    before = e.reruns
    with config.configure(tune=tune):
        got = fn(**args)
    assert e.reruns == before + 1
    return want, got


NONFINITE = [("x", (1, 20, 2, 0), np.inf), ("dt", (0, 40, 1), np.nan), ("B", (1, 3, 0, 5), -np.inf),
             ("s", (0, 1, 0, 2), np.inf), ("g_y", (1, 3, 0, 0), -np.inf)]


@pytest.mark.parametrize("tune", [dict(FORCE), dict(FORCE, M1_NW=2, M1_FTI=4, M1_TI=4)])
@pytest.mark.parametrize("where", NONFINITE)
def test_inf_and_nan_come_out_as_token_by_token(where, tune):
    name, at, value = where
    case = m1_case(9, S=2, T=64, blocks=1, N=16)
    args = {**case.args(), "g_y": case.g_y.copy(), "g_states": case.g_states}
    args[name] = args[name].copy()
    args[name][at] = value
    if name != "g_y":
        fwd_args = {k: v for k, v in args.items() if k not in ("g_y", "g_states")}
        want, got = token_by_token_and_rerun(ssm_vk.ssm_scan, fwd_args, tune)
        assert np.array_equal(got.y, want.y, equal_nan=True)
        assert np.array_equal(got.states, want.states, equal_nan=True)
    want, got = token_by_token_and_rerun(ssm_vk.ssm_scan_back, args, tune)
    for k in GRAD_NAMES:
        assert np.array_equal(getattr(got, k), getattr(want, k), equal_nan=True), k
    assert not all(np.isfinite(getattr(got, k)).all() for k in GRAD_NAMES)


@pytest.mark.parametrize("form", ["log1p", None])
@pytest.mark.parametrize("tune", [dict(FORCE), dict(FORCE, M1_NW=2, M1_FTI=4, M1_TI=4)])
def test_every_step_form_matches_the_oracle(form, tune):
    # the accurate step (log1p) is kept by the forward's summary for its final pass; with no
    # softplus (None) dt is the step
    case = m1_case(11, S=2, T=70, blocks=1, N=16, ids="permutation", R=3)
    args = {**case.args(), "dt_softplus": form}
    if form is None:
        args["dt"] = np.abs(args["dt"]) + np.float32(0.05)
    with config.configure(tune=tune):
        r = ssm_vk.ssm_scan(**args)
        g = ssm_vk.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states)
    o = oracle_scan(**args)
    og = oracle_back(**args, g_y=case.g_y, g_states=case.g_states)
    for k in ("y", "states"):
        assert_close(VK, k, getattr(r, k), getattr(o, k), label=f"{form} {tune}")
    for k in GRAD_NAMES:
        assert_close(VK, k, getattr(g, k), getattr(og, k), label=f"{form} {tune}")


def test_without_their_spirv_the_token_sequential_kernels_run_it_and_say_so(monkeypatch, tmp_path):
    # A wheel holds these kernels for N = 16 only; elsewhere, with no glslc, the shape runs on the
    # packaged token-sequential kernels, on the device, and supports() says why.
    from faultcase import fresh_context

    from ssm_cli.build import variants
    from ssm_vk.runtime import shaders

    monkeypatch.delenv("SSM_VK_TUNE", raising=False)
    case = m1_case(12, S=2, T=40, blocks=1, N=5)
    pkg = tmp_path / "pkg"
    shaders.build_all(variants([limits()], [5], ()), pkg)                 # no time-in-threads kernels for N = 5
    monkeypatch.setenv("PATH", str(tmp_path))                              # no glslc
    monkeypatch.setenv("SSM_SCAN_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(shaders, "PACKAGED_SPIRV", pkg)
    engine.clear()
    fresh_context()
    try:
        with config.configure(tune=FORCE):
            assert planned(case, FORCE, False) is not None and planned(case, FORCE, True) is not None
            for op in ("ssm_scan", "ssm_scan_back"):
                sup = ssm_vk.supports(op, **case.args())
                assert sup and "Mamba-1 kernels with time in threads cannot" in sup.reason, (op, sup)
            _, _, fwd, bwd = run_both(case, FORCE)
    finally:
        engine.clear()
    assert_matches_oracle(case, fwd, bwd, "no SPIR-V of the time-in-threads kernels")
