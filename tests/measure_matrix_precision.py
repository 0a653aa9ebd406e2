"""Measure the matrix-unit settings (ssm_ref.precision) against float64 (not a test; the source of
the numbers in ssm_ref.tolerance.MATRIX_TOL, tests/ref/test_matrix_precision.py and docs/SPEC.md
"Matrix-unit precision").

    PYTHONPATH=. python tests/measure_matrix_precision.py [--draws 300] [--seed 7] [--op scan|mamba3]

Products: the worst per-element error of ``matmul(a, b, precision)`` over the exact product, in
units of 2^-24 (|A| |B|)_ij (plain and wide-range rows), for "high" and "medium". Chunked form:
ssm_ref.chunked's float32 forward and backward at each precision against ssm_ref.scan in float64,
norm-relative per output (ssm_ref.tolerance.rel_err), over drawn Mamba-2 problems (every finite
regime, L in 8, 16, 64, T up to 3 chunks) and at (1, 256, 2, 64, 128), G = 1, L = 64: the
benchmark's train shape scaled down. ``--op mamba3``: the same for Mamba-3's chunked form
(ssm_ref.mamba3_chunked and mamba3_chunked_back) against ssm_ref.mamba3 in float64, drawn Mamba-3
problems (SISO and MIMO, its finite regimes, L in 4, 8, 16, 64), held to MAMBA3_MATRIX_TOL (scaled
by T / 16 beyond 16 tokens, as MAMBA3_F32_TOL is), and
(1, 256, 2, 64, 128) with F = 32, L = 64: the side-by-side's SISO shape scaled down.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from matrix_outputs import M3_OUTS, OUTS, chunked_and_float64, mamba3_chunked_and_float64
from problems import make_problem

from ssm_ref.precision import matmul
from ssm_ref.testing import mamba3_cases
from ssm_ref.tolerance import MAMBA3_MATRIX_TOL, MATRIX_TOL, compare, rel_err, scaled

REGIMES = ("typical", "wide_dt", "small_A", "long_decay")


def product_ulps(rng, precision: str, wide: bool, draws: int) -> tuple[float, float]:
    """Worst |C - exact|_ij in units of 2^-24 (|A| |B|)_ij, and in units of 2^-24 ((|A| |B|)_ij +
    2^-15 F_ij), F_ij = max|A| sum_k |B_kj| + max|B| sum_k |A_ik| (the block-scale floor), over
    drawn float32 products; ``wide``: rows of A 2^-20 .. 2^20 apart."""
    worst = [0.0, 0.0]
    for _ in range(draws):
        m, k, n = (int(v) for v in rng.integers(1, 130, 3))
        a = rng.standard_normal((m, k))
        if wide:
            a *= np.exp2(rng.uniform(-20, 20, (m, 1)))
        a = a.astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        got = matmul(a, b, precision).astype(np.float64)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        err = np.abs(got - a64 @ b64)
        scale = np.abs(a64) @ np.abs(b64)
        floor = (np.abs(a64).max() * np.abs(b64).sum(axis=0)[None, :]
                 + np.abs(b64).max() * np.abs(a64).sum(axis=1)[:, None])
        worst[0] = max(worst[0], float(np.max(err / (scale * 2.0**-24))))
        worst[1] = max(worst[1], float(np.max(err / ((scale + 2.0**-15 * floor) * 2.0**-24))))
    return worst[0], worst[1]


def chunked_cases(rng, draws: int):
    for _ in range(draws):
        L = int(rng.choice([8, 16, 64]))
        T = int(rng.integers(1, 3 * L + 1)) if L < 64 else int(rng.integers(1, 130))
        G = int(rng.integers(1, 3))
        S = int(rng.integers(1, 3))
        case = make_problem(rng, S=S, T=T, G=G, H=G * int(rng.integers(1, 3)), P=int(rng.integers(1, 9)),
                            N=int(rng.integers(1, 17)), ids="permutation", variant="mamba2",
                            regime=str(rng.choice(REGIMES)))
        yield case, L
    yield make_problem(rng, S=1, T=256, H=2, P=64, N=128, G=1, ids="none", variant="mamba2"), 64


M3_REGIMES = ("typical", "long_decay", "small_dA", "large_dt")


def mamba3_cases_drawn(rng, draws: int):
    for _ in range(draws):
        L = int(rng.choice([4, 8, 16, 64]))
        T = int(rng.integers(1, 3 * L + 1)) if L < 64 else int(rng.integers(1, 130))
        M = [None, 1, 2, 4][int(rng.integers(4))]
        S = int(rng.integers(2, 4))
        case = mamba3_cases.make_case(rng, S=S, T=T, H=2, P=int(rng.integers(1, 9)), N=int(rng.choice([4, 8, 16])),
                                      G=1, M=M, R=S + 1, ids=str(rng.choice(["permutation", "duplicates"])),
                                      psi=bool(rng.random() < 0.5), regime=str(rng.choice(M3_REGIMES)))
        yield case, L
    yield mamba3_cases.make_case(rng, S=1, T=256, H=2, P=64, N=128, G=1, F=32, R=1, ids="identity"), 64


def errors(case, L: int, precision: str, op: str = "scan") -> dict[str, float]:
    if op == "mamba3":
        (got, want), names, table = mamba3_chunked_and_float64(case, L, precision), M3_OUTS, MAMBA3_MATRIX_TOL
    else:
        (got, want), names, table = chunked_and_float64(case, L, precision), OUTS, MATRIX_TOL
    out = {}
    for k in names:
        if k not in want:
            continue
        w = np.asarray(want[k], dtype=np.float64)
        norm = float(np.linalg.norm(w))
        rms = float(np.linalg.norm(got[k] - w)) / np.sqrt(max(w.size, 1))
        r = rel_err(got[k], w)
        tol = scaled(table[precision], case.dims["T"])[k] if op == "mamba3" else table[precision][k]
        used = compare(k, got[k], w, tol).used if precision != "highest" else 0.0
        out[k] = (r if norm >= 0.1 * np.sqrt(w.size) else 0.0, r, rms, used)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--precisions", nargs="+", default=["highest", "high", "medium"])
    ap.add_argument("--no-products", action="store_true")
    ap.add_argument("--op", choices=("scan", "mamba3"), default="scan")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    for precision in () if args.no_products else ("high", "medium"):
        for wide in (False, True):
            plain, floored = product_ulps(rng, precision, wide, 200)
            print(f"matmul {precision:7s} {'wide rows' if wide else 'plain'}: worst {plain:.2f} x 2^-24 (|A||B|)_ij, "
                  f"{floored:.2f} x 2^-24 ((|A||B|)_ij + 2^-15 F_ij)")
    draw = mamba3_cases_drawn if args.op == "mamba3" else chunked_cases
    cases = list(draw(np.random.default_rng([args.seed, 1]), args.draws))   # apart from the products
    names = M3_OUTS if args.op == "mamba3" else OUTS
    for precision in args.precisions:
        t = time.perf_counter()
        worst = {k: [0.0, 0.0, 0.0, 0.0] for k in names}
        who = {}
        for case, L in cases[:-1]:
            e = errors(case, L, precision, args.op)
            for k in e:
                if e[k][3] > worst[k][3]:
                    who[k] = f"{case.label} L={L}"
                worst[k] = [max(u, v) for u, v in zip(worst[k], e[k], strict=True)]
        took = time.perf_counter() - t
        print(f"chunked {precision}, {len(cases) - 1} drawn (rel, rel(all), rms, used) [{took:.1f} s]:")
        for k, (r, ra, rms, used) in worst.items():
            print(f"    {k:7s} {r:.2e} {ra:.2e} {rms:.2e} {used:.1%}  {who.get(k, '')}")
        bench = errors(*cases[-1], precision, args.op)
        print("  (1, 256, 2, 64, 128): " + " ".join(f"{k} {v[1]:.2e}" for k, v in bench.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
