"""Measure the float32 reference against the float64 oracle (not a test; the source of the
numbers in registry.F32_TOL and docs/SPEC.md "Tolerance policy").

    PYTHONPATH=. python tests/measure_f32_error.py [--draws 4000] [--seed 7]

For every output it prints the worst norm-relative error over outputs whose norm is not
cancellation-small (norm >= 0.1 * sqrt(size)), the worst over all outputs (where the norm may be
tiny), the worst absolute RMS error ||got - want|| / sqrt(size), and the largest share of the
registry's bound (rtol*||want|| + atol*sqrt(size)) any case used.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from problems import IDS_PATTERNS, make_problem
from registry import F32_TOL, OUTPUTS, rel_err

import ssm_ref

SEED_SHAPES = [  # (N, P, H, T, S): the seed's sb_dims shapes plus its d_state=16 case
    (128, 4, 2, 3, 1), (128, 1, 1, 1, 1), (128, 8, 4, 7, 1), (256, 4, 2, 5, 1),
    (128, 4, 2, 3, 3), (128, 64, 8, 16, 1), (16, 4, 2, 3, 1),
]


def _cases(rng, draws: int):
    for _ in range(draws):
        S = int(rng.integers(1, 4))
        G = int(rng.integers(1, 4))
        H = G * int(rng.integers(1, 4))
        pattern = str(rng.choice([p for p in IDS_PATTERNS if not (p == "duplicates" and S < 2)]))
        R = S if pattern == "identity" else S + int(rng.integers(1 if pattern == "unused" else 0, 4))
        yield make_problem(rng, S=S, T=int(rng.integers(0, 17)), H=H, P=int(rng.integers(1, 5)),
                           N=int(rng.integers(1, 10)), G=G, R=R, ids=pattern,
                           variant=str(rng.choice(["mamba1", "mamba2"])), a_form=str(rng.choice(["h", "h1"])))
    for N, P, H, T, S in SEED_SHAPES:
        yield make_problem(rng, S=S, T=T, H=H, P=P, N=N, G=1, ids="none")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    worst = {k: [0.0, 0.0, 0.0, 0.0] for k in OUTPUTS}  # rel (not tiny), rel (all), rms, used
    for case in _cases(rng, args.draws):
        a = case.args()
        got = {**vars_of(ssm_ref.ssm_scan(**a)),
               **ssm_ref.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states).as_dict()}
        want = {**vars_of(ssm_ref.ssm_scan(**a, dtype=np.float64)),
                **ssm_ref.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states, dtype=np.float64).as_dict()}
        for k in OUTPUTS:
            w = want[k]
            if w.size == 0:
                continue
            r = rel_err(got[k], w)
            rms = float(np.linalg.norm(got[k].astype(np.float64) - w)) / math.sqrt(w.size)
            big = np.linalg.norm(w) >= 0.1 * math.sqrt(w.size)
            worst[k][0] = max(worst[k][0], r if big else 0.0)
            worst[k][1] = max(worst[k][1], r)
            worst[k][2] = max(worst[k][2], rms)
            tol = F32_TOL[k]
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
