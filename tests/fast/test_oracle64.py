"""ssm_fast.oracle64 (the parallel float64 reference used to check the GPU at large shapes)
agrees with ssm_ref's float64 oracle to rounding."""

import numpy as np
import pytest
from problems import make_problem

import ssm_ref
from ssm_fast.oracle64 import scan64, scan_back64


@pytest.mark.parametrize("variant,ids", [("mamba2", "duplicates"), ("mamba1", "unused"), ("mamba2", "permutation")])
@pytest.mark.parametrize("T", [0, 1, 7])
def test_oracle64_matches_the_reference(variant, ids, T):
    case = make_problem(np.random.default_rng(T), S=3, T=T, H=4, P=3, N=5, G=2, variant=variant, ids=ids)
    r = scan64(**case.args())
    o = ssm_ref.ssm_scan(**case.args(), dtype=np.float64)
    np.testing.assert_allclose(r.y, o.y, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(r.states, o.states, rtol=1e-12, atol=1e-13)
    g = scan_back64(**case.args(), g_y=case.g_y, g_states=case.g_states)
    og = ssm_ref.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states, dtype=np.float64)
    for k in ssm_ref.GRAD_NAMES:
        np.testing.assert_allclose(getattr(g, k), getattr(og, k), rtol=1e-11, atol=1e-12, err_msg=k)
        assert getattr(g, k).shape == getattr(og, k).shape
