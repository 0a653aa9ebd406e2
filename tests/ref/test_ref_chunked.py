"""ssm_ref.chunked (the matrix form of the Mamba-2 scan, the spec of ssm_vk/chunked/glsl/chunk_*.comp) against
ssm_ref.scan (the token-sequential definition), both in float64: every output of the forward and
the backward within 1e-12 relative, over drawn shapes whose T is not a multiple of the chunk
length, with several groups, permuted and repeated ids and cache rows nobody reads; and the decay
tables of one chunk against exp of their explicit token-range sums."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from problems import make_problem

import ssm_ref
from ssm_ref import chunked, scan
from ssm_ref.tolerance import rel_err

LS = (1, 2, 3, 8, 64)
FORWARD = ("y", "states")
GRADS = ("d_s", "d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C")
# Regimes whose float64 values stay finite (overflow and nonfinite put inf/nan in, where the
# matrix form and the sequential product may legitimately disagree on nan vs inf).
FINITE_REGIMES = ("typical", "wide_dt", "small_A", "long_decay")


def problem64(case):
    return ssm_ref.check_backward(**case.args(), g_y=case.g_y, g_states=case.g_states, dtype=np.float64)


def assert_same(p, L: int, label: str) -> None:
    """chunked.forward/backward(p, L) == scan.forward/backward(p) to 1e-12, output by output."""
    y, states, _ = scan.forward(p)
    cy, cstates = chunked.forward(p, L)
    want = {"y": y, "states": states, **scan.backward(p)}
    got = {"y": cy, "states": cstates, **chunked.backward(p, L)}
    assert set(got) == set(want) == {*FORWARD, *GRADS}
    for k in want:
        assert got[k].shape == want[k].shape and got[k].dtype == np.float64, (k, label)
        assert np.all(np.isfinite(want[k])), (k, label)   # the comparison below is about values
        r = rel_err(got[k], want[k])
        assert r < 1e-12, f"{k}: relative error {r:.3e} [{label}, L={L}]"


@st.composite
def mamba2_cases(draw):
    """(case, L): Mamba-2 problems with G > 1 often, T drawn off the multiples of L, any ids."""
    L = draw(st.sampled_from(LS))
    n_chunks = draw(st.integers(0, 2 if L < 64 else 1))
    rest = draw(st.integers(1, L - 1)) if L > 1 else 0      # T % L != 0 whenever L > 1
    T = n_chunks * L + rest if n_chunks * L + rest else 1
    G = draw(st.integers(1, 3))
    S = draw(st.integers(1, 3))
    pattern = draw(st.sampled_from(("none", "permutation", "duplicates", "unused")
                                   if S > 1 else ("none", "permutation", "unused")))
    R = S + draw(st.integers(1 if pattern in ("unused", "permutation") else 0, 2))
    dims = dict(S=S, T=T, G=G, H=G * draw(st.integers(1, 2)), P=draw(st.integers(1, 3)),
                N=draw(st.integers(1, 4)), R=R)
    case = make_problem(draw(st.integers(0, 2**32 - 1)), **dims, ids=pattern, variant="mamba2",
                        a_form=draw(st.sampled_from(("h", "h1"))), regime=draw(st.sampled_from(FINITE_REGIMES)))
    return case, L


@settings(max_examples=25)
@given(mamba2_cases())
def test_chunked_form_equals_the_scan_in_float64(drawn):
    case, L = drawn
    assert_same(problem64(case), L, case.label)


@pytest.mark.parametrize("L", LS)
def test_every_chunk_length_with_groups_repeated_ids_and_spare_rows(L):
    # Guaranteed coverage of what the drawn test only may reach: T = 2L + 1 (a short last
    # chunk), G = 2 groups of 2 heads, a repeated id and R > S (an unread cache row).
    T = 2 * L + 1 if L < 64 else L + 5
    case = make_problem(np.random.default_rng(L), S=3, T=T, H=4, P=2, N=3, G=2, R=4, ids=[2, 0, 2])
    p = problem64(case)
    assert p.dims.T % L != 0 or L == 1
    assert_same(p, L, f"T={T}")
    d_s = chunked.backward(p, L)["d_s"]
    assert np.all(d_s[[1, 3]] == 0) and np.any(d_s[2] != 0)      # rows 1, 3 unread; row 2 twice


def test_one_chunk_and_one_token_per_chunk_agree():
    case = make_problem(np.random.default_rng(7), S=2, T=9, H=2, P=3, N=4, G=2, ids="permutation")
    p = problem64(case)
    whole = chunked.forward(p, L=64, keep_chunk_states=True)
    single = chunked.forward(p, L=1, keep_chunk_states=True)
    assert whole[2].shape[1] == 1 and single[2].shape[1] == 9
    assert rel_err(whole[0], single[0]) < 1e-12 and rel_err(whole[1], single[1]) < 1e-12


def test_kept_chunk_states_are_the_scan_states_at_chunk_starts():
    # keep_chunk_states: the state entering chunk c is the sequential state after token c*L - 1
    # (the initial row s[ids[i]] for c = 0), which is what the backward recomputes from.
    case = make_problem(np.random.default_rng(8), S=2, T=7, H=2, P=2, N=3, G=1, ids="duplicates", R=3)
    p = problem64(case)
    L = 3
    _, _, kept = chunked.forward(p, L, keep_chunk_states=True)
    assert kept.shape == (2, 3, 2, 2, 3)
    for c in range(3):
        head = case.args(np.float64)
        for k in ("x", "dt", "B", "C"):
            head[k] = head[k][:, : c * L]
        _, want, _ = scan.forward(ssm_ref.check_forward(**head, dtype=np.float64))
        assert rel_err(kept[:, c], want) < 1e-12, c


@pytest.mark.parametrize("fn", [chunked.forward, chunked.backward])
def test_mamba1_is_refused(fn):
    case = make_problem(np.random.default_rng(1), S=1, T=4, H=2, P=2, N=3, G=1, variant="mamba1")
    with pytest.raises(ValueError, match="Mamba-2"):
        fn(problem64(case), 2)


@pytest.mark.parametrize("L", [0, -1])
def test_chunk_length_below_one_is_refused(L):
    case = make_problem(np.random.default_rng(2), S=1, T=4, H=2, P=2, N=3, G=1)
    with pytest.raises(ValueError, match="chunk length"):
        chunked.forward(problem64(case), L)


def _range_sum(la, lo: int, hi: int) -> float:
    """la[lo] + ... + la[hi - 1], exactly rounded (math.fsum); 0.0 for an empty range."""
    return math.fsum(float(v) for v in la[lo:hi])


@settings(max_examples=40)
@given(st.integers(1, 12), st.integers(0, 2**32 - 1), st.sampled_from((1e-3, 1.0, 30.0)))
def test_chunk_tables_are_exp_of_their_range_sums(Lc, seed, scale):
    la = -np.random.default_rng(seed).uniform(0.0, scale, Lc)          # log-decays, <= 0
    M, din, dout, dch = chunked.chunk_tables(la)
    assert M.shape == (Lc, Lc) and din.shape == dout.shape == (Lc,)
    for t in range(Lc):
        for s in range(Lc):
            if s > t:
                assert M[t, s] == 0.0                                   # masked: exactly zero
            else:
                assert math.isclose(M[t, s], math.exp(_range_sum(la, s + 1, t + 1)), rel_tol=1e-13, abs_tol=0.0)
        assert M[t, t] == 1.0                                           # the empty range
        assert math.isclose(din[t], math.exp(_range_sum(la, 0, t + 1)), rel_tol=1e-13, abs_tol=0.0)
        assert math.isclose(dout[t], math.exp(_range_sum(la, t + 1, Lc)), rel_tol=1e-13, abs_tol=0.0)
    assert dout[Lc - 1] == 1.0
    assert math.isclose(float(dch), math.exp(_range_sum(la, 0, Lc)), rel_tol=1e-13, abs_tol=0.0)


@pytest.mark.parametrize("bad", [-np.inf, np.nan])
def test_a_non_finite_log_decay_stays_inside_the_ranges_that_hold_it(bad):
    # The docstring's promise: decays are sums over their own range, never differences of
    # running sums, so a -inf (decay 0) or nan at token k reaches exactly the entries whose
    # range holds k, as in the sequential product of decays.
    Lc, k = 6, 2
    la = np.full(Lc, -0.25)
    la[k] = bad
    with np.errstate(invalid="ignore"):
        M, din, dout, dch = chunked.chunk_tables(la)

    def expect(v, holds: bool):
        if not holds:
            return np.isfinite(v) and v > 0
        return v == 0.0 if bad == -np.inf else np.isnan(v)

    for t in range(Lc):
        for s in range(t + 1):
            assert expect(M[t, s], s + 1 <= k <= t), (t, s, M[t, s])
        assert expect(din[t], k <= t), (t, din[t])
        assert expect(dout[t], t + 1 <= k), (t, dout[t])
    assert expect(dch, True)
