"""The float32 error of the step softplus(dt) on each backend, by range of dt (not a test; the
source of the per-backend rows in docs/SPEC.md section 8).

    python benchmarks/softplus_accuracy.py [--backend ssm_ref ssm_fast ssm_vk] [--points 200000]
                                           [--json out.json]

Each backend runs the probe problem (one head per dt value, s = 0, x = B = C = 1, so that y is the
step itself) through its public ssm_scan, for each dt_softplus form; the step is compared with the
exact log1p(exp(z)) of the float32 input z (Python's float64 math, whose own error is far below
float32's), relative error, worst per range of z.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import platform

import numpy as np

BANDS = [(-1.0, 20.0), (-5.0, -1.0), (-7.0, -5.0), (-10.0, -7.0), (-15.0, -10.0), (-16.6, -15.0),
         (-50.0, -16.6), (-87.0, -50.0)]


def steps(module, zs: np.ndarray, form) -> np.ndarray:
    H = zs.size
    f32 = np.float32
    inp = dict(s=np.zeros((1, H, 1, 1), f32), x=np.ones((1, 1, H, 1), f32), dt=zs.reshape(1, 1, H).astype(f32),
               A=np.full(H, -0.01, f32), B=np.ones((1, 1, 1, 1), f32), C=np.ones((1, 1, 1, 1), f32))
    r = module.ssm_scan(**inp, dt_softplus=form)
    y = r.y.numpy() if hasattr(r.y, "numpy") else r.y
    return np.asarray(y, np.float64).reshape(H), r.where


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", nargs="+", default=["ssm_ref", "ssm_fast", "ssm_vk"])
    ap.add_argument("--points", type=int, default=200_000, help="dt values per range")
    ap.add_argument("--json", help="write the table here too")
    a = ap.parse_args()
    zs = {band: np.linspace(band[0], band[1], a.points).astype(np.float32) for band in BANDS}
    exact = {band: np.array([math.log1p(math.exp(float(z))) for z in v]) for band, v in zs.items()}
    rows = []
    for name in a.backend:
        module = importlib.import_module(name)
        for form in ("ggml", "log1p"):
            row = {"backend": name, "form": form}
            for band in BANDS:
                got, where = steps(module, zs[band], form)
                row[f"[{band[0]:g}, {band[1]:g}]"] = float(np.max(np.abs(got / exact[band] - 1)))
            row["where"] = where
            rows.append(row)
    heads = [k for k in rows[0] if k not in ("backend", "form", "where")]
    print(f"# {platform.node()} {platform.processor() or platform.machine()}: worst relative error of the step")
    print("| backend (where) | form | " + " | ".join(heads) + " |")
    print("|---|---|" + "---|" * len(heads))
    for r in rows:
        print(f"| {r['backend']} ({r['where']}) | {r['form']} | " + " | ".join(f"{r[h]:.1e}" for h in heads) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
