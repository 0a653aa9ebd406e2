"""Correctness and first timings of ssm_vk on a real GPU, at the benchmark shapes.

For each shape: inputs drawn with the distributions of ggmlR's R test (float32), the float64 oracle
(ssm_fast.oracle64, parallel over the host's cores), then ssm_vk forward and backward with
device-resident inputs: relative error of every output (norm-relative against float64), GPU time
from timestamps and wall time per call (medians). Prints a table and writes JSON.

    python benchmarks/vk_gpu_check.py [--shapes demo,train,...] [--reps 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import numpy as np

import ssm_ref
import ssm_vk
from ssm_fast.oracle64 import scan64, scan_back64
from ssm_vk import run as vk_run

SHAPES = {  # name: (S, T, H, P, N, G, variant)
    "demo": (1, 64, 16, 64, 128, 1, "mamba2"),
    "mid": (1, 512, 48, 64, 128, 1, "mamba2"),
    "train": (8, 2048, 24, 64, 128, 1, "mamba2"),
    "long": (1, 16384, 24, 64, 128, 1, "mamba2"),
    "mamba1": (1, 512, 1536, 1, 16, 1, "mamba1"),
    "m1-train": (8, 2048, 1536, 1, 16, 1, "mamba1"),
    "m1-long": (1, 16384, 1536, 1, 16, 1, "mamba1"),
    "m1-wide": (4, 1024, 5120, 1, 16, 1, "mamba1"),
    "groups": (2, 256, 32, 64, 128, 4, "mamba2"),
    "batch": (4, 128, 24, 64, 128, 2, "mamba2"),
}


def inputs(shape, seed=0):
    S, T, H, P, N, G, variant = shape
    rng = np.random.default_rng(seed)

    def u(lo, hi, sh):
        return rng.uniform(lo, hi, sh).astype(np.float32)

    a_shape = (H, N) if variant == "mamba1" else (H,)
    args = dict(s=u(-0.5, 0.5, (S, H, P, N)), x=u(-1, 1, (S, T, H, P)), dt=u(-0.5, 0.5, (S, T, H)),
                A=-u(0.2, 1.0, a_shape), B=u(-0.5, 0.5, (S, T, G, N)), C=u(-0.5, 0.5, (S, T, G, N)))
    return args, u(-1, 1, (S, T, H, P)), u(-1, 1, (S, H, P, N))


def rel(got, want) -> float:
    g = np.asarray(got, dtype=np.float64)
    w = np.asarray(want, dtype=np.float64)
    n = np.linalg.norm(w)
    return float(np.linalg.norm(g - w) / n) if n else float(np.linalg.norm(g))


def vk_timed(forward, backward=None, where=None):
    """() -> (GPU us, wall us) of ``forward()`` (and ``backward()`` after it, the two summed):
    the wall time of the calls, the GPU time from their command buffers' timestamps
    (ssm_vk.run.last_gpu_ns, read between the calls, outside the wall time). ``where``: a list
    that gets the first result's ``where``."""
    def call():
        t0 = time.perf_counter()
        r = forward()
        t1 = time.perf_counter()
        if where is not None and not where:
            where.append(r.where)
        gpu = vk_run.last_gpu_ns() or math.nan
        if backward is None:
            return gpu / 1e3, (t1 - t0) * 1e6
        t2 = time.perf_counter()
        backward()
        t3 = time.perf_counter()
        del r
        return (gpu + (vk_run.last_gpu_ns() or math.nan)) / 1e3, ((t1 - t0) + (t3 - t2)) * 1e6

    return call


def warm(fn, seconds: float) -> None:
    """Call ``fn`` once, then back to back for ``seconds``: an idle GPU runs at a fraction of its
    clock (an H100: 345 MHz) and raises it only under sustained load. The first call is not
    counted, since it may build pipelines on the host for longer than ``seconds`` (then no load
    would follow it: an H100's first 1 GiB forward was timed at 345-525 MHz so)."""
    fn()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        fn()


def timed(fn, reps):
    walls, gpus = [], []
    out = None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - t0)
        gpus.append(vk_run.last_gpu_ns() or float("nan"))
    return out, statistics.median(walls) * 1e6, statistics.median(gpus) / 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    ctx = ssm_vk.runtime.get_context()
    info = ctx.info
    print(f"device: {info.name} ({info.type}), driver {info.driver}, subgroup {info.subgroup_size}, "
          f"ops {sorted(info.subgroup_ops)}", flush=True)
    rows = []
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        a, g_y, g_states = inputs(shape)
        t0 = time.perf_counter()
        o = scan64(**a)
        og = scan_back64(**a, ids=None, g_y=g_y, g_states=g_states)
        t_oracle = time.perf_counter() - t0
        dev = {k: ssm_vk.to_device(v) for k, v in a.items()}
        dgy, dgs = ssm_vk.to_device(g_y), ssm_vk.to_device(g_states)
        for _ in range(2):  # warm-up: shader builds, pipelines, pool
            ssm_vk.ssm_scan(**dev)
            ssm_vk.ssm_scan_back(**dev, ids=None, g_y=dgy, g_states=dgs)
        r, f_wall, f_gpu = timed(lambda dev=dev: ssm_vk.ssm_scan(**dev), args.reps)
        g, b_wall, b_gpu = timed(lambda dev=dev, dgy=dgy, dgs=dgs: ssm_vk.ssm_scan_back(
            **dev, ids=None, g_y=dgy, g_states=dgs), args.reps)
        errs = {"y": rel(r.y.numpy(), o.y), "states": rel(r.states.numpy(), o.states)}
        for k in ssm_ref.GRAD_NAMES:
            errs[k] = rel(getattr(g, k).numpy(), getattr(og, k))
        row = dict(shape=name, dims=shape, where=r.where, fwd_gpu_us=f_gpu, fwd_wall_us=f_wall,
                   bwd_gpu_us=b_gpu, bwd_wall_us=b_wall, max_rel_err=max(errs.values()), errors=errs,
                   oracle_s=t_oracle)
        rows.append(row)
        print(f"{name:8s} fwd {f_gpu:10.1f} us gpu {f_wall:10.1f} us wall | bwd {b_gpu:10.1f} us gpu "
              f"{b_wall:10.1f} us wall | max rel err {row['max_rel_err']:.2e} "
              + " ".join(f"{k}={v:.1e}" for k, v in errs.items()), flush=True)
        for v in dev.values():
            v.release()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=info.name, driver=info.driver, rows=rows), f, indent=1)
    bad = [r["shape"] for r in rows if not r["max_rel_err"] < 1e-5]
    print("ALL WITHIN 1e-5" if not bad else f"OVER 1e-5: {bad}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
