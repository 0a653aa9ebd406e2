"""Decode steps on ssm_vk: one token (T = 1) for S sequences that read S of R state-cache rows,
every input device-resident, as an inference engine calls the scan once per token and layer.

    python benchmarks/vk_decode.py [--cases 1/64/80,16/64/80,128/256/48] [--reps 200] [--json out.json]

A case is S/R/H (P = 64, N = 128, G = 1; ids a fixed random choice of S distinct rows). For each:
the median GPU time (timestamps) and wall time per call, and the GPU time split into the gather of
the cache rows (states <- s[ids], copy commands) and the scan (SSM_VK_PROFILE=1 is set here);
the memory floor: the state rows read once and written once (2 S H P N floats) at the device
bandwidth measured by a plain buffer copy in the same run; and the error of y and the new states
against the float64 oracle.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

os.environ["SSM_VK_PROFILE"] = "1"   # before ssm_vk reads it: a timestamp after the gather

import ssm_vk
from ssm_vk import run as vk_run
from ssm_vk import runtime as rt

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from vk_gpu_check import rel

P, N = 64, 128


def copy_bandwidth(ctx, nbytes=256 << 20, reps=20) -> float:
    """Bytes moved per second (read + write) by one device-local buffer copy, best of ``reps``."""
    a, b = rt.Buffer(ctx, nbytes), rt.Buffer(ctx, nbytes)
    seq = rt.Sequence(ctx)
    seq.timestamp("a")
    seq.copy(a, b, nbytes, 0, 0)
    seq.timestamp("b")
    seq.finish()
    best = 0.0
    for _ in range(reps):
        seq.submit()
        best = max(best, 2 * nbytes / (seq.gpu_times()["b"] * 1e-9))
    seq.close()
    a.close()
    b.close()
    return best


def case(S: int, R: int, H: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    f = np.float32
    a = dict(s=rng.uniform(-0.5, 0.5, (R, H, P, N)).astype(f), x=rng.uniform(-1, 1, (S, 1, H, P)).astype(f),
             dt=rng.uniform(-1, 1, (S, 1, H)).astype(f), A=-rng.uniform(0.2, 1, H).astype(f),
             B=rng.uniform(-0.5, 0.5, (S, 1, 1, N)).astype(f), C=rng.uniform(-0.5, 0.5, (S, 1, 1, N)).astype(f))
    return a, rng.choice(R, S, replace=False).astype(np.int64)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="1/64/80,16/64/80,128/256/48")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from ssm_fast.oracle64 import scan64

    ctx = rt.get_context()
    bw = copy_bandwidth(ctx)
    print(f"device: {ctx.info.name}, {ctx.info.driver}; buffer copy {bw / 1e12:.2f} TB/s (read + write)")
    rows = []
    for spec in args.cases.split(","):
        S, R, H = (int(v) for v in spec.split("/"))
        a, ids = case(S, R, H)
        dev = {k: ssm_vk.to_device(v) for k, v in a.items()}
        for _ in range(20):   # record, warm the clocks
            r = ssm_vk.ssm_scan(**dev, ids=ids)
        want = scan64(**a, ids=ids)
        err = max(rel(r.y.numpy(), want.y), rel(r.states.numpy(), want.states))
        del r
        walls, gpus, gathers = [], [], []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            r = ssm_vk.ssm_scan(**dev, ids=ids)
            walls.append(time.perf_counter() - t0)
            t = vk_run._timing.seq.gpu_times()
            gpus.append(t["end"] / 1e3)
            gathers.append(t.get("gather", float("nan")) / 1e3)
            del r
        floor = 2 * S * H * P * N * 4 / bw * 1e6
        row = dict(S=S, R=R, H=H, P=P, N=N, gpu_us=statistics.median(gpus), wall_us=statistics.median(walls) * 1e6,
                   gather_us=statistics.median(gathers), floor_us=floor, max_rel_err=err)
        row["scan_us"] = row["gpu_us"] - row["gather_us"]
        rows.append(row)
        print(f"S={S:4d} of R={R:4d} H={H:3d}: GPU {row['gpu_us']:7.1f} us (gather {row['gather_us']:6.1f}, "
              f"scan {row['scan_us']:6.1f}), wall {row['wall_us']:7.1f} us, floor {floor:6.1f} us "
              f"({floor / row['gpu_us']:.0%} of it), err {err:.1e}", flush=True)
        for v in dev.values():
            v.release()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=ctx.info.name, driver=ctx.info.driver, copy_bytes_per_s=bw, rows=rows), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
