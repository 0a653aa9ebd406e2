"""ssm_fast's K state snapshots (``snapshots=K``, ``g_snapshots``; docs/SPEC.md section 3.1 and
section 4) against the reference: the slots, their edges (slot T the start state, slots k > T
NaN, T = 0, T < K, T = K, T > K), update_cache, the backward's g_snapshots term, the packed
gradient with K slots, errors and supports(); and ssm_fast.oracle64's float64 slots.

Expected values come from ssm_ref (float32 and the float64 oracle) or from finite differences of
the float64 path. The one comparison of ssm_fast with itself is the contract's: a K call's y and
states are the default call's bits (docs/SPEC.md 3.1), whose accuracy test_fast checks. The
bounds are test_fast's (``assert_close_to_oracle``: the contract's table, ssm_ref.tolerance, plus
the norm-relative bound against the float32 reference's own error); a slot is a state after fewer
tokens, so the slots are held to the ``states`` row of the table.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_fast import (
    ABS_FLOOR,
    OUTPUTS_BWD,
    OUTPUTS_FWD,
    RATIO,
    assert_close_to_oracle,
    assert_gradients_match_differences,
    make_problem,
    rel_err,
)

import ssm_fast
import ssm_fast.config
import ssm_ref
from ssm_fast.oracle64 import scan64, scan_back64
from ssm_ref.tolerance import F32_TOL, compare, scaled


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    ssm_fast.warmup()


@st.composite
def k_problems(draw):
    """K, then T on every side of it (0, < K, == K, > K), the two variants, permuted and
    duplicate ids; small shapes so the float64 reference stays quick."""
    K = draw(st.integers(1, 6))
    T = draw(st.sampled_from(["zero", "below", "equal", "above", "long"]))
    T = {"zero": 0, "below": draw(st.integers(0, K - 1)), "equal": K,
         "above": K + draw(st.integers(1, 3)), "long": draw(st.integers(K + 4, 20))}[T]
    mamba1 = draw(st.booleans())
    G = draw(st.sampled_from([1, 2]))
    H = G * draw(st.integers(1, 2))
    P = draw(st.sampled_from([1, 2, 3, 5]))
    N = draw(st.sampled_from([1, 5, 16, 33]))
    S = draw(st.integers(1, 3))
    R = S + draw(st.integers(0, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ids = draw(st.sampled_from(["arange", "permuted", "duplicate"]))
    ids = {"arange": np.arange(S), "permuted": rng.permutation(R)[:S],
           "duplicate": rng.integers(0, R, S)}[ids]
    p, g_y, g_states = make_problem(rng, S, T, H, P, N, G, R=R, mamba1=mamba1, ids=ids)
    g_snap = rng.uniform(-1, 1, (K, S, H, P, N))
    return K, p, g_y, g_states, g_snap


def check_slots(fast, p, K):
    """fast.snapshots against ssm_ref's (float32 and float64): slots k < T within the contract's
    table for ``states`` (ssm_ref.tolerance), slot 0 the bits of ``states``, slots 1 .. T-1 also
    within test_fast's norm-relative bound, slot T (T < K) exactly the start state, slots k > T
    exactly NaN."""
    T = p["x"].shape[1]
    ref32 = ssm_ref.ssm_scan(**p, snapshots=K)
    oracle = ssm_ref.ssm_scan(**p, snapshots=K, dtype=np.float64)
    got = fast.snapshots
    S, H, P, N = fast.states.shape
    assert got.shape == (K, S, H, P, N) and got.dtype == np.float32
    np.testing.assert_array_equal(got[0], fast.states)          # slot 0 is the final state
    live = min(K, T)
    if live:
        contract = compare("states", got[:live], oracle.snapshots[:live], scaled(F32_TOL, T)["states"])
        assert contract.ok, f"snapshots: outside the tolerance table: {contract}"
    if live > 1:
        # slot 0 is states, whose norm-relative bound test_fast holds the default call to
        f, r, o = got[1:live], ref32.snapshots[1:live], oracle.snapshots[1:live]
        e_fast, e_ref = rel_err(f, o), rel_err(r, o)
        bound = max(ABS_FLOOR, RATIO * e_ref, F32_TOL["states"].rtol / 2)
        assert e_fast <= bound, f"snapshots: norm-relative error {e_fast:.2e} > {bound:.2e} (ref32 {e_ref:.2e})"
    if T < K:
        start = np.asarray(p["s"], dtype=np.float32)[np.asarray(p["ids"])]
        np.testing.assert_array_equal(got[T], start)             # bit for bit: no arithmetic
        assert np.isnan(got[T + 1:]).all()
        assert np.isnan(oracle.snapshots[T + 1:]).all()
    assert not np.isnan(got[:T + 1]).any()


# ---------------------------------------------------------------------------------------------
# Forward


@given(k_problems())
def test_snapshots_agree_with_the_reference(problem):
    """The slots against the reference; y and states are the default call's bits (docs/SPEC.md
    3.1), which test_fast holds to the reference, and within the contract's table here too."""
    K, p, _g_y, _g_states, _g_snap = problem
    T = p["x"].shape[1]
    fast = ssm_fast.ssm_scan(**p, snapshots=K)
    plain = ssm_fast.ssm_scan(**p)
    oracle = ssm_ref.ssm_scan(**p, dtype=np.float64)
    for name in OUTPUTS_FWD:
        np.testing.assert_array_equal(getattr(fast, name), getattr(plain, name), err_msg=name)
        contract = compare(name, getattr(fast, name), getattr(oracle, name), scaled(F32_TOL, T)[name])
        assert contract.ok, f"{name}: outside the tolerance table: {contract}"
    check_slots(fast, p, K)


def test_one_element_cancelling_state():
    """A drawn case whose one-element final state cancels (terms ~0.2, sum 0.011): within the
    contract's table, and its K slots as the reference's."""
    p = dict(s=np.array([-0.479154756464091, -0.07242290794105932, 0.4158719954092428]).reshape(3, 1, 1, 1),
             x=np.array([0.15382555545779875, -0.7654273882477987]).reshape(1, 2, 1, 1),
             dt=np.array([-0.1131465969319293, 0.3897342060428378]).reshape(1, 2, 1),
             A=np.array([-0.45972792519234784]),
             B=np.array([0.3139519567538087, -0.32604754828701143]).reshape(1, 2, 1, 1),
             C=np.array([0.11347507875214513, 0.112734420863433]).reshape(1, 2, 1, 1), ids=np.array([0]))
    for K in (1, 2, 3, 4):
        check_slots(ssm_fast.ssm_scan(**p, snapshots=K), p, K)


@pytest.mark.parametrize("mamba1", [False, True], ids=["mamba2", "mamba1"])
def test_k1_is_the_default_call_bit_for_bit(mamba1):
    """snapshots=1 is the default path: the same y and states bits, and its one slot is states."""
    p, _, _ = make_problem(np.random.default_rng(31), S=2, T=7, H=4, P=3, N=6, G=2, R=3, ids=[2, 0], mamba1=mamba1)
    a = ssm_fast.ssm_scan(**p)
    b = ssm_fast.ssm_scan(**p, snapshots=1)
    for r in (a, b):
        np.testing.assert_array_equal(r.y, a.y)
        np.testing.assert_array_equal(r.states, a.states)
        assert r.snapshots.shape == (1, *a.states.shape)
        np.testing.assert_array_equal(r.snapshots[0], r.states)
    # the slots of a K > 1 call hold the same bits as the default call's states (slot 0)
    c = ssm_fast.ssm_scan(**p, snapshots=3)
    np.testing.assert_array_equal(c.y, a.y)
    np.testing.assert_array_equal(c.states, a.states)
    np.testing.assert_array_equal(c.snapshots[0], a.states)


@pytest.mark.parametrize("direct_bytes", [0, 1 << 40], ids=["scratch rows", "direct"])
@pytest.mark.parametrize("K", [1, 2, 3])
def test_decode_step_snapshots_both_paths(K, direct_bytes, monkeypatch):
    """T = 1 (Mamba-2) on both decode paths: slot 0 the new state, slot 1 the start state, slot 2 NaN."""
    monkeypatch.setattr(ssm_fast.config, "DECODE_DIRECT_BYTES", direct_bytes)
    p, _, _ = make_problem(np.random.default_rng(7), S=3, T=1, H=4, P=37, N=33, G=2, R=4, ids=[3, 0, 1])
    check_slots(ssm_fast.ssm_scan(**p, snapshots=K), p, K)


@pytest.mark.parametrize("mamba1", [False, True], ids=["mamba2", "mamba1"])
def test_snapshots_across_task_blocks(mamba1):
    """More rows than one task holds (Mamba-2's ROWS_FWD channels, Mamba-1's LANES rows, a
    partial last block): every task writes its own rows of every slot."""
    dims = dict(S=1, T=6, H=70, P=1, N=5, G=1) if mamba1 else dict(S=2, T=6, H=2, P=37, N=9, G=1)
    p, _, _ = make_problem(np.random.default_rng(13), mamba1=mamba1, **dims)
    for K in (4, 6, 7, 9):
        check_slots(ssm_fast.ssm_scan(**p, snapshots=K), p, K)


@pytest.mark.parametrize("mamba1", [False, True], ids=["mamba2", "mamba1"])
@pytest.mark.parametrize("T", [0, 2, 5])
def test_update_cache_with_k(mamba1, T):
    """update_cache=True: the final states go into the cache rows; states None; snapshots None
    for K = 1, all K slots (slot 0 included) for K > 1 -- as ssm_ref."""
    p, _, _ = make_problem(np.random.default_rng(17), S=2, T=T, H=4, P=3, N=5, G=2, R=4, ids=[3, 1], mamba1=mamba1)
    want = ssm_ref.ssm_scan(**p, dtype=np.float64)
    start = np.asarray(p["s"], dtype=np.float32)
    for K in (1, 3):
        cache = np.asarray(p["s"], dtype=np.float32).copy()
        r = ssm_fast.ssm_scan(**{**p, "s": cache}, snapshots=K, update_cache=True)
        assert r.states is None
        if K == 1:
            assert r.snapshots is None
        else:
            check_slots(SimpleNamespace(snapshots=r.snapshots, states=r.snapshots[0]), p, K)
        assert compare("states", cache[[3, 1]], want.states, scaled(F32_TOL, T)["states"]).ok
        np.testing.assert_array_equal(cache[[0, 2]], start[[0, 2]])   # rows nobody reads: untouched
        if K > 1:
            np.testing.assert_array_equal(cache[[3, 1]], r.snapshots[0])


@pytest.mark.parametrize("mamba1", [False, True], ids=["mamba2", "mamba1"])
def test_zero_start_states_and_no_tokens(mamba1):
    """s=None with T = 0: slot 0 is the zero start state, every other slot NaN."""
    p, _, _ = make_problem(np.random.default_rng(47), S=2, T=0, H=2, P=3, N=4, G=1, mamba1=mamba1)
    p = {**p, "s": None, "ids": None}
    r = ssm_fast.ssm_scan(**p, snapshots=3)
    assert r.snapshots.shape == (3, 2, 2, 3, 4)
    assert not r.snapshots[0].any() and not np.isnan(r.snapshots[0]).any()
    assert np.isnan(r.snapshots[1:]).all()
    o = ssm_ref.ssm_scan(**p, snapshots=3, dtype=np.float64)
    np.testing.assert_array_equal(r.snapshots, o.snapshots)     # zeros and NaN: exact


def test_packed_forward_holds_the_k_slots():
    p, _, _ = make_problem(np.random.default_rng(19), S=2, T=3, H=2, P=3, N=4, G=1)
    r = ssm_fast.ssm_scan(**p, snapshots=5)
    d = ssm_ref.Dims(S=2, T=3, H=2, P=3, N=4, G=1, R=2, mamba1=False, a_shape=(2,), K=5)
    packed = r.packed()
    assert packed.shape == (d.forward_size,)
    np.testing.assert_array_equal(ssm_ref.unpack_snapshots(packed, d), r.snapshots)


# ---------------------------------------------------------------------------------------------
# Backward


@given(k_problems())
def test_backward_with_g_snapshots_agrees_with_the_reference(problem):
    K, p, g_y, g_states, g_snap = problem
    T = p["x"].shape[1]
    gf = ssm_fast.ssm_scan_back(**p, g_y=g_y, g_states=g_states, g_snapshots=g_snap)
    g32 = ssm_ref.ssm_scan_back(**p, g_y=g_y, g_states=g_states, g_snapshots=g_snap)
    g64 = ssm_ref.ssm_scan_back(**p, g_y=g_y, g_states=g_states, g_snapshots=g_snap, dtype=np.float64)
    assert_close_to_oracle(gf, g32, g64, OUTPUTS_BWD, T)
    # slots k > T are ignored: NaN there changes no bit
    if K > T + 1:
        poisoned = g_snap.copy()
        poisoned[T + 1:] = np.nan
        gp = ssm_fast.ssm_scan_back(**p, g_y=g_y, g_states=g_states, g_snapshots=poisoned)
        for k in OUTPUTS_BWD:
            np.testing.assert_array_equal(getattr(gp, k), getattr(gf, k), err_msg=k)


@pytest.mark.parametrize("mamba1", [False, True], ids=["mamba2", "mamba1"])
def test_backward_g_snapshots_across_recompute_segments(mamba1, monkeypatch):
    """8-token recompute segments (T = 45): the snapshots' gradients join the carry in segments
    other than the last, and at their boundaries."""
    monkeypatch.setattr(ssm_fast.config, "SEGMENT_BYTES", 64)
    rng = np.random.default_rng(23)
    p, g_y, g_states = make_problem(rng, S=2, T=45, H=4, P=3, N=6, G=2, mamba1=mamba1)
    for K in (9, 17, 45, 46, 50):
        g_snap = rng.uniform(-1, 1, (K, 2, 4, 3, 6))
        gf = ssm_fast.ssm_scan_back(**p, g_y=g_y, g_states=g_states, g_snapshots=g_snap)
        g32 = ssm_ref.ssm_scan_back(**p, g_y=g_y, g_states=g_states, g_snapshots=g_snap)
        g64 = ssm_ref.ssm_scan_back(**p, g_y=g_y, g_states=g_states, g_snapshots=g_snap, dtype=np.float64)
        assert_close_to_oracle(gf, g32, g64, OUTPUTS_BWD, 45)


def test_backward_g_snapshots_with_chunks_and_partial_lane_blocks():
    rng = np.random.default_rng(29)
    for dims in (dict(S=1, T=5, H=70, P=1, N=5, G=1, mamba1=True), dict(S=1, T=5, H=7, P=9, N=40, G=1)):
        p, g_y, g_states = make_problem(rng, **dims)
        mamba1 = dims.get("mamba1", False)
        d = ssm_ref.Dims(S=1, T=5, H=dims["H"], P=dims["P"], N=dims["N"], G=1, R=1, mamba1=mamba1,
                         a_shape=(dims["H"], dims["N"]) if mamba1 else (dims["H"],))
        assert ssm_fast._chunks(d) > 1
        g_snap = rng.uniform(-1, 1, (4, 1, dims["H"], dims["P"], dims["N"]))
        gf = ssm_fast.ssm_scan_back(**p, g_y=g_y, g_states=g_states, g_snapshots=g_snap)
        g32 = ssm_ref.ssm_scan_back(**p, g_y=g_y, g_states=g_states, g_snapshots=g_snap)
        g64 = ssm_ref.ssm_scan_back(**p, g_y=g_y, g_states=g_states, g_snapshots=g_snap, dtype=np.float64)
        assert_close_to_oracle(gf, g32, g64, OUTPUTS_BWD, 5)


@pytest.mark.parametrize("mamba1", [False, True], ids=["mamba2", "mamba1"])
@pytest.mark.parametrize("T", [0, 2, 4, 7])
def test_packed_gradient_with_k_slots(mamba1, T):
    """A packed g_y of length S*T*H*P + K*S*H*P*N is g_y and the K slots' g_snapshots (g_states
    zeros): the same bits as the structured call; and against the reference."""
    rng = np.random.default_rng(37 + T)
    p, g_y, _ = make_problem(rng, S=2, T=T, H=4, P=3, N=5, G=2, mamba1=mamba1)
    K = 4
    g_snap = rng.uniform(-1, 1, (K, 2, 4, 3, 5))
    packed = ssm_ref.pack_forward(g_y, g_snap)
    a = ssm_fast.ssm_scan_back(**p, g_y=packed, g_states=None)
    b = ssm_fast.ssm_scan_back(**p, g_y=g_y, g_states=None, g_snapshots=g_snap.astype(np.float32))
    for k in OUTPUTS_BWD:
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=k)
    g32 = ssm_ref.ssm_scan_back(**p, g_y=packed, g_states=None)
    g64 = ssm_ref.ssm_scan_back(**p, g_y=packed, g_states=None, dtype=np.float64)
    assert_close_to_oracle(a, g32, g64, OUTPUTS_BWD, T)


# ---------------------------------------------------------------------------------------------
# Errors and supports


BAD_SNAPSHOTS = [0, -2, 1.5, True, "2", None, np.float32(2.0)]


@pytest.mark.parametrize("bad", BAD_SNAPSHOTS, ids=repr)
def test_bad_snapshots_raise_like_the_reference(bad):
    p, _, _ = make_problem(np.random.default_rng(0), S=2, T=3, H=4, P=2, N=5, G=2)
    for call in (lambda m: m.ssm_scan(**p, snapshots=bad), lambda m: m.supports("ssm_scan", **p, snapshots=bad),
                 lambda m: m.supports("ssm_scan_back", **p, snapshots=bad)):
        with pytest.raises((TypeError, ValueError)) as want:
            call(ssm_ref)
        with pytest.raises(want.type) as got:
            call(ssm_fast)
        assert str(got.value) == str(want.value)
        assert str(got.value).startswith("snapshots:")


def test_bad_g_snapshots_raise_like_the_reference():
    p, g_y, g_states = make_problem(np.random.default_rng(0), S=2, T=3, H=4, P=2, N=5, G=2)
    bad = [np.zeros((2, 4, 2, 5)), np.zeros((0, 2, 4, 2, 5)), np.zeros((3, 1, 4, 2, 5)), np.zeros((3, 2, 4, 2, 4)),
           np.zeros((3, 2, 4, 2, 5), dtype=np.int32)]
    for gsn in bad:
        with pytest.raises((TypeError, ValueError)) as want:
            ssm_ref.ssm_scan_back(**p, g_y=g_y, g_states=g_states, g_snapshots=gsn)
        with pytest.raises(want.type) as got:
            ssm_fast.ssm_scan_back(**p, g_y=g_y, g_states=g_states, g_snapshots=gsn)
        assert str(got.value) == str(want.value)
        assert str(got.value).startswith("g_snapshots:")
    # a packed g_y whose tail is not a whole number of slots names g_y
    packed = ssm_ref.pack_forward(g_y, np.zeros((3, 2, 4, 2, 5)))[:-1]
    with pytest.raises(ValueError) as want:
        ssm_ref.ssm_scan_back(**p, g_y=packed, g_states=None)
    with pytest.raises(ValueError) as got:
        ssm_fast.ssm_scan_back(**p, g_y=packed, g_states=None)
    assert str(got.value) == str(want.value) and str(got.value).startswith("g_y:")


def test_supports_every_k():
    for mamba1 in (False, True):
        p, _, _ = make_problem(np.random.default_rng(0), S=1, T=2, H=2, P=2, N=3, G=1, mamba1=mamba1)
        for op in ("ssm_scan", "ssm_scan_back"):
            for K in (1, 2, 3, 8, np.int64(4)):
                s = ssm_fast.supports(op, **p, snapshots=K)
                assert s and s.ok and s.reason


# ---------------------------------------------------------------------------------------------
# ssm_fast.oracle64: the float64 path with K slots


@pytest.mark.parametrize("mamba1", [False, True], ids=["mamba2", "mamba1"])
@pytest.mark.parametrize("T", [0, 1, 3, 4, 7])
def test_oracle64_slots_match_the_reference(mamba1, T):
    rng = np.random.default_rng(41 + T)
    K = 4
    p, g_y, g_states = make_problem(rng, S=3, T=T, H=4, P=3, N=5, G=2, R=4, ids=[3, 0, 3], mamba1=mamba1)
    g_snap = rng.uniform(-1, 1, (K, 3, 4, 3, 5))
    r = scan64(**p, snapshots=K)
    o = ssm_ref.ssm_scan(**p, snapshots=K, dtype=np.float64)
    assert r.snapshots.shape == o.snapshots.shape
    np.testing.assert_array_equal(np.isnan(r.snapshots), np.isnan(o.snapshots))
    np.testing.assert_allclose(r.snapshots, o.snapshots, rtol=1e-12, atol=1e-13)   # NaN == NaN here
    g = scan_back64(**p, g_y=g_y, g_states=g_states, g_snapshots=g_snap)
    og = ssm_ref.ssm_scan_back(**p, g_y=g_y, g_states=g_states, g_snapshots=g_snap, dtype=np.float64)
    for k in ssm_ref.GRAD_NAMES:
        np.testing.assert_allclose(getattr(g, k), getattr(og, k), rtol=1e-11, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("mamba1", [False, True], ids=["mamba2", "mamba1"])
@pytest.mark.parametrize("T", [2, 4])
def test_oracle64_g_snapshots_match_finite_differences(mamba1, T):
    """Central differences of the float64 loss sum(y g_y) + sum(states g_states) + sum over the
    slots k <= T of snapshots * g_snapshots (scan64) against scan_back64's gradients: T = 2 has
    slots past the start (ignored), T = 4 has none. h = 1e-6: the differences are accurate to
    ~1e-9, the bound 1e-6 of the largest entry is far below the effect of a missed slot."""
    rng = np.random.default_rng(43)
    S, H, P, N, G, R, K = 2, 4, 2, 3, 2, 3, 4
    p, g_y, g_states = make_problem(rng, S, T, H, P, N, G, R=R, mamba1=mamba1, ids=[2, 0])
    g_snap = rng.uniform(-1, 1, (K, S, H, P, N))
    live = min(K, T + 1)
    grads = scan_back64(**p, g_y=g_y, g_states=g_states, g_snapshots=g_snap)

    def loss(**kw):
        r = scan64(**{**p, **kw}, snapshots=K)
        return float(np.sum(r.y * g_y) + np.sum(r.states * g_states) + np.sum(r.snapshots[:live] * g_snap[:live]))

    assert_gradients_match_differences(grads, p, loss, 1e-6)
