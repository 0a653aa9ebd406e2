"""The softplus inside the scan: its two branches and its float32 behaviour (docs/SPEC.md, 3 and 8).

A probe problem makes softplus visible: S = T = P = N = G = 1, one head per dt value, s = 0,
x = B = C = 1. Then u = d, st = d and y = d = softplus(dt) exactly (every product is by 1, every
sum adds 0), and with g_y = 1, g_states = 0 the backward gives d_dt = softplus'(dt) exactly
(dd = gamma * x = 1 because q = lam * st_prev * a = 0).
"""

import math

import numpy as np
import pytest
from registry import BACKENDS

import ssm_ref


def probe(dts, dtype=np.float32):
    """Inputs whose y is softplus(dts) and whose d_dt is its derivative."""
    H = len(dts)
    dts = np.asarray(dts, dtype=dtype)
    return dict(s=np.zeros((1, H, 1, 1), dtype), x=np.ones((1, 1, H, 1), dtype), dt=dts.reshape(1, 1, H),
                A=np.full(H, -0.01, dtype), B=np.ones((1, 1, 1, 1), dtype), C=np.ones((1, 1, 1, 1), dtype))


def softplus_via_scan(dts, dtype=np.float64, module=ssm_ref):
    kw = {"dtype": dtype} if module is ssm_ref else {}
    inp = probe(dts, dtype)
    H = len(dts)
    y = module.ssm_scan(**inp, **kw).y.reshape(H)
    g = module.ssm_scan_back(**inp, ids=None, g_y=np.ones((1, 1, H, 1)), g_states=np.zeros((1, H, 1, 1)), **kw)
    return y, g.d_dt.reshape(H)


def test_above_20_softplus_is_the_identity_with_derivative_1_in_float64():
    dts = [20.5, 21.0, 30.0, 100.0, 1e4]
    y, ddt = softplus_via_scan(dts)
    assert np.array_equal(y, np.array(dts))             # log(1+exp(20.5)) would be 20.5 + 1.3e-9
    assert np.array_equal(ddt, np.ones(len(dts)))        # sigmoid(20.5) would be 1 - 1.3e-9


def test_at_20_softplus_takes_the_log_branch_in_float64():
    y, ddt = softplus_via_scan([20.0, np.nextafter(20.0, 21.0)])
    # log(1 + exp(20)) = 20 + 2.1e-9; 1e-15 allows for numpy's and libm's exp/log differing by an ulp.
    assert y[0] == pytest.approx(math.log(1.0 + math.exp(20.0)), rel=1e-15) and y[0] - 20.0 > 1e-9
    assert ddt[0] == pytest.approx(1.0 / (1.0 + math.exp(-20.0)), rel=1e-15) and ddt[0] != 1.0
    # One ulp above 20 is the identity branch.
    assert y[1] == np.nextafter(20.0, 21.0) and ddt[1] == 1.0


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_above_20_is_exact_in_float32_too(backend):
    dts = [20.5, 24.0, 1e4]
    y, ddt = softplus_via_scan(dts, np.float32, backend.module)
    assert np.array_equal(y, np.array(dts, dtype=np.float32))
    assert np.array_equal(ddt, np.ones(3, dtype=np.float32))


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_float32_softplus_is_exactly_zero_below_about_minus_16_6(backend):
    # 1 + exp(z) rounds to 1 in float32 once exp(z) <= 2**-24, i.e. z <= -24 ln 2 = -16.6355.
    below = [-16.65, -16.7, -17.0, -20.0, -50.0, -88.0, -104.0, -1e4]
    above = [-16.62, -16.5, -16.0]
    y, _ = softplus_via_scan(below + above, np.float32, backend.module)
    assert np.all(y[: len(below)] == 0.0)
    assert np.all(y[len(below):] > 0.0)
    # The float64 oracle is not zero there: the difference is the float32 contract, not a bug.
    y64, _ = softplus_via_scan([-16.7, -20.0])
    assert y64 == pytest.approx([math.exp(-16.7), math.exp(-20.0)], rel=1e-6)


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_float32_softplus_is_log_of_1_plus_exp_not_log1p(backend):
    # Build log(1 + exp(z)) rounded as float32 arithmetic rounds it, step by step, from float64
    # math: each intermediate is rounded once to float32. Where that rounding of 1 + exp(z) is
    # coarse, the result is far from log1p(exp(z)) (17% at z = -15), so this tells them apart.
    zs = [-12.0, -15.0, -16.0, -16.5]
    want = []
    for z in zs:
        e = float(np.float32(math.exp(float(np.float32(z)))))
        one_plus = float(np.float32(1.0 + e))
        want.append(float(np.float32(math.log(one_plus))))
    y, _ = softplus_via_scan(zs, np.float32, backend.module)
    assert y == pytest.approx(want, rel=3e-7)             # within about 2 ulp (log's own rounding)
    log1p = [math.log1p(math.exp(z)) for z in zs]
    assert np.all(np.abs(np.array(y, dtype=np.float64) / log1p - 1.0) > 5e-3)


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_float32_state_passes_unchanged_where_softplus_is_zero(backend):
    # d = 0 gives a = exp(0) = 1 and u = 0: the state is carried through bit for bit, and d_x
    # (= gamma * d) is exactly 0.
    rng = np.random.default_rng(4)
    S, T, H, P, N, G = 2, 3, 2, 2, 5, 1
    s = rng.uniform(-0.5, 0.5, (S, H, P, N)).astype(np.float32)
    inp = dict(s=s, x=rng.uniform(-1, 1, (S, T, H, P)).astype(np.float32),
               dt=np.full((S, T, H), -18.0, np.float32), A=np.full((H, N), -0.5, np.float32),
               B=rng.uniform(-0.5, 0.5, (S, T, G, N)).astype(np.float32),
               C=rng.uniform(-0.5, 0.5, (S, T, G, N)).astype(np.float32))
    r = backend.module.ssm_scan(**inp)
    assert np.array_equal(r.states, s)
    g = backend.module.ssm_scan_back(**inp, ids=None, g_y=np.ones((S, T, H, P), np.float32),
                                     g_states=np.ones((S, H, P, N), np.float32))
    assert np.all(g.d_x == 0.0)
