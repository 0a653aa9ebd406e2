"""ggml's CPU SSM_SCAN forward beside ssm_fast's, in one process, in interleaved rounds.

    SSM_GGML_LIB=build/ggml/sdist-0.0.45/lib python benchmarks/ggml_side_by_side.py [--threads 2]
        [--rounds 7] [--reps 5] [--out docs/results]

What is timed. ggml: the graph of each shape is built and its inputs set once; a sample is one
``ggml_backend_graph_compute`` (plus ``ggml_backend_synchronize``) on the CPU backend with
``--threads`` threads -- the compute only, no copies in or out. ssm_fast: a sample is one call of
``ssm_fast.ssm_scan`` on the same float32 inputs with numba's thread count set to ``--threads``:
the whole call, including the argument checks and the allocation of y and states (its API has
nothing smaller to time). The kernels are compiled before the first round. Each round times
``--reps`` samples of ggml then ``--reps`` of ssm_fast for every shape, so a slow phase of the
machine hits both; the medians over all rounds are reported, with their ratio. The two outputs
are compared once per shape (their largest difference relative to the largest |y|).

Writes ``ggml-side-by-side-<date>-<threads>t.md`` and ``.json`` to --out, with the CPU model (lscpu), the
date, the ggml build (version, commit, source and cmake flags from ggml-build.json) and the load.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ssm_ref.testing.cases import make_problem  # noqa: E402

# name: (N, P, H, G, T, S)
SHAPES = {
    "demo": (128, 64, 16, 1, 64, 1),
    "prefill": (128, 64, 24, 1, 512, 1),
    "batch": (128, 64, 24, 2, 128, 4),
    "mamba1": (16, 1, 1536, 1, 512, 1),
}


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    model = fields.get("Model name", "unknown").strip()
    return f"{model}, {os.cpu_count()} logical CPUs visible"


def case_of(name: str):
    N, P, H, G, T, S = SHAPES[name]
    variant = "mamba1" if name == "mamba1" else "mamba2"
    return make_problem(7, S=S, T=T, H=H, P=P, N=N, G=G, R=S, ids="identity", variant=variant, a_form="h",
                        regime="typical")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "docs" / "results"))
    args = ap.parse_args()

    import ssm_fast
    import ssm_ggml
    from ssm_ggml.graph import Device, ScanGraph
    from ssm_ggml.lib import load
    from ssm_ref.checks import check_forward

    lib = load()
    info = lib.info
    dev = Device(lib, "CPU", threads=args.threads)
    ssm_fast.set_num_threads(args.threads)
    ssm_fast.warmup()
    graphs, kw, ratio_note = {}, {}, {}
    for name in SHAPES:
        case = case_of(name)
        a = case.args()
        p = check_forward(**a)
        shapes = {"s": p.s.shape, "x": p.x.shape, "dt": p.dt.shape, "A": p.A.shape, "B": p.B.shape,
                  "C": p.C.shape, "S": p.dims.S}
        g = ScanGraph(dev, shapes)
        g.set_inputs({"s": p.s, "x": p.x, "dt": p.dt, "A": p.A, "B": p.B, "C": p.C, "ids": p.ids.astype(np.int32)})
        g.compute()
        y_ggml = g.output()[: p.x.size]
        y_fast = ssm_fast.ssm_scan(**a).y.ravel()
        ratio_note[name] = float(np.max(np.abs(y_ggml - y_fast)) / max(float(np.max(np.abs(y_fast))), 1e-30))
        graphs[name], kw[name] = g, a
    load_before = os.getloadavg()[0]
    samples = {name: {"ggml": [], "ssm_fast": []} for name in SHAPES}
    for _ in range(args.rounds):
        for name in SHAPES:
            for _ in range(args.reps):
                samples[name]["ggml"].append(graphs[name].compute())
            for _ in range(args.reps):
                t0 = time.perf_counter()
                ssm_fast.ssm_scan(**kw[name])
                samples[name]["ssm_fast"].append(time.perf_counter() - t0)
    load_after = os.getloadavg()[0]
    for g in graphs.values():
        g.close()
    dev.close()

    today = _dt.date.today().isoformat()
    rows = []
    for name, (N, P, H, G, T, S) in SHAPES.items():
        mg = statistics.median(samples[name]["ggml"])
        mf = statistics.median(samples[name]["ssm_fast"])
        rows.append({"shape": name, "N": N, "P": P, "H": H, "G": G, "T": T, "S": S,
                     "ggml_median_s": mg, "ssm_fast_median_s": mf, "ggml_over_fast": mg / mf,
                     "ggml_min_s": min(samples[name]["ggml"]), "ssm_fast_min_s": min(samples[name]["ssm_fast"]),
                     "y_max_diff_rel": ratio_note[name], "samples": samples[name]})
    rec = {"date": today, "cpu": cpu_model(), "threads": args.threads, "rounds": args.rounds, "reps": args.reps,
           "load_1min_before": load_before, "load_1min_after": load_after,
           "ggml": {"version": info.version, "commit": info.commit, "api": info.api, "folder": info.folder,
                    "source": info.recipe.get("source", ""), "flags": info.recipe.get("flags", ""),
                    "compiler": info.recipe.get("compiler", "")},
           "ssm_fast_version": ssm_fast.__version__, "ssm_ggml": ssm_ggml.NAME, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"ggml-side-by-side-{today}-{args.threads}t.json").write_text(json.dumps(rec, indent=1) + "\n")
    lines = [f"# ggml's CPU SSM_SCAN forward beside ssm_fast ({today})", "",
             f"- CPU: {rec['cpu']}; {args.threads} threads for both; 1-minute load {load_before:.2f} before, "
             f"{load_after:.2f} after",
             f"- ggml {info.version} (commit {info.commit or '?'}), {info.api}; built from "
             f"{rec['ggml']['source'] or '?'} with `{rec['ggml']['flags'] or '?'}` ({rec['ggml']['compiler']})",
             f"- ssm_fast {ssm_fast.__version__} (numba)",
             f"- {args.rounds} interleaved rounds of {args.reps} samples each per shape and implementation; medians",
             "- ggml: `ggml_backend_graph_compute` + synchronize only (graph built and inputs set once); "
             "ssm_fast: the whole `ssm_scan` call (argument checks and output allocation included)",
             "- made by `benchmarks/ggml_side_by_side.py`", "",
             "| shape | N, P, H, G, T, S | ggml | ssm_fast | ggml / ssm_fast | max \\|y diff\\| / max \\|y\\| |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['N']}, {r['P']}, {r['H']}, {r['G']}, {r['T']}, {r['S']} | "
                     f"{r['ggml_median_s'] * 1e3:.3f} ms | {r['ssm_fast_median_s'] * 1e3:.3f} ms | "
                     f"{r['ggml_over_fast']:.2f} | {r['y_max_diff_rel']:.1e} |")
    cores = os.cpu_count() or 1
    if load_before >= 0.5 * cores:
        lines += ["", f"The machine was busy: a 1-minute load of {load_before:.2f} on {cores} logical CPUs before the "
                  "run, from other processes. ggml's CPU backend splits each graph across its threads and waits "
                  "for all of them at its barriers, so a thread that shares its core with another process holds "
                  "up the whole compute (the times can then come in steps of the scheduler's time slice); "
                  "ssm_fast's parallel loop hands out tasks dynamically. Compare the 1-thread run of the same "
                  "day."]
    (out / f"ggml-side-by-side-{today}-{args.threads}t.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
