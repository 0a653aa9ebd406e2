"""Every registered backend (float32) against the float64 oracle, and the oracle's forward
against a scalar-loop transcription of docs/SPEC.md; plus properties that must hold exactly or
nearly: determinism, the three A forms, independence of sequences, splitting the tokens.
"""

import warnings

import numpy as np
import pytest
from hypothesis import given
from oracles import naive_forward
from problems import make_problem, problems
from registry import BACKENDS, OUTPUTS, assert_close, oracle_back, oracle_scan, rel_err

import ssm_ref


def run_all(module, case, **kw):
    """Forward and backward outputs of one backend by name (y, states, d_s, ...)."""
    a = case.args()
    r = module.ssm_scan(**a, **kw)
    g = module.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states, **kw)
    return r, g, {"y": r.y, "states": r.states, **g.as_dict()}


def oracle_all(case):
    a = case.args()
    r = oracle_scan(**a)
    g = oracle_back(**a, g_y=case.g_y, g_states=case.g_states)
    return {"y": r.y, "states": r.states, **g.as_dict()}


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@given(case=problems(max_T=8))
def test_float32_matches_the_float64_oracle(backend, case):
    r, g, got = run_all(backend.module, case)
    want = oracle_all(case)
    for name in OUTPUTS:
        assert got[name].dtype == np.float32, name
        assert_close(backend, name, got[name], want[name], label=case.label)
    for res in (r, g):
        assert res.backend == backend.name
    assert r.where == g.where


@given(case=problems(max_S=2, max_T=4, max_H_per_G=2, max_G=2, max_P=3, max_N=5))
def test_oracle_forward_matches_scalar_loops_from_the_spec(case):
    a = case.args(np.float64)
    r = oracle_scan(**a)
    y, states = naive_forward(**a)
    assert r.y.dtype == np.float64 and r.states.dtype == np.float64
    assert rel_err(r.y, y) <= 1e-13
    assert rel_err(r.states, states) <= 1e-13


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_float32_forward_matches_scalar_loops(backend):
    case = make_problem(np.random.default_rng(21), S=2, T=5, H=6, P=3, N=7, G=3, R=4, ids="duplicates",
                        variant="mamba1")
    y, states = naive_forward(**case.args(np.float64))
    r = backend.module.ssm_scan(**case.args())
    assert_close(backend, "y", r.y, y)
    assert_close(backend, "states", r.states, states)


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_runs_are_bit_identical(backend):
    case = make_problem(np.random.default_rng(22), S=3, T=6, H=4, P=4, N=9, G=2, R=4, ids="duplicates")
    _, _, first = run_all(backend.module, case)
    _, _, second = run_all(backend.module, case)
    for name in OUTPUTS:
        assert np.array_equal(first[name], second[name], equal_nan=True), name


def test_the_three_forms_of_A_agree():
    # Mamba-2's A as (H,) or (H, 1), and Mamba-1's (H, N) with every column equal to it, are the
    # same scan; d_A of Mamba-2 is Mamba-1's d_A summed over n.
    case = make_problem(np.random.default_rng(23), S=2, T=4, H=4, P=2, N=5, G=2, R=3, ids="permutation")
    a = case.args(np.float64)
    A = a["A"]                                            # (H,)
    forms = {"h": A, "h1": A[:, None], "hn": np.repeat(A[:, None], 5, axis=1)}
    res = {k: oracle_scan(**{**a, "A": v}) for k, v in forms.items()}
    grads = {k: oracle_back(**{**a, "A": v}, g_y=case.g_y, g_states=case.g_states) for k, v in forms.items()}
    for k in ("h1", "hn"):
        assert np.array_equal(res[k].y, res["h"].y) and np.array_equal(res[k].states, res["h"].states)
        for name in ("d_s", "d_x", "d_dt", "d_B", "d_C"):
            assert rel_err(getattr(grads[k], name), getattr(grads["h"], name)) <= 1e-14, (k, name)
    assert grads["h"].d_A.shape == (4,) and grads["h1"].d_A.shape == (4, 1) and grads["hn"].d_A.shape == (4, 5)
    assert rel_err(grads["h1"].d_A.ravel(), grads["h"].d_A) <= 1e-14
    assert rel_err(grads["hn"].d_A.sum(axis=1), grads["h"].d_A) <= 1e-13


def test_sequences_are_independent():
    # Running sequence i alone from its own cache row gives row i of y, states and the per-sequence
    # gradients; d_A sums over sequences; d_s adds each sequence's d_s0 at its row.
    case = make_problem(np.random.default_rng(24), S=3, T=3, H=2, P=2, N=3, G=1, R=3, ids="duplicates",
                        variant="mamba1")
    a = case.args(np.float64)
    r = oracle_scan(**a)
    g = oracle_back(**a, g_y=case.g_y, g_states=case.g_states)
    d_A_sum = np.zeros_like(g.d_A)
    d_s_sum = np.zeros_like(g.d_s)
    for i in range(3):
        one = {**a, **{k: a[k][i:i + 1] for k in ("x", "dt", "B", "C")}, "ids": a["ids"][i:i + 1]}
        ri = oracle_scan(**one)
        gi = oracle_back(**one, g_y=case.g_y[i:i + 1], g_states=case.g_states[i:i + 1])
        assert np.array_equal(ri.y[0], r.y[i]) and np.array_equal(ri.states[0], r.states[i])
        for name in ("d_s0", "d_x", "d_dt", "d_B", "d_C"):
            assert rel_err(getattr(gi, name)[0], getattr(g, name)[i]) <= 1e-14, (i, name)
        d_A_sum += gi.d_A
        d_s_sum += gi.d_s
    assert rel_err(g.d_A, d_A_sum) <= 1e-13
    assert rel_err(g.d_s, d_s_sum) <= 1e-14


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@pytest.mark.parametrize("split", [1, 3, 5])
def test_splitting_the_tokens_changes_nothing(backend, split):
    # Scan tokens [0, split) from the cache, then [split, T) from the states reached: same y and
    # states. Backward: the second half's d_s0 is the g_states of the first half.
    case = make_problem(np.random.default_rng(25), S=2, T=6, H=4, P=2, N=3, G=2, R=3, ids="permutation",
                        variant="mamba1")
    a = case.args()
    m = backend.module
    head = {k: a[k][:, :split] for k in ("x", "dt", "B", "C")}
    tail = {k: a[k][:, split:] for k in ("x", "dt", "B", "C")}
    whole = m.ssm_scan(**a)
    r1 = m.ssm_scan(**{**a, **head})
    r2 = m.ssm_scan(s=r1.states, **tail, A=a["A"], ids=None)
    assert_close(backend, "y", np.concatenate([r1.y, r2.y], axis=1), whole.y)
    assert_close(backend, "states", r2.states, whole.states)

    gw = m.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states)
    g2 = m.ssm_scan_back(s=r1.states, **tail, A=a["A"], ids=None, g_y=case.g_y[:, split:],
                         g_states=case.g_states)
    g1 = m.ssm_scan_back(**{**a, **head}, g_y=case.g_y[:, :split], g_states=g2.d_s0)
    assert_close(backend, "d_s", g1.d_s, gw.d_s)
    assert_close(backend, "d_s0", g1.d_s0, gw.d_s0)
    assert_close(backend, "d_A", g1.d_A + g2.d_A, gw.d_A)
    for name in ("d_x", "d_dt", "d_B", "d_C"):
        assert_close(backend, name, np.concatenate([getattr(g1, name), getattr(g2, name)], axis=1),
                     getattr(gw, name))


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_overflow_gives_inf_and_nan_like_the_oracle_without_warnings(backend):
    # A > 0 with d * A = 1000 overflows exp in float32 and float64 alike: the results are inf/nan
    # in the same places as the oracle's, nothing raises, no RuntimeWarning escapes.
    case = make_problem(np.random.default_rng(26), S=2, T=3, H=2, P=2, N=3, G=1, R=2, ids="identity")
    a = case.args()
    a["A"] = np.full(2, 250.0, np.float32)
    a["dt"][0] = 4.0                                      # d * A ~ 1000: sequence 0 overflows
    a["dt"][1] = -10.0                                    # d * A ~ 0.01: sequence 1 stays finite
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = backend.module.ssm_scan(**a)
        g = backend.module.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states)
    want_r = oracle_scan(**a)
    want_g = oracle_back(**a, g_y=case.g_y, g_states=case.g_states)
    assert not np.all(np.isfinite(r.states[0])) and np.all(np.isfinite(r.states[1]))
    got = {"y": r.y, "states": r.states, **g.as_dict()}
    want = {"y": want_r.y, "states": want_r.states, **want_g.as_dict()}
    for name in OUTPUTS:
        assert np.array_equal(np.isnan(got[name]), np.isnan(want[name])), name
        assert np.array_equal(np.isposinf(got[name]), np.isposinf(want[name])), name
        assert np.array_equal(np.isneginf(got[name]), np.isneginf(want[name])), name


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_nan_input_stays_in_its_sequence(backend):
    case = make_problem(np.random.default_rng(27), S=2, T=3, H=2, P=2, N=3, G=1, R=2, ids="identity")
    a = case.args()
    a["x"][0, 1, 0, 0] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = backend.module.ssm_scan(**a)
    assert np.isnan(r.y[0, 1, 0, 0]) and np.all(np.isnan(r.states[0, 0, 0]))
    assert np.all(np.isfinite(r.y[1])) and np.all(np.isfinite(r.states[1]))
    assert np.all(np.isfinite(r.y[0, 0]))                 # tokens before the nan are untouched


def test_scatter_of_opposite_infinities_is_nan_without_warnings():
    # Two sequences reading one row, whose d_s0 are +inf and -inf: the row's d_s is nan, silently
    # (found by the overflow regime of ssm_ref.testing.cases: np.add.at ran outside the scan's errstate).
    d_s0 = np.array([[[[np.inf]]], [[[-np.inf]]]], dtype=np.float32)   # (S=2, H=1, P=1, N=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d_s = ssm_ref.scatter_rows(d_s0, np.array([0, 0]), 1)
    assert d_s.shape == (1, 1, 1, 1) and np.isnan(d_s[0, 0, 0, 0])
