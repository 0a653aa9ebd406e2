"""K state snapshots in the testing kit (docs/PORTING.md, "The port interface"; docs/SPEC.md
section 3.1): the cases and strategies draw K, a port declares what it takes (SNAPSHOTS), the
properties, verify and the fuzzer compare the slots it declares, and a port that declares nothing
is checked with K = 1 exactly as before."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis.errors import NoSuchExample

import ssm_ref
from ssm_ref import ScanResult
from ssm_ref.ops import SCAN
from ssm_ref.testing import GOLDEN, ports, verify
from ssm_ref.testing.cases import make_problem
from ssm_ref.testing.fuzzing import fuzz
from ssm_ref.testing.properties import PROPERTIES, PropertyFailed
from ssm_ref.testing.regressions import load_case, save_case
from ssm_ref.testing.strategies import elements, problems
from ssm_ref.tolerance import F32_TOL

FEW = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
SNAPSHOT_CASES = [n for n in GOLDEN if n.startswith("snapshots_")]


# --- cases and strategies -----------------------------------------------------------------------

def test_a_case_with_k_has_the_inputs_of_the_same_seed_with_k_1_and_its_g_snapshots():
    one = make_problem(5, S=2, T=3, H=2, P=2, N=3, G=1)
    four = make_problem(5, S=2, T=3, H=2, P=2, N=3, G=1, K=4)
    for k, v in one.inputs.items():
        assert (v is None and four.inputs[k] is None) or np.array_equal(v, four.inputs[k])
    assert np.array_equal(one.g_y, four.g_y) and np.array_equal(one.g_states, four.g_states)
    assert one.K == 1 and one.g_snapshots is None and "K" not in one.recipe      # recipes of K = 1 unchanged
    assert four.K == 4 and four.g_snapshots.shape == (4, 2, 2, 2, 3) and four.recipe["K"] == 4
    assert " K=4 " in four.label + " "
    with pytest.raises(ValueError, match="K: expected an integer >= 1"):
        make_problem(5, K=0)


@FEW
@given(problems(max_K=5, max_elements=3000))
def test_drawn_k_is_small_counted_in_the_size_and_rebuilt_by_the_recipe(case):
    d = case.dims
    assert 1 <= case.K <= 5
    assert (case.g_snapshots is None) == (case.K == 1)
    if d["T"] > 0 and case.regime != "long_decay":
        assert case.size() <= 3000 or d["T"] == 0
    assert elements(d["S"], d["T"], d["H"], d["P"], d["N"], d["G"], d["R"], case.variant == "mamba1", case.K) \
        == case.size() + (d["H"] * d["N"] - case.inputs["A"].size if case.variant == "mamba1" else
                          d["H"] - case.inputs["A"].size)
    kw = dict(case.recipe)
    again = make_problem(kw.pop("seed"), **kw)
    assert again.K == case.K and (case.K == 1 or np.array_equal(again.g_snapshots, case.g_snapshots))


@FEW
@given(problems())
def test_the_default_strategy_draws_no_k(case):
    assert case.K == 1 and "K" not in case.recipe


def test_the_strategies_reach_t_below_k_and_keep_mamba1_at_k_1_for_ggml():
    short = find(problems(max_K=5), lambda c: c.dims["T"] < c.K, settings=FEW)
    assert short.K > short.dims["T"]
    find(problems(max_K=5), lambda c: c.variant == "mamba1" and c.K > 1, settings=FEW)
    with pytest.raises(NoSuchExample):
        find(problems(max_K=5, snapshots_mamba1=False), lambda c: c.variant == "mamba1" and c.K > 1, settings=FEW)
    with pytest.raises(ValueError, match="max_K"):
        problems(max_K=0).example()


def test_a_regression_file_keeps_k_and_g_snapshots(tmp_path):
    case = make_problem(9, S=2, T=2, H=2, P=2, N=3, G=1, K=3)
    back = load_case(save_case(case, tmp_path, prop="oracle_forward", found_on="x")).case
    assert back.K == 3 and np.array_equal(back.g_snapshots, case.g_snapshots)
    plain = load_case(save_case(make_problem(9, S=1, T=2, H=1, P=1, N=2, G=1), tmp_path, prop="p", found_on="y"))
    assert plain.case.K == 1 and plain.case.g_snapshots is None


# --- ports: the declaration and the call -------------------------------------------------------

def _port(name, kind, mangle=None, keyword=True):
    """ssm_ref as a port of SNAPSHOTS ``kind``; ``mangle(snapshots, T)`` rewrites its slots."""
    def ssm_scan(s, x, dt, A, B, C, ids=None, **kw):
        if not keyword:
            assert not kw, f"a port without SNAPSHOTS was called with {kw}"
        r = ssm_ref.ssm_scan(s, x, dt, A, B, C, ids, **kw)
        snaps = r.snapshots.copy()
        if mangle is not None:
            mangle(snaps, x.shape[1])
        return ScanResult(y=r.y, states=r.states, snapshots=snaps, where="CPU", backend=name)

    def ssm_scan_back(*a, **kw):
        if not keyword:
            assert not kw, f"a port without SNAPSHOTS was called with {kw}"
        return ssm_ref.ssm_scan_back(*a, **kw)

    port = SimpleNamespace(NAME=name, ssm_scan=ssm_scan, ssm_scan_back=ssm_scan_back, supports=ssm_ref.supports)
    if kind is not None:
        port.SNAPSHOTS = kind
    return port


def _garbage_past_t(snaps, T):
    snaps[T:] = 7.0                          # what ggml's slots k >= T may hold: anything


def _slot1_off(snaps, T):
    if snaps.shape[0] > 1:
        snaps[1] *= np.float32(1.001)


def test_the_declaration_is_read_and_a_bad_one_is_named():
    assert ports.snapshot_kind(ssm_ref) == "all"
    assert [ports.snapshot_kind(_port("p", k)) for k in (None, False, True, "all", "ggml")] == \
        ["", "", "all", "all", "ggml"]
    assert ports.compared_slots("ggml", 4, 2) == 2 and ports.compared_slots("all", 4, 2) == 4
    assert ports.compared_slots("", 4, 2) == 0
    bad = _port("p", 3)
    assert any("SNAPSHOTS of p is 3" in p for p in ports.interface_problems(bad))


def test_the_packed_layout_and_the_three_tuple_read_the_k_slots():
    case = make_problem(4, S=2, T=3, H=2, P=2, N=3, G=1, K=4)
    a = case.args()
    r = ssm_ref.ssm_scan(**a, snapshots=4)
    for form in (r.packed(), (r.y, r.states, r.snapshots), {"y": r.y, "states": r.states, "snapshots": r.snapshots}):
        got = ports.normalise(SCAN, form, a, {"snapshots": 4})
        assert np.array_equal(got["snapshots"], r.snapshots, equal_nan=True)
        assert np.array_equal(got["states"], r.states)


def test_k_1_calls_a_port_exactly_as_before():
    old = _port("old", None, keyword=False)        # its functions take no keyword at all
    case = make_problem(6, S=2, T=2, H=2, P=2, N=3, G=1, K=4)
    for prop in PROPERTIES.values():
        if case.regime in prop.regimes:
            prop.check(old, case, F32_TOL)          # K > 1 case: run as K = 1, no keyword passed
    report = fuzz([old], minutes=0.02, seed=2, properties=["oracle_forward", "split_tokens"])
    assert report.ok and not report.with_k
    assert "K = 1 only (the port declares no SNAPSHOTS)" in report.summary()


# --- properties ---------------------------------------------------------------------------------

CASE_LONG = make_problem(31, S=2, T=5, H=4, P=2, N=3, G=2, R=3, K=4)
CASE_SHORT = make_problem(32, S=2, T=2, H=4, P=2, N=3, G=2, R=3, K=5)


@pytest.mark.parametrize("prop", ["oracle_forward", "split_tokens", "group_broadcast", "permute_sequences",
                                  "mamba2_as_mamba1", "deterministic", "nonfinite_pattern", "oracle_backward"])
def test_the_reference_declaring_all_passes_with_k(prop):
    for case in (CASE_LONG, CASE_SHORT):
        assert PROPERTIES[prop].check(ssm_ref, case, F32_TOL)


def test_a_wrong_snapshot_slot_fails_the_oracle_and_names_the_snapshots():
    wrong = _port("wrong_slot", "all", _slot1_off)
    with pytest.raises(PropertyFailed, match="snapshots"):
        PROPERTIES["oracle_forward"].check(wrong, CASE_LONG, F32_TOL)
    with pytest.raises(PropertyFailed, match="snapshots"):                      # ggml writes slot 1 < T too
        PROPERTIES["oracle_forward"].check(_port("wrong_ggml", "ggml", _slot1_off), CASE_LONG, F32_TOL)
    assert PROPERTIES["oracle_forward"].check(wrong, make_problem(31, S=2, T=5, H=4, P=2, N=3, G=2, R=3),
                                              F32_TOL)                         # K = 1: no slot 1


def test_slots_past_t_are_free_for_a_ggml_port_and_checked_for_every_other():
    ggml_like = _port("ggml_like", "ggml", _garbage_past_t)
    for prop in ("oracle_forward", "split_tokens", "group_broadcast", "permute_sequences", "deterministic"):
        assert PROPERTIES[prop].check(ggml_like, CASE_SHORT, F32_TOL), prop
    strict = _port("strict", "all", _garbage_past_t)
    with pytest.raises(PropertyFailed, match="snapshots"):
        PROPERTIES["oracle_forward"].check(strict, CASE_SHORT, F32_TOL)
    with pytest.raises(PropertyFailed, match="snapshots"):
        PROPERTIES["nonfinite_pattern"].check(strict, CASE_SHORT, F32_TOL)


def test_a_port_that_returns_no_snapshots_for_k_fails():
    def ssm_scan(*a, **kw):
        r = ssm_ref.ssm_scan(*a, **kw)
        return r.y, r.states

    port = SimpleNamespace(NAME="forgets", SNAPSHOTS="all", ssm_scan=ssm_scan, ssm_scan_back=ssm_ref.ssm_scan_back,
                           supports=ssm_ref.supports)
    with pytest.raises(PropertyFailed, match="returned no"):
        PROPERTIES["oracle_forward"].check(port, CASE_LONG, F32_TOL)


def test_the_fuzzer_draws_k_for_a_port_that_declares_it_and_finds_a_wrong_slot():
    report = fuzz([ssm_ref], minutes=0.05, seed=4, properties=["oracle_forward", "oracle_backward"])
    assert report.ok and report.with_k[("ssm_ref", "oracle_forward")] > 0
    assert "state snapshots of ssm_ref: K in 1..5, every slot compared" in report.summary()
    bad = fuzz([_port("wrong_slot", "all", _slot1_off)], minutes=0.1, seed=4, properties=["oracle_forward"])
    assert not bad.ok
    (f,) = bad.failures
    assert f.case.K == 2 and "snapshots" in f.message          # shrunk to the smallest K with a slot 1
    assert "K=2" in f.message and "K = 2" in bad.summary()


# --- verify -------------------------------------------------------------------------------------

def test_verify_checks_the_snapshot_cases_on_a_port_that_declares_k():
    report = verify(ssm_ref)
    assert report.ok, str(report)
    assert {r.case for r in report.rows} == set(GOLDEN)
    assert {(r.case, r.output) for r in report.rows} >= {(n, "snapshots") for n in SNAPSHOT_CASES}
    packed = verify(lambda *a, **kw: ssm_ref.ssm_scan(*a, **kw).packed(), snapshots="all", cases=SNAPSHOT_CASES)
    assert packed.ok, str(packed)
    assert {r.output for r in packed.rows} == {"y", "states", "snapshots"}


def test_verify_leaves_k_out_for_a_port_without_it_and_says_so_when_asked():
    plain = verify(ssm_ref.ssm_scan)
    assert plain.ok and {r.case for r in plain.rows} & set(SNAPSHOT_CASES) == {"snapshots_k1"}
    assert {r.output for r in plain.rows} == {"y", "states"}
    named = verify(ssm_ref.ssm_scan, cases=["snapshots_k2"])
    assert not named.ok and "takes no snapshots=K" in str(named)
    assert "snapshots: expected None, 'all' or 'ggml'" in str(verify(ssm_ref.ssm_scan, snapshots="some"))


def test_the_vectors_on_disk_carry_k(tmp_path):
    from ssm_ref.testing.vectors import read_vectors, write_vectors

    write_vectors(tmp_path, SNAPSHOT_CASES)
    goldens = {g.name: g for g in read_vectors(tmp_path)}
    short = goldens["snapshots_k4_short"]
    assert short.K == 4 and short.dims["T"] == 2
    snaps = short.expected["snapshots"]
    ids = short.inputs["ids"]
    assert np.array_equal(snaps[2], short.inputs["s"][ids]) and np.isnan(snaps[3]).all()
    assert np.array_equal(snaps[0], short.expected["states"])
    assert not short.inputs["g_states"].any() and short.inputs["g_snapshots"].shape == (4, 2, 2, 2, 4)
    assert goldens["snapshots_k1"].K == 1 and "g_snapshots" not in goldens["snapshots_k1"].inputs
    assert verify(ssm_ref, vectors=tmp_path).ok


def test_the_snapshots_bound_leaves_the_shared_table_alone():
    """tol_for adds the snapshots' bound to its own copy: ssm_ref.tolerance's tables keep their nine
    outputs whatever T and steps the case has (a short case once wrote into F32_TOL itself)."""
    from ssm_ref.testing.properties._common import tol_for
    from ssm_ref.tolerance import OUTPUTS

    for T in (3, 40):
        t = tol_for(F32_TOL, make_problem(np.random.default_rng(T), S=1, T=T, H=2, P=2, N=3, G=1))
        assert t["snapshots"] == t["states"]
    assert set(F32_TOL) == set(OUTPUTS)
