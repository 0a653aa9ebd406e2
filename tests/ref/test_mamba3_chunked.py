"""ssm_ref.mamba3_chunked (the matrix form of the Mamba-3 scan) against ssm_ref.mamba3 (the
token-by-token definition), both in float64: every output within 1e-12 relative over drawn shapes,
chunk lengths that do and do not divide T (and longer than T), start states given and None,
repeated ids, SISO and MIMO, both rotations. theta is compared on the circle: the chunk's prefix
sum reduced once and the scan's running reduction may round to the two sides of the wrap."""

from __future__ import annotations

import numpy as np
import pytest
from m3_problems import drawn_shape, make

from ssm_ref import mamba3, mamba3_chunked
from ssm_ref.mamba3_checks import check_mamba3_forward

CLOSE = 1e-12


def _problem(args, rotation):
    return check_mamba3_forward(**args, rotation=rotation, dtype=np.float64)


def assert_same(p, L, label):
    y, st = mamba3.forward(p)
    cy, cst = mamba3_chunked.forward(p, L)
    for name, got, want in (("y", cy, y), *zip(("theta", "h", "k", "v"), cst, st, strict=True)):
        d = got - want
        if name == "theta":
            d = (d + np.pi) % (2 * np.pi) - np.pi
        scale = max(1.0, float(np.abs(want).max(initial=0.0)))
        assert float(np.abs(d).max(initial=0.0)) <= CLOSE * scale, f"{label} L={L}: {name}"


@pytest.mark.parametrize("rotation", ["interleaved", "halved"])
@pytest.mark.parametrize("mimo", [False, True])
def test_chunked_equals_the_scan_over_drawn_shapes(mimo, rotation):
    rng = np.random.default_rng(3 + 2 * mimo + len(rotation))
    for n in range(6):
        kw = drawn_shape(rng, n, mimo)
        args, _ = make(rng, rotation=rotation, wrap_margin=0.0, **kw)
        p = _problem(args, rotation)
        for L in sorted({1, 2, 3, 4, kw["T"], kw["T"] + 5}):
            assert_same(p, L, str(kw))


def test_zero_tokens_and_a_bad_chunk_length():
    args, _ = make(np.random.default_rng(0), S=2, T=3, H=2, P=2, N=4, G=1, M=2, F=1, ids="duplicates")
    a0 = {k: (v[:, :0] if k in ("x", "dt", "dA", "lam", "B", "C", "dtheta") else v) for k, v in args.items()}
    assert_same(_problem(a0, "interleaved"), 4, "T = 0")
    for L in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"^L: "):
            mamba3_chunked.forward(_problem(args, "interleaved"), L)
