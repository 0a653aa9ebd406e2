"""Decode steps on ssm_vk: one token (T = 1) for S sequences that read S of R state-cache rows,
every input device-resident, as an inference engine calls the scan once per token and layer.

    python benchmarks/vk_decode.py [--cases 1/64/80,16/64/80,128/256/48] [--reps 200]
                                   [--variants "LN=16;WG=256"] [--update-cache] [--dt-softplus log1p]
                                   [--json out.json]

A case is S/R/H (P = 64, N = 128, G = 1; ids a fixed random choice of S distinct rows). For each
case and tuning variant (SSM_VK_TUNE's knobs), after a second of back-to-back calls (the GPU's
clocks ramp only under load): the median GPU time (timestamps) and wall time per call, and the
GPU time split into the gather of the cache rows (states <- s[ids], copy commands; 0 when the
scan reads them in place) and the scan (SSM_VK_PROFILE=1 is set here); the memory floor: the
state rows read once and written once (2 S H P N floats) at the bandwidth a plain vec4 copy
shader reaches on buffers of that size in the same run (benchmarks/glsl/bench_copy.comp: the
device's cache included, as the scan's); and the error of y and the new states against the
float64 oracle. Each row has the wall-clock span of its timed calls (t0, t1) to read a clock
log by (benchmarks/clocks.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import time
from pathlib import Path

import numpy as np

import ssm_ref
import ssm_vk
from ssm_vk import config
from ssm_vk import engine as vk_engine
from ssm_vk import run as vk_run
from ssm_vk import runtime as rt

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from vk_gpu_check import rel, warm

P, N = 64, 128
BENCH_GLSL = Path(__file__).resolve().parent / "glsl"  # the benchmark's own shaders


def copy_bandwidth(ctx, nbytes: int, seconds: float = 0.3) -> float:
    """Bytes moved per second (read + write) by the vec4 copy shader from one device-local buffer
    of ``nbytes`` into another, best over ``seconds`` of repeats."""
    nbytes = max(16, min(nbytes, ctx.info.max_storage_buffer_range) // 16 * 16)
    wg = 256
    k = rt.Kernel.get(ctx, "bench_copy", bindings=2, push_size=8, local_size=(wg, 1, 1), defines={"WG": wg},
                      search_path=BENCH_GLSL)
    n = nbytes // 16
    groups = min(-(-n // wg), 132 * 32)
    a, b = rt.Buffer(ctx, nbytes), rt.Buffer(ctx, nbytes)
    seq = rt.Sequence(ctx)
    seq.timestamp("a")
    seq.dispatch(k, [a, b], struct.pack("<II", n, groups * wg), (groups, 1, 1))
    seq.timestamp("b")
    seq.finish()
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
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
    ap.add_argument("--warm-s", type=float, default=1.0)
    ap.add_argument("--variants", default="", help="';'-separated SSM_VK_TUNE settings (default: the planner's)")
    ap.add_argument("--update-cache", action="store_true",
                    help="update_cache=True: the new states into the cache rows (it changes call by call)")
    ap.add_argument("--dt-softplus", default="ggml", choices=["ggml", "log1p"],
                    help="the step's form on both sides (ggml's, the default, or the accurate one)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    os.environ["SSM_VK_PROFILE"] = "1"   # read when a workspace is made: a timestamp after the gather
    ctx = rt.get_context()
    big = copy_bandwidth(ctx, 1 << 30, 1.0)
    print(f"device: {ctx.info.name}, {ctx.info.driver}; copy shader {big / 1e12:.2f} TB/s (up to 1 GiB, read + write)",
          flush=True)
    variants = args.variants.split(";") if args.variants else [""]
    rows = []
    for spec in args.cases.split(","):
        S, R, H = (int(v) for v in spec.split("/"))
        a, ids = case(S, R, H)
        dev = {k: ssm_vk.to_device(v) for k, v in a.items()}
        moved = 2 * S * H * P * N * 4
        bw = copy_bandwidth(ctx, moved // 2)
        want = ssm_ref.ssm_scan(**a, ids=ids, dtype=np.float64, dt_softplus=args.dt_softplus)
        for var in variants:
            tuned = config.configure(tune=config.parse_tune(var, "--variants"))
            vk_engine.clear(ctx)
            kw = {"dt_softplus": args.dt_softplus}
            if args.update_cache:
                kw["update_cache"] = True
            if args.update_cache:   # the error of one call from the original cache, then the timing
                dev["s"].release()
                dev["s"] = ssm_vk.to_device(a["s"])
                r = ssm_vk.ssm_scan(**dev, ids=ids, **kw)
                err = max(rel(r.y.numpy(), want.y), rel(dev["s"].numpy()[ids], want.states))
            warm(lambda dev=dev, ids=ids, kw=kw: ssm_vk.ssm_scan(**dev, ids=ids, **kw), args.warm_s)
            r = ssm_vk.ssm_scan(**dev, ids=ids, **kw)
            if not args.update_cache:
                err = max(rel(r.y.numpy(), want.y), rel(r.states.numpy(), want.states))
            del r
            walls, gpus, gathers = [], [], []
            t0 = time.time()
            for _ in range(args.reps):
                c0 = time.perf_counter()
                r = ssm_vk.ssm_scan(**dev, ids=ids, **kw)
                walls.append(time.perf_counter() - c0)
                t = vk_run.last_sequence().gpu_times()
                gpus.append(t["end"] / 1e3)
                gathers.append(t.get("gather", float("nan")) / 1e3)
                del r
            t1 = time.time()
            tuned.restore()
            floor = moved / bw * 1e6
            row = dict(S=S, R=R, H=H, P=P, N=N, variant=var or "default", update_cache=args.update_cache,
                       dt_softplus=args.dt_softplus,
                       gpu_us=statistics.median(gpus),
                       gpu_min_us=min(gpus), wall_us=statistics.median(walls) * 1e6,
                       gather_us=statistics.median(gathers), copy_bytes_per_s=bw, floor_us=floor,
                       max_rel_err=err, t0=t0, t1=t1)
            row["scan_us"] = row["gpu_us"] - row["gather_us"]
            rows.append(row)
            print(f"S={S:4d} of R={R:4d} H={H:3d} {var or 'default':12s}: GPU {row['gpu_us']:7.1f} us "
                  f"(min {row['gpu_min_us']:7.1f}; gather {row['gather_us']:5.1f}, scan {row['scan_us']:7.1f}), "
                  f"wall {row['wall_us']:7.1f} us, floor {floor:6.1f} us at {bw / 1e12:.2f} TB/s "
                  f"({floor / row['gpu_us']:.0%} of it), err {err:.1e}", flush=True)
        for v in dev.values():
            v.release()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=ctx.info.name, driver=ctx.info.driver, copy_1gib_bytes_per_s=big, rows=rows),
                      fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
