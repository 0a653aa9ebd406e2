"""ssm_ref.testing.strategies and ssm_ref.testing.cases: what a user fuzzing their port relies on. Sizes within
the limits asked for, every regime making the values it promises, recipes that rebuild a case
bit for bit, hypothesis optional."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ssm_ref.extras import install_hint
from ssm_ref.testing.cases import IDS_PATTERNS, ORACLE_REGIMES, REGIMES, make_problem
from ssm_ref.testing.strategies import dims, elements, problems


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_import_ssm_ref_does_not_import_hypothesis():
    r = _run("import sys, ssm_ref.testing; ssm_ref.ssm_scan; ssm_ref.testing.cases; ssm_ref.testing.properties; "
             "ssm_ref.testing.verify\n"
             "assert 'hypothesis' not in sys.modules, 'hypothesis was imported'")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("module", ["ssm_ref.testing.strategies", "ssm_ref.testing.fuzzing"])
def test_without_hypothesis_the_strategies_say_what_to_install(module):
    # sys.modules[name] = None makes any import of that name fail, as if it were not installed.
    r = _run(f"import sys; sys.modules['hypothesis'] = None\nimport ssm_ref\ntry:\n    import {module}\n"
             "except ImportError as e:\n    print(e)\nelse:\n    raise SystemExit('imported')")
    assert r.returncode == 0, r.stderr
    assert "needs hypothesis" in r.stdout and install_hint("test", "hypothesis") in r.stdout
    assert "pip install hypothesis (or" in r.stdout and "pip install '.[test]'" in r.stdout


def test_cli_without_hypothesis_writes_vectors_and_explains_fuzz(tmp_path):
    r = _run("import sys; sys.modules['hypothesis'] = None\nfrom ssm_cli.main import main\n"
             f"assert main(['vectors', '--out', {str(tmp_path)!r}, '--case', 'one_token']) == 0\n"
             "assert main(['fuzz', '--minutes', '0.01']) == 2")
    assert r.returncode == 0, r.stderr
    assert "ssm-scan fuzz: error: ssm_ref.testing.fuzzing needs hypothesis" in r.stderr   # one line on stderr, exit 2
    assert (tmp_path / "manifest.json").exists()


def test_strategies_are_reachable_as_an_attribute_of_ssm_ref_testing():
    import ssm_ref.testing

    assert ssm_ref.testing.strategies.problems is problems


@given(st.data(), st.integers(16, 3000))
def test_max_elements_is_respected(data, limit):
    case = data.draw(problems(max_elements=limit, regimes=REGIMES, max_T=50, max_T_long=400, max_N=40, max_P=20))
    assert case.size() <= limit
    d = case.dims
    assert elements(d["S"], d["T"], d["H"], d["P"], d["N"], d["G"], d["R"], case.variant == "mamba1") == case.size()


@given(problems(regimes=REGIMES, allow_empty=True))
def test_drawn_cases_are_valid_problems(case):
    d = case.dims
    a = case.args()
    assert d["H"] % d["G"] == 0 and d["S"] >= 1 and d["R"] >= 1
    assert case.ids.shape == (d["S"],) and case.ids.min() >= 0 and case.ids.max() < d["R"]
    assert a["x"].shape == (d["S"], d["T"], d["H"], d["P"]) and a["s"].shape == (d["R"], d["H"], d["P"], d["N"])
    assert a["B"].shape == a["C"].shape == (d["S"], d["T"], d["G"], d["N"])
    assert case.g_y.shape == a["x"].shape and case.g_states.shape == (d["S"], d["H"], d["P"], d["N"])
    assert all(v.dtype == np.float32 for k, v in a.items() if k != "ids" and v is not None)
    pattern = case.ids_pattern
    assert pattern in IDS_PATTERNS
    if pattern == "identity":
        assert d["R"] == d["S"] and np.array_equal(case.ids, np.arange(d["S"]))
    if pattern == "duplicates":
        assert len(set(case.ids.tolist())) < d["S"]
    if pattern == "unused":
        assert d["R"] > d["S"] and len(set(case.ids.tolist())) == d["S"]


@given(problems(regimes=REGIMES))
def test_the_recipe_rebuilds_the_case_bit_for_bit(case):
    recipe = dict(case.recipe)
    again = make_problem(recipe.pop("seed"), **recipe)
    for k, v in case.inputs.items():
        assert (v is None and again.inputs[k] is None) or v.tobytes() == again.inputs[k].tobytes(), k
    assert case.g_y.tobytes() == again.g_y.tobytes() and case.g_states.tobytes() == again.g_states.tobytes()


def _regime_case(regime, seed, **kw):
    base = dict(S=3, T=8, H=4, P=2, N=3, G=2, R=4, ids="permutation", variant="mamba1")
    return make_problem(seed, **{**base, **kw}, regime=regime)


@pytest.mark.parametrize("seed", range(5))
def test_each_regime_makes_the_values_it_promises(seed):
    t = _regime_case("typical", seed)
    assert np.all(np.abs(t.inputs["dt"]) <= 0.5) and np.all(t.inputs["A"] < 0)
    w = _regime_case("wide_dt", seed).inputs["dt"]
    assert np.any(w > 20) and np.any(w == 20) and np.any(w < -20) and np.all((np.abs(w) <= 0.5) | (np.abs(w) >= 20))
    a = _regime_case("small_A", seed).inputs["A"]
    assert np.all(np.abs(a) <= 1e-3) and np.any(a == 0)
    ld = _regime_case("long_decay", seed, T=64).inputs
    d = np.log1p(np.exp(ld["dt"].astype(np.float64)))
    decay = np.exp(d[..., None] * ld["A"][None, None].astype(np.float64).reshape(1, 1, 4, 3))
    assert np.all((decay > 0.99) & (decay < 1))
    o = _regime_case("overflow", seed)
    A, dt = o.inputs["A"], o.inputs["dt"]
    hot = np.all(A > 50, axis=1)                              # (H,): the heads made to overflow
    assert hot.any() and np.all((A > 50) | (A < 0))
    for h in np.flatnonzero(hot):                             # per sequence: all hot or all frozen
        for i in range(3):
            assert np.all(dt[i, :, h] >= 10) or np.all(dt[i, :, h] <= -40)
    n = _regime_case("nonfinite", seed)
    arrays = [v for k, v in n.inputs.items() if k != "ids"] + [n.g_y, n.g_states]
    assert sum(int((~np.isfinite(v)).sum()) for v in arrays) >= 1


@given(problems(regimes=("long_decay",), max_T_long=80, max_N=20, max_P=20))
def test_long_decay_draws_long_scans_within_the_size_limit(case):
    assert 20 <= case.dims["T"] <= 80 and case.size() <= 4096


@given(problems(regimes=("overflow",)))
def test_overflow_regime_overflows_in_float32_and_float64_alike(case):
    import ssm_ref

    a = case.args()
    r32, r64 = ssm_ref.ssm_scan(**a), ssm_ref.ssm_scan(**a, dtype=np.float64)
    for k in ("y", "states"):
        v32, v64 = getattr(r32, k), getattr(r64, k)
        assert np.array_equal(np.isnan(v32), np.isnan(v64)) and np.array_equal(np.isinf(v32), np.isinf(v64))


def test_bad_strategy_arguments_raise_value_error():
    with pytest.raises(ValueError, match="regimes"):
        problems(regimes=("typical", "stormy"))
    with pytest.raises(ValueError, match="max_elements"):
        problems(max_elements=3)
    with pytest.raises(ValueError, match="variants"):
        dims(variants=())
    with pytest.raises(ValueError, match="regime"):
        make_problem(0, regime="stormy")
    assert set(ORACLE_REGIMES) < set(REGIMES)
