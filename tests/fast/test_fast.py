"""ssm_fast against the reference: agreement, edge cases, determinism, errors, inputs untouched.

Expected values always come from ssm_ref (float32 reference and float64 oracle) or from finite
differences of the float64 reference, never from ssm_fast itself.

Tolerances. Each output is compared by its norm-relative error to the float64 oracle,
``||fast - oracle|| / ||oracle||``. ssm_fast accumulates in float32 like the float32 reference but
groups sums differently (vectorised sums over n, FMAs), so its error is of the same size as the
reference's own float32 error, not equal to it. The bound is ``max(ABS_FLOOR, RATIO * err_ref32)``:
RATIO = 8 leaves room for the different rounding order, and the reference's error calibrates the
bound to how ill-conditioned a drawn case is (cancelling sums, such as d_A, have larger relative
errors in every float32 implementation); ABS_FLOOR = 2e-6 (about 30 float32 ulps) is the bound
for well-conditioned outputs, where the observed errors are 1e-7 .. 5e-7. The reference's error
is one sample of a rounding walk: on a cancelling sum it can be far below what that sum's
conditioning allows (one drawn d_A of a single head, a sum of 16,384 terms: reference 3.7e-7,
ssm_fast 6.9e-6), so the bound never goes below half the contract's rtol
(ssm_ref/tolerance.F32_TOL, which every result is also held to). A missing or doubled term, a
wrong index or a wrong sign gives errors of 1e-3 or more.

d_A is a sum over (i, t, p[, n]) of terms d q of both signs, and any float32 computation of it
(inputs rounded to float32, float32 states) has an error that scales with the sum of the terms'
absolute values, not with |d_A|. Where they cancel, the reference's error is again a poor gauge
(one drawn Mamba-2 head, P = 64, N = 33, T = 16: magnitude 639, d_A = -0.0108; rounding the inputs
to float32 alone moves d_A by 4.4e-7 (4.0e-5 relative), ssm_fast's error is 6.1e-7, the reference's 2.7e-8). So
d_A's bound also never goes below ``RATIO * EPS32 * cond``, cond = ||sum |d q| || / ||d_A||
from a float64 recomputation (:func:`d_A_magnitude`). In 307 drawn cases ssm_fast's error was at
most 1.2 EPS32 ||sum |d q| ||, the reference's 2.6. The term is below rtol/2 for cond < 10.5 (most
drawn cases), so where the sum does not cancel d_A's bound is unchanged
(test_d_A_bound_fails_a_wrong_d_A).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ssm_fast
import ssm_fast.config
import ssm_ref
from ssm_ref.scan import softplus
from ssm_ref.tolerance import F32_TOL, compare, scaled

ROOT = Path(__file__).resolve().parents[2]
ABS_FLOOR = 2e-6
RATIO = 8.0
EPS32 = float(np.finfo(np.float32).eps)
OUTPUTS_FWD = ("y", "states")
OUTPUTS_BWD = ssm_ref.GRAD_NAMES


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    """Compile (or load) every kernel once, so the cache is warm for the subprocess tests."""
    ssm_fast.warmup()


# ---------------------------------------------------------------------------------------------
# Problems


def make_problem(rng, S, T, H, P, N, G, R=None, mamba1=False, a_shape=None, ids=None,
                 dt_lo=-0.5, dt_hi=0.5):
    """Inputs with the R test's distributions (float64 arrays; the backends convert)."""
    R = S if R is None else R
    if a_shape is None:
        a_shape = (H, N) if mamba1 else (H,)
    p = dict(
        s=rng.uniform(-0.5, 0.5, (R, H, P, N)),
        x=rng.uniform(-1, 1, (S, T, H, P)),
        dt=rng.uniform(dt_lo, dt_hi, (S, T, H)),
        A=-rng.uniform(0.2, 1.0, a_shape),
        B=rng.uniform(-0.5, 0.5, (S, T, G, N)),
        C=rng.uniform(-0.5, 0.5, (S, T, G, N)),
        ids=np.arange(S) if ids is None else np.asarray(ids),
    )
    g_y = rng.uniform(-1, 1, (S, T, H, P))
    g_states = rng.uniform(-1, 1, (S, H, P, N))
    return p, g_y, g_states


@st.composite
def problems(draw, max_T=16):
    """Dimensions first (the R test's ranges plus edge cases), then arrays of those shapes."""
    variant = draw(st.sampled_from(["mamba2", "mamba2_h1", "mamba1"]))
    G = draw(st.sampled_from([1, 1, 2, 4]))
    H = G * draw(st.integers(1, max(1, 8 // G)))
    if variant == "mamba1":
        N = draw(st.sampled_from([1, 3, 5, 16, 17, 32]))
        P = draw(st.sampled_from([1, 1, 2, 3]))
    else:
        N = draw(st.sampled_from([1, 5, 16, 33, 128, 256]))
        P = draw(st.sampled_from([1, 4, 8, 64] if N >= 128 else [1, 2, 3, 4, 7, 8, 64]))
    if P * N * H > 64 * 128 * 2:  # keep the float64 reference backward quick
        P = max(1, (64 * 128 * 2) // (N * H))
    S = draw(st.integers(1, 3))
    T = draw(st.sampled_from([0, 1, 2, 5, 16, max_T]))
    R = S + draw(st.integers(0, 2))
    ids_kind = draw(st.sampled_from(["arange", "permuted", "duplicate"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if ids_kind == "arange":
        ids = np.arange(S)
    elif ids_kind == "permuted":
        ids = rng.permutation(R)[:S]
    else:
        ids = rng.integers(0, R, S)
    a_shape = {"mamba2": (H,), "mamba2_h1": (H, 1), "mamba1": (H, N)}[variant]
    return make_problem(rng, S, T, H, P, N, G, R=R, a_shape=a_shape, ids=ids)


def rel_err(got, want) -> float:
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    scale = np.linalg.norm(want)
    diff = np.linalg.norm(got - want)
    return float(diff / scale) if scale > 0 else float(diff)


def d_A_magnitude(p: dict, g_y, g_states, dt_softplus="ggml") -> np.ndarray:
    """sum over (i, t, p[, n]) of |d_t q_t| (q_t = lam_t st_{t-1} a_t, the terms of d_A), in
    float64, shaped as A: what the rounding error of any float32 d_A scales with. The reference's
    recurrences (ssm_ref.scan.backward) recomputed here, since ssm_ref returns only the sums."""
    s = np.asarray(p["s"], np.float64)[np.asarray(p["ids"])]            # (S, H, P, N)
    x, dt, A, B, C = (np.asarray(p[k], np.float64) for k in ("x", "dt", "A", "B", "C"))
    T, H, G = x.shape[1], x.shape[2], B.shape[2]
    A2 = A.reshape(H, -1)                                               # (H, 1|N)
    head_group = np.arange(H) // (H // G)
    d = softplus(dt, dt_softplus)                                       # (S, T, H)
    with np.errstate(over="ignore", invalid="ignore"):
        sts = [s]                                                       # sts[t]: state before token t
        for t in range(T):
            a = np.exp(d[:, t, :, None, None] * A2[None, :, None, :])   # (S, H, 1, 1|N)
            u = x[:, t] * d[:, t, :, None]                              # (S, H, P)
            sts.append(sts[t] * a + B[:, t][:, head_group][:, :, None, :] * u[..., None])
        carry = np.asarray(g_states, np.float64)                        # a_{t+1} lam_{t+1}
        mag = np.zeros((H, s.shape[3]))                                 # (H, N)
        for t in reversed(range(T)):
            a = np.exp(d[:, t, :, None, None] * A2[None, :, None, :])
            lam = carry + np.asarray(g_y, np.float64)[:, t, :, :, None] * C[:, t][:, head_group][:, :, None, :]
            mag += np.sum(np.abs(lam * sts[t] * a * d[:, t, :, None, None]), axis=(0, 2))
            carry = a * lam
    if A2.shape[1] == 1:
        mag = mag.sum(axis=1, keepdims=True)                            # Mamba-2: also over n
    return mag.reshape(A.shape)


def oracle_bound(name: str, e_ref: float, oracle=None, magnitude=None) -> float:
    """The norm-relative bound of ``name``'s error (module docstring): max(ABS_FLOOR, RATIO *
    e_ref, rtol/2), and for d_A given its :func:`d_A_magnitude`, at least RATIO * EPS32 * cond."""
    bound = max(ABS_FLOOR, RATIO * e_ref, F32_TOL[name].rtol / 2)
    if name == "d_A" and magnitude is not None:
        scale = np.linalg.norm(oracle)
        cancel = RATIO * EPS32 * float(np.linalg.norm(magnitude)) / (scale if scale > 0 else 1.0)
        if np.isfinite(cancel):                                         # an overflowed state: no term
            bound = max(bound, cancel)
    return bound


def assert_close_to_oracle(fast, ref32, oracle, names, T, d_A_mag=None):
    """Each output in ``names`` within the contract's table and within :func:`oracle_bound`;
    ``d_A_mag``: d_A's :func:`d_A_magnitude` (its cancellation term), where known."""
    table = scaled(F32_TOL, T)
    for name in names:
        f, r, o = (getattr(v, name) for v in (fast, ref32, oracle))
        assert f.shape == o.shape, name
        assert f.dtype == np.float32, name
        contract = compare(name, f, o, table[name])
        assert contract.ok, f"{name}: outside the tolerance table: {contract}"
        e_fast, e_ref = rel_err(f, o), rel_err(r, o)
        bound = oracle_bound(name, e_ref, o, d_A_mag)
        assert e_fast <= bound, f"{name}: norm-relative error {e_fast:.2e} > {bound:.2e} (ref32 {e_ref:.2e})"


def check_against_reference(p, g_y, g_states):
    fast = ssm_fast.ssm_scan(**p)
    assert (fast.where, fast.backend) == ("CPU", "ssm_fast")
    assert_close_to_oracle(fast, ssm_ref.ssm_scan(**p), ssm_ref.ssm_scan(**p, dtype=np.float64), OUTPUTS_FWD,
                           p["x"].shape[1])
    gf = ssm_fast.ssm_scan_back(**p, g_y=g_y, g_states=g_states)
    assert (gf.where, gf.backend) == ("CPU", "ssm_fast")
    g32 = ssm_ref.ssm_scan_back(**p, g_y=g_y, g_states=g_states)
    g64 = ssm_ref.ssm_scan_back(**p, g_y=g_y, g_states=g_states, dtype=np.float64)
    assert_close_to_oracle(gf, g32, g64, OUTPUTS_BWD, p["x"].shape[1], d_A_magnitude(p, g_y, g_states))


# ---------------------------------------------------------------------------------------------
# Agreement with the reference


@given(problems())
def test_agrees_with_reference_on_drawn_shapes(problem):
    check_against_reference(*problem)


def test_d_A_of_a_cancelling_sum():
    """The drawn case behind d_A's cancellation term (module docstring): one Mamba-2 head whose
    33,792 terms d q (magnitude 639) sum to -0.0108. Rounding its inputs to float32 alone moves
    d_A by 4.0e-5 relative, beyond the bound the reference's error gives (8 * 2.5e-6)."""
    rng = np.random.default_rng(15541)
    ids = rng.permutation(2)[:1]                     # as problems() draws "permuted" ids
    p, g_y, g_states = make_problem(rng, 1, 16, 1, 64, 33, 1, R=2, a_shape=(1,), ids=ids)
    oracle = ssm_ref.ssm_scan_back(**p, g_y=g_y, g_states=g_states, dtype=np.float64)
    assert np.linalg.norm(d_A_magnitude(p, g_y, g_states)) / np.linalg.norm(oracle.d_A) > 1e4
    check_against_reference(p, g_y, g_states)


@pytest.mark.parametrize("mamba1", [False, True], ids=["mamba2", "mamba1"])
def test_d_A_bound_fails_a_wrong_d_A(mamba1):
    """The cancellation term leaves d_A's bound where the sum does not cancel: 1e-3 relative
    off fails it, as does an error just above the bound that the contract's table lets through."""
    rng = np.random.default_rng(5)
    dims = (1, 16, 64, 1, 16) if mamba1 else (2, 16, 4, 2, 5)            # S, T, H, P, N
    p, g_y, g_states = make_problem(rng, *dims, 1, mamba1=mamba1)
    gf = ssm_fast.ssm_scan_back(**p, g_y=g_y, g_states=g_states)
    g32 = ssm_ref.ssm_scan_back(**p, g_y=g_y, g_states=g_states)
    g64 = ssm_ref.ssm_scan_back(**p, g_y=g_y, g_states=g_states, dtype=np.float64)
    mag = d_A_magnitude(p, g_y, g_states)
    assert np.linalg.norm(mag) / np.linalg.norm(g64.d_A) < 10
    assert_close_to_oracle(gf, g32, g64, ["d_A"], 16, mag)
    bound = oracle_bound("d_A", rel_err(g32.d_A, g64.d_A), g64.d_A, mag)
    assert bound < 1e-4
    for off, failing in ((1e-3, "outside the tolerance table"), (1.5 * bound, "norm-relative error")):
        wrong = SimpleNamespace(d_A=(g64.d_A * (1 + off)).astype(np.float32))
        assert rel_err(wrong.d_A, g64.d_A) > bound
        with pytest.raises(AssertionError, match=f"d_A: {failing}"):
            assert_close_to_oracle(wrong, g32, g64, ["d_A"], 16, mag)


# ggmlR's R test's shapes (d_state, head_dim, n_head, n_tok, n_seqs) and the benchmark layouts,
# scaled down where the float64 reference would be slow.
R_TEST_SHAPES = [
    # S, T, H, P, N, G, variant
    (1, 3, 2, 4, 128, 1, "mamba2"),      # the R test's defaults
    (1, 1, 1, 1, 128, 1, "mamba2"),
    (3, 16, 8, 8, 256, 1, "mamba2"),
    (2, 16, 4, 64, 128, 1, "mamba2"),
    (1, 16, 8, 1, 256, 1, "mamba2"),
    (2, 16, 4, 64, 128, 2, "mamba2"),    # groups, as the "batch" benchmark
    (1, 16, 64, 1, 16, 1, "mamba1"),     # Mamba-1 as the "mamba1" benchmark, fewer heads
    (2, 7, 6, 3, 16, 3, "mamba1"),
]


@pytest.mark.parametrize("shape", R_TEST_SHAPES, ids=lambda s: "S{}T{}H{}P{}N{}G{}-{}".format(*s))
def test_agrees_with_reference_on_r_test_shapes(shape):
    S, T, H, P, N, G, variant = shape
    rng = np.random.default_rng(5)
    check_against_reference(*make_problem(rng, S, T, H, P, N, G, mamba1=variant == "mamba1"))


@pytest.mark.parametrize("mamba1", [False, True], ids=["mamba2", "mamba1"])
@pytest.mark.parametrize("dims", [
    dict(S=2, T=0, H=2, P=3, N=4, G=1),            # no tokens: states = s[ids], d_s0 = g_states
    dict(S=1, T=1, H=1, P=1, N=1, G=1),
    dict(S=2, T=5, H=4, P=1, N=7, G=2),            # P = 1, odd N
    dict(S=1, T=4, H=2, P=2, N=0, G=1),            # empty state
    dict(S=2, T=3, H=2, P=0, N=3, G=1),            # no channels
    dict(S=1, T=300, H=2, P=3, N=9, G=1),          # several recompute segments in the backward
    dict(S=3, T=9, H=6, P=5, N=3, G=3, R=5, ids=[4, 1, 4]),   # R > S, duplicate ids
])
def test_edge_cases(dims, mamba1):
    rng = np.random.default_rng(11)
    check_against_reference(*make_problem(rng, mamba1=mamba1, **dims))


@pytest.mark.parametrize("mamba1", [False, True], ids=["mamba2", "mamba1"])
def test_several_recompute_segments(mamba1, monkeypatch):
    """With small segment buffers the backward checkpoints and recomputes segment by segment,
    the last one partial (T = 45 with segments of SEGMENT_MIN = 8 tokens)."""
    monkeypatch.setattr(ssm_fast.config, "SEGMENT_BYTES", 64)
    d = ssm_ref.Dims(S=2, T=45, H=4, P=3, N=6, G=2, R=2, mamba1=mamba1,
                     a_shape=(4, 6) if mamba1 else (4,))
    seg = ssm_fast._segment(d, ssm_fast.config.LANES)
    assert seg == ssm_fast.config.SEGMENT_MIN and d.T % seg
    rng = np.random.default_rng(3)
    check_against_reference(*make_problem(rng, S=2, T=45, H=4, P=3, N=6, G=2, mamba1=mamba1))


def test_many_chunks_and_partial_lane_blocks():
    """S*G = 1 splits the group's rows into chunks (summed afterwards); 70 rows leave a partial
    lane block in the Mamba-1 kernel."""
    rng = np.random.default_rng(4)
    d = ssm_ref.Dims(S=1, T=5, H=70, P=1, N=5, G=1, R=1, mamba1=True, a_shape=(70, 5))
    assert ssm_fast._chunks(d) > 1
    check_against_reference(*make_problem(rng, S=1, T=5, H=70, P=1, N=5, G=1, mamba1=True))
    check_against_reference(*make_problem(rng, S=1, T=5, H=7, P=9, N=40, G=1))


@pytest.mark.parametrize("mamba1", [False, True], ids=["mamba2", "mamba1"])
def test_softplus_branches(mamba1):
    """dt on both sides of 20 (identity branch, derivative 1), exactly 20 (log branch), and far
    below 0 (softplus is exactly 0 in float32 there)."""
    rng = np.random.default_rng(8)
    p, g_y, g_states = make_problem(rng, S=2, T=8, H=4, P=3, N=5, G=2, mamba1=mamba1)
    p["dt"] = rng.choice([-40.0, -17.0, -16.0, -3.0, 0.0, 19.5, 20.0, 20.5, 25.0], size=p["dt"].shape)
    p["A"] = p["A"] * 0.05  # keep exp(d * A) away from 0 at d ~ 25
    check_against_reference(p, g_y, g_states)


@pytest.mark.parametrize("mamba1", [False, True], ids=["mamba2", "mamba1"])
def test_overflow_gives_inf_and_nan_where_the_reference_does(mamba1):
    """A > 0 with large d overflows exp: the non-finite pattern matches the float32 reference."""
    rng = np.random.default_rng(9)
    p, g_y, g_states = make_problem(rng, S=1, T=6, H=2, P=2, N=3, G=1, mamba1=mamba1)
    p["A"] = np.abs(p["A"]) * 10
    p["dt"][0, 3:, 1] = 30.0  # d = 30: exp(30 * A) = inf for head 1 from token 3 on
    fast = ssm_fast.ssm_scan(**p)
    ref = ssm_ref.ssm_scan(**p)
    gf = ssm_fast.ssm_scan_back(**p, g_y=g_y, g_states=g_states)
    with np.errstate(all="ignore"):
        gr = ssm_ref.ssm_scan_back(**p, g_y=g_y, g_states=g_states)
    assert not np.all(np.isfinite(ref.y))
    for got, want, name in [(fast.y, ref.y, "y"), (fast.states, ref.states, "states")] + [
            (getattr(gf, k), getattr(gr, k), k) for k in OUTPUTS_BWD]:
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{name}: nan pattern")
        np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want), err_msg=f"{name}: +inf pattern")
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), err_msg=f"{name}: -inf pattern")


def test_infinite_decay_with_terms_of_both_signs_gives_nan_like_the_reference():
    """a = exp(d*A) = inf and lam_t * st_{t-1} of both signs: sum_n q_t[n] is inf - inf = nan in
    the reference, so d_dt and d_A are nan (a factored-out a_t * sum_n lam st would give inf).
    Found by the property suite on main (tests/regressions/ssm_fast-nonfinite_pattern-overflow-0)."""
    p = dict(s=np.array([[[[1.0, -1.0, 0.5]]]]), x=np.ones((1, 1, 1, 1)), dt=np.full((1, 1, 1), 30.0),
             A=np.array([10.0]), B=np.ones((1, 1, 1, 3)), C=np.ones((1, 1, 1, 3)), ids=None)
    g_y, g_states = np.zeros((1, 1, 1, 1)), np.ones((1, 1, 1, 3))
    with np.errstate(all="ignore"):
        want = ssm_ref.ssm_scan_back(**p, g_y=g_y, g_states=g_states)
    got = ssm_fast.ssm_scan_back(**p, g_y=g_y, g_states=g_states)
    assert np.isnan(want.d_dt).all() and np.isnan(want.d_A).all()
    for k in OUTPUTS_BWD:
        w, g = getattr(want, k), getattr(got, k)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=k)
        np.testing.assert_array_equal(np.isinf(g), np.isinf(w), err_msg=k)


# ---------------------------------------------------------------------------------------------
# Gradients against finite differences


@pytest.mark.parametrize("mamba1", [False, True], ids=["mamba2", "mamba1"])
def test_gradients_match_finite_differences(mamba1):
    """Central differences of the float64 reference's loss against ssm_fast's float32 gradients.
    The differences are accurate to ~1e-9; the bound 1e-4 (relative to the largest entry) is the
    float32 gradients' rounding with a wide margin, far below the effect of a wrong term."""
    rng = np.random.default_rng(21)
    S, T, H, P, N, G, R = 2, 4, 4, 2, 3, 2, 3
    p, g_y, g_states = make_problem(rng, S, T, H, P, N, G, R=R, mamba1=mamba1, ids=[2, 0])
    grads = ssm_fast.ssm_scan_back(**p, g_y=g_y, g_states=g_states)

    def loss(**kw):
        r = ssm_ref.ssm_scan(**{**p, **kw}, dtype=np.float64)
        return float(np.sum(r.y * g_y) + np.sum(r.states * g_states))

    assert_gradients_match_differences(grads, p, loss, 1e-4)


def assert_gradients_match_differences(grads, p: dict, loss, bound: float, h: float = 1e-6) -> None:
    """Each gradient ``grads.d_<name>`` of the six inputs in ``p`` against central differences
    (step ``h``) of ``loss(**{name: moved})``, entry by entry, within ``bound`` times the largest
    difference."""
    for name in ("s", "x", "dt", "A", "B", "C"):
        base = p[name]
        fd = np.empty_like(base)
        for i in np.ndindex(base.shape):
            up, dn = base.copy(), base.copy()
            up[i] += h
            dn[i] -= h
            fd[i] = (loss(**{name: up}) - loss(**{name: dn})) / (2 * h)
        got = getattr(grads, "d_" + name)
        assert got.shape == base.shape
        np.testing.assert_allclose(got, fd, rtol=0, atol=bound * np.abs(fd).max(), err_msg=f"d_{name}")


# ---------------------------------------------------------------------------------------------
# Determinism


def _digest(p, g_y, g_states) -> str:
    f = ssm_fast.ssm_scan(**p)
    g = ssm_fast.ssm_scan_back(**p, g_y=g_y, g_states=g_states)
    h = hashlib.sha256()
    for a in (f.y, f.states, *(getattr(g, k) for k in OUTPUTS_BWD)):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


# Shapes whose backward runs with one chunk and with several; both variants.
DETERMINISM_SHAPES = [
    dict(S=1, T=40, H=4, P=16, N=128, G=1, mamba1=False),   # S*G = 1: 16 chunks
    dict(S=3, T=20, H=6, P=4, N=33, G=3, mamba1=False),
    dict(S=1, T=300, H=96, P=1, N=16, G=1, mamba1=True),    # chunks, several lane blocks, segments
    dict(S=2, T=9, H=4, P=3, N=5, G=2, R=3, ids=[2, 2], mamba1=True),
]


def _digests_here() -> list[str]:
    """Digests of every DETERMINISM_SHAPES case, with the configured segments and again with
    8-token segments (checkpoints everywhere), each with the configured small-call threshold and
    with none (every call of more than one task on all threads)."""
    out = []
    saved = ssm_fast.config.SEGMENT_BYTES, ssm_fast.config.SERIAL_BELOW_S
    try:
        for seg_bytes in (saved[0], 64):
            for below in (saved[1], 0.0):
                ssm_fast.config.SEGMENT_BYTES, ssm_fast.config.SERIAL_BELOW_S = seg_bytes, below
                for k, dims in enumerate(DETERMINISM_SHAPES):
                    out.append(_digest(*make_problem(np.random.default_rng(100 + k), **dims)))
    finally:
        ssm_fast.config.SEGMENT_BYTES, ssm_fast.config.SERIAL_BELOW_S = saved
    return out


def test_bit_identical_run_to_run_and_for_any_alignment():
    first = _digests_here()
    assert _digests_here() == first
    # The same values in buffers at another address (offset by one float) give the same bits.
    rng = np.random.default_rng(100)
    p, g_y, g_states = make_problem(rng, **DETERMINISM_SHAPES[0])

    def shifted(a):
        a = np.asarray(a, dtype=np.float32)
        buf = np.empty(a.size + 1, dtype=np.float32)
        out = buf[1:].reshape(a.shape)
        out[...] = a
        return out

    q = {k: (v if k == "ids" else shifted(v)) for k, v in p.items()}
    assert _digest(q, shifted(g_y), shifted(g_states)) == first[0]


def test_bit_identical_for_any_thread_count():
    """The same outputs, bit for bit, with NUMBA_NUM_THREADS = 1, 2 and 4 (fresh processes)."""
    code = ("import json, tests.fast.test_fast as t, ssm_fast, numba; "
            "print(json.dumps([numba.get_num_threads(), t._digests_here()]))")
    results = {}
    for n in (1, 2, 4):
        env = dict(os.environ, NUMBA_NUM_THREADS=str(n), PYTHONPATH=str(ROOT))
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        threads, digests = json.loads(out.stdout.strip().splitlines()[-1])
        assert threads == n
        results[n] = digests
    assert results[1] == results[2] == results[4]
    assert results[1] == _digests_here()


# ---------------------------------------------------------------------------------------------
# Interface: errors, packed gradients, inputs untouched, supports


BAD_INPUTS = [
    ("B without the group axis", lambda p: {**p, "B": p["B"][:, :, 0, :]}),
    ("integer x", lambda p: {**p, "x": p["x"].astype(np.int32)}),
    ("id out of range", lambda p: {**p, "ids": np.array([0, 5])}),
    ("H not a multiple of G", lambda p: {**p, "B": p["B"][:, :, :1].repeat(3, axis=2),
                                         "C": p["C"][:, :, :1].repeat(3, axis=2)}),
    ("A of a wrong shape", lambda p: {**p, "A": p["A"][:1]}),
    ("ids None with fewer rows than sequences", lambda p: {**p, "s": p["s"][:1], "ids": None}),
]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_raises_like_the_reference(case):
    _, mutate = case
    p, g_y, g_states = make_problem(np.random.default_rng(0), S=2, T=3, H=4, P=2, N=5, G=2)
    bad = mutate(p)
    for call in (lambda m: m.ssm_scan(**bad),
                 lambda m: m.ssm_scan_back(**bad, g_y=g_y, g_states=g_states),
                 lambda m: m.supports("ssm_scan", **bad)):
        with pytest.raises((TypeError, ValueError)) as want:
            call(ssm_ref)
        with pytest.raises(want.type) as got:
            call(ssm_fast)
        assert str(got.value) == str(want.value)


def test_bad_gradient_shapes_raise_like_the_reference():
    p, g_y, g_states = make_problem(np.random.default_rng(0), S=2, T=3, H=4, P=2, N=5, G=2)
    for gy, gs in ((g_y[:, :2], g_states), (g_y, g_states[..., :3]), (g_y.ravel()[:-1], None)):
        with pytest.raises(ValueError) as want:
            ssm_ref.ssm_scan_back(**p, g_y=gy, g_states=gs)
        with pytest.raises(ValueError, match=None) as got:
            ssm_fast.ssm_scan_back(**p, g_y=gy, g_states=gs)
        assert str(got.value) == str(want.value)


def test_packed_gradient_input_gives_the_same_result():
    p, g_y, g_states = make_problem(np.random.default_rng(2), S=2, T=5, H=4, P=3, N=6, G=2)
    a = ssm_fast.ssm_scan_back(**p, g_y=g_y, g_states=g_states)
    b = ssm_fast.ssm_scan_back(**p, g_y=ssm_ref.pack_forward(g_y, g_states), g_states=None)
    for k in OUTPUTS_BWD:
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=k)
    assert a.packed().shape == (ssm_ref.Dims(S=2, T=5, H=4, P=3, N=6, G=2, R=2, mamba1=False,
                                             a_shape=(4,)).backward_size,)


@pytest.mark.parametrize("mamba1", [False, True], ids=["mamba2", "mamba1"])
def test_inputs_are_never_written(mamba1):
    p, g_y, g_states = make_problem(np.random.default_rng(6), S=2, T=5, H=4, P=3, N=6, G=2,
                                    mamba1=mamba1)
    p = {k: (v.astype(np.float32) if k != "ids" else v) for k, v in p.items()}  # no conversion copy
    g_y, g_states = g_y.astype(np.float32), g_states.astype(np.float32)
    before = {k: v.copy() for k, v in p.items()}
    gy0, gs0 = g_y.copy(), g_states.copy()
    ssm_fast.ssm_scan(**p)
    ssm_fast.ssm_scan_back(**p, g_y=g_y, g_states=g_states)
    for k, v in p.items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
        assert v.flags.writeable, k
    np.testing.assert_array_equal(g_y, gy0)
    np.testing.assert_array_equal(g_states, gs0)


def test_supports_every_valid_shape_and_checks_op():
    p, _, _ = make_problem(np.random.default_rng(0), S=1, T=2, H=2, P=2, N=3, G=1, mamba1=True)
    for op in ("ssm_scan", "ssm_scan_back"):
        s = ssm_fast.supports(op, **p)
        assert s and s.ok and s.reason
    with pytest.raises(ValueError):
        ssm_fast.supports("ssm_conv", **p)
    assert ssm_fast.NAME == "ssm_fast"


def test_d_s_is_the_reference_scatter_bit_for_bit():
    """d_s adds d_s0 rows into rows ids[i] in the order of ssm_ref.scatter_rows (duplicates add,
    unread rows are zero), so it equals scatter_rows(d_s0) exactly."""
    p, g_y, g_states = make_problem(np.random.default_rng(12), S=4, T=3, H=2, P=3, N=5, G=1, R=6,
                                    ids=[5, 1, 5, 5])
    g = ssm_fast.ssm_scan_back(**p, g_y=g_y, g_states=g_states)
    np.testing.assert_array_equal(g.d_s, ssm_ref.scatter_rows(g.d_s0, np.asarray(p["ids"]), 6))
    assert not g.d_s[[0, 2, 3, 4]].any()


def test_numba_disable_jit_falls_back_to_the_reference_visibly():
    """NUMBA_DISABLE_JIT=1: ssm_fast (and ssm_vk's CPU fallback through it) compute with ssm_ref,
    log why once, and say so in ``backend``."""
    code = ("import json, logging, numpy as np, tests.fast.test_fast as t, ssm_fast, ssm_ref\n"
            "logging.basicConfig(level=logging.WARNING)\n"
            "p, gy, gs = t.make_problem(np.random.default_rng(1), S=2, T=5, H=2, P=3, N=4, G=1)\n"
            "r, g = ssm_fast.ssm_scan(**p), ssm_fast.ssm_scan_back(**p, g_y=gy, g_states=gs)\n"
            "r0, g0 = ssm_ref.ssm_scan(**p), ssm_ref.ssm_scan_back(**p, g_y=gy, g_states=gs)\n"
            "same = np.array_equal(r.y, r0.y) and all(np.array_equal(getattr(g, k), getattr(g0, k)) "
            "for k in ssm_ref.GRAD_NAMES)\n"
            "print(json.dumps([r.backend, g.backend, bool(same)]))\n")
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["ssm_ref", "ssm_ref", True]
    assert out.stderr.count("NUMBA_DISABLE_JIT is set") == 1, out.stderr


@pytest.mark.parametrize("direct_bytes", [0, 1 << 40], ids=["scratch rows", "direct"])
def test_decode_step_both_paths(direct_bytes, monkeypatch):
    """T = 1 (Mamba-2) takes the direct path up to config.DECODE_DIRECT_BYTES of states, else the
    scratch-row path; both agree with the reference (partial row blocks and duplicate ids too)."""
    monkeypatch.setattr(ssm_fast.config, "DECODE_DIRECT_BYTES", direct_bytes)
    rng = np.random.default_rng(7)
    for dims in (dict(S=3, T=1, H=4, P=37, N=33, G=2, R=4, ids=[3, 0, 3]), dict(S=1, T=1, H=2, P=64, N=128, G=1)):
        check_against_reference(*make_problem(rng, **dims))


@pytest.mark.parametrize("form", ["ggml", "log1p", None])
@pytest.mark.parametrize("variant", ["mamba2", "mamba1"])
def test_every_dt_softplus_form_agrees_with_the_reference(form, variant):
    # the accurate and the identity forms (what the PyTorch drop-ins call) against ssm_ref's, in
    # float64, with dt on both softplus branches and far below zero
    rng = np.random.default_rng(5)
    p, g_y, g_states = make_problem(rng, S=2, T=9, H=4, P=3, N=8, G=2, mamba1=variant == "mamba1",
                                    dt_lo=-18.0, dt_hi=24.0)
    if form is None:
        p["dt"] = np.abs(p["dt"]) / 10        # a step: positive
    fast = ssm_fast.ssm_scan(**p, dt_softplus=form)
    ref32 = ssm_ref.ssm_scan(**p, dt_softplus=form)
    oracle = ssm_ref.ssm_scan(**p, dtype=np.float64, dt_softplus=form)
    assert_close_to_oracle(fast, ref32, oracle, OUTPUTS_FWD, 9)
    gf = ssm_fast.ssm_scan_back(**p, g_y=g_y, g_states=g_states, dt_softplus=form)
    g32 = ssm_ref.ssm_scan_back(**p, g_y=g_y, g_states=g_states, dt_softplus=form)
    g64 = ssm_ref.ssm_scan_back(**p, g_y=g_y, g_states=g_states, dtype=np.float64, dt_softplus=form)
    assert_close_to_oracle(gf, g32, g64, OUTPUTS_BWD, 9)
    if form != "ggml":   # and they differ from the default form where it matters
        other = ssm_fast.ssm_scan(**p)
        assert not np.array_equal(other.y, fast.y)
    with pytest.raises(ValueError, match=r"^dt_softplus: expected"):
        ssm_fast.ssm_scan(**p, dt_softplus="exact")
