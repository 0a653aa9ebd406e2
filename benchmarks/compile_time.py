"""First-call cost of ssm_fast: numba compilation in a cold process, cache loading in a warm one.

    python benchmarks/compile_time.py            # a fresh temporary NUMBA_CACHE_DIR, two processes

Each process imports ssm_fast and makes the first call of every kernel on a tiny input, timing
each step. The first process finds an empty cache and compiles; the second loads what the first
wrote (numba's ``cache=True``). Prints one markdown table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, time
t0 = time.perf_counter()
import numpy as np
import ssm_fast
out = {"import ssm_fast": time.perf_counter() - t0}
rng = np.random.default_rng(0)
S, T, H, P, N, G = 1, 2, 2, 2, 3, 1
for variant, a_shape in (("Mamba-2", (H,)), ("Mamba-1", (H, N))):
    inp = dict(s=rng.standard_normal((S, H, P, N)), x=rng.standard_normal((S, T, H, P)),
               dt=rng.standard_normal((S, T, H)), A=-rng.random(a_shape),
               B=rng.standard_normal((S, T, G, N)), C=rng.standard_normal((S, T, G, N)))
    t0 = time.perf_counter()
    ssm_fast.ssm_scan(**inp)
    out[f"first ssm_scan, {variant}"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ssm_fast.ssm_scan_back(**inp, ids=None, g_y=np.ones((S, T, H, P)), g_states=np.ones((S, H, P, N)))
    out[f"first ssm_scan_back, {variant}"] = time.perf_counter() - t0
t0 = time.perf_counter()
ssm_fast.warmup()
out["warmup() after that"] = time.perf_counter() - t0
print(json.dumps(out))
"""


def run(cache_dir: str) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="ssm-fast-cache-") as d:
        cold = run(d)
        warm = run(d)
    print("| step | cold process (compiles), s | warm process (cache), s |")
    print("|---|---|---|")
    for k in cold:
        print(f"| {k} | {cold[k]:.2f} | {warm[k]:.2f} |")
    total_cold = sum(v for k, v in cold.items() if k != "warmup() after that")
    total_warm = sum(v for k, v in warm.items() if k != "warmup() after that")
    print(f"| total | {total_cold:.2f} | {total_warm:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
