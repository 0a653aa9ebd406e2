"""CPU benchmark: ssm_fast against ssm_ref and a PyTorch (autograd) implementation.

    /tmp/venv-bench/bin/python benchmarks/bench_cpu.py            # all shapes, markdown table
    /tmp/venv-bench/bin/python benchmarks/bench_cpu.py --shapes demo,mamba1 --reps 31 --json out.json

torch is a benchmark-only dependency (see docs/BENCHMARKS.md for the environment). Every
implementation runs in this one process with THREADS threads (numba and torch), and the
measurements are interleaved: each round runs every (implementation, op) once, in turn, so slow
phases of a shared machine hit all of them alike. Reported: the median over rounds (and the
minimum), in milliseconds.

Ops: "fwd" returns y and the final states; "bwd" is the backward alone (ssm_fast and ssm_ref
recompute the states inside; for torch only ``loss.backward()`` on a graph built beforehand);
"fwd+bwd" is a training step: the forward with whatever it keeps for the backward, then the
backward.

A probe before and after the run reports how much of THREADS cores the process actually got:
the speed-up of a fixed numba parallel loop from 1 to THREADS threads (2.0 = two free cores).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

THREADS = 2
os.environ.setdefault("NUMBA_NUM_THREADS", str(THREADS))
# libgomp's default spin-then-sleep wait costs ~8 ms per parallel region on this shared VM
# (docs/BENCHMARKS.md); the passive policy applies to numba's and torch's OpenMP alike.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numba  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_scan  # noqa: E402

import ssm_fast  # noqa: E402
import ssm_ref  # noqa: E402

# name: (variant, N, P, H, G, T, S)
SHAPES = {
    "demo": ("mamba2", 128, 64, 16, 1, 64, 1),
    "prefill": ("mamba2", 128, 64, 24, 1, 512, 1),
    "batch": ("mamba2", 128, 64, 24, 2, 128, 4),
    "mamba1": ("mamba1", 16, 1, 1536, 1, 512, 1),
}
# Targets of the issue (ms, 2 cores): fwd, bwd, fwd+bwd.
TARGETS = {
    "demo": (0.7, 2.9, 2.3),
    "prefill": (7.5, 37.0, 19.0),
    "batch": (9.1, 34.0, 20.0),
    "mamba1": (20.0, 19.0, 48.0),
}
OPS = ("fwd", "bwd", "fwd+bwd")


def make_inputs(name, seed=0):
    variant, N, P, H, G, T, S = SHAPES[name]
    rng = np.random.default_rng(seed)
    f = np.float32
    a_shape = (H, N) if variant == "mamba1" else (H,)
    p = dict(s=rng.uniform(-0.5, 0.5, (S, H, P, N)).astype(f), x=rng.uniform(-1, 1, (S, T, H, P)).astype(f),
             dt=rng.uniform(-0.5, 0.5, (S, T, H)).astype(f), A=(-rng.uniform(0.2, 1.0, a_shape)).astype(f),
             B=rng.uniform(-0.5, 0.5, (S, T, G, N)).astype(f), C=rng.uniform(-0.5, 0.5, (S, T, G, N)).astype(f),
             ids=np.arange(S))
    g_y = rng.uniform(-1, 1, (S, T, H, P)).astype(f)
    g_states = rng.uniform(-1, 1, (S, H, P, N)).astype(f)
    return p, g_y, g_states


def numpy_ops(mod, p, g_y, g_states):
    def fwd():
        return mod.ssm_scan(**p)

    def bwd():
        return mod.ssm_scan_back(**p, g_y=g_y, g_states=g_states)

    def step():
        fwd()
        return bwd()

    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": step}


def torch_ops(p, g_y, g_states):
    leaves = {k: torch.from_numpy(v).requires_grad_(k != "ids") for k, v in p.items()}
    gy, gs = torch.from_numpy(g_y), torch.from_numpy(g_states)

    def zero():
        for k, v in leaves.items():
            if k != "ids":
                v.grad = None

    def loss():
        y, st = torch_scan.scan(**leaves)
        return (y * gy).sum() + (st * gs).sum()

    def fwd():
        with torch.no_grad():
            return torch_scan.scan(**leaves)

    graph = {}

    def prepare_bwd():
        zero()
        graph["loss"] = loss()

    def bwd():
        graph.pop("loss").backward()

    def step():
        zero()
        loss().backward()

    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": step}, {"bwd": prepare_bwd}, leaves


def check_torch(name, leaves, fast):
    """Norm-relative difference of torch's results to ssm_fast's (both float32)."""
    p = {k: v.detach() for k, v in leaves.items()}
    with torch.no_grad():
        y, _ = torch_scan.scan(**p)
    return float(np.linalg.norm(y.numpy() - fast.y) / np.linalg.norm(fast.y))


@numba.njit(parallel=True, cache=True)
def _probe_kernel(n):
    acc = np.zeros(64)
    for k in numba.prange(64):
        v = 0.0
        for _ in range(n):
            v = v * 0.999999 + 1.0
        acc[k] = v
    return acc.sum()


def probe() -> float:
    """Speed-up of a fixed parallel loop from 1 to THREADS threads (THREADS = all cores free)."""
    _probe_kernel(10)
    times = {}
    for t in (1, THREADS):
        numba.set_num_threads(t)
        best = []
        for _ in range(5):
            t0 = time.perf_counter()
            _probe_kernel(200_000)
            best.append(time.perf_counter() - t0)
        times[t] = min(best)
    numba.set_num_threads(THREADS)
    return times[1] / times[THREADS]


def bench_shape(name, reps, ref_reps):
    p, g_y, g_states = make_inputs(name)
    impls = {"ssm_fast": (numpy_ops(ssm_fast, p, g_y, g_states), {})}
    t_ops, t_prep, leaves = torch_ops(p, g_y, g_states)
    impls["torch"] = (t_ops, t_prep)
    if ref_reps:
        impls["ssm_ref"] = (numpy_ops(ssm_ref, p, g_y, g_states), {})
    # warm up (compiles numba on first use, builds torch's kernels)
    for ops, prep in impls.values():
        for op, fn in ops.items():
            if op in prep:
                prep[op]()
            fn()
    times = {(impl, op): [] for impl in impls for op in OPS}
    for r in range(reps):
        for impl, (ops, prep) in impls.items():
            if impl == "ssm_ref" and r >= ref_reps:
                continue
            for op, fn in ops.items():
                if op in prep:
                    prep[op]()
                t0 = time.perf_counter()
                fn()
                times[(impl, op)].append(time.perf_counter() - t0)
    fast = ssm_fast.ssm_scan(**p)
    diff = check_torch(name, leaves, fast)
    return {f"{impl} {op}": {"median_ms": 1e3 * float(np.median(v)), "min_ms": 1e3 * float(np.min(v)), "n": len(v)}
            for (impl, op), v in times.items() if v} | {"torch_vs_fast_y_rel": diff}


def environment() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"date": datetime.datetime.now().isoformat(timespec="minutes"), "cpu": cpu,
            "cpus": os.cpu_count(), "threads": THREADS, "numba": numba.__version__, "numpy": np.__version__,
            "torch": torch.__version__, "python": platform.python_version(),
            "numba_threading_layer": numba.threading_layer(), "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY")}


def markdown(results, env) -> str:
    lines = [f"Machine: {env['cpu']}, {env['cpus']} CPUs, {env['threads']} threads; {env['date']}; "
             f"numba {env['numba']} ({env['numba_threading_layer']}), numpy {env['numpy']}, torch {env['torch']}, "
             f"OMP_WAIT_POLICY={env['OMP_WAIT_POLICY']}. Probe (speed-up 1 -> {env['threads']} threads): "
             f"{env['probe_before']:.2f} before, {env['probe_after']:.2f} after; load average {env['loadavg']}.",
             "",
             "| shape | op | ssm_fast median (min) | target | fast / target | torch median (min) | torch / fast "
             "| ssm_ref median |",
             "|---|---|---|---|---|---|---|---|"]
    for name, res in results.items():
        for k, op in enumerate(OPS):
            f = res[f"ssm_fast {op}"]
            t = res[f"torch {op}"]
            r = res.get(f"ssm_ref {op}")
            target = TARGETS[name][k]
            lines.append(
                f"| {name} | {op} | {f['median_ms']:.2f} ({f['min_ms']:.2f}) | {target:g} | "
                f"{f['median_ms'] / target:.2f} | {t['median_ms']:.2f} ({t['min_ms']:.2f}) | "
                f"{t['median_ms'] / f['median_ms']:.1f} | {r['median_ms']:.1f} |" if r else
                f"| {name} | {op} | {f['median_ms']:.2f} ({f['min_ms']:.2f}) | {target:g} | "
                f"{f['median_ms'] / target:.2f} | {t['median_ms']:.2f} ({t['min_ms']:.2f}) | "
                f"{t['median_ms'] / f['median_ms']:.1f} | - |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of " + ", ".join(SHAPES))
    ap.add_argument("--reps", type=int, default=21, help="interleaved rounds per shape (default 21)")
    ap.add_argument("--ref-reps", type=int, default=3, help="rounds that include ssm_ref (0: skip it)")
    ap.add_argument("--json", help="also write the raw results here")
    args = ap.parse_args(argv)
    numba.set_num_threads(THREADS)
    torch.set_num_threads(THREADS)
    ssm_fast.warmup()
    env = environment()
    env["probe_before"] = probe()
    results = {}
    for name in args.shapes.split(","):
        results[name] = bench_shape(name, args.reps, args.ref_reps)
        print(f"{name}: done", file=sys.stderr, flush=True)
    env["probe_after"] = probe()
    env["loadavg"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(markdown(results, env))
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
