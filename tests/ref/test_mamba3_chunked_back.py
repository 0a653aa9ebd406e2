"""ssm_ref.mamba3_chunked_back (the Mamba-3 backward in chunk form) against ssm_ref.mamba3.backward
(the token-by-token adjoint, itself checked against finite differences in
test_mamba3_gradients.py), both in float64: every gradient, the start-state ones included, within
1e-12 relative over drawn shapes -- SISO and MIMO, both rotations, G > 1, F = 0, start states given
and None, repeated and permuted ids, chunk lengths 1, 2, 3, T and beyond T (one chunk, several,
a short last chunk) -- and T = 0."""

from __future__ import annotations

import numpy as np
import pytest
from m3_problems import drawn_shape, make

from ssm_ref import mamba3, mamba3_chunked_back
from ssm_ref.mamba3_checks import check_mamba3_backward

CLOSE = 1e-12


def _problem(args, cot, rotation):
    return check_mamba3_backward(**args, **cot, rotation=rotation, dtype=np.float64)


def assert_same(p, L, label):
    want = mamba3.backward(p)
    got = mamba3_chunked_back.backward(p, L)
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        g = got[name]
        assert g.shape == w.shape and g.dtype == w.dtype, f"{label} L={L}: {name}"
        scale = max(1.0, float(np.abs(w).max(initial=0.0)))
        err = float(np.abs(g - w).max(initial=0.0))
        assert err <= CLOSE * scale, f"{label} L={L}: {name} off by {err:.2e} (scale {scale:.2e})"


@pytest.mark.parametrize("rotation", ["interleaved", "halved"])
@pytest.mark.parametrize("mimo", [False, True])
def test_chunked_backward_equals_the_token_backward(mimo, rotation):
    rng = np.random.default_rng(11 + 2 * mimo + len(rotation))
    for n in range(6):
        kw = drawn_shape(rng, n, mimo, edges=True)
        args, cot = make(rng, rotation=rotation, wrap_margin=0.0, **kw)
        p = _problem(args, cot, rotation)
        for L in sorted({1, 2, 3, kw["T"], kw["T"] + 5}):
            assert_same(p, L, str(kw))


def test_one_token_odd_n_and_zero_tokens():
    rng = np.random.default_rng(5)
    args, cot = make(rng, S=2, T=1, H=2, P=3, N=5, G=1, F=0, ids="duplicates")
    p = _problem(args, cot, "interleaved")
    for L in (1, 4):
        assert_same(p, L, "T = 1, N odd")
    args, cot = make(rng, S=2, T=3, H=2, P=2, N=4, G=1, M=2, F=1, ids="duplicates")
    a0 = {k: (v[:, :0] if k in ("x", "dt", "dA", "lam", "B", "C", "dtheta") else v) for k, v in args.items()}
    c0 = {k: (v[:, :0] if k == "g_y" else v) for k, v in cot.items()}
    assert_same(_problem(a0, c0, "halved"), 4, "T = 0")


def test_a_bad_chunk_length():
    args, cot = make(np.random.default_rng(0), S=1, T=2, H=1, P=1, N=2, G=1, F=1)
    for L in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"^L: "):
            mamba3_chunked_back.backward(_problem(args, cot, "interleaved"), L)
