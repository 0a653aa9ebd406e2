"""Every CPU speed target of ssm_fast, measured in one run: quiet and under load, rounds interleaved.

    SSM_GGML_LIB=build/ggml/sdist-0.0.45/lib SSM_GGMLR_BACK_LIB=build/ggmlr \
        python benchmarks/cpu_targets.py [--rounds 7] [--budget 0.25] [--threads 2] [--out docs/results]

Targets (ratios, so they hold on the machine at hand), at the shapes demo, prefill, batch, mamba1:
  * forward: ggml's CPU SSM_SCAN / ssm_fast >= 1.5;
  * backward: ggmlR's CPU SSM_SCAN_BACK / ssm_fast >= 10;
  * forward+backward: the PyTorch chunked scan (benchmarks/torch_scan.py, autograd) / ssm_fast >= 3,
    at demo and prefill;
  * under load (two processes spinning on the machine's cores, benchmarks/contention.py's Load):
    each of ssm_fast's calls within 2x of its quiet time, and never slower than ssm_ref.

What is timed, all in this one process, every implementation on ``--threads`` threads:
ssm_fast, its whole call (argument checks and output allocation included); ggml, the graph
compute alone (``ssm_ggml``'s ScanGraph, built and filled once);
ggmlR, the threaded region of its op alone (benchmarks/ggmlr_back.py: ggmlR's own kernel, built by
tools/build_ggmlr_back.sh); torch, zeroing the gradients, the forward and ``loss.backward()``;
ssm_ref (numpy), its whole call, one sample per round in the first ``--ref-rounds`` rounds, and
left out where one quiet call takes more than 5 s. A measurement is the median of as many calls as
fit in ``--budget`` seconds (at least 3). Each round measures every (shape, implementation) quiet
and loaded, the two in alternating order from round to round; reported is the median over rounds.
Before timing, every implementation's result is compared with ssm_fast's.

Then, quiet, ``--scaling-rounds`` rounds of ssm_fast and ggml at 1 thread (ggmlR's backward runs on
one thread whatever the count: docs/BENCHMARKS.md), for the thread scaling of each: ggml's forward
beside ssm_fast's on one thread and on ``--threads``, as benchmarks/ggml_side_by_side.py (commit
d8008ea) timed them alone.

OMP_WAIT_POLICY defaults to PASSIVE (the comment at the top says why).

Writes cpu-targets-<date>.md and .json to --out: the CPU (lscpu), date, threads, load averages,
the ggml build, ggmlR's commit, every median and every ratio.
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

# Before any OpenMP runtime starts (torch's, ggml's and ggmlR's libgomp): libgomp's default
# spin-then-sleep wait cost torch ~50x and ggml's 2-thread forward ~6x on this shared 2-core VM
# (a spinning thread holds the core its partner needs), as benchmarks/bench_cpu.py (commit d8008ea)
# found for torch. The passive policy is the competitors' better setting here; set OMP_WAIT_POLICY to override.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import ggmlr_back  # noqa: E402
import torch_scan  # noqa: E402
from contention import Load  # noqa: E402

import ssm_fast  # noqa: E402
import ssm_ref  # noqa: E402
from ssm_ref.checks import check_forward  # noqa: E402
from ssm_ref.testing.cases import make_problem  # noqa: E402

# name: (N, P, H, G, T, S)
SHAPES = {
    "demo": (128, 64, 16, 1, 64, 1),
    "prefill": (128, 64, 24, 1, 512, 1),
    "batch": (128, 64, 24, 2, 128, 4),
    "mamba1": (16, 1, 1536, 1, 512, 1),
}

TORCH_SHAPES = ("demo", "prefill")
REF_LIMIT_S = 5.0
# (target, op, competitor, ssm_fast's key, competitor's key, needed competitor / ssm_fast, shapes)
TARGETS = [
    ("forward vs ggml", "fwd", "ggml", "fast fwd", "ggml fwd", 1.5, tuple(SHAPES)),
    ("backward vs ggmlR", "bwd", "ggmlR", "fast bwd", "ggmlR bwd", 10.0, tuple(SHAPES)),
    ("fwd+bwd vs PyTorch", "fwd+bwd", "torch", "fast fwd+bwd", "torch fwd+bwd", 3.0, TORCH_SHAPES),
]
FAST_KEYS = ("fast fwd", "fast bwd", "fast fwd+bwd")


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


def rel(a, b) -> float:
    """Norm-relative difference of a to b (float64)."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def torch_step(torch, a, g_y, g_states):
    """A training step of the PyTorch scan: zero the gradients, forward, loss, backward."""
    leaves = {k: torch.from_numpy(np.ascontiguousarray(v)).requires_grad_(True)
              for k, v in a.items() if k != "ids"}
    ids = torch.from_numpy(np.asarray(a["ids"], dtype=np.int64))
    gy, gs = torch.from_numpy(g_y), torch.from_numpy(g_states)

    def step():
        for v in leaves.values():
            v.grad = None
        y, st = torch_scan.scan(**leaves, ids=ids)
        ((y * gy).sum() + (st * gs).sum()).backward()
        return y

    return step


def timed(fn):
    """A call that returns its own wall time."""
    def run():
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return run


def build(name, threads, dev, dev1, ggmlr, torch) -> dict:
    """One shape: its timed calls (key -> callable returning seconds) on ``threads`` threads, those
    of the scaling pass on one (ssm_fast's need set_num_threads(1) first), the agreement checks
    and the ggml graphs to close."""
    a = case_of(name).args()
    p = check_forward(**a)
    d = p.dims
    rng = np.random.default_rng(3)
    g = rng.uniform(-1, 1, d.forward_size).astype(np.float32)
    g_y, g_states = ssm_ref.unpack_forward(g, d)
    from ssm_ggml.graph import ScanGraph

    graphs = []
    for device in (dev, dev1):
        graphs.append(ScanGraph(device, {"s": p.s.shape, "x": p.x.shape, "dt": p.dt.shape, "A": p.A.shape,
                                         "B": p.B.shape, "C": p.C.shape, "S": d.S}))
        graphs[-1].set_inputs({"s": p.s, "x": p.x, "dt": p.dt, "A": p.A, "B": p.B, "C": p.C,
                               "ids": p.ids.astype(np.int32)})
    graph = graphs[0]

    def fast_fwd():
        return ssm_fast.ssm_scan(**a)

    def fast_bwd():
        return ssm_fast.ssm_scan_back(**a, g_y=g_y, g_states=g_states)

    def fast_step():
        fast_fwd()
        return fast_bwd()

    calls = {"fast fwd": timed(fast_fwd), "ggml fwd": graph.compute, "fast bwd": timed(fast_bwd),
             "ggmlR bwd": lambda: ggmlr.scan_back(**a, g_packed=g, threads=threads)[1],
             "fast fwd+bwd": timed(fast_step),
             "ref fwd": timed(lambda: ssm_ref.ssm_scan(**a)),
             "ref bwd": timed(lambda: ssm_ref.ssm_scan_back(**a, g_y=g_y, g_states=g_states))}
    y_fast = fast_fwd().y
    graph.compute()
    grads_fast = fast_bwd()
    packed_r, _ = ggmlr.scan_back(**a, g_packed=g, threads=threads)
    got_r = ssm_ref.unpack_backward(packed_r, d)
    checks = {"ggml_y_vs_fast": rel(graph.output()[: p.x.size], y_fast),
              "ggmlR_grads_vs_fast_max": max(rel(v, getattr(grads_fast, k)) for k, v in got_r.items())}
    if name in TORCH_SHAPES:
        step = torch_step(torch, a, g_y, g_states)
        calls["torch fwd+bwd"] = timed(step)
        checks["torch_y_vs_fast"] = rel(step().detach().numpy(), y_fast)
    one = {"fast fwd": calls["fast fwd"], "fast bwd": calls["fast bwd"], "ggml fwd": graphs[1].compute,
           "ggmlR bwd": lambda: ggmlr.scan_back(**a, g_packed=g, threads=1)[1]}
    return {"calls": calls, "one_thread": one, "checks": checks, "graphs": graphs,
            "updates": d.S * d.T * d.H * d.P * d.N}


def reps_for(fn, budget: float) -> int:
    t = statistics.median(fn() for _ in range(3))
    return max(3, min(2000, int(budget / max(t, 1e-6))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ref-rounds", type=int, default=3)
    ap.add_argument("--scaling-rounds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0.25, help="seconds of calls per measurement")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--out", default=str(HERE.parent / "docs" / "results"))
    args = ap.parse_args()
    shapes = args.shapes.split(",")

    import torch

    from ssm_ggml.graph import Device
    from ssm_ggml.lib import load

    torch.set_num_threads(args.threads)
    ssm_fast.set_num_threads(args.threads)
    ssm_fast.warmup()
    glib = load()
    ggmlr = ggmlr_back.load()
    dev = Device(glib, "CPU", threads=args.threads)
    dev1 = Device(glib, "CPU", threads=1)
    load0 = os.getloadavg()
    built = {n: build(n, args.threads, dev, dev1, ggmlr, torch) for n in shapes}
    reps, skipped = {}, {}
    for n, b in built.items():
        for k, fn in b["calls"].items():
            if k.startswith("ref "):
                t = fn()
                if t > REF_LIMIT_S:
                    skipped[f"{n} {k}"] = t
                reps[(n, k)] = 1
            else:
                reps[(n, k)] = reps_for(fn, args.budget)
    res: dict = {}
    load = Load()
    loads = []
    try:
        for r in range(args.rounds):
            for state in (("quiet", "loaded") if r % 2 == 0 else ("loaded", "quiet")):
                (load.on if state == "loaded" else load.off)()
                for n, b in built.items():
                    for k, fn in b["calls"].items():
                        if k.startswith("ref ") and (r >= args.ref_rounds or f"{n} {k}" in skipped):
                            continue
                        v = [fn() for _ in range(reps[(n, k)])]
                        res.setdefault(f"{n} {k} {state}", []).append(statistics.median(v))
            loads.append(os.getloadavg()[0])
            print(f"round {r + 1}/{args.rounds} done, load {loads[-1]:.2f}", file=sys.stderr, flush=True)
    finally:
        load.close()
    # thread scaling, quiet: every implementation at 1 thread
    ssm_fast.set_num_threads(1)
    try:
        for _ in range(args.scaling_rounds):
            for n, b in built.items():
                for k, fn in b["one_thread"].items():
                    v = [fn() for _ in range(reps[(n, k)])]
                    res.setdefault(f"{n} {k} quiet-1t", []).append(statistics.median(v))
    finally:
        ssm_fast.set_num_threads(args.threads)
    load1 = os.getloadavg()
    for b in built.values():
        for graph in b["graphs"]:
            graph.close()
    dev.close()
    dev1.close()

    med = {k: statistics.median(v) for k, v in res.items()}
    report = summarize(med, built, shapes, skipped)
    info = glib.info
    today = _dt.date.today().isoformat()
    rec = {"date": today, "time": _dt.datetime.now().isoformat(timespec="minutes"), "cpu": cpu_model(),
           "cpus": os.cpu_count(), "threads": args.threads, "rounds": args.rounds, "ref_rounds": args.ref_rounds,
           "scaling_rounds": args.scaling_rounds, "budget_s": args.budget, "loadavg_before": load0,
           "loadavg_after": load1, "load_1min_per_round": loads,
           "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
           "ggml": {"version": info.version, "commit": info.commit, "api": info.api, "folder": info.folder,
                    "source": info.recipe.get("source", ""), "flags": info.recipe.get("flags", ""),
                    "compiler": info.recipe.get("compiler", "")},
           "ggmlR": ggmlr.info, "versions": {"ssm_fast": ssm_fast.__version__, "torch": torch.__version__,
                                             "numpy": np.__version__, "python": platform.python_version()},
           "checks": {n: b["checks"] for n, b in built.items()},
           "state_updates": {n: b["updates"] for n, b in built.items()},
           "reps": {f"{n} {k}": v for (n, k), v in reps.items()}, "ref_skipped_s": skipped,
           "medians_s": med, "rounds_s": res, **report}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"cpu-targets-{today}.json").write_text(json.dumps(rec, indent=1) + "\n")
    text = markdown(rec, shapes)
    (out / f"cpu-targets-{today}.md").write_text(text)
    print(text)
    return 0


def summarize(med, built, shapes, skipped) -> dict:
    """The target rows, the loaded / quiet ratios and the ssm_ref rows from the medians."""
    def m(n, k, state):
        return med.get(f"{n} {k} {state}")

    rows = []
    for target, op, _, fast, other, need, tshapes in TARGETS:
        for n in tshapes:
            if n not in shapes:
                continue
            q = m(n, other, "quiet") / m(n, fast, "quiet")
            lo = m(n, other, "loaded") / m(n, fast, "loaded")
            rows.append({"target": f"{target} >= {need:g}x", "op": op, "shape": n, "quiet": q, "loaded": lo,
                         "met_quiet": q >= need, "met_loaded": lo >= need})
    contention = []
    for n in shapes:
        for k in FAST_KEYS:
            ratio = m(n, k, "loaded") / m(n, k, "quiet")
            contention.append({"shape": n, "op": k.split()[1], "quiet_s": m(n, k, "quiet"),
                               "loaded_s": m(n, k, "loaded"), "loaded_over_quiet": ratio, "met": ratio <= 2.0})
    ref = []
    for n in shapes:
        for op in ("fwd", "bwd"):
            if f"{n} ref {op}" in skipped:
                ref.append({"shape": n, "op": op, "skipped": f"one quiet call took {skipped[f'{n} ref {op}']:.1f} s"})
                continue
            q = m(n, f"ref {op}", "quiet") / m(n, f"fast {op}", "quiet")
            lo = m(n, f"ref {op}", "loaded") / m(n, f"fast {op}", "loaded")
            ref.append({"shape": n, "op": op, "quiet": q, "loaded": lo, "met": q >= 1 and lo >= 1})
    scaling = []
    for n in shapes:
        for k in ("fast fwd", "fast bwd", "ggml fwd", "ggmlR bwd"):
            one, two = m(n, k, "quiet-1t"), m(n, k, "quiet")
            if one is not None:
                scaling.append({"shape": n, "impl": k, "one_thread_s": one, "two_threads_s": two,
                                "speedup": one / two,
                                "ns_per_state_update_1t": one / built[n]["updates"] * 1e9})
    return {"targets": rows, "contention": contention, "ref": ref, "scaling": scaling}


def _met(q: bool, lo: bool) -> str:
    return {(True, True): "yes", (True, False): "quiet only", (False, True): "loaded only"}.get((q, lo), "no")


def markdown(rec, shapes) -> str:
    med = rec["medians_s"]
    g = rec["ggml"]
    r = rec["ggmlR"]
    lb, la = rec["loadavg_before"], rec["loadavg_after"]
    lines = [f"# ssm_fast against its CPU targets ({rec['date']})", "",
             f"- CPU: {rec['cpu']}; {rec['threads']} threads for every implementation; load average "
             f"{lb[0]:.2f} / {lb[1]:.2f} / {lb[2]:.2f} before, {la[0]:.2f} / {la[1]:.2f} / {la[2]:.2f} after "
             f"(1 / 5 / 15 min; the run's own load included); OMP_WAIT_POLICY {rec['omp_wait_policy']}",
             f"- ggml {g['version']} (commit {g['commit'] or '?'}), built from {g['source'] or '?'} with "
             f"`{g['flags'] or '?'}` ({g['compiler']})",
             f"- ggmlR: {r.get('ggmlr_repo', '?')} at {r.get('ggmlr_commit', '?')}, {r.get('ggmlr_file', '?')} "
             f"(sha256 {r.get('ggmlr_file_sha256', '?')[:16]}...), compiled unchanged by tools/build_ggmlr_back.sh "
             f"against ggml {r.get('ggml_version', '?')}'s CPU headers ({r.get('compiler', '?')})",
             f"- ssm_fast {rec['versions']['ssm_fast']}, torch {rec['versions']['torch']}, numpy "
             f"{rec['versions']['numpy']}, Python {rec['versions']['python']}",
             f"- {rec['rounds']} rounds, each quiet and loaded (two processes spinning, switched by SIGSTOP / "
             f"SIGCONT) in alternating order; a measurement is the median of the calls that fit in "
             f"{rec['budget_s']} s (at least 3); medians over rounds. ssm_ref: 1 call per round in "
             f"{rec['ref_rounds']} rounds. Made by `benchmarks/cpu_targets.py`.", "",
             "## Targets", "",
             "| target | shape | quiet ratio | loaded ratio | met? |", "|---|---|---:|---:|---|"]
    for row in rec["targets"]:
        lines.append(f"| {row['target']} | {row['shape']} | {row['quiet']:.2f} | {row['loaded']:.2f} | "
                     f"{_met(row['met_quiet'], row['met_loaded'])} |")
    for row in rec["contention"]:
        lines.append(f"| ssm_fast {row['op']} loaded / quiet <= 2 | {row['shape']} | "
                     f"{row['quiet_s'] * 1e3:.3g} ms | {row['loaded_s'] * 1e3:.3g} ms ({row['loaded_over_quiet']:.2f}) "
                     f"| {'yes' if row['met'] else 'no'} |")
    for row in rec["ref"]:
        if "skipped" in row:
            lines.append(f"| ssm_ref / ssm_fast {row['op']} >= 1 | {row['shape']} | - | - | not measured "
                         f"({row['skipped']}) |")
        else:
            lines.append(f"| ssm_ref / ssm_fast {row['op']} >= 1 | {row['shape']} | {row['quiet']:.1f} | "
                         f"{row['loaded']:.1f} | {'yes' if row['met'] else 'no'} |")
    lines += ["", "## Medians (ms)", "", "| shape | impl | quiet | loaded | loaded / quiet |",
              "|---|---|---:|---:|---:|"]
    for n in shapes:
        for k in ("fast fwd", "ggml fwd", "fast bwd", "ggmlR bwd", "fast fwd+bwd", "torch fwd+bwd", "ref fwd",
                  "ref bwd"):
            q, lo = med.get(f"{n} {k} quiet"), med.get(f"{n} {k} loaded")
            if q is not None and lo is not None:
                lines.append(f"| {n} | {k} | {q * 1e3:.3f} | {lo * 1e3:.3f} | {lo / q:.2f} |")
    lines += ["", "## Thread scaling (quiet) and time per state update", "",
              "| shape | impl | 1 thread (ms) | 2 threads (ms) | speed-up | ns per state update, 1 thread |",
              "|---|---|---:|---:|---:|---:|"]
    for row in rec["scaling"]:
        lines.append(f"| {row['shape']} | {row['impl']} | {row['one_thread_s'] * 1e3:.3f} | "
                     f"{row['two_threads_s'] * 1e3:.3f} | {row['speedup']:.2f} | {row['ns_per_state_update_1t']:.2f} |")
    lines += ["", "## Agreement with ssm_fast (norm-relative)", "",
              "| shape | ggml y | ggmlR gradients (worst block) | torch y |", "|---|---:|---:|---:|"]
    for n in shapes:
        c = rec["checks"][n]
        t = f"{c['torch_y_vs_fast']:.1e}" if "torch_y_vs_fast" in c else "-"
        lines.append(f"| {n} | {c['ggml_y_vs_fast']:.1e} | {c['ggmlR_grads_vs_fast_max']:.1e} | {t} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
