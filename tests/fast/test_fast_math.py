"""ssm_fast.mathf: the vectorisable float32 exp / softplus / sigmoid against numpy's float32."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from ssm_fast.mathf import exp_f32, sigmoid_f32, softplus_f32


@njit(cache=True)
def _apply(kind, x, out):
    for i in range(x.size):
        if kind == 0:
            out[i] = exp_f32(x[i])
        elif kind == 1:
            out[i] = softplus_f32(x[i])
        else:
            out[i] = sigmoid_f32(x[i])


def _run(kind, x):
    x = np.asarray(x, dtype=np.float32)
    out = np.empty_like(x)
    _apply(kind, x, out)
    return out


def _ulps(a, b):
    """Distance in units in the last place between float32 arrays (monotone integer mapping)."""
    ia = a.view(np.int32).astype(np.int64)
    ib = b.view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return np.abs(ia - ib)


def _softplus_ref(z):
    z = z.astype(np.float32)
    with np.errstate(over="ignore"):
        return np.where(z > 20, z, np.log(np.float32(1) + np.exp(np.minimum(z, np.float32(20)))))


def test_exp_within_3_ulp_of_numpy_over_the_whole_range():
    x = np.linspace(-110, 92, 2_000_001, dtype=np.float32)
    got = _run(0, x)
    with np.errstate(over="ignore"):
        want = np.exp(x)
    normal = want >= np.finfo(np.float32).tiny
    assert _ulps(got[normal], want[normal]).max() <= 3
    # subnormal results: absolute error below the smallest normal
    assert np.max(np.abs(got[~normal] - want[~normal])) < np.finfo(np.float32).tiny
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_array_equal(got == 0, want == 0)


def test_exp_special_values():
    got = _run(0, [np.nan, np.inf, -np.inf, 0.0, -0.0, 88.7, 88.8, -103.0, -104.5])
    assert np.isnan(got[0])
    assert got[1] == np.inf and got[2] == 0.0
    assert got[3] == 1.0 and got[4] == 1.0
    assert np.isfinite(got[5]) and got[6] == np.inf
    assert got[7] > 0 and got[8] == 0.0


def test_softplus_matches_the_reference_formula():
    """Absolute error within 1.5e-7 of the exact log(1 + e^z) (numpy's float32 evaluation of the
    same formula is within 2.1e-7: both round 1 + e^z to float32 first, as docs/SPEC.md says)."""
    z = np.linspace(-30, 30, 1_000_001, dtype=np.float32)
    got = _run(1, z)
    exact = np.log1p(np.exp(z.astype(np.float64)))
    err = np.abs(got - exact) / np.maximum(1.0, exact)
    assert err.max() < 1.5e-7
    ref = _softplus_ref(z)
    np.testing.assert_array_equal(got == 0, ref == 0)  # the same z where float32 gives exactly 0


@pytest.mark.parametrize("z, want", [(20.0, np.log1p(np.exp(20.0))), (20.5, 20.5), (25.0, 25.0),
                                     (np.inf, np.inf), (-np.inf, 0.0), (-40.0, 0.0)])
def test_softplus_branches(z, want):
    got = float(_run(1, [z])[0])
    assert got == pytest.approx(want, rel=1e-6, abs=0)


def test_softplus_and_sigmoid_propagate_nan():
    assert np.isnan(_run(1, [np.nan])[0])
    assert np.isnan(_run(2, [np.nan])[0])


def test_sigmoid_is_the_softplus_derivative():
    z = np.linspace(-30, 30, 200_001, dtype=np.float32)
    got = _run(2, z)
    want = np.where(z > 20, 1.0, 1.0 / (1.0 + np.exp(-z.astype(np.float64))))
    assert np.max(np.abs(got - want) / want) < 5e-7
    assert _run(2, [20.5])[0] == 1.0 and _run(2, [-np.inf])[0] == 0.0
