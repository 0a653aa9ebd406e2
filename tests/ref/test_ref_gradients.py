"""The reference backward against finite differences of the float64 forward.

Loss L = sum(y * g_y) + sum(states * g_states). Every entry of every float input (s included,
through the ids) is checked on a table of small cases that covers Mamba-1 and Mamba-2, one and
several groups, identity / permuted / duplicate / unused ids with R > S, T = 1, P = 1 and N not
a power of two; a hypothesis property then samples entries over drawn shapes.
"""

import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from oracles import fd_grad
from problems import INPUT_NAMES, make_problem, problems
from registry import rel_err

import ssm_ref

# The fourth-order stencil of oracles.fd_grad is good to ~1e-12 here (measured 2e-12 relative at
# worst on these cases), so 1e-7 catches any real error with five orders of margin. FD_ATOL
# absorbs the stencil's rounding noise (~1e-16 * |loss| / h, measured 4e-14) where the true
# gradient is exactly 0 (d_A with T = 0, unread rows of d_s).
FD_RTOL = 1e-7
FD_ATOL = 1e-11

FD_CASES = {
    "mamba2-G1-identity": dict(S=1, T=3, H=2, P=3, N=4, G=1, ids="identity", variant="mamba2"),
    "mamba2-G2-permuted-R>S": dict(S=2, T=3, H=4, P=2, N=5, G=2, R=4, ids="permutation", variant="mamba2"),
    "mamba2-H1-form-duplicates": dict(S=3, T=2, H=2, P=2, N=3, G=1, R=4, ids="duplicates", variant="mamba2",
                                      a_form="h1"),
    "mamba1-G1-duplicates": dict(S=3, T=2, H=3, P=2, N=3, G=1, R=2, ids="duplicates", variant="mamba1"),
    "mamba1-G3-unused-rows": dict(S=2, T=3, H=6, P=1, N=6, G=3, R=5, ids="unused", variant="mamba1"),
    "mamba1-T1-P1-N7": dict(S=2, T=1, H=2, P=1, N=7, G=2, R=3, ids="permutation", variant="mamba1"),
    "mamba2-T1-P1-N7": dict(S=2, T=1, H=2, P=1, N=7, G=1, R=2, ids="duplicates", variant="mamba2"),
    "mamba2-default-ids-R>S": dict(S=2, T=4, H=2, P=2, N=3, G=2, R=4, ids="none", variant="mamba2"),
}


def assert_matches_fd(got, fd, what):
    """Norm-relative within FD_RTOL (plus FD_ATOL per element), and no single entry off by more
    than FD_RTOL * max|fd| + FD_ATOL."""
    assert got.shape == fd.shape, what
    err = float(np.linalg.norm(got - fd))
    assert err <= FD_RTOL * np.linalg.norm(fd) + FD_ATOL * np.sqrt(fd.size), (
        f"{what}: rel_err {rel_err(got, fd):.2e}")
    worst = float(np.abs(got - fd).max(initial=0.0))
    allowed = FD_RTOL * float(np.abs(fd).max(initial=0.0)) + FD_ATOL
    assert worst <= allowed, f"{what}: worst entry off by {worst:.2e} (allowed {allowed:.2e})"


@pytest.mark.parametrize("name", list(FD_CASES))
def test_every_gradient_entry_matches_finite_differences(name):
    case = make_problem(np.random.default_rng(zlib.crc32(name.encode())), **FD_CASES[name])
    inputs = case.args(np.float64)
    g = ssm_ref.ssm_scan_back(**inputs, g_y=case.g_y, g_states=case.g_states, dtype=np.float64)
    for x in INPUT_NAMES:
        fd = fd_grad(inputs, x, case.g_y, case.g_states)
        assert_matches_fd(getattr(g, "d_" + x), fd, f"{name}: d_{x}")
    # The cache gradient really is a gradient of the cache: rows nobody reads have none.
    unread = np.setdiff1d(np.arange(case.dims["R"]), case.ids)
    assert np.all(g.d_s[unread] == 0)


@pytest.mark.parametrize("name", ["mamba2-H1-form-duplicates", "mamba1-G1-duplicates", "mamba1-G3-unused-rows"])
def test_d_s0_is_the_gradient_of_each_sequences_own_start_state(name):
    # Give every sequence a private copy of its start row (s' = s[ids], ids' = arange(S)): the
    # forward is unchanged, and the gradient w.r.t. s' is d_s0 by definition, duplicates or not.
    case = make_problem(np.random.default_rng(5), **FD_CASES[name])
    inputs = case.args(np.float64)
    g = ssm_ref.ssm_scan_back(**inputs, g_y=case.g_y, g_states=case.g_states, dtype=np.float64)
    private = {**inputs, "s": inputs["s"][case.ids], "ids": None}
    fd = fd_grad(private, "s", case.g_y, case.g_states)
    assert_matches_fd(g.d_s0, fd, f"{name}: d_s0")


def test_gradients_on_the_identity_branch_of_softplus():
    # dt in (21, 24): softplus is the identity there and its derivative 1. A is kept small so
    # exp(d * A) stays well inside float64 while d is large. The stencil's reach (2h = 2e-3)
    # stays far from the kink at 20.
    case = make_problem(np.random.default_rng(9), S=2, T=3, H=2, P=2, N=3, G=1, R=3, ids="permutation",
                        dt_range=(21.0, 24.0))
    inputs = case.args(np.float64)
    inputs["A"] = inputs["A"] * 0.05
    g = ssm_ref.ssm_scan_back(**inputs, g_y=case.g_y, g_states=case.g_states, dtype=np.float64)
    for x in INPUT_NAMES:
        assert_matches_fd(getattr(g, "d_" + x), fd_grad(inputs, x, case.g_y, case.g_states), f"d_{x}")


def test_gradients_far_down_the_log_branch():
    # dt in (-12, -8): softplus ~ exp(dt) is small, and d_dt must be right relative to its own
    # size. With s = 0 the loss is itself of the size of exp(dt), so the finite differences keep
    # their relative accuracy. (Not further down: log(1 + exp(dt)) in float64 has a relative
    # rounding error of about 1e-16 / exp(dt), 1e-5 at dt = -25, so there the float64 forward is
    # itself a staircase no finite difference can follow; SPEC.md, "Numerics".)
    case = make_problem(np.random.default_rng(10), S=2, T=3, H=2, P=2, N=3, G=2, R=2, ids="identity",
                        dt_range=(-12.0, -8.0))
    inputs = case.args(np.float64)
    inputs["s"] = np.zeros_like(inputs["s"])
    g = ssm_ref.ssm_scan_back(**inputs, g_y=case.g_y, g_states=case.g_states, dtype=np.float64)
    assert_matches_fd(g.d_dt, fd_grad(inputs, "dt", case.g_y, case.g_states), "d_dt")
    assert_matches_fd(g.d_s, fd_grad(inputs, "s", case.g_y, case.g_states), "d_s")


@given(problems(), st.integers(0, 2**32 - 1))
def test_sampled_gradient_entries_match_finite_differences(case, pick_seed):
    inputs = case.args(np.float64)
    g = ssm_ref.ssm_scan_back(**inputs, g_y=case.g_y, g_states=case.g_states, dtype=np.float64)
    pick = np.random.default_rng(pick_seed)
    for x in INPUT_NAMES:
        got = getattr(g, "d_" + x)
        if got.size == 0:
            continue
        idx = pick.choice(got.size, size=min(3, got.size), replace=False)
        fd = fd_grad(inputs, x, case.g_y, case.g_states, idx=idx)
        allowed = FD_RTOL * float(np.abs(got).max()) + FD_ATOL
        worst = float(np.abs(got.ravel()[idx] - fd).max())
        assert worst <= allowed, f"{case.label}: d_{x} entries {idx} off by {worst:.2e}"
