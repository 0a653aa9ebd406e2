"""Mamba-3's chunked form on emulated matrix units (ssm_ref.mamba3_chunked and mamba3_chunked_back,
``precision=``: every product of a chunk through ssm_ref.precision.matmul) against the
token-by-token scan in float64 (ssm_ref.mamba3), held to ssm_ref.tolerance.MAMBA3_MATRIX_TOL; a
split that loses its lo part must fail "high", and "high" must keep float32's accuracy where
"highest" has it (docs/SPEC.md section 15)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matrix_outputs import mamba3_chunked_and_float64

from ssm_ref import mamba3_chunked, mamba3_chunked_back, precision
from ssm_ref.mamba3_checks import check_mamba3_backward
from ssm_ref.ops import MAMBA3
from ssm_ref.testing import mamba3_cases
from ssm_ref.tolerance import MAMBA3_MATRIX_TOL, compare, rel_err, scaled

_REAL_SPLIT = precision.split


def _vs_float64(case, L, prec):
    """Comparisons of the float32 chunked form at ``prec`` with the float64 scan, under
    MAMBA3_MATRIX_TOL[prec] ("highest" under the "high" table) scaled to the case's tokens."""
    got, want = mamba3_chunked_and_float64(case, L, prec)
    table = scaled(MAMBA3_MATRIX_TOL["high" if prec == "highest" else prec], case.dims["T"])
    return [compare(k, got[k], want[k], table[k]) for k in want]


def _problem(case, dtype):
    a, cot = case.args(), case.cotangents
    return check_mamba3_backward(*(a[n] for n in MAMBA3.float_inputs), a["ids"],
                                 *(cot[n] for n in MAMBA3.cotangent_names), rotation=case.keywords["rotation"],
                                 dtype=dtype)


def test_an_unknown_precision_and_matrix_units_in_float64_are_refused():
    case = mamba3_cases.make_case(1, S=1, T=4, H=2, P=2, N=4, G=1, F=1)
    p32, p64 = _problem(case, np.float32), _problem(case, np.float64)
    for call in (mamba3_chunked.forward, mamba3_chunked_back.backward):
        with pytest.raises(ValueError, match="precision"):
            call(p32, 2, precision="tf32")
        with pytest.raises(ValueError, match="precision: 'medium' emulates float32"):
            call(p64, 2, precision="medium")


@st.composite
def drawn(draw):
    """(case, L): SISO and MIMO problems in Mamba-3's finite regimes, T up to three chunks."""
    L = draw(st.sampled_from((4, 8, 16, 64)))
    S = draw(st.integers(2, 3))
    case = mamba3_cases.make_case(draw(st.integers(0, 2**32 - 1)), S=S, T=draw(st.integers(1, 3 * L if L < 64 else 80)),
                                  H=2, P=draw(st.integers(1, 8)), N=draw(st.sampled_from((4, 8, 16))), G=1,
                                  M=draw(st.sampled_from((None, 1, 2, 4))), R=S + 1,
                                  ids=draw(st.sampled_from(("permutation", "duplicates"))), psi=draw(st.booleans()),
                                  regime=draw(st.sampled_from(("typical", "long_decay", "small_dA", "large_dt"))))
    return case, L


@pytest.mark.parametrize("prec", ["high", "medium"])
@settings(max_examples=10, deadline=None)
@given(d=drawn())
def test_on_matrix_units_within_the_bounds(prec, d):
    """Every output and gradient within MAMBA3_MATRIX_TOL[prec] (measured worst:
    tests/measure_matrix_precision.py --op mamba3; the table's comments)."""
    case, L = d
    for c in _vs_float64(case, L, prec):
        assert c.ok, c.message(case.label)


def test_high_keeps_float32s_accuracy_at_the_side_by_side_shape_scaled_down():
    """(1, 256, 2, 64, 128), F = 32, chunks of 64: the side-by-side's SISO shape with fewer tokens
    and heads. "high" is "highest"'s error within a factor of 2 (plus 1e-7) on every output and
    gradient, and "medium" within the table; measured: both 1e-7 to 1e-6, "medium" 2e-4 to 2e-3
    (mamba_ssm's bfloat16 kernels: 5.2e-3 forward, 2.2e-2 gradients at the full shape,
    docs/BENCHMARKS.md)."""
    case = mamba3_cases.make_case(3, S=1, T=256, H=2, P=64, N=128, G=1, F=32, R=1, ids="identity")
    got = {prec: mamba3_chunked_and_float64(case, 64, prec) for prec in ("highest", "high", "medium")}
    for k, want in got["highest"][1].items():
        base = rel_err(got["highest"][0][k], want)
        assert rel_err(got["high"][0][k], want) <= 2 * base + 1e-7, k
        c = compare(k, got["medium"][0][k], want, scaled(MAMBA3_MATRIX_TOL["medium"], 256)[k])
        assert c.ok, c


def _split_without_lo(a, prec="high"):
    """A broken split for the test that must fail: hi alone, as if lo were lost."""
    hi, lo, e = _REAL_SPLIT(a, prec)
    return hi, np.zeros_like(lo), e


def test_high_fails_its_bounds_without_lo(monkeypatch):
    case = mamba3_cases.make_case(4, S=2, T=16, H=2, P=16, N=32, G=1, F=4, R=2, ids="permutation")
    assert all(c.ok for c in _vs_float64(case, 16, "high"))
    monkeypatch.setattr(precision, "split", _split_without_lo)
    broken = {c.output: c.used for c in _vs_float64(case, 16, "high")}
    # every output a product reaches fails (v = psi x, k the last rotated key and theta: none does)
    assert all(used > 1 for out, used in broken.items() if out not in ("v", "k", "theta")), broken


def test_on_matrix_units_reruns_are_bit_identical():
    case = mamba3_cases.make_case(6, S=2, T=21, H=2, P=3, N=6, G=1, M=2, F=1, R=2, ids="permutation")
    p = _problem(case, np.float32)
    one, two = (mamba3_chunked_back.backward(p, 8, precision="high") for _ in range(2))
    assert all(np.array_equal(one[k], two[k]) for k in one)
