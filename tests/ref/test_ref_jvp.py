"""ssm_ref.jvp (forward mode) against finite differences of the float64 forward, one input at a
time and all at once; its primal outputs against ssm_scan; its dot product with the reference
backward (the adjoint identity, float64)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ssm_ref
from ssm_ref.jvp import ssm_scan_jvp
from ssm_ref.testing.cases import INPUT_NAMES, make_problem
from ssm_ref.testing.strategies import problems
from ssm_ref.tolerance import rel_err


def direction(case, rng, names=INPUT_NAMES) -> dict:
    """A random tangent (float64) for each input in ``names``, zero for the others."""
    a = case.args(np.float64)
    return {f"{k}_dot": (rng.uniform(-1, 1, a[k].shape) if k in names else np.zeros(a[k].shape))
            for k in INPUT_NAMES}


def fd_jvp(args: dict, tangents: dict, h: float = 1e-3):
    """(y_dot, states_dot) by the fourth-order central stencil along the tangent (float64)."""
    outs = []
    for step in (-2, -1, 1, 2):
        moved = {**args, **{k: args[k] + step * h * tangents[f"{k}_dot"] for k in INPUT_NAMES}}
        r = ssm_ref.ssm_scan(**moved, dtype=np.float64)
        outs.append((r.y, r.states))
    return tuple((o[0] - 8 * o[1] + 8 * o[2] - o[3]) / (12 * h)
                 for o in zip(*outs, strict=True))


def assert_fd_close(got, want, what):
    # SPEC.md: the stencil's own error is near 1e-12 relative here; 1e-7 leaves five orders.
    err = float(np.linalg.norm(got - want))
    bound = 1e-7 * float(np.linalg.norm(want)) + 1e-11 * np.sqrt(want.size)
    assert err <= bound, f"{what}: ||jvp - fd|| = {err:.3e} > {bound:.3e}"


CASES = {
    "mamba2-permutation": dict(S=2, T=4, H=4, P=2, N=3, G=2, ids="permutation"),
    "mamba1-duplicates": dict(S=3, T=3, H=2, P=2, N=4, G=1, R=2, ids="duplicates", variant="mamba1"),
    "mamba2-h1-unused": dict(S=2, T=5, H=3, P=1, N=2, G=3, R=4, ids="unused", a_form="h1"),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("wrt", [*INPUT_NAMES, "all"])
def test_jvp_matches_finite_differences(name, wrt):
    case = make_problem(np.random.default_rng(71), **CASES[name])
    a = case.args(np.float64)
    v = direction(case, np.random.default_rng(72), INPUT_NAMES if wrt == "all" else (wrt,))
    j = ssm_scan_jvp(**a, **v)
    fy, fs = fd_jvp(a, v)
    assert_fd_close(j.y_dot, fy, f"y_dot wrt {wrt}")
    assert_fd_close(j.states_dot, fs, f"states_dot wrt {wrt}")
    assert np.any(j.y_dot != 0) or case.dims["T"] == 0


def test_jvp_on_the_identity_branch_of_softplus():
    # dt > 20: d = dt, d' = 1 (finite differences stay on the branch: dt in [22, 24]).
    case = make_problem(np.random.default_rng(73), S=1, T=3, H=2, P=2, N=2, G=1, ids="identity",
                        dt_range=(22.0, 24.0))
    a = case.args(np.float64)
    a["A"] = a["A"] * 0.05                                   # keeps exp(d * A) away from 0
    v = direction(case, np.random.default_rng(74))
    j = ssm_scan_jvp(**a, **v)
    fy, fs = fd_jvp(a, v)
    assert_fd_close(j.y_dot, fy, "y_dot")
    assert_fd_close(j.states_dot, fs, "states_dot")


@given(problems(max_T=5), st.integers(0, 2**32 - 1))
def test_drawn_problems_jvp_matches_finite_differences(case, seed):
    a = case.args(np.float64)
    v = direction(case, np.random.default_rng(seed))
    j = ssm_scan_jvp(**a, **v)
    fy, fs = fd_jvp(a, v)
    assert_fd_close(j.y_dot, fy, "y_dot")
    assert_fd_close(j.states_dot, fs, "states_dot")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_primal_outputs_are_the_forward_bit_for_bit(dtype):
    case = make_problem(np.random.default_rng(75), S=2, T=4, H=4, P=2, N=3, G=2, variant="mamba1")
    a = case.args()
    j = ssm_scan_jvp(**a, **direction(case, np.random.default_rng(76)), dtype=dtype)
    r = ssm_ref.ssm_scan(**a, dtype=dtype)
    assert j.y.dtype == dtype and j.y_dot.dtype == dtype
    assert np.array_equal(j.y, r.y) and np.array_equal(j.states, r.states)


def test_no_tangent_gives_zero_tangents():
    case = make_problem(np.random.default_rng(77), S=2, T=3)
    j = ssm_scan_jvp(**case.args())
    assert j.y_dot.shape == j.y.shape and j.states_dot.shape == j.states.shape
    assert not np.any(j.y_dot) and not np.any(j.states_dot)


@given(problems(max_T=6), st.integers(0, 2**32 - 1))
def test_reference_backward_is_the_adjoint_of_the_jvp_in_float64(case, seed):
    # <J v, w> == <v, J^T w> with w = (g_y, g_states): the float64 backward against forward mode.
    a = case.args(np.float64)
    v = direction(case, np.random.default_rng(seed))
    j = ssm_scan_jvp(**a, **v)
    g = ssm_ref.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states, dtype=np.float64)
    lhs_terms = np.concatenate([(j.y_dot * case.g_y).ravel(), (j.states_dot * case.g_states).ravel()])
    grads = {"s": g.d_s, "x": g.d_x, "dt": g.d_dt, "A": g.d_A, "B": g.d_B, "C": g.d_C}
    rhs_terms = np.concatenate([(v[f"{k}_dot"] * grads[k]).ravel() for k in INPUT_NAMES])
    lhs, rhs = lhs_terms.sum(), rhs_terms.sum()
    scale = np.abs(lhs_terms).sum() + np.abs(rhs_terms).sum()
    assert abs(lhs - rhs) <= 1e-12 * scale + 1e-300, (lhs, rhs, scale)


def test_bad_tangents_raise_naming_the_argument():
    case = make_problem(np.random.default_rng(78), S=2, T=3, H=4, P=2, N=3, G=2)
    a = case.args()
    with pytest.raises(ValueError, match=r"x_dot: expected shape \(S, T, H, P\) = \(2, 3, 4, 2\)"):
        ssm_scan_jvp(**a, x_dot=np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="A_dot"):
        ssm_scan_jvp(**a, A_dot=np.zeros((4, 3)))
    with pytest.raises(TypeError, match="dt_dot: expected a float array"):
        ssm_scan_jvp(**a, dt_dot=np.zeros((2, 3, 4), dtype=np.int32))
    with pytest.raises(ValueError, match="B:"):
        ssm_scan_jvp(**{**a, "B": a["B"][:, :, :, :2]})


def test_rel_err_of_a_wrong_tangent_is_seen():
    # The finite-difference comparison is sharp enough to see a tangent off by 1e-4.
    case = make_problem(np.random.default_rng(79), S=1, T=3, H=2, P=2, N=2, G=1)
    a = case.args(np.float64)
    v = direction(case, np.random.default_rng(80))
    j = ssm_scan_jvp(**a, **v)
    fy, _ = fd_jvp(a, v)
    assert rel_err(j.y_dot * (1 + 1e-4), fy) > 1e-5
    with pytest.raises(AssertionError):
        assert_fd_close(j.y_dot * (1 + 1e-4), fy, "y_dot")
