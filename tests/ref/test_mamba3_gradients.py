"""The Mamba-3 reference backward (ssm_ref.mamba3_scan_back) against finite differences of the
float64 forward.

Loss L = Σ y·g_y + Σ theta·g_theta + Σ h·g_h + Σ k·g_k + Σ v·g_v with random cotangents. Every
entry of every float input (the four start-state parts included, through the ids) on a table of
small cases: SISO and MIMO, both rotations, one and several groups, F from 1 to N/2, repeated ids
(the scatter-add), permuted ids with unread rows, start states given and None, psi given and None.
"""

import zlib

import numpy as np
import pytest
from m3_problems import INPUTS, fd_directional, fd_grad, make

import ssm_ref

# The fourth-order stencil at h = 1e-3 is good to ~1e-11 here (measured: 2.3e-11 relative at worst,
# on d_s_k), so 1e-7 catches any real error with four orders of margin; FD_ATOL absorbs its
# rounding noise where a gradient is exactly 0 (unread cache rows).
FD_RTOL = 1e-7
FD_ATOL = 1e-10

CASES = {
    "siso-interleaved-G2-duplicates": dict(S=2, T=3, H=4, P=2, N=4, G=2, F=2, ids="duplicates"),
    "siso-halved-F1-permuted-R>S": dict(S=2, T=3, H=2, P=3, N=6, G=1, F=1, R=4, ids="permutation",
                                        rotation="halved"),
    "siso-no-states-G2": dict(S=2, T=3, H=2, P=2, N=4, G=2, F=2, states=False),
    "mimo-halved-duplicates": dict(S=3, T=2, H=2, P=2, N=6, G=1, M=2, F=3, ids="duplicates", rotation="halved"),
    "mimo-interleaved-G2-psi-none": dict(S=2, T=3, H=4, P=2, N=4, G=2, M=3, F=1, ids="identity", psi=False),
    "mimo-no-states-T1": dict(S=2, T=1, H=2, P=2, N=4, G=1, M=2, F=2, states=False),
    "siso-F0": dict(S=1, T=3, H=2, P=2, N=3, G=1, F=0),
}


def _case(name):
    kw = dict(CASES[name])
    rotation = kw.pop("rotation", "interleaved")
    args, cot = make(np.random.default_rng(zlib.crc32(name.encode())), rotation=rotation, **kw)
    return args, cot, rotation


def assert_matches_fd(got, fd, what):
    assert got.shape == fd.shape, what
    worst = float(np.abs(got - fd).max(initial=0.0))
    allowed = FD_RTOL * float(np.abs(fd).max(initial=0.0)) + FD_ATOL
    assert worst <= allowed, f"{what}: worst entry off by {worst:.2e} (allowed {allowed:.2e})"


@pytest.mark.parametrize("name", list(CASES))
def test_every_gradient_entry_matches_finite_differences(name):
    args, cot, rotation = _case(name)
    g = ssm_ref.mamba3_scan_back(**args, **cot, rotation=rotation, dtype=np.float64)
    assert list(g) == ["d_" + n for n in INPUTS]
    for n in INPUTS:
        if args.get(n) is None:
            continue
        assert_matches_fd(g["d_" + n], fd_grad(args, n, cot, rotation), f"{name}: d_{n}")
    if args.get("psi") is None:
        assert g.d_psi is None
    if args.get("ids") is not None:
        unread = np.setdiff1d(np.arange(args["s_h"].shape[0]), args["ids"])
        for n in ("d_s_theta", "d_s_h", "d_s_k", "d_s_v"):
            assert np.all(g[n][unread] == 0), n


@pytest.mark.parametrize("name", ["siso-no-states-G2", "mimo-no-states-T1"])
def test_without_states_the_state_gradients_are_those_of_the_zero_start(name):
    # States None is zeros (S, ...) with ids arange(S): the same forward, so the same gradients,
    # and those of the explicit zeros are checked against finite differences above.
    args, cot, rotation = _case(name)
    g = ssm_ref.mamba3_scan_back(**args, **cot, rotation=rotation, dtype=np.float64)
    out = ssm_ref.mamba3_scan(**args, rotation=rotation, dtype=np.float64)
    zeros = {n: np.zeros_like(getattr(out, o)) for n, o in (("s_theta", "theta"), ("s_h", "h"), ("s_k", "k"),
                                                            ("s_v", "v"))}
    g0 = ssm_ref.mamba3_scan_back(**{**args, **zeros}, **cot, rotation=rotation, dtype=np.float64)
    for n in g0:
        if g0[n] is not None:
            np.testing.assert_array_equal(g[n], g0[n], err_msg=n)
    for n in ("s_theta", "s_h", "s_k", "s_v"):
        assert_matches_fd(g["d_" + n], fd_grad({**args, **zeros}, n, cot, rotation), f"{name}: d_{n}")


@pytest.mark.parametrize("M", [None, 2])
@pytest.mark.parametrize("rotation", ["interleaved", "halved"])
def test_directional_derivatives_over_drawn_shapes(M, rotation):
    # Wider shapes than the entry-by-entry table, checked along random directions.
    rng = np.random.default_rng(17 + (M or 0) + len(rotation))
    for _ in range(3):
        G = int(rng.choice([1, 2]))
        N = 2 * int(rng.integers(1, 5))
        kw = dict(S=int(rng.integers(1, 4)), T=int(rng.integers(1, 6)), H=G * int(rng.integers(1, 3)),
                  P=int(rng.integers(1, 4)), N=N, G=G, M=M, F=int(rng.integers(0, N // 2 + 1)),
                  ids=str(rng.choice(["none", "duplicates", "permutation"])))
        args, cot = make(rng, rotation=rotation, **kw)
        g = ssm_ref.mamba3_scan_back(**args, **cot, rotation=rotation, dtype=np.float64)
        for n in INPUTS:
            if args.get(n) is None:
                continue
            u = rng.standard_normal(np.shape(args[n]))
            want = fd_directional(args, n, u, cot, rotation)
            got = float(np.sum(g["d_" + n] * u))
            assert abs(got - want) <= FD_RTOL * (np.linalg.norm(g["d_" + n]) * np.linalg.norm(u)) + FD_ATOL, \
                (kw, n, got, want)


def test_cotangents_none_are_zeros_and_t0_passes_them_to_the_start():
    args, cot, rotation = _case("mimo-halved-duplicates")
    g_none = ssm_ref.mamba3_scan_back(**args, dtype=np.float64, rotation=rotation)
    assert all(np.all(v == 0) for v in g_none.values() if v is not None)
    # T = 0: the outputs are the start rows, so each cotangent lands in its row (added where repeated).
    a0 = {k: (v[:, :0] if k in ("x", "dt", "dA", "lam", "B", "C", "dtheta") else v) for k, v in args.items()}
    g = ssm_ref.mamba3_scan_back(**a0, g_theta=cot["g_theta"], g_h=cot["g_h"], g_k=cot["g_k"], g_v=cot["g_v"],
                                 dtype=np.float64, rotation=rotation)
    for n, o in (("theta", "g_theta"), ("h", "g_h"), ("k", "g_k"), ("v", "g_v")):
        want = np.zeros_like(args["s_" + n])
        np.add.at(want, args["ids"], cot[o])
        np.testing.assert_array_equal(g["d_s_" + n], want)
    assert g.d_x.shape == a0["x"].shape and g.d_B.shape == a0["B"].shape
    assert np.all(g.d_B_bias == 0) and np.all(g.d_psi == 0)
