"""T == 0 (defined by this library: states = s[ids], empty y) and zero-size N, P, H."""

import numpy as np
import pytest
from hypothesis import given
from oracles import scatter_add
from problems import IDS_PATTERNS, make_problem, problems
from registry import BACKENDS, OUTPUTS, assert_close, oracle_back, oracle_scan


def shapes_of(d, a_shape):
    S, T, H, P, N, G, R = (d[k] for k in "STHPNGR")
    return {"y": (S, T, H, P), "states": (S, H, P, N), "d_s": (R, H, P, N), "d_s0": (S, H, P, N),
            "d_x": (S, T, H, P), "d_dt": (S, T, H), "d_A": a_shape, "d_B": (S, T, G, N), "d_C": (S, T, G, N)}


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@pytest.mark.parametrize("variant,a_form", [("mamba2", "h"), ("mamba2", "h1"), ("mamba1", "h")])
@pytest.mark.parametrize("pattern", IDS_PATTERNS)
@pytest.mark.parametrize("packed", [False, True], ids=["structured", "packed"])
def test_zero_tokens(backend, variant, a_form, pattern, packed):
    case = make_problem(np.random.default_rng(31), S=3, T=0, H=4, P=2, N=3, G=2, R=5, ids=pattern,
                        variant=variant, a_form=a_form)
    a = case.args()
    m = backend.module
    r = m.ssm_scan(**a)
    if packed:
        g_y = np.concatenate([case.g_y.ravel(), case.g_states.ravel()])  # y block is empty
        g = m.ssm_scan_back(**a, g_y=g_y, g_states=None)
    else:
        g = m.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states)
    got = {"y": r.y, "states": r.states, **g.as_dict()}
    want_shapes = shapes_of(case.dims, a["A"].shape)
    for name in OUTPUTS:
        assert got[name].shape == want_shapes[name], name
        assert got[name].dtype == np.float32, name
    ids = case.ids
    # Copying and adding only: exact, except that duplicate ids add in float32 (one rounding).
    assert np.array_equal(r.states, a["s"][ids])
    assert np.array_equal(g.d_s0, case.g_states)
    if len(set(ids.tolist())) == len(ids):
        assert np.array_equal(g.d_s, scatter_add(case.g_states, ids, 5))
    else:
        assert_close(backend, "d_s", g.d_s, scatter_add(case.g_states, ids, 5))
    unread = np.setdiff1d(np.arange(5), ids)
    assert np.all(g.d_s[unread] == 0)
    assert np.all(g.d_A == 0)


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@pytest.mark.parametrize("empty", ["N", "P", "H", "NP"])
@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
def test_zero_size_dims(backend, empty, variant):
    dims = dict(S=2, T=3, H=2, P=2, N=3, G=1)
    for k in empty:
        dims[k] = 0
    case = make_problem(np.random.default_rng(32), **dims, R=3, ids="permutation", variant=variant)
    a = case.args()
    m = backend.module
    r = m.ssm_scan(**a)
    g = m.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states)
    got = {"y": r.y, "states": r.states, **g.as_dict()}
    want_shapes = shapes_of(case.dims, a["A"].shape)
    for name in OUTPUTS:
        assert got[name].shape == want_shapes[name], name
    # Sums over nothing are 0: with no state (N = 0) y, d_x and d_dt vanish; with no channel
    # (P = 0) or no head (H = 0) d_B, d_C, d_dt and d_A do; nothing is nan.
    for name in OUTPUTS:
        assert not np.any(np.isnan(got[name])), name
    if "N" in empty:
        for name in ("y", "d_x", "d_dt", "d_A"):
            assert np.all(got[name] == 0), name
    if "P" in empty or "H" in empty:
        for name in ("d_B", "d_C", "d_dt", "d_A"):
            assert np.all(got[name] == 0), name


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@given(case=problems(allow_empty=True, max_T=3))
def test_drawn_shapes_with_empty_dims_match_the_oracle(backend, case):
    a = case.args()
    m = backend.module
    r = m.ssm_scan(**a)
    g = m.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states)
    want_r = oracle_scan(**a)
    want_g = oracle_back(**a, g_y=case.g_y, g_states=case.g_states)
    got = {"y": r.y, "states": r.states, **g.as_dict()}
    want = {"y": want_r.y, "states": want_r.states, **want_g.as_dict()}
    want_shapes = shapes_of(case.dims, a["A"].shape)
    for name in OUTPUTS:
        assert got[name].shape == want_shapes[name], name
        assert_close(backend, name, got[name], want[name], label=case.label)
