"""GPU speed of ssm_vk: ceilings of this stack, then forward / backward GPU time per shape and
tuning variant, with the error of each against the float64 oracle.

    python benchmarks/vk_speed.py [--shapes demo,mid,train,long] [--variants "LN=32;LN=8,WG=128"]
                                  [--dt-softplus ggml|log1p|none]

Steps: (1) warm the GPU (clocks ramp under load); (2) FMA ceiling of a simple shader through this
stack (TFLOP/s); (3) one pre-recorded empty submit + wait from Python; (4) per shape and variant:
median GPU time (timestamps) and wall time per device-resident call, max relative error.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import sys
import time
from pathlib import Path

import ssm_ref
import ssm_vk
from ssm_vk import config, registry
from ssm_vk import engine as vk_engine
from ssm_vk import run as vk_run
from ssm_vk import runtime as rt
from ssm_vk.sequential.sequential_planner import layout_for
from ssm_vk.sizing import Limits

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from vk_gpu_check import SHAPES, inputs, rel, warm

BENCH_GLSL = Path(__file__).resolve().parent / "glsl"  # the benchmark's own shaders (not the product's)


def fma_ceiling(ctx, seconds=1.0):
    wg = 256
    k = rt.Kernel.get(ctx, "bench_fma", bindings=1, push_size=8, local_size=(wg, 1, 1), defines={"WG": wg},
                      search_path=BENCH_GLSL)
    groups = 132 * 64
    buf = rt.Buffer(ctx, groups * wg * 4)
    iters = 4096
    seq = rt.Sequence(ctx)
    seq.timestamp("a")
    seq.dispatch(k, [buf], struct.pack("<II", iters, groups), (groups, 1, 1))
    seq.timestamp("b")
    seq.finish()
    t_end = time.perf_counter() + seconds
    best = 0.0
    while time.perf_counter() < t_end:
        seq.submit()
        ns = seq.gpu_times()["b"]
        best = max(best, groups * wg * iters * 16 / ns / 1e3)  # TFLOP/s
    seq.close()
    buf.close()
    return best


def submit_cost(ctx, n=300):
    seq = rt.Sequence(ctx)
    seq.finish()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        seq.submit()
        ts.append(time.perf_counter() - t0)
    seq.close()
    return statistics.median(ts) * 1e6


def replay_wall(reps=50):
    """Median wall time of resubmitting the last recorded sequence alone (driver + GPU, no
    Python of ours), in us."""
    seq = vk_run.last_sequence()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        seq.submit()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def split():
    """Microseconds between consecutive timestamps of the last call (SSM_VK_PROFILE=1 records one
    after each step of the chunked kernels), or {}."""
    seq = vk_run.last_sequence()
    times = seq.gpu_times() if seq is not None else {}
    if len(times) <= 2:
        return {}
    out, prev = {}, 0.0
    for k, v in times.items():
        if k != "start":
            out[k] = (v - prev) / 1e3
            prev = v
    return out


def measure(fn, reps):
    warm(fn, 0.6)
    walls, gpus = [], []
    PHASES.append(time.time())
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - t0)
        gpus.append(vk_run.last_gpu_ns() or float("nan"))
    PHASES.append(time.time())
    return out, statistics.median(gpus) / 1e3, statistics.median(walls) * 1e6, min(gpus) / 1e3


PHASES: list = []   # wall-clock start and end of each measure()'s timed calls (to read the clocks log by)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="demo,mid,train,long,mamba1")
    ap.add_argument("--variants", default="")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--dt-softplus", default="ggml", choices=["ggml", "log1p", "none"],
                    help="the step's form of every call (the error is checked for ggml's form only)")
    args = ap.parse_args(argv)
    form = None if args.dt_softplus == "none" else args.dt_softplus
    kw = {} if form == "ggml" else {"dt_softplus": form}
    from ssm_fast.oracle64 import scan64, scan_back64

    ctx = rt.get_context()
    info = ctx.info
    print(f"device: {info.name}, {info.driver}, subgroup {info.subgroup_size}", flush=True)
    tflops = fma_ceiling(ctx, 1.5)
    print(f"FMA ceiling: {tflops:.1f} TFLOP/s (float32, 8 chains per invocation)", flush=True)
    print(f"empty submit+wait: {submit_cost(ctx):.1f} us", flush=True)
    variants = [v for v in args.variants.split(";")] if args.variants else [""]
    rows = []
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        a, g_y, g_states = inputs(shape)
        ref = None
        if not args.no_check and form == "ggml":
            ref = (scan64(**a), scan_back64(**a, ids=None, g_y=g_y, g_states=g_states))
        dev = {k: ssm_vk.to_device(v) for k, v in a.items()}
        dgy, dgs = ssm_vk.to_device(g_y), ssm_vk.to_device(g_states)
        S, T, H, P, N, _, _ = shape
        updates = S * T * H * P * N
        for var in variants:
            t_case = time.time()
            tuned = config.configure(tune=config.parse_tune(var, "--variants"))
            vk_engine.clear(ctx)
            for _ in range(3):
                ssm_vk.ssm_scan(**dev, **kw)
                ssm_vk.ssm_scan_back(**dev, ids=None, g_y=dgy, g_states=dgs, **kw)
            r, fg, fw, fmin = measure(lambda dev=dev: ssm_vk.ssm_scan(**dev, **kw), args.reps)
            f_split = split()
            f_replay = replay_wall()
            g, bg, bw, bmin = measure(lambda dev=dev, dgy=dgy, dgs=dgs: ssm_vk.ssm_scan_back(
                **dev, ids=None, g_y=dgy, g_states=dgs, **kw), args.reps)
            b_split = split()
            b_replay = replay_wall()

            def step(dev=dev, dgy=dgy, dgs=dgs):
                ssm_vk.ssm_scan(**dev, **kw)
                return ssm_vk.ssm_scan_back(**dev, ids=None, g_y=dgy, g_states=dgs, **kw)
            _, _, step_wall, _ = measure(step, args.reps)
            err = float("nan")
            if ref is not None:
                errs = [rel(r.y.numpy(), ref[0].y), rel(r.states.numpy(), ref[0].states)]
                errs += [rel(getattr(g, k).numpy(), getattr(ref[1], k)) for k in
                         ("d_s", "d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C")]
                err = max(errs)
            dims = ssm_ref.check_forward(**dev, keep_device=True).dims
            lay = layout_for(dims, Limits.of(info), True)
            # what ran: the Mamba-1 kernels with time in threads, or the token-sequential layout
            fp = [registry.plan(dims, Limits.of(info), b) for b in (False, True)]
            m1 = [f.plan if f.family.name == "m1" else None for f in fp]
            ran = (f"M1 fwd NW={m1[0].NW} TI={m1[0].TI} NCH={m1[0].NCH}, bwd NW={m1[1].NW} TI={m1[1].TI} "
                   f"NB={m1[1].NB} NCH={m1[1].NCH}" if m1[0] and m1[1] else
                   f"LN={lay.LN} NPL={lay.NPL} WG={lay.WG} K={lay.K} RS={lay.ROW_SUM}")
            tuned.restore()
            row = dict(shape=name, variant=var or "default", dt_softplus=args.dt_softplus, layout=ran,
                       fwd_gpu_us=fg, fwd_min_us=fmin,
                       fwd_wall_us=fw, bwd_gpu_us=bg, bwd_min_us=bmin, bwd_wall_us=bw, max_rel_err=err,
                       fwd_gupd_s=updates / fg / 1e3, bwd_gupd_s=updates / bg / 1e3,
                       fwd_replay_us=f_replay, bwd_replay_us=b_replay)
            row.update(fwd_split_us=f_split, bwd_split_us=b_split, step_wall_us=step_wall,
                       t_start=t_case, t_end=time.time(), fwd_t=PHASES[-6:-4], bwd_t=PHASES[-4:-2],
                       step_t=PHASES[-2:])
            rows.append(row)
            print(f"{name:7s} {var or 'default':18s} fwd {fg:8.1f} us (wall {fw:8.1f}, replay {f_replay:8.1f}) "
                  f"bwd {bg:9.1f} us (wall {bw:9.1f}, replay {b_replay:9.1f}) step wall {step_wall:9.1f} err {err:.1e} "
                  f"fwd {row['fwd_gupd_s']:.0f} Gupd/s "
                  f"{ran}", flush=True)
            for lab, sp in (("fwd", f_split), ("bwd", b_split)):
                if sp:
                    print("        " + lab + " split: " + " ".join(f"{k} {v:.1f}" for k, v in sp.items()), flush=True)
        for v in dev.values():
            v.release()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=info.name, driver=info.driver, fma_tflops=tflops, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
