"""Measure how far the float32 Mamba-3 reference lands from the float64 oracle: the numbers
behind ssm_ref.tolerance.MAMBA3_F32_TOL.

    PYTHONPATH=. python tests/measure_mamba3_f32_error.py [--cases 2000] [--seed 7]

Draws problems (SISO and MIMO, both rotations, start states given or not, repeated ids), rounds
every input to float32 (so both runs see the same numbers and the difference is arithmetic only),
runs forward and backward in both precisions, and prints per output: the worst norm-relative
error over outputs whose norm is not cancellation-small (>= 0.1 sqrt(size)) ("rel"), over every
output ("rel(all)"), the worst RMS error ("rms"), and the largest share of the table's bound any
case used ("used"). theta is compared on the circle (its distance mod 2 pi): a float32 angle
within rounding of the wrap lands on the other side of it, 2 pi away in plain numbers.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import ssm_ref
from ssm_ref.tolerance import MAMBA3_F32_TOL

sys.path.insert(0, "tests/ref")
from m3_problems import make


def draw_shape(rng):
    big = rng.random() < 0.1
    G = int(rng.choice([1, 2]))
    N = int(rng.choice([16, 32, 64])) if big else 2 * int(rng.integers(1, 6))
    return dict(S=int(rng.integers(1, 4)), T=int(rng.integers(1, 17)), H=G * int(rng.integers(1, 3)),
                P=int(rng.choice([16, 32])) if big else int(rng.integers(1, 5)), N=N, G=G,
                M=None if rng.random() < 0.5 else int(rng.integers(1, 5)), F=int(rng.integers(0, N // 2 + 1)),
                ids=str(rng.choice(["none", "duplicates", "permutation"])), states=bool(rng.random() < 0.8))


def errors(got, want, circle=False):
    d = got.astype(np.float64) - want
    if circle:
        d = (d + np.pi) % (2 * np.pi) - np.pi
    n = max(want.size, 1)
    norm_w, norm_d = float(np.linalg.norm(want)), float(np.linalg.norm(d))
    return norm_d, norm_w, norm_d / np.sqrt(n), n


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    worst: dict = {}
    for _ in range(a.cases):
        kw = draw_shape(rng)
        if not kw["states"]:
            kw["ids"] = "none"
        rotation = str(rng.choice(["interleaved", "halved"]))
        args, cot = make(rng, rotation=rotation, wrap_margin=0.0, **kw)
        args = {k: (None if v is None else v if k == "ids" else np.float32(v).astype(np.float64) if np.ndim(v) == 0
                    else np.asarray(v, np.float32).astype(np.float64)) for k, v in args.items()}
        cot = {k: np.asarray(v, np.float32).astype(np.float64) for k, v in cot.items()}
        res = {}
        for dt in (np.float32, np.float64):
            out = ssm_ref.mamba3_scan(**args, rotation=rotation, dtype=dt)
            g = ssm_ref.mamba3_scan_back(**args, **cot, rotation=rotation, dtype=dt)
            res[dt] = {**{n: getattr(out, n) for n in ("y", "theta", "h", "k", "v")},
                       **{k: v for k, v in g.items() if v is not None}}
        for name, want in res[np.float64].items():
            norm_d, norm_w, rms, n = errors(res[np.float32][name], want, circle=name == "theta")
            w = worst.setdefault(name, {"rel": 0.0, "rel_all": 0.0, "rms": 0.0, "used": 0.0})
            rel = norm_d / norm_w if norm_w else (0.0 if norm_d == 0 else np.inf)
            w["rel_all"] = max(w["rel_all"], rel)
            if norm_w >= 0.1 * np.sqrt(n):
                w["rel"] = max(w["rel"], rel)
            w["rms"] = max(w["rms"], rms)
            tol = MAMBA3_F32_TOL.get(name)
            if tol is not None:
                w["used"] = max(w["used"], norm_d / (tol.rtol * norm_w + tol.atol * np.sqrt(n)))
    for name, w in worst.items():
        print(f"{name:10s} rel {w['rel']:.1e}  rel(all) {w['rel_all']:.1e}  rms {w['rms']:.1e}  "
              f"used {100 * w['used']:.1f}%")


if __name__ == "__main__":
    main()
