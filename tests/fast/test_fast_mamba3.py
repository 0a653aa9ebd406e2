"""ssm_fast's Mamba-3 scan against the reference: agreement with the float64 oracle, determinism,
the decode step, errors, inputs untouched.

Expected values come from ssm_ref (its float64 oracle and float32 contract), never from ssm_fast.
Each output is held to two bounds: the op's declared float32 tolerance (``ops.get("mamba3_scan")
.tol()``, ssm_ref.tolerance.MAMBA3_F32_TOL) and a norm-relative error against the float64 oracle
of at most ``max(ABS_FLOOR, RATIO * e_ref32)``, with e_ref32 the reference's own float32 error on
the same case. ssm_fast groups sums differently from the reference (the pre-decay state of
kernels_m3_fwd, vectorised sums over n, fused multiply-adds), so its error is of the size of the
reference's, not equal to it: RATIO = 8 leaves room for the order, ABS_FLOOR = 2e-6 (about 30
float32 ulps) for outputs the reference gets almost exactly. Over 400 drawn problems ssm_fast's
error was at most 10% of any declared bound, its median 0.8-1.0 times the reference's. A missing
term, a wrong index or sign gives 1e-3 or more.

Where an output is a sum of terms of both signs that cancel (d_dA, d_dt, d_lam: dot products over
the P x N state; d_dtheta, d_s_theta: running sums over the tokens), the reference's error is one
sample of the rounding and no gauge of what the sum's conditioning allows; there the second bound
never goes below RATIO * EPS32 * (the terms' magnitude) / ||oracle|| (step_magnitudes,
running_sum_bound), as test_fast.py does for d_A.

The drawn problems keep the final angles away from the wrap at 2 pi, where float32 and float64
can land on different sides (0 against 2 pi: a difference of the output theta, not of anything
that reads it).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import njit

import ssm_fast
import ssm_fast.config
import ssm_fast.mamba3
import ssm_ref
import ssm_ref.ops as ops
from ssm_fast import pool
from ssm_fast.mathf import sincos_f32
from ssm_ref.tolerance import compare, rel_err

OP = ops.get("mamba3_scan")
ABS_FLOOR = 2e-6
RATIO = 8.0
TWO_PI = 2 * np.pi
WRAP_MARGIN = 1e-3
EPS32 = float(np.finfo(np.float32).eps)
STATE_NAMES = ("s_theta", "s_h", "s_k", "s_v")


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    ssm_fast.mamba3.warmup()


# ---------------------------------------------------------------------------------------------
# Problems


def make(rng, *, S=2, T=3, H=2, P=3, N=4, G=1, M=None, F=1, R=None, ids="none", states=True, psi=True,
         rotation="interleaved"):
    """(mamba3_scan's keyword arguments in float64, the five cotangents). M None: SISO; ids one of
    "none" (states None then), "identity", "permutation" (R > S: unread rows), "duplicates"."""
    rank = () if M is None else (M,)
    for _ in range(50):
        a = dict(
            x=rng.standard_normal((S, T, H, P)),
            dt=rng.uniform(0.05, 0.8, (S, T, H)),
            lam=rng.uniform(0.05, 0.95, (S, T, H)),
            B=rng.standard_normal((S, T, *rank, G, N)), C=rng.standard_normal((S, T, *rank, G, N)),
            B_bias=rng.standard_normal((H, *rank, N)), C_bias=rng.standard_normal((H, *rank, N)),
            dtheta=rng.uniform(-2.0, 2.0, (S, T, H, F)),
            psi=rng.standard_normal((H, M, P)) if (M is not None and psi) else None,
        )
        a["dA"] = -a["dt"] * rng.uniform(0.2, 1.5, (S, T, H))
        if states:
            R = R or (S + 2 if ids in ("permutation", "duplicates") else S)
            a.update(s_theta=rng.uniform(0, TWO_PI, (R, H, F)), s_h=rng.standard_normal((R, H, P, N)),
                     s_k=rng.standard_normal((R, H, *rank, N)), s_v=rng.standard_normal((R, H, *rank, P)))
            a["ids"] = {"none": None, "identity": np.arange(S), "permutation": rng.permutation(R)[:S],
                        "duplicates": rng.integers(0, max(1, S // 2), S)}[ids]
        out = ssm_ref.mamba3_scan(**a, rotation=rotation, dtype=np.float64)
        if T == 0 or np.all((out.theta > WRAP_MARGIN) & (out.theta < TWO_PI - WRAP_MARGIN)):
            break
    else:
        raise AssertionError("no problem with its final angles away from the wrap")
    cot = {"g_" + n: rng.standard_normal(getattr(out, n).shape) for n in ("y", "theta", "h", "k", "v")}
    return a, cot


@st.composite
def problems(draw):
    M = draw(st.sampled_from([None, None, 1, 2, 3, 4]))
    G = draw(st.sampled_from([1, 1, 2]))
    H = G * draw(st.integers(1, 2))
    N = draw(st.sampled_from([2, 4, 6, 8, 16]))
    F = draw(st.integers(0, N // 2))
    P = draw(st.sampled_from([1, 3, 4, 5, 8]))
    S = draw(st.integers(1, 3))
    T = draw(st.sampled_from([0, 1, 2, 5, 9]))
    ids = draw(st.sampled_from(["none", "identity", "permutation", "duplicates"]))
    rotation = draw(st.sampled_from(["interleaved", "halved"]))
    psi = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    a, cot = make(rng, S=S, T=T, H=H, P=P, N=N, G=G, M=M, F=F, ids=ids, states=ids != "none", psi=psi,
                  rotation=rotation)
    return a, cot, rotation


def bound(e_ref: float) -> float:
    return max(ABS_FLOOR, RATIO * e_ref)


def running_sum_bound(d_dtheta64: np.ndarray, oracle: np.ndarray) -> float:
    """The norm-relative bound of d_dtheta and d_s_theta from their conditioning: both are running
    sums over the tokens (from the last back), whose float32 rounding error is at most about eps
    times the sum of the partial sums' magnitudes, Σ_t |d_dtheta[:, t]|. Where the partial sums
    are large and the result small (terms of both signs), the reference's own error is no gauge
    (a drawn case: partial sums up to 37, d_s_theta = -0.399; ssm_fast 2.2e-5 relative off, the
    reference 7.9e-7); RATIO * EPS32 times that magnitude, relative to ||oracle||."""
    mag = np.linalg.norm(np.abs(d_dtheta64).sum(axis=1))
    scale = np.linalg.norm(oracle)
    return RATIO * EPS32 * mag / scale if scale > 0 else 0.0


def step_magnitudes(a: dict, cot: dict, rotation: str) -> dict:
    """For d_dA, d_dt and d_lam: per (i, t, h) the sum of the absolute values of the terms of the
    P x N dot products they are made of (<dL/dh_t, h_{t-1}>, and the β and γ terms'
    Σ_r v^rᵀ dL/dh_t k^r), in float64 -- what any float32 computation's rounding error scales
    with, as d_A's in test_fast.py. Recomputes the reference's walk back (ssm_ref.mamba3.backward)
    with the products' absolute values."""
    from ssm_ref.mamba3 import forward, rotate
    from ssm_ref.mamba3_checks import check_mamba3_backward, pair_index

    p = check_mamba3_backward(**a, **cot, rotation=rotation, dtype=np.float64)
    d = p.dims
    _, _, (thetas, hs, ks, vs) = forward(p, keep=True)
    ia, ib = pair_index(rotation, d.N, d.F)
    heads = d.group_of_head()
    g_h = p.g_h.copy()
    mags = {k: np.zeros((d.S, d.T, d.H)) for k in ("d_dA", "d_dt", "d_lam")}
    for t in reversed(range(d.T)):
        c, sn = np.cos(thetas[t + 1])[:, :, None], np.sin(thetas[t + 1])[:, :, None]
        q = rotate(p.C[:, t][:, :, heads].transpose(0, 2, 1, 3) + p.C_bias[None], c, sn, ia, ib)
        g_h = g_h + np.einsum("smhp,shmn->shpn", p.g_y[:, t], q)
        prev = np.abs(g_h * np.einsum("shmp,shmn->shpn", vs[t], ks[t])).sum(axis=(2, 3))
        cur = np.abs(g_h * np.einsum("shmp,shmn->shpn", vs[t + 1], ks[t + 1])).sum(axis=(2, 3))
        alpha, dt, lam = np.exp(p.dA[:, t]), p.dt[:, t], p.lam[:, t]
        mags["d_dA"][:, t] = alpha * (np.abs(g_h * hs[t]).sum(axis=(2, 3)) + prev * dt * (1 - lam))
        mags["d_dt"][:, t] = prev * alpha * (1 - lam) + cur * lam
        mags["d_lam"][:, t] = cur * dt + prev * alpha * dt
        g_h = alpha[:, :, None, None] * g_h
    return mags


def assert_close(name, fast, ref32, oracle, floor=0.0):
    """fast (float32) within the declared tolerance (where the op declares one for ``name``) and
    within :func:`bound` of the float64 oracle (or ``floor``, where larger)."""
    if oracle is None:
        assert fast is None and ref32 is None, name
        return
    assert fast.shape == oracle.shape, (name, fast.shape, oracle.shape)
    assert fast.dtype == np.float32, name
    tol = OP.tol().get(name)
    if tol is not None:
        c = compare(name, fast, oracle, tol)
        assert c.ok, f"{name}: outside the declared tolerance: {c}"
    e_fast, e_ref = rel_err(fast, oracle), rel_err(ref32, oracle)
    b = max(bound(e_ref), floor)
    assert e_fast <= b, f"{name}: norm-relative error {e_fast:.2e} > {b:.2e} (ref32 {e_ref:.2e})"


def check_against_reference(a, cot, rotation):
    fast = ssm_fast.mamba3_scan(**a, rotation=rotation)
    assert isinstance(fast, ssm_ref.Mamba3Result) and fast.where == "CPU"
    ref32 = ssm_ref.mamba3_scan(**a, rotation=rotation)
    oracle = ssm_ref.mamba3_scan(**a, rotation=rotation, dtype=np.float64)
    for name in OP.output_names:
        assert_close(name, getattr(fast, name), getattr(ref32, name), getattr(oracle, name))
    gf = ssm_fast.mamba3_scan_back(**a, **cot, rotation=rotation)
    assert isinstance(gf, ssm_ref.Mamba3Grads) and gf.where == "CPU"
    g32 = ssm_ref.mamba3_scan_back(**a, **cot, rotation=rotation)
    g64 = ssm_ref.mamba3_scan_back(**a, **cot, rotation=rotation, dtype=np.float64)
    assert list(gf) == list(g64)
    mags = step_magnitudes(a, cot, rotation)
    for name in OP.grad_names:
        floor = 0.0
        if name in ("d_dtheta", "d_s_theta"):
            floor = running_sum_bound(g64.d_dtheta, g64[name])
        elif name in mags and np.linalg.norm(g64[name]) > 0:
            floor = RATIO * EPS32 * float(np.linalg.norm(mags[name]) / np.linalg.norm(g64[name]))
        assert_close(name, gf[name], g32[name], g64[name], floor)


# ---------------------------------------------------------------------------------------------
# Agreement with the reference


@given(problems())
def test_agrees_with_the_reference_on_drawn_problems(problem):
    check_against_reference(*problem)


CASES = {
    "siso-G2-duplicates": dict(S=3, T=6, H=4, P=5, N=8, G=2, F=3, ids="duplicates"),
    "siso-halved-F=N/2-permuted": dict(S=2, T=7, H=2, P=4, N=8, F=4, ids="permutation", rotation="halved"),
    "mimo4-halved-psi-none-no-states": dict(S=2, T=5, H=2, P=3, N=6, M=4, F=2, states=False, psi=False,
                                            rotation="halved"),
    "mimo2-G2-identity": dict(S=1, T=4, H=4, P=6, N=4, G=2, M=2, F=1, ids="identity"),
    "siso-F0-T1": dict(S=2, T=1, H=2, P=4, N=5, F=0, ids="identity"),
    "siso-T0": dict(S=2, T=0, H=2, P=3, N=4, F=2, ids="permutation"),
    "mimo-T0-no-states": dict(S=2, T=0, H=2, P=3, N=4, M=2, F=1, states=False),
    "siso-64x64-rows": dict(S=1, T=4, H=1, P=66, N=64, F=32, ids="identity"),   # 4-row blocks and a tail
}


@pytest.mark.parametrize("name", list(CASES))
def test_agrees_with_the_reference_on_fixed_cases(name):
    kw = dict(CASES[name])
    rotation = kw.pop("rotation", "interleaved")
    check_against_reference(*make(np.random.default_rng(len(name)), rotation=rotation, **kw), rotation)


def test_several_recompute_segments(monkeypatch):
    """A sequence longer than one segment: checkpoints, then segment by segment (T = 45 in
    segments of 8, the last partial), SISO and MIMO."""
    monkeypatch.setattr(ssm_fast.config, "M3_SEGMENT_BYTES", 800)
    for M in (None, 2):
        a, cot = make(np.random.default_rng(3), S=2, T=45, H=2, P=3, N=4, G=1, M=M, F=2, ids="identity")
        d = ssm_ref.mamba3_checks.check_mamba3_forward(**a).dims
        seg = ssm_fast.mamba3.backward_segment(d)
        assert seg == ssm_fast.config.SEGMENT_MIN and d.T % seg
        check_against_reference(a, cot, "interleaved")


def test_sincos_is_accurate():
    """The kernels' vectorisable sin and cos (mathf.sincos_f32) on [-20, 20] and on the angles'
    range [0, 2 pi]: within 1.5e-7 absolute of float64 (numpy's float32: 6e-8); nan beyond 8192,
    for inf and for nan."""
    @njit
    def both(x):
        s = np.empty_like(x)
        c = np.empty_like(x)
        for i in range(x.size):
            s[i], c[i] = sincos_f32(x[i])
        return s, c

    x = np.concatenate([np.linspace(-20, 20, 200_001), np.linspace(0, TWO_PI, 100_001)]).astype(np.float32)
    s, c = both(x)
    x64 = x.astype(np.float64)
    assert np.max(np.abs(s - np.sin(x64))) < 1.5e-7
    assert np.max(np.abs(c - np.cos(x64))) < 1.5e-7
    s, c = both(np.array([np.nan, np.inf, -np.inf, 1e5], np.float32))
    assert np.isnan(s).all() and np.isnan(c).all()


# ---------------------------------------------------------------------------------------------
# Determinism


def _digest(a, cot, rotation="interleaved") -> str:
    f = ssm_fast.mamba3_scan(**a, rotation=rotation)
    g = ssm_fast.mamba3_scan_back(**a, **cot, rotation=rotation)
    h = hashlib.sha256()
    for v in (*f, *g.values()):
        if v is not None:
            h.update(np.ascontiguousarray(v).tobytes())
    return h.hexdigest()


def _big(rng, **kw):
    """Inputs for the determinism tests: large enough (milliseconds) that a helper thread joins."""
    S, T, H, P, N, M, F = kw["S"], kw["T"], kw["H"], kw["P"], kw["N"], kw.get("M"), kw["F"]
    G = kw.get("G", 1)
    rank = () if M is None else (M,)
    r = rng.standard_normal
    a = dict(x=r((S, T, H, P)), dt=rng.uniform(0.05, 0.5, (S, T, H)), lam=rng.uniform(0.1, 0.9, (S, T, H)),
             B=r((S, T, *rank, G, N)), C=r((S, T, *rank, G, N)), B_bias=r((H, *rank, N)), C_bias=r((H, *rank, N)),
             dtheta=rng.uniform(-2, 2, (S, T, H, F)), psi=None if M is None else r((H, M, P)),
             s_theta=rng.uniform(0, TWO_PI, (S + 1, H, F)), s_h=r((S + 1, H, P, N)), s_k=r((S + 1, H, *rank, N)),
             s_v=r((S + 1, H, *rank, P)), ids=rng.integers(0, 2, S))           # duplicate ids: the scatter-add
    a["dA"] = -a["dt"] * rng.uniform(0.2, 1.5, (S, T, H))
    out = ssm_fast.mamba3_scan(**a)
    return a, {"g_" + n: r(getattr(out, n).shape) for n in ("y", "theta", "h", "k", "v")}


def test_bit_identical_run_to_run_and_for_any_thread_count(monkeypatch):
    """Two runs give the same bits, and so do one thread and two (every call threaded: no
    small-call threshold; a helper thread took part), with duplicate ids (the scatter-add),
    several heads per group (the sums over heads), several recompute segments, SISO and MIMO."""
    monkeypatch.setattr(ssm_fast.config, "SERIAL_BELOW_S", 0.0)
    monkeypatch.setattr(ssm_fast.config, "M3_SEGMENT_BYTES", 64 * 1024)
    cases = [_big(np.random.default_rng(7), S=3, T=200, H=4, P=32, N=32, G=2, F=8),
             _big(np.random.default_rng(8), S=2, T=60, H=4, P=16, N=16, G=1, M=3, F=4)]
    before = ssm_fast.get_num_threads()
    try:
        ssm_fast.set_num_threads(1)
        one = [_digest(*c) for c in cases]
        assert [_digest(*c) for c in cases] == one
        ssm_fast.set_num_threads(2)
        runs = pool.helper_runs()
        two = [_digest(*c) for c in cases for _ in range(3)]
        assert pool.helper_runs() > runs, "no call ran on a helper thread"
    finally:
        ssm_fast.set_num_threads(before)
    assert two == [d for d in one for _ in range(3)]


# ---------------------------------------------------------------------------------------------
# The decode step


def _f32(d: dict) -> dict:
    return {k: (v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v) for k, v in d.items()}


@pytest.mark.parametrize("M", [None, 2], ids=["siso", "mimo"])
@pytest.mark.parametrize("cache_dtype", [np.float32, np.float64], ids=["f32-in-place", "f64-copied"])
def test_decode_step_is_the_last_token_of_the_full_scan(M, cache_dtype):
    """update_cache=True with T = 1 from the state after T - 1 tokens gives the full scan's last y
    and final states, writes them into rows ids of the four caches and no other row; its
    y agrees with the float64 oracle of the full scan."""
    T = 5
    a, _ = make(np.random.default_rng(11), S=2, T=T, H=4, P=6, N=8, G=2, M=M, F=3, R=5, ids="permutation")
    a = _f32(a)
    full = ssm_fast.mamba3_scan(**a)
    oracle = ssm_ref.mamba3_scan(**a, dtype=np.float64)
    seq = ("x", "dt", "dA", "lam", "B", "C", "dtheta")
    head = ssm_fast.mamba3_scan(**{**a, **{k: a[k][:, :T - 1] for k in seq}})
    caches = {k: a[k].astype(cache_dtype) for k in STATE_NAMES}     # copies: the rows the decode starts from
    for k, v in zip(STATE_NAMES, (head.theta, head.h, head.k, head.v), strict=True):
        caches[k][a["ids"]] = v
    untouched = {k: v.copy() for k, v in caches.items()}
    step = ssm_fast.mamba3_scan(**{**a, **{k: a[k][:, T - 1:] for k in seq}, **caches}, update_cache=True)
    assert step.theta is None and step.h is None and step.k is None and step.v is None
    ids = a["ids"]
    others = np.setdiff1d(np.arange(5), ids)
    last = np.take(full.y, [T - 1], axis=1)
    np.testing.assert_allclose(step.y, last, rtol=1e-5, atol=1e-5)
    want = np.take(oracle.y, [T - 1], axis=1)
    assert rel_err(step.y, want) <= bound(rel_err(last, want))
    for k, want in zip(STATE_NAMES, (full.theta, full.h, full.k, full.v), strict=True):
        np.testing.assert_allclose(caches[k][ids], want, rtol=1e-5, atol=1e-5, err_msg=k)
        np.testing.assert_array_equal(caches[k][others], untouched[k][others], err_msg=f"{k}: a row not in ids")


def test_decode_step_in_place_equals_the_step_that_returns_states():
    """The in-place decode kernel and the forward kernel at T = 1 agree to float32 rounding (the
    forward walks four state rows at a time, which LLVM vectorises with another grouping of the
    sums over n: 1 ulp apart where they differ)."""
    a, _ = make(np.random.default_rng(12), S=3, T=1, H=2, P=9, N=8, M=None, F=2, R=4, ids="permutation")
    a = _f32(a)
    ret = ssm_fast.mamba3_scan(**a)
    caches = {k: a[k].copy() for k in STATE_NAMES}
    step = ssm_fast.mamba3_scan(**{**a, **caches}, update_cache=True)
    np.testing.assert_allclose(step.y, ret.y, rtol=4e-6, atol=1e-6)
    for k, want in zip(STATE_NAMES, (ret.theta, ret.h, ret.k, ret.v), strict=True):
        np.testing.assert_allclose(caches[k][a["ids"]], want, rtol=4e-6, atol=1e-6, err_msg=k)


# ---------------------------------------------------------------------------------------------
# Interface: errors, inputs untouched, supports


def _drop(k):
    return lambda a: {**a, k: None}


BAD_INPUTS = [
    ("x without the head axis", lambda a: {**a, "x": a["x"][:, :, 0]}),
    ("integer dt", lambda a: {**a, "dt": a["dt"].astype(np.int32)}),
    ("B with three axes", lambda a: {**a, "B": a["B"][:, :, 0]}),
    ("C of another G", lambda a: {**a, "C": a["C"][:, :, :1].repeat(3, axis=2)}),
    ("F beyond N/2", lambda a: {**a, "dtheta": np.zeros((*a["dt"].shape, 3))}),
    ("psi with SISO", lambda a: {**a, "psi": np.ones((2, 1, 3))}),
    ("three of the four state parts", _drop("s_v")),
    ("id out of range", lambda a: {**a, "ids": np.array([0, 9])}),
    ("B_bias of a wrong shape", lambda a: {**a, "B_bias": a["B_bias"][:1]}),
]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_raises_like_the_reference(case):
    a, cot = make(np.random.default_rng(0), S=2, T=3, H=2, P=3, N=4, F=1, ids="identity")
    bad = case[1](a)
    for call in (lambda m: m.mamba3_scan(**bad), lambda m: m.mamba3_scan_back(**bad, **cot)):
        with pytest.raises((TypeError, ValueError)) as want:
            call(ssm_ref)
        with pytest.raises(want.type) as got:
            call(ssm_fast)
        assert str(got.value) == str(want.value)
    with pytest.raises(want.type) as got:
        ssm_fast.supports("mamba3_scan", **bad)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("kw", [dict(rotation="rope"), dict(dtype=np.int32), dict(update_cache=1)],
                         ids=["rotation", "dtype", "update_cache"])
def test_bad_keywords_raise_like_the_reference(kw):
    a, _ = make(np.random.default_rng(0), S=2, T=3, H=2, P=3, N=4, F=1, ids="identity")
    with pytest.raises((TypeError, ValueError)) as want:
        ssm_ref.mamba3_scan(**a, **kw)
    with pytest.raises(want.type) as got:
        ssm_fast.mamba3_scan(**a, **kw)
    assert str(got.value) == str(want.value)


def test_bad_cotangent_and_bad_cache_raise_like_the_reference():
    a, cot = make(np.random.default_rng(0), S=2, T=3, H=2, P=3, N=4, F=1, ids="identity")
    for bad in ({**cot, "g_y": cot["g_y"][:, :2]}, {**cot, "g_h": cot["g_h"][..., :3]}):
        with pytest.raises(ValueError) as want:
            ssm_ref.mamba3_scan_back(**a, **bad)
        with pytest.raises(ValueError) as got:
            ssm_fast.mamba3_scan_back(**a, **bad)
        assert str(got.value) == str(want.value)
    ro = {**a, "s_h": a["s_h"].copy()}
    ro["s_h"].flags.writeable = False
    dup = {**a, "ids": np.array([1, 1])}
    for bad in (ro, dup):
        with pytest.raises(ValueError) as want:
            ssm_ref.mamba3_scan(**bad, update_cache=True)
        with pytest.raises(ValueError) as got:
            ssm_fast.mamba3_scan(**bad, update_cache=True)
        assert str(got.value) == str(want.value)


def test_float64_is_refused_with_a_clear_error():
    a, _ = make(np.random.default_rng(0), S=1, T=2, H=2, P=3, N=4, F=1)
    with pytest.raises(ValueError, match=r"^dtype: ssm_fast computes in float32"):
        ssm_fast.mamba3_scan(**a, dtype=np.float64)


@pytest.mark.parametrize("M", [None, 3], ids=["siso", "mimo"])
def test_inputs_are_never_written(M):
    a, cot = make(np.random.default_rng(6), S=2, T=5, H=2, P=3, N=4, M=M, F=2, ids="permutation")
    a, cot = _f32(a), _f32(cot)                         # float32: the kernels read the caller's buffers
    before = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in {**a, **cot}.items()}
    ssm_fast.mamba3_scan(**a)
    ssm_fast.mamba3_scan_back(**a, **cot)
    for k, v in {**a, **cot}.items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(v, before[k], err_msg=k)
            assert v.flags.writeable, k


def test_supports_answers_for_the_op_and_keeps_the_scans():
    a, _ = make(np.random.default_rng(0), S=1, T=2, H=2, P=2, N=4, F=1)
    for op in ("mamba3_scan", "mamba3_scan_back"):
        s = ssm_fast.supports(op, **a)
        assert s and s.ok and s.reason
    with pytest.raises(ValueError, match="update_cache"):
        ssm_fast.supports("mamba3_scan_back", **a, update_cache=True)
    assert ssm_fast.supports("mamba3_scan", **{**a, **_f32({k: a[k] for k in STATE_NAMES})}, update_cache=True)
    with pytest.raises(ValueError, match=r"^op: "):
        ssm_fast.supports("mamba4_scan", **a)
    assert "mamba3_scan" in ssm_fast.__all__ and "mamba3_scan_back" in ssm_fast.__all__


def test_the_conditioning_floors_still_fail_a_wrong_gradient():
    """The floors of d_dA, d_dt, d_lam (step_magnitudes) and of the angles' running sums leave the
    bound below 1e-4 where nothing cancels: a gradient 1e-3 off fails it."""
    a, cot = make(np.random.default_rng(2), S=2, T=6, H=2, P=4, N=8, F=3, ids="identity")
    g32 = ssm_ref.mamba3_scan_back(**a, **cot)
    g64 = ssm_ref.mamba3_scan_back(**a, **cot, dtype=np.float64)
    mags = step_magnitudes(a, cot, "interleaved")
    for name in ("d_dA", "d_dt", "d_lam", "d_dtheta", "d_s_theta"):
        if name in mags:
            floor = RATIO * EPS32 * float(np.linalg.norm(mags[name]) / np.linalg.norm(g64[name]))
        else:
            floor = running_sum_bound(g64.d_dtheta, g64[name])
        assert floor < 1e-4, name
        wrong = (g64[name] * (1 + 1e-3)).astype(np.float32)
        with pytest.raises(AssertionError, match=name):
            assert_close(name, wrong, g32[name], g64[name], floor)


@pytest.mark.parametrize("T", [0, 4])
def test_update_cache_of_several_tokens_writes_the_final_states(T):
    """update_cache=True with T != 1 (the forward, then a copy into the rows): the rows ids hold
    the states the call without update_cache returns, the other rows are untouched."""
    a, _ = make(np.random.default_rng(13), S=2, T=T, H=2, P=3, N=4, M=2, F=2, R=4, ids="permutation")
    a = _f32(a)
    ret = ssm_fast.mamba3_scan(**a)
    caches = {k: a[k].copy() for k in STATE_NAMES}
    step = ssm_fast.mamba3_scan(**{**a, **caches}, update_cache=True)
    np.testing.assert_array_equal(step.y, ret.y)
    others = np.setdiff1d(np.arange(4), a["ids"])
    for k, want in zip(STATE_NAMES, (ret.theta, ret.h, ret.k, ret.v), strict=True):
        np.testing.assert_array_equal(caches[k][a["ids"]], want, err_msg=k)
        np.testing.assert_array_equal(caches[k][others], a[k][others], err_msg=k)
