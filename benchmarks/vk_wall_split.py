"""Where a call's wall time goes: host and GPU events of one ssm_vk call on one clock.

    python benchmarks/vk_wall_split.py [--cases dec:16/64/80,dec:128/256/48,step:1/64/16] [--reps 300]
                                       [--spin-us 200,0] [--json out.json]

Needs calibrated timestamps (VK_KHR/EXT_calibrated_timestamps with CLOCK_MONOTONIC: NVIDIA's and
AMD's Linux drivers, lavapipe): the GPU's timestamps at the start and the end of the call's
command buffer are placed on the host's clock (``Sequence.host_times``) between the host's own
events, which this script records by wrapping ``Sequence.submit`` and ``Sequence.wait``. For each
call (median over ``--reps`` calls, after a second of warm-up), in microseconds:

    before    the call's Python up to its sequence's submit (validation, look-ups, outputs)
    submit    Sequence.submit up to its wait: vkResetFences + vkQueueSubmit and bookkeeping
    launch    from there to the GPU's first timestamp (the driver and the GPU's front end)
    gpu       the GPU's first to last timestamp (what the benchmarks report as GPU time)
    done      from the last timestamp to the wait's return (the end-of-buffer barrier, the fence,
              the poll or the driver's wake-up)
    after     from the wait's return to the call's return (results, the non-finite check)
    wall      the whole call; wall - gpu is what the host adds

Cases: ``dec:S/R/H`` a decode step (T = 1, P = 64, N = 128, S of R cache rows, device-resident
inputs, ids a numpy array); ``step:S/T/H`` a Mamba-2 forward and backward (P = 64, N = 128, G = 1)
on device arrays, each call split (the backward repeated alone, right after its forward, and
with the forward's tables dropped before each call); each also prepared once (``ssm_vk.prepare_scan`` /
``prepare_scan_back``) and replayed by ``run()``. Beside them, on the same clock, the two bare sequences that
bound what any call pays: an empty command buffer (two timestamps), and the benchmark's vec4 copy
shader moving the bytes the decode step moves (its state rows read and written once), so the
launch and done of a scan can be read against those of a plain kernel of the same size.
``--stages`` adds each call's GPU time by stage (``SSM_VK_PROFILE=1``: a timestamp after each
stage, which adds barriers). ``--spin-us`` runs each case under each fence-poll setting
(``SSM_VK_SPIN_US``: 0 sleeps in the driver at once). ``submits`` counts vkQueueSubmit per call.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import struct
import sys
import time
from pathlib import Path

import numpy as np

import ssm_vk
from ssm_vk import engine as vk_engine
from ssm_vk import run as vk_run
from ssm_vk import runtime as rt

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import clocks
from vk_decode import case as decode_case  # the decode steps' inputs, as vk_decode times them

P, N = 64, 128
BENCH_GLSL = Path(__file__).resolve().parent / "glsl"
SEGMENTS = ("before", "submit", "launch", "gpu", "done", "after", "wall")


class Recorder:
    """Host times of Sequence.submit's entry and of Sequence.wait's entry and return (the last
    of each in a call), on time.monotonic's clock, while ``on``."""

    def __init__(self, stages: bool = False):
        self.on = False
        self.stages = stages
        self.submits = 0
        self.sub_in = self.wait_in = self.wait_out = None
        submit, wait = rt.Sequence.submit, rt.Sequence.wait
        rec = self

        def submit_wrapped(seq, *a, **k):
            if rec.on and not seq.internal:
                rec.submits += 1
                rec.sub_in = time.monotonic()
            return submit(seq, *a, **k)

        def wait_wrapped(seq, *a, **k):
            mine = rec.on and seq.pending and not seq.internal
            if mine:
                rec.wait_in = time.monotonic()
            try:
                return wait(seq, *a, **k)
            finally:
                if mine:
                    rec.wait_out = time.monotonic()

        rt.Sequence.submit, rt.Sequence.wait = submit_wrapped, wait_wrapped

    def split(self, fn, seq_of) -> dict:
        """Run ``fn()`` once and split its wall time; ``seq_of(result)`` is the call's sequence."""
        self.submits, self.on = 0, True
        t0 = time.monotonic()
        r = fn()
        t1 = time.monotonic()
        self.on = False
        h = seq_of(r).host_times()
        g0, g1 = h["start"], h["end"]
        us = 1e6
        out = dict(before=(self.sub_in - t0) * us, submit=(self.wait_in - self.sub_in) * us,
                   launch=(g0 - self.wait_in) * us, gpu=(g1 - g0) * us, done=(self.wait_out - g1) * us,
                   after=(t1 - self.wait_out) * us, wall=(t1 - t0) * us, submits=self.submits)
        if self.stages:   # each labelled timestamp's time since the one before it, us
            t = sorted(seq_of(r).gpu_times().items(), key=lambda kv: kv[1])
            out["stages"] = {k: (v - u) / 1e3 for (_, u), (k, v) in itertools.pairwise(t)}
        del r
        return out


def median_split(rec: Recorder, fn, seq_of, reps: int, warm_s: float, pre=None) -> dict:
    """Medians of ``reps`` splits of ``fn`` after ``warm_s`` of calls; ``pre()`` (untimed) runs
    before each call."""
    end = time.monotonic() + warm_s
    while time.monotonic() < end:
        if pre is not None:
            pre()
        fn()
    rows = []
    t0 = time.time()
    for _ in range(reps):
        if pre is not None:
            pre()
        rows.append(rec.split(fn, seq_of))
    out = {k: statistics.median(r[k] for r in rows) for k in (*SEGMENTS, "submits")}
    out.update(t0=t0, t1=time.time())   # the timed calls' span, to read a clock log by (benchmarks/clocks.py)
    if rows and "stages" in rows[0] and all(r["stages"].keys() == rows[0]["stages"].keys() for r in rows):
        out["stages"] = {k: statistics.median(r["stages"][k] for r in rows) for k in rows[0]["stages"]}
    return out


def bare(ctx, nbytes: int):
    """A finished sequence: two timestamps around the copy shader over ``nbytes`` (0: nothing)."""
    seq = rt.Sequence(ctx)
    keep = []
    seq.timestamp("start")
    if nbytes:
        wg = 256
        k = rt.Kernel.get(ctx, "bench_copy", bindings=2, push_size=8, local_size=(wg, 1, 1), defines={"WG": wg},
                          search_path=BENCH_GLSL)
        nbytes = max(16, min(nbytes, ctx.info.max_storage_buffer_range) // 16 * 16)
        n = nbytes // 16
        groups = min(-(-n // wg), 132 * 32)
        a, b = rt.Buffer(ctx, nbytes), rt.Buffer(ctx, nbytes)
        keep += [a, b]
        seq.dispatch(k, [a, b], struct.pack("<II", n, groups * wg), (groups, 1, 1))
    seq.timestamp("end")
    seq.finish()
    return seq, keep


def step_case(S, T, H, seed=0):
    rng = np.random.default_rng(seed)
    f = np.float32
    a = dict(s=rng.uniform(-0.5, 0.5, (S, H, P, N)).astype(f), x=rng.uniform(-1, 1, (S, T, H, P)).astype(f),
             dt=rng.uniform(-1, 1, (S, T, H)).astype(f), A=-rng.uniform(0.2, 1, H).astype(f),
             B=rng.uniform(-0.5, 0.5, (S, T, 1, N)).astype(f), C=rng.uniform(-0.5, 0.5, (S, T, 1, N)).astype(f))
    g = dict(g_y=rng.uniform(-1, 1, (S, T, H, P)).astype(f), g_states=rng.uniform(-1, 1, (S, H, P, N)).astype(f))
    return a, g


def fmt(name: str, r: dict) -> str:
    line = f"{name:34s} " + " ".join(f"{k} {r[k]:7.1f}" for k in SEGMENTS) + f"  submits {r['submits']:.0f}"
    if len(r.get("stages", {})) > 1:
        line += "\n    GPU stages (us): " + ", ".join(f"{k} {v:.1f}" for k, v in r["stages"].items())
    return line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="dec:1/64/80,dec:16/64/80,dec:128/256/48,step:1/64/16")
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--warm-s", type=float, default=1.0)
    ap.add_argument("--spin-us", default="200,0", help="comma-separated fence-poll times (SSM_VK_SPIN_US)")
    ap.add_argument("--stages", action="store_true",
                    help="SSM_VK_PROFILE=1: each call's GPU time by stage too (its timestamps add barriers)")
    ap.add_argument("--clocks", default=None,
                    help="nvidia-smi log of gpu_env.sh (default $OUT/clocks.csv if present): SM clock per row")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.stages:
        os.environ["SSM_VK_PROFILE"] = "1"   # read when a workspace is made
    ctx = rt.get_context()
    if not ctx.calibration:
        print(f"{ctx.info.name}: no calibrated timestamps on CLOCK_MONOTONIC; nothing to split", file=sys.stderr)
        return 2
    print(f"device: {ctx.info.name}, {ctx.info.driver}; {ctx.calibration}", flush=True)
    rec = Recorder(args.stages)
    rows = []
    last = lambda _r: vk_run.last_sequence()  # noqa: E731 -- the call's main sequence
    for spin in (float(v) for v in args.spin_us.split(",")):
        ctx.spin_s = spin / 1e6
        empty, _ = bare(ctx, 0)
        r = median_split(rec, empty.submit, lambda _r, s=empty: s, args.reps, 0.2)
        rows.append(dict(case="empty", spin_us=spin, **r))
        print(fmt(f"empty command buffer, spin {spin:g}", r), flush=True)
        for spec in args.cases.split(","):
            kind, dims = spec.split(":")
            A, B, C = (int(v) for v in dims.split("/"))
            if kind == "dec":
                a, ids = decode_case(A, B, C)
                dev = {k: ssm_vk.to_device(v) for k, v in a.items()}
                r = median_split(rec, lambda dev=dev, ids=ids: ssm_vk.ssm_scan(**dev, ids=ids), last, args.reps,
                                 args.warm_s)
                rows.append(dict(case=spec, op="fwd", spin_us=spin, **r))
                print(fmt(f"{spec} fwd, spin {spin:g}", r), flush=True)
                with ssm_vk.prepare_scan(**dev, ids=ids) as prepared:
                    r = median_split(rec, prepared.run, last, args.reps, args.warm_s)
                rows.append(dict(case=spec, op="fwd prepared", spin_us=spin, **r))
                print(fmt(f"{spec} fwd prepared, spin {spin:g}", r), flush=True)
                copy, keep = bare(ctx, A * C * P * N * 4)
                r = median_split(rec, copy.submit, lambda _r, s=copy: s, args.reps, 0.3)
                rows.append(dict(case=spec, op="copy", spin_us=spin, **r))
                print(fmt(f"{spec} copy of its bytes, spin {spin:g}", r), flush=True)
                copy.close()
                for b in keep:
                    b.close()
            else:
                a, g = step_case(A, B, C)
                dev = {k: ssm_vk.to_device(v) for k, v in a.items()}
                dg = {k: ssm_vk.to_device(v) for k, v in g.items()}
                ids = np.arange(A, dtype=np.int64)
                fwd = lambda dev=dev, ids=ids: ssm_vk.ssm_scan(**dev, ids=ids)  # noqa: E731
                bwd = lambda dev=dev, dg=dg, ids=ids: ssm_vk.ssm_scan_back(**dev, **dg, ids=ids)  # noqa: E731
                eng = vk_engine.engine_of(ctx)
                kept = eng.kept
                # The backward three ways: repeated alone (the tables its forward left, if any, taken
                # each time), right after its forward (a training step), and with no tables kept
                # (the forward recomputed inside it, as a prepared backward does).
                for op, fn, pre in (("fwd", fwd, None), ("bwd", bwd, None), ("bwd after fwd", bwd, fwd),
                                    ("bwd without tables", bwd, kept.clear)):
                    taken = eng.states_reused
                    r = median_split(rec, fn, last, args.reps, args.warm_s, pre)
                    r["tables_taken"] = eng.states_reused - taken   # backwards that took the forward's tables
                    rows.append(dict(case=spec, op=op, spin_us=spin, **r))
                    print(fmt(f"{spec} {op}, spin {spin:g}", r) + f"  tables taken {r['tables_taken']}", flush=True)
                with ssm_vk.prepare_scan(**dev, ids=ids) as pf, \
                        ssm_vk.prepare_scan_back(**dev, **dg, ids=ids) as pb:
                    for op, fn in (("fwd prepared", pf.run), ("bwd prepared", pb.run)):
                        r = median_split(rec, fn, last, args.reps, args.warm_s)
                        rows.append(dict(case=spec, op=op, spin_us=spin, **r))
                        print(fmt(f"{spec} {op}, spin {spin:g}", r), flush=True)
                for v in dg.values():
                    v.release()
            for v in dev.values():
                v.release()
        empty.close()
    log = args.clocks or os.path.join(os.environ.get("OUT", ""), "clocks.csv")
    epoch = os.path.join(os.path.dirname(log), "clock_epoch.txt")
    if os.path.exists(log) and os.path.exists(epoch):   # the SM clock (min/median/max MHz) of each row
        clk = clocks.samples(log, epoch)
        print("SM clock during each row's timed calls (min/median/max MHz):")
        for r in rows:
            r["sm_mhz"] = clocks.during(clk, [r["t0"], r["t1"]])
            print(f"  {r['case']} {r.get('op', '')}, spin {r['spin_us']:g}: gpu {r['gpu']:.1f} us at {r['sm_mhz']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=ctx.info.name, driver=ctx.info.driver, calibration=ctx.calibration,
                           date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), rows=rows), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
