"""ssm_fast on a busy machine: each shape's time with and without two busy processes, in one run.

    python benchmarks/contention.py                      # the benchmark shapes and the decode steps
    python benchmarks/contention.py --configs default,serial --shapes demo,decode1 --rounds 9
    python benchmarks/contention.py --json out.json

Every configuration (threading layer, wait policy, threads: CONFIGS) runs in its own worker process,
started once, which holds the inputs and answers "time this call n times" over a pipe. The load
is two processes spinning in ``while True: pass``, started once and switched on and off with
SIGCONT / SIGSTOP, so quiet and loaded measurements alternate round by round and every worker
sees the same slow and fast phases of the machine. Reported per (configuration, shape, op): the
median over rounds of each round's median, quiet and loaded, and their ratio; also ssm_ref, the
memory floor of a decode step (numpy copying the state once: read it, write it) and the machine's
load average before and after.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name: (variant, N, P, H, G, T, S)
SHAPES = {
    "demo": ("mamba2", 128, 64, 16, 1, 64, 1),
    "prefill": ("mamba2", 128, 64, 24, 1, 512, 1),
    "batch": ("mamba2", 128, 64, 24, 2, 128, 4),
    "mamba1": ("mamba1", 16, 1, 1536, 1, 512, 1),
    "decode1": ("mamba2", 128, 64, 24, 1, 1, 1),
    "decode4": ("mamba2", 128, 64, 24, 1, 1, 4),
    "decode16": ("mamba2", 128, 64, 24, 1, 1, 16),
    "decode1h80": ("mamba2", 128, 64, 80, 1, 1, 1),
    "decode16h80": ("mamba2", 128, 64, 80, 1, 1, 16),
}
DEFAULT_SHAPES = "demo,prefill,batch,mamba1,decode1,decode4,decode16,decode1h80,decode16h80"

# name: environment of the worker (on top of this process's, minus the variables listed here).
# The "old-*" configurations run another checkout of the library, given by --old (e.g. the commit
# before the thread pool: numba parallel=True kernels), with its own numba cache directory.
CONFIGS = {
    "default": {},                                   # what a user gets: the library's own choices
    "serial": {"NUMBA_NUM_THREADS": "1"},            # one thread: the single-thread time
    "old-omp": {"NUMBA_THREADING_LAYER": "omp"},
    "old-omp-passive": {"NUMBA_THREADING_LAYER": "omp", "OMP_WAIT_POLICY": "PASSIVE"},
    "old-workqueue": {"NUMBA_THREADING_LAYER": "workqueue"},
    "old-serial": {"NUMBA_NUM_THREADS": "1"},
}
CLEARED = ("NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER", "OMP_WAIT_POLICY")

WORKER = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
import ssm_fast, ssm_ref
shapes = json.loads(sys.argv[2])

def inputs(variant, N, P, H, G, T, S):
    rng = np.random.default_rng(0)
    f = np.float32
    a = (H, N) if variant == "mamba1" else (H,)
    p = dict(s=rng.uniform(-.5, .5, (S, H, P, N)).astype(f), x=rng.uniform(-1, 1, (S, T, H, P)).astype(f),
             dt=rng.uniform(-.5, .5, (S, T, H)).astype(f), A=(-rng.uniform(.2, 1., a)).astype(f),
             B=rng.uniform(-.5, .5, (S, T, G, N)).astype(f), C=rng.uniform(-.5, .5, (S, T, G, N)).astype(f),
             ids=np.arange(S))
    return p, rng.uniform(-1, 1, (S, T, H, P)).astype(f), rng.uniform(-1, 1, (S, H, P, N)).astype(f)

calls = {}
for name, shp in shapes.items():
    p, gy, gs = inputs(*shp)
    dst = np.empty_like(p["s"])
    calls[(name, "fwd", "ssm_fast")] = lambda p=p: ssm_fast.ssm_scan(**p)
    calls[(name, "bwd", "ssm_fast")] = lambda p=p, gy=gy, gs=gs: ssm_fast.ssm_scan_back(**p, g_y=gy, g_states=gs)
    calls[(name, "fwd", "ssm_ref")] = lambda p=p: ssm_ref.ssm_scan(**p)
    calls[(name, "bwd", "ssm_ref")] = lambda p=p, gy=gy, gs=gs: ssm_ref.ssm_scan_back(**p, g_y=gy, g_states=gs)
    calls[(name, "fwd", "copy")] = lambda p=p, dst=dst: np.copyto(dst, p["s"])
ssm_fast.warmup()
import numba
try:
    layer = numba.threading_layer()
except ValueError:
    layer = None
print(json.dumps({"ready": True, "layer": layer, "threads": numba.get_num_threads()}), flush=True)
for line in sys.stdin:
    name, op, impl, n = line.split()
    fn = calls[(name, op, impl)]
    fn()
    out = []
    for _ in range(int(n)):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    print(json.dumps(out), flush=True)
"""


class Load:
    """Two processes spinning on the machine, switched on and off by SIGCONT / SIGSTOP."""

    def __init__(self, n=2):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
        self.off()

    def on(self):
        for p in self.procs:
            p.send_signal(signal.SIGCONT)
        time.sleep(0.05)

    def off(self):
        for p in self.procs:
            p.send_signal(signal.SIGSTOP)
        time.sleep(0.05)

    def close(self):
        for p in self.procs:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()


class Worker:
    def __init__(self, name, env_extra, shapes, old=None):
        env = {k: v for k, v in os.environ.items() if k not in CLEARED} | env_extra
        root = ROOT
        if name.startswith("old-"):
            root = Path(old)
            env["NUMBA_CACHE_DIR"] = str(Path(tempfile.gettempdir()) / f"ssm-fast-old-cache-{root.name}")
        env["PYTHONPATH"] = str(root)
        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(root), json.dumps(shapes)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = json.loads(self.proc.stdout.readline())

    def time(self, shape, op, impl, n) -> list[float]:
        self.proc.stdin.write(f"{shape} {op} {impl} {n}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def median(v):
    v = sorted(v)
    k = len(v) // 2
    return v[k] if len(v) % 2 else 0.5 * (v[k - 1] + v[k])


def calls_for(shape_name: str, ops: list[str]):
    decode = shape_name.startswith("decode")
    for op in ops:
        if decode and op != "fwd":
            continue  # a decode step is a forward
        yield op


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="default,serial", help="comma-separated subset of " + ", ".join(CONFIGS))
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated subset of " + ", ".join(SHAPES))
    ap.add_argument("--ops", default="fwd,bwd")
    ap.add_argument("--rounds", type=int, default=7, help="rounds; each round: quiet, then loaded (default 7)")
    ap.add_argument("--budget", type=float, default=0.25, help="seconds of calls per measurement (default 0.25)")
    ap.add_argument("--ref", action="store_true", help="also time ssm_ref (loaded only, 3 rounds)")
    ap.add_argument("--floor", action="store_true", help="also time the decode memory floor (numpy copy of s)")
    ap.add_argument("--old", help="another checkout, for the old-* configurations")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    shapes = {k: SHAPES[k] for k in args.shapes.split(",")}
    ops = args.ops.split(",")
    load0 = os.getloadavg()
    workers = [Worker(c, CONFIGS[c], shapes, args.old) for c in args.configs.split(",")]
    load = Load()
    try:
        # calls per measurement, from one quiet call of each
        reps = {}
        for w in workers:
            for s in shapes:
                for op in calls_for(s, ops):
                    t = median(w.time(s, op, "ssm_fast", 3))
                    reps[(w.name, s, op)] = max(3, min(2000, int(args.budget / max(t, 1e-6))))
        res: dict = {}
        for r in range(args.rounds):
            for state in ("quiet", "loaded"):
                (load.on if state == "loaded" else load.off)()
                for s in shapes:
                    for op in calls_for(s, ops):
                        for w in workers:
                            v = w.time(s, op, "ssm_fast", reps[(w.name, s, op)])
                            res.setdefault((w.name, s, op, state), []).append(median(v))
                        if args.floor and s.startswith("decode"):
                            v = workers[0].time(s, op, "copy", 200)
                            res.setdefault(("copy", s, op, state), []).append(median(v))
                        if args.ref and r < 3 and (state == "loaded" or r == 0):
                            v = workers[0].time(s, op, "ssm_ref", 1 if not s.startswith("decode") else 20)
                            res.setdefault(("ssm_ref", s, op, state), []).append(median(v))
            print(f"round {r + 1}/{args.rounds} done, load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    finally:
        load.close()
        for w in workers:
            w.close()
    load1 = os.getloadavg()
    env = {"date": datetime.datetime.now().isoformat(timespec="minutes"), "cpus": os.cpu_count(),
           "loadavg_before": load0, "loadavg_after": load1,
           "workers": {w.name: w.info for w in workers}}
    try:
        env["cpu"] = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                          if line.startswith("model name"))
    except (OSError, StopIteration):
        env["cpu"] = "unknown"
    table = {" ".join(k): median(v) for k, v in res.items()}
    print(f"{env['cpu']}, {env['cpus']} CPUs, {env['date']}; load average before {load0[0]:.2f}, after "
          f"{load1[0]:.2f} (1 min); workers: " + ", ".join(f"{k} ({v['layer']}, {v['threads']} threads)"
                                                       for k, v in env["workers"].items()))
    print()
    names = [w.name for w in workers] + [k for k in ("ssm_ref", "copy") if any(key[0] == k for key in res)]
    print("| shape | op | " + " | ".join(f"{n} quiet / loaded (ms), ratio" for n in names) + " |")
    print("|---|---|" + "---|" * len(names))
    for s in shapes:
        for op in calls_for(s, ops):
            cells = []
            for n in names:
                q, lo = table.get(f"{n} {s} {op} quiet"), table.get(f"{n} {s} {op} loaded")
                if lo is None:
                    cells.append("-")
                elif q is None:
                    cells.append(f"- / {1e3 * lo:.3g}")
                else:
                    cells.append(f"{1e3 * q:.3g} / {1e3 * lo:.3g}, {lo / q:.2f}")
            print(f"| {s} | {op} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "results": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
