"""What a second busy CPU and the contention load do to one ssm_fast call: the causes behind
benchmarks/cpu_targets.py's thread scaling and loaded / quiet ratios.

    python benchmarks/core_sharing.py [--shapes prefill,mamba1] [--n 7]

For each (shape, op), single calls timed (medians of --n; the conditions cycled --repeat times,
medians over the cycles):
  * alone: 1 thread, nothing else running;
  * twin: 1 thread while a second process runs the same call on the other CPU (if the two
    logical CPUs share a core's units or the memory path, each copy slows down);
  * spinner: 1 thread while one process spins (`while True: pass`) -- one CPU left free;
  * 2 threads quiet, and 2 threads under contention.py's load (two spinners), with the CPU time
    the process got (time.process_time over wall time: the cores it was given);
  * Mamba-1 backward only: 1 thread with config.SEGMENT_BYTES raised from 1 MiB to 4 MiB, so the
    sequence fits one recompute segment and each decay's exp is computed once instead of twice.
Prints a markdown table. OMP_WAIT_POLICY plays no part (ssm_fast runs its own threads).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from contention import Load  # noqa: E402


def calls(shape):
    import numpy as np
    from ggml_side_by_side import case_of

    import ssm_fast
    import ssm_ref
    from ssm_ref.checks import check_forward

    a = case_of(shape).args()
    d = check_forward(**a).dims
    g = np.random.default_rng(3).uniform(-1, 1, d.forward_size).astype(np.float32)
    g_y, g_states = ssm_ref.unpack_forward(g, d)
    return {"fwd": lambda: ssm_fast.ssm_scan(**a),
            "bwd": lambda: ssm_fast.ssm_scan_back(**a, g_y=g_y, g_states=g_states)}


def time_calls(fn, n):
    fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def worker(shape, op, n, threads, segment_bytes):
    import ssm_fast
    from ssm_fast import config

    ssm_fast.set_num_threads(threads)
    if segment_bytes:
        config.SEGMENT_BYTES = segment_bytes
    fn = calls(shape)[op]
    fn()
    print("ready", flush=True)
    sys.stdin.readline()                      # start together with the twin
    w0, c0 = time.perf_counter(), time.process_time()
    med = time_calls(fn, n)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    print(json.dumps({"median_s": med, "cores": cpu / wall}), flush=True)


def run(shape, op, n, copies=1, threads=1, segment_bytes=0, during=None):
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", shape, op, str(n), str(threads),
                               str(segment_bytes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(copies)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    if during:
        during.on()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    res = [json.loads(p.stdout.readline()) for p in procs]
    if during:
        during.off()
    for p in procs:
        p.wait()
    return res[0]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="prefill,mamba1")
    ap.add_argument("--n", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=3, help="cycles through the conditions; medians over them")
    args = ap.parse_args()
    one_spinner, two_spinners = Load(1), Load(2)
    rows = []
    try:
        for shape in args.shapes.split(","):
            for op in ("fwd", "bwd"):
                # The conditions are cycled, not run one after the other: this VM's speed moves by
                # up to 2x from one measurement to the next, and each ratio wants its two sides close.
                conds = {"alone": {}, "twin": {"copies": 2}, "spinner": {"during": one_spinner},
                         "2t": {"threads": 2}, "2t_loaded": {"threads": 2, "during": two_spinners}}
                if shape == "mamba1" and op == "bwd":
                    conds["seg4m"] = {"segment_bytes": 4 << 20}
                got: dict = {}
                for _ in range(args.repeat):
                    for name, kw in conds.items():
                        res = run(shape, op, args.n, **kw)
                        got.setdefault(name, []).append(res["median_s"])
                        if name == "2t_loaded":
                            got.setdefault("cores_loaded", []).append(res["cores"])
                r = {"shape": shape, "op": op} | {k: statistics.median(v) for k, v in got.items()}
                r["rounds"] = got
                rows.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
    finally:
        one_spinner.close()
        two_spinners.close()
    print("| shape | op | 1 thread alone (ms) | twin / alone | one spinner / alone | 2 threads (ms), speed-up | "
          "2 threads loaded (ms), / 1 thread alone | cores got, loaded | 1 thread, 4 MiB segments (ms) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        seg = f"{r['seg4m'] * 1e3:.1f}" if "seg4m" in r else "-"
        print(f"| {r['shape']} | {r['op']} | {r['alone'] * 1e3:.2f} | {r['twin'] / r['alone']:.2f} | "
              f"{r['spinner'] / r['alone']:.2f} | {r['2t'] * 1e3:.2f}, {r['alone'] / r['2t']:.2f} | "
              f"{r['2t_loaded'] * 1e3:.1f}, {r['2t_loaded'] / r['alone']:.2f} | {r['cores_loaded']:.2f} | {seg} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
