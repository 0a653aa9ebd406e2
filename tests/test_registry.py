"""The test helpers themselves: the registry, rel_err, assert_close and the problem builders."""

import math

import numpy as np
import pytest
from hypothesis import given
from problems import IDS_PATTERNS, make_problem, problems
from registry import BACKENDS, F32_TOL, OUTPUTS, Backend, assert_close, rel_err

import ssm_ref


def test_registry_always_holds_the_reference_and_every_entry_is_complete():
    assert [b.name for b in BACKENDS][:1] == ["ssm_ref"]
    for b in BACKENDS:
        assert b.module.NAME == b.name
        assert set(b.tol) == set(OUTPUTS)
        for t in b.tol.values():
            assert 0 < t.rtol < 1e-3 and 0 < t.atol < 1e-3


def test_rel_err_is_norm_relative():
    want = np.array([3.0, 4.0])          # norm 5
    got = np.array([3.0, 4.5])           # diff norm 0.5
    assert rel_err(got, want) == pytest.approx(0.1)
    assert rel_err(want, want) == 0.0


def test_rel_err_empty_zero_and_nonfinite():
    assert rel_err(np.zeros((2, 0)), np.zeros((2, 0))) == 0.0
    assert rel_err(np.zeros(3), np.zeros(3)) == 0.0
    assert rel_err(np.array([0.0, 1e-3]), np.zeros(2)) == pytest.approx(1e-3)   # absolute when want == 0
    both = np.array([np.inf, np.nan, 1.0])
    assert rel_err(both, both.copy()) == 0.0
    assert rel_err(np.array([-np.inf, np.nan, 1.0]), both) == math.inf
    assert rel_err(np.array([np.inf, 2.0, 1.0]), both) == math.inf
    with pytest.raises(AssertionError, match="shape"):
        rel_err(np.zeros(2), np.zeros(3))


def test_assert_close_rejects_an_error_beyond_the_bound_and_accepts_one_within():
    b = BACKENDS[0]
    want = np.linspace(1.0, 2.0, 100)
    tol = F32_TOL["y"]
    bound = tol.rtol * np.linalg.norm(want) + tol.atol * 10.0
    assert_close(b, "y", want + 0.5 * bound / 10.0, want)          # diff norm = bound / 2
    with pytest.raises(AssertionError, match="y"):
        assert_close(b, "y", want + 2.0 * bound / 10.0, want)      # diff norm = 2 * bound
    with pytest.raises(AssertionError, match="shape"):
        assert_close(b, "y", want[:-1], want)
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close(b, "y", np.where(want > 1.5, np.nan, want), want)


def test_backend_repr_is_its_name():
    assert repr(Backend("x", ssm_ref, "CPU", F32_TOL)) == "x"


@pytest.mark.parametrize("pattern", IDS_PATTERNS)
def test_make_problem_ids_patterns(pattern):
    rng = np.random.default_rng(0)
    c = make_problem(rng, S=3, T=2, ids=pattern, R=5 if pattern != "identity" else None)
    ids, R = c.ids, c.dims["R"]
    assert ids.shape == (3,) and ids.min() >= 0 and ids.max() < R
    if pattern in ("none", "identity"):
        assert np.array_equal(ids, np.arange(3))
    if pattern == "duplicates":
        assert len(set(ids.tolist())) < 3
    if pattern in ("permutation", "unused"):
        assert len(set(ids.tolist())) == 3
    if pattern == "unused":
        assert R > 3
    for v in c.args().values():
        assert v is None or v.dtype in (np.float32, np.int64)


@given(problems(allow_empty=True))
def test_drawn_problems_have_consistent_shapes(case):
    d = case.dims
    a = case.args()
    assert a["s"].shape == (d["R"], d["H"], d["P"], d["N"])
    assert a["x"].shape == (d["S"], d["T"], d["H"], d["P"])
    assert d["H"] % d["G"] == 0
    assert a["A"].shape in ((d["H"],), (d["H"], 1), (d["H"], d["N"]))
    assert case.ids.shape == (d["S"],) and (d["S"] == 0 or case.ids.max() < d["R"])
    # Elements stay bounded, which keeps every property test fast.
    assert a["s"].size <= 6 * 9 * 4 * 9 and a["x"].size <= 3 * 6 * 9 * 4


# --- tests/optional.py: the frameworks a test needs ----------------------------------------------

def test_a_missing_framework_skips_or_fails_when_required(monkeypatch):
    from optional import REQUIRE, need

    for framework, env in REQUIRE.items():
        monkeypatch.delenv(env, raising=False)
        with pytest.raises(pytest.skip.Exception, match=f"ssm_no_such_module is not installed.*{env}=1"):
            need("ssm_no_such_module", framework, "pip install it")
        monkeypatch.setenv(env, "1")
        with pytest.raises(ImportError, match="ssm_no_such_module"):
            need("ssm_no_such_module", framework, "pip install it")
    assert need("numpy", "torch") is np


def test_no_test_skips_past_the_require_variables():
    """A test that needs torch, jax or transformers gets them through tests/optional.py (or
    tests/pytorch/torchreq.py, which uses it): a bare pytest.importorskip would skip where CI's
    SSM_REQUIRE_TORCH=1 / SSM_REQUIRE_JAX=1 says the test must run."""
    import re
    from pathlib import Path

    here = Path(__file__).resolve().parent
    bare = re.compile(r"importorskip\(\s*['\"](torch|jax|transformers|einops)")
    found = [f"{p.relative_to(here)}:{n}" for p in sorted(here.rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if bare.search(line)]
    assert not found, found
