"""ssm_scan(..., update_cache=True) on every backend: sequence i's final state lands in row
ids[i] of the caller's s (the other rows untouched, no other input written), y as without it,
``states`` None; every misuse is refused before any work with the argument's name."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from problems import make_problem, problems
from registry import BACKENDS, assert_close, oracle_scan

import ssm_ref

IDS = {"permutation", "unused", "identity", "none"}


def _np(a):
    return a.numpy() if hasattr(a, "numpy") else a


@settings(max_examples=20, deadline=None)
@given(problems(ids_patterns=tuple(IDS)))
@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_the_final_states_land_in_their_cache_rows(backend, case):
    args = case.args()
    inputs = {k: v.copy() for k, v in args.items() if isinstance(v, np.ndarray) and k != "s"}
    s = args["s"].copy()
    r = backend.module.ssm_scan(**{**args, "s": s}, update_cache=True)
    o = oracle_scan(**case.args())
    assert r.states is None
    assert_close(backend, "y", _np(r.y), o.y, label=repr(case))
    assert_close(backend, "states", s[case.ids], o.states, label=repr(case))
    others = np.setdiff1d(np.arange(s.shape[0]), case.ids)
    assert np.array_equal(s[others], args["s"][others])            # rows no sequence names: as they were
    for k, v in inputs.items():
        assert np.array_equal(args[k], v), k                        # nothing else written


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_y_is_bit_for_bit_the_call_without_it_and_the_rows_its_states(backend):
    case = make_problem(np.random.default_rng(4), S=3, T=7, H=4, P=3, N=8, G=2, ids="unused")
    plain = backend.module.ssm_scan(**case.args())
    s = case.args()["s"].copy()
    r = backend.module.ssm_scan(**{**case.args(), "s": s}, update_cache=True)
    assert np.array_equal(_np(r.y), _np(plain.y))
    assert np.array_equal(s[case.ids], _np(plain.states))


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_a_float64_cache_gets_the_states_rounded_into_it(backend):
    case = make_problem(np.random.default_rng(5), S=2, T=4, H=2, P=2, N=4, G=1, ids="unused")
    s = case.args()["s"].astype(np.float64)
    r = backend.module.ssm_scan(**{**case.args(), "s": s}, update_cache=True)
    plain = backend.module.ssm_scan(**case.args())
    assert r.states is None and s.dtype == np.float64
    assert np.array_equal(s[case.ids], _np(plain.states).astype(np.float64))


CASE = make_problem(np.random.default_rng(6), S=2, T=3, H=2, P=2, N=4, G=1, ids="unused")


@pytest.mark.parametrize(("change", "error", "match"), [
    (dict(update_cache=1), TypeError, r"^update_cache: expected True or False, got 1"),
    (dict(update_cache="yes"), TypeError, r"^update_cache: expected True or False"),
    (dict(ids=[1, 1]), ValueError, r"^ids: update_cache=True .* distinct; row 1 is named more than once"),
    (dict(s="list"), TypeError, r"^s: update_cache=True writes the new states into s: expected a writeable numpy "
                                r"float array.*got list"),
    (dict(s="readonly"), ValueError, r"^s: update_cache=True writes the new states into s, which is read-only"),
    (dict(s="int"), TypeError, r"^s: .* got ndarray of int64"),
])
@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_misuse_is_refused_before_any_work(backend, change, error, match):
    args = {**CASE.args(), "update_cache": True}
    s0 = args["s"].copy()
    if change.get("s") == "list":
        args["s"] = s0.tolist()
    elif change.get("s") == "readonly":
        args["s"] = s0.copy()
        args["s"].flags.writeable = False
    elif change.get("s") == "int":
        args["s"] = np.zeros(s0.shape, dtype=np.int64)
    else:
        args.update(change)
    if change.get("s") == "int":
        # an integer s is refused by the shape checks first, as without update_cache
        with pytest.raises(TypeError, match=r"^s: expected a float array"):
            backend.module.ssm_scan(**args)
        return
    with pytest.raises(error, match=match):
        backend.module.ssm_scan(**args)
    sup_args = {k: v for k, v in args.items()}
    with pytest.raises(error, match=match):
        backend.module.supports("ssm_scan", **sup_args)
    if isinstance(args["s"], np.ndarray):
        assert np.array_equal(args["s"], s0)                         # not written


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_only_the_forward_takes_it(backend):
    args = CASE.args()
    with pytest.raises(ValueError, match=r"^update_cache: only ssm_scan writes into the cache"):
        backend.module.supports("ssm_scan_back", **args, update_cache=True)
    assert backend.module.supports("ssm_scan", **args, update_cache=True)
    with pytest.raises(TypeError):
        backend.module.ssm_scan_back(**args, g_y=CASE.g_y, g_states=CASE.g_states, update_cache=True)


def test_the_reference_oracle_writes_float64_states():
    case = make_problem(np.random.default_rng(7), S=2, T=3, H=2, P=2, N=4, G=1, ids="unused")
    s = case.args()["s"].astype(np.float64)
    ssm_ref.ssm_scan(**{**case.args(), "s": s}, dtype=np.float64, update_cache=True)
    o = oracle_scan(**case.args())
    assert np.array_equal(s[case.ids], o.states)
