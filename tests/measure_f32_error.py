"""Measure the float32 reference against the float64 oracle (not a test; the source of the
numbers in registry.F32_TOL and docs/SPEC.md "Tolerance policy").

    PYTHONPATH=. python tests/measure_f32_error.py [--draws 4000] [--seed 7]
    PYTHONPATH=. python tests/measure_f32_error.py --regime long_decay --tokens 256 256 --draws 150

For every output it prints the worst norm-relative error over outputs whose norm is not
cancellation-small (norm >= 0.1 * sqrt(size)), the worst over all outputs (where the norm may be
tiny), the worst absolute RMS error ||got - want|| / sqrt(size), and the largest share of the
registry's bound (rtol*||want|| + atol*sqrt(size)) any case used. ``--regime`` draws the values of
another regime of ssm_ref.testing.cases (the R test's large shapes are added for "typical" only);
``--tokens LO HI`` the range of T; the bound is the table scaled for T (ssm_ref.tolerance.scaled).
``--backend ssm_vk`` measures another backend's float32 results against the same oracle.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from problems import IDS_PATTERNS, make_problem
from registry import F32_TOL, OUTPUTS, rel_err

import ssm_ref
from ssm_ref.tolerance import scaled

R_TEST_SHAPES = [  # (N, P, H, T, S): ggmlR's R test's sb_dims shapes plus its d_state=16 case
    (128, 4, 2, 3, 1), (128, 1, 1, 1, 1), (128, 8, 4, 7, 1), (256, 4, 2, 5, 1),
    (128, 4, 2, 3, 3), (128, 64, 8, 16, 1), (16, 4, 2, 3, 1),
]


def _cases(rng, draws: int, regime: str = "typical", tokens=(0, 16)):
    for _ in range(draws):
        S = int(rng.integers(1, 4))
        G = int(rng.integers(1, 4))
        H = G * int(rng.integers(1, 4))
        pattern = str(rng.choice([p for p in IDS_PATTERNS if not (p == "duplicates" and S < 2)]))
        R = S if pattern == "identity" else S + int(rng.integers(1 if pattern == "unused" else 0, 4))
        yield make_problem(rng, S=S, T=int(rng.integers(tokens[0], tokens[1] + 1)), H=H, P=int(rng.integers(1, 5)),
                           N=int(rng.integers(1, 10)), G=G, R=R, ids=pattern,
                           variant=str(rng.choice(["mamba1", "mamba2"])), a_form=str(rng.choice(["h", "h1"])),
                           regime=regime)
    if regime != "typical":
        return
    for N, P, H, T, S in R_TEST_SHAPES:
        yield make_problem(rng, S=S, T=T, H=H, P=P, N=N, G=1, ids="none")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--regime", default="typical", choices=["typical", "wide_dt", "small_A", "long_decay", "overflow"])
    ap.add_argument("--tokens", type=int, nargs=2, default=(0, 16), metavar=("LO", "HI"))
    ap.add_argument("--backend", default="ssm_ref", help="module whose float32 results are measured")
    args = ap.parse_args(argv)
    mod = importlib.import_module(args.backend)
    rng = np.random.default_rng(args.seed)
    worst = {k: [0.0, 0.0, 0.0, 0.0] for k in OUTPUTS}  # rel (not tiny), rel (all), rms, used
    for case in _cases(rng, args.draws, args.regime, args.tokens):
        a = case.args()
        got = {**vars_of(mod.ssm_scan(**a)),
               **mod.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states).as_dict()}
        want = {**vars_of(ssm_ref.ssm_scan(**a, dtype=np.float64)),
                **ssm_ref.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states, dtype=np.float64).as_dict()}
        for k in OUTPUTS:
            w = want[k]
            fin = np.isfinite(w)
            if not fin.any():
                continue
            if not fin.all():                       # overflow regime: same pattern, norms over the rest
                assert math.isfinite(rel_err(got[k], w)), k
                got[k], w = got[k][fin], w[fin]
            r = rel_err(got[k], w)
            rms = float(np.linalg.norm(got[k].astype(np.float64) - w)) / math.sqrt(w.size)
            big = np.linalg.norm(w) >= 0.1 * math.sqrt(w.size)
            worst[k][0] = max(worst[k][0], r if big else 0.0)
            worst[k][1] = max(worst[k][1], r)
            worst[k][2] = max(worst[k][2], rms)
            tol = scaled(F32_TOL, case.dims["T"])[k]
            used = rms * math.sqrt(w.size) / (tol.rtol * np.linalg.norm(w) + tol.atol * math.sqrt(w.size))
            worst[k][3] = max(worst[k][3], used)
    print(f"{'output':8s} {'rel':>9s} {'rel(all)':>9s} {'rms':>9s} {'of bound':>9s}")
    for k in OUTPUTS:
        print(f"{k:8s} {worst[k][0]:9.2e} {worst[k][1]:9.2e} {worst[k][2]:9.2e} {worst[k][3]:9.1%}")
    return 0


def vars_of(r) -> dict:
    return {"y": r.y, "states": r.states}


if __name__ == "__main__":
    sys.exit(main())
