"""A first gradient check of the reference; the full suite lives beside it."""

import numpy as np

import ssm_ref


def test_backward_matches_central_differences_mamba2_groups_permuted_ids():
    rng = np.random.default_rng(1)
    S, T, H, P, N, G, R = 2, 4, 4, 2, 3, 2, 3
    inp = dict(s=rng.standard_normal((R, H, P, N)), x=rng.standard_normal((S, T, H, P)),
               dt=rng.standard_normal((S, T, H)), A=-rng.random(H),
               B=rng.standard_normal((S, T, G, N)), C=rng.standard_normal((S, T, G, N)),
               ids=np.array([2, 0]))
    g_y = rng.standard_normal((S, T, H, P))
    g_states = rng.standard_normal((S, H, P, N))
    g = ssm_ref.ssm_scan_back(**inp, g_y=g_y, g_states=g_states, dtype=np.float64)

    def loss(**kw):
        r = ssm_ref.ssm_scan(**{**inp, **kw}, dtype=np.float64)
        return np.sum(r.y * g_y) + np.sum(r.states * g_states)

    for name in ("s", "x", "dt", "A", "B", "C"):
        base = inp[name]
        fd = np.empty_like(base)
        for i in np.ndindex(base.shape):
            up, dn = base.copy(), base.copy()
            up[i] += 1e-6
            dn[i] -= 1e-6
            fd[i] = (loss(**{name: up}) - loss(**{name: dn})) / 2e-6
        got = getattr(g, "d_" + name)
        np.testing.assert_allclose(got, fd, rtol=1e-7, atol=1e-7 * np.abs(fd).max())
