"""``ssm-scan bench``: median times per backend, shape and op; GPU time beside wall time for Vulkan;
throughput; the float32 FLOP floor where the machine's peak is known; optionally a plot."""

from __future__ import annotations

import os
import statistics
import sys
import time

from . import backends as bk
from . import common, machine
from .progress import Progress
from .shapes import CUSTOM_HELP, SHAPES, Shape, default_sweep, make_inputs, parse_shapes, parse_sweep, swept
from .table import flops, rate, seconds, table

HELP = "time the forward and the backward on each backend (GPU time for Vulkan), optionally plot them"

# Above these many state updates a run is refused unless --force: ssm_ref keeps all T+1 states
# of the backward (4 bytes each: 1.2 GB at 3e8), and at these sizes a call of ssm_ref, or of a
# CPU Vulkan device such as lavapipe, takes seconds (docs/BENCHMARKS.md, "All three backends").
SLOW_LIMITS = {"ssm_ref": 3e8, "cpu-device": 1.1e8}

_SHAPE_LINES = "\n".join(f"  {s.name:8s} {f'{s.S},{s.T},{s.H},{s.P},{s.N},{s.G}':20s} {s.note}"
                         for s in SHAPES.values())
DESCRIPTION = f"""Time the forward and the backward per backend and shape, and optionally plot the times.

Times ssm_scan (fwd) and ssm_scan_back (bwd) per backend and shape: median wall time with
its min-max spread over the repetitions, for Vulkan also the GPU time from timestamps (inputs are
uploaded once, device-resident, as in a training loop), throughput in state updates per second
(S*T*H*P*N per call, for both ops) and the float32 FLOP floor (FLOPs / the machine's float32 peak,
where that peak is known: a measured GPU, or an estimate for the CPU from /proc/cpuinfo).

shapes (S,T,H,P,N,G: sequences, tokens, heads, head_dim, d_state, groups; the Python API's order):
{_SHAPE_LINES}
  {CUSTOM_HELP}
    G defaults to 1; ",mamba1" makes A of shape (H, N) (Mamba-1, with P = 1). ggml's order
    N,P,H,G,T,S (the former "custom N,P,H,G,T,S") is refused, with its translation.

On a machine without a GPU the big shapes are slow: ssm_ref (numpy, one core, every state of a
sequence in memory) is refused above {SLOW_LIMITS["ssm_ref"]:.2g} state updates and ssm_vk on a CPU
device (lavapipe) above {SLOW_LIMITS["cpu-device"]:.2g}, unless --force.

  ssm-scan bench                                  the demo shape, every backend
  ssm-scan bench --shape prefill --backend vk --pass fwd
  ssm-scan bench --shape custom:1,64,16,64,128 --backend fast   S=1 T=64 H=16 P=64 N=128 (G=1)
  ssm-scan bench --shape demo --sweep T=16,64,256 --plot bench.png --json bench.json"""
MIN_SAMPLES = 3


def add_arguments(p) -> None:
    p.add_argument("--shape", action="extend", nargs="+", metavar="SHAPE",
                   help=f"one or more of {', '.join(SHAPES)}, or {CUSTOM_HELP} (default: demo)")
    p.add_argument("--sweep", metavar="AXIS=V1,V2,...",
                   help="run each shape at these values of one axis (S, T, H, P, N or G), e.g. T=16,64,256")
    common.add_backend(p, "time")
    common.add_device(p)
    p.add_argument("--pass", dest="pass_", choices=("fwd", "bwd", "both"), default="both",
                   help="which pass to time: the forward, the backward or both (default both)")
    common.add_op(p)
    p.add_argument("--reps", type=int, default=5, help="timed calls per measurement after one warm-up (default 5)")
    p.add_argument("--budget", type=float, default=20.0, metavar="SECONDS",
                   help=f"stop a measurement early once it took this long and has {MIN_SAMPLES} samples "
                        "(default 20)")
    p.add_argument("--force", action="store_true", help="run slow backends above their size limits")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    common.add_json(p)
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw time against the swept axis per backend and op (log-log, needs matplotlib); "
                        "without --sweep, each shape's T is swept over 1/16, 1/4 and 1 of its own T")
    common.add_verbose(p)


def too_slow(b: bk.Backend, shape: Shape) -> str | None:
    """Why ``b`` should not run ``shape`` without --force, or None."""
    n = shape.updates
    if b.name == "ssm_ref" and n > SLOW_LIMITS["ssm_ref"]:
        gb = 4 * n * (shape.T + 1) / max(shape.T, 1) / 1e9
        return (f"{n:.2g} state updates > {SLOW_LIMITS['ssm_ref']:.2g}: numpy on one core, about "
                f"{40e-9 * n:.0f} s a backward and {gb:.1f} GB of states; --force runs it")
    if b.is_vulkan and b.device().type == "cpu" and n > SLOW_LIMITS["cpu-device"]:
        return (f"{n:.2g} state updates > {SLOW_LIMITS['cpu-device']:.2g} on a CPU Vulkan device "
                f"({b.device().name}): about {140e-9 * n:.0f} s a backward; --force runs it")
    return None


def _release(result) -> None:
    """Give device-resident results back to the pool now rather than at garbage collection."""
    if isinstance(result, dict):
        values = result.values()
    elif isinstance(result, tuple | list):
        values = result
    else:
        values = vars(result).values() if hasattr(result, "__dict__") else ()
    for v in values:
        if hasattr(v, "release"):
            v.release()


def measure(b: bk.Backend, op: str, kw: dict, g_y, g_states, reps: int, budget: float) -> dict:
    """One warm-up call (shader builds, JIT), then up to ``reps`` timed calls."""
    mod = b.module
    gpu_ns = None
    if b.is_vulkan:  # device-resident inputs, as a training loop holds them
        from ssm_vk import run

        kw = {k: (mod.to_device(v) if v is not None and k != "ids" else v) for k, v in kw.items()}
        g_y, g_states = mod.to_device(g_y), mod.to_device(g_states)
        gpu_ns = run.last_gpu_ns
    from ssm_ref.testing import ports

    pos = ports.args_of(kw) if op == "fwd" else (*ports.args_of(kw), g_y, g_states)
    fn = mod.ssm_scan if op == "fwd" else mod.ssm_scan_back

    def call():
        return fn(*pos)

    t0 = time.perf_counter()
    r = call()
    first = time.perf_counter() - t0
    where, computed_by = ports.origin(r, ports.port_name(mod))   # as check and verify read them
    _release(r)
    walls, gpus = [], []
    spent = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        r = call()
        t = time.perf_counter() - t0
        walls.append(t)
        ns = gpu_ns() if gpu_ns is not None and where.startswith("Vulkan") else None
        if ns is not None:
            gpus.append(ns * 1e-9)
        _release(r)
        spent += t
        if spent > budget and len(walls) >= MIN_SAMPLES:
            break
    if b.is_vulkan:
        for v in (*kw.values(), g_y, g_states):
            if hasattr(v, "release"):
                v.release()
    out = {"where": where, "computed_by": computed_by, "first_call_s": first, "samples_s": walls,
           **_stats(walls, "")}
    if gpus:
        out.update(_stats(gpus, "gpu_"))
        out["gpu_samples_s"] = gpus
    return out


def _stats(xs: list[float], prefix: str) -> dict:
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return {f"{prefix}median_s": statistics.median(xs), f"{prefix}min_s": min(xs), f"{prefix}max_s": max(xs),
            f"{prefix}q1_s": q[0], f"{prefix}q3_s": q[2], f"{prefix}n": len(xs)}


def hardware(backs: list[bk.Backend]) -> dict:
    """What the timings ran on, with float32 peaks where known."""
    c = machine.cpu()
    hw = {"cpu": c.label(), "cpu_peak_flops": c.peak_flops, "cpu_peak_note": c.peak_note(), "vulkan": None}
    vk = next((b for b in backs if b.is_vulkan and b.available), None)
    if vk is not None:
        info = vk.device()
        peak, note = machine.device_peak(info)
        hw["vulkan"] = {"where": info.where, "name": info.name, "type": info.type, "driver": info.driver,
                        "peak_flops": peak, "peak_note": note}
    return hw


def _peak(b: bk.Backend, row: dict, hw: dict) -> float | None:
    if row["where"].startswith("Vulkan") and hw["vulkan"]:
        return hw["vulkan"]["peak_flops"]
    return hw["cpu_peak_flops"]


def load() -> dict:
    """The machine's 1-minute load average and its cores (None where the OS does not say)."""
    try:
        avg = os.getloadavg()[0]
    except (AttributeError, OSError):
        avg = None
    return {"loadavg_1min": avg, "cores": os.cpu_count()}


def busy(before: dict, after: dict) -> str | None:
    """Why the times are not those of an idle machine, or None: other work was running (a load
    average of half the cores before the run), or more than the benchmark's own (after it)."""
    cores = before["cores"] or 1
    a, b = before["loadavg_1min"], after["loadavg_1min"]
    if a is None or b is None:
        return None
    if a >= 0.5 * cores or b >= 1.5 * cores:
        return (f"the machine was busy (load average {a:.2f} before, {b:.2f} after, {cores} cores): other "
                "processes shared the cores, so the times are slower and noisier than on an idle machine")
    return None


def run(args) -> int:
    if args.op in ("fwd", "bwd", "both"):
        raise common.UsageError(f"--op {args.op}: --op names the op (ssm_scan); the forward or the backward alone "
                                f"is --pass {args.op}")
    common.scan_only(args, "the benchmark shapes are")
    shapes = parse_shapes(args.shape)
    sweep = parse_sweep(args.sweep)
    if args.reps < 1:
        raise common.UsageError(f"--reps must be >= 1, got {args.reps}")
    common.check_json_dest(args)
    per_shape = None
    if args.plot:
        _require_matplotlib()
        common.writable_file(args.plot, "--plot")
        if sweep is None:  # each shape around its own T
            per_shape = {shape.name: default_sweep(shape) for shape in shapes}
    if per_shape:
        points = [s for shape in shapes for s in swept(shape, per_shape[shape.name])]
        sweep = ("T", sorted({v for _, values in per_shape.values() for v in values}))
    else:
        points = [s for shape in shapes for s in swept(shape, sweep)]
    names = common.split_list(args.backend, "--backend")
    backs = [b for b in bk.require(bk.resolve(names or None, args.device)) if b.available]
    ops = ("fwd", "bwd") if args.pass_ == "both" else (args.pass_,)
    hw = hardware(backs)
    report = {"hardware": hw, "sweep": {"axis": sweep[0], "values": sweep[1]} if sweep else None,
              "sweep_per_shape": {k: v[1] for k, v in per_shape.items()} if per_shape else None,
              "reps": args.reps, "seed": args.seed, "flops_per_update": machine.FLOPS_PER_UPDATE,
              "rows": [], "skipped": []}
    plan = []
    for shape in points:
        for b in backs:
            why = None if args.force else too_slow(b, shape)
            if why:
                report["skipped"].append({"shape": _point(shape, sweep), "dims": shape.dims, "backend": b.name,
                                          "reason": why})
            else:
                plan.append((shape, b))
    if not plan:
        raise common.UsageError("nothing to measure: " + "; ".join(f"{s['backend']} on {s['shape']}: {s['reason']}"
                                                                     for s in report["skipped"]))
    load_before = load()
    prog = Progress(len(plan) * len(ops), args.verbose)
    inputs_for = None
    try:
        for shape, b in plan:
            if inputs_for is None or inputs_for[0] != shape:
                inputs_for = (shape, make_inputs(shape, args.seed))
            kw, g_y, g_states = inputs_for[1]
            for op in ops:
                prog.update(f"{b.name} {_point(shape, sweep)} {op}")
                try:
                    m = measure(b, op, kw, g_y, g_states, args.reps, args.budget)
                except NotImplementedError as e:  # a port without a backward (ssm_ggml)
                    report["skipped"].append({"shape": _point(shape, sweep), "dims": shape.dims, "backend": b.name,
                                              "reason": f"{op}: {e}"})
                    prog.update(f"{b.name} {_point(shape, sweep)} {op}", advance=1)
                    continue
                row = {"shape": shape.name, "point": _point(shape, sweep), "dims": shape.dims,
                       "variant": shape.variant, "updates": shape.updates, "backend": b.name, "op": op, **m}
                row["updates_per_s"] = shape.updates / row["median_s"] if row["median_s"] > 0 else None
                if "gpu_median_s" in row and row["gpu_median_s"] > 0:
                    row["gpu_updates_per_s"] = shape.updates / row["gpu_median_s"]
                peak = _peak(b, row, hw)
                flops = machine.FLOPS_PER_UPDATE[op] * shape.updates
                row["flops"] = flops
                row["floor_s"] = flops / peak if peak else None
                report["rows"].append(row)
                prog.update(f"{b.name} {_point(shape, sweep)} {op}", advance=1)
    finally:
        prog.close()
    report["load"] = {"before": load_before, "after": load()}
    report["load"]["busy"] = busy(load_before, report["load"]["after"])
    common.say(args, render(report))
    if report["load"]["busy"]:
        print(f"ssm-scan bench: warning: {report['load']['busy']}", file=sys.stderr)
    common.write_json(args, report)
    if args.plot:
        from . import plot

        plot.plot_bench(report, args.plot)
        common.say(args, f"plot: {args.plot}")
    return common.EXIT_OK


def _point(shape: Shape, sweep) -> str:
    return shape.name if sweep is None else f"{shape.name} {sweep[0]}={getattr(shape, sweep[0])}"


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        from ssm_ref.extras import install_hint

        raise common.UsageError(f"--plot needs matplotlib: {install_hint('plot', 'matplotlib')}") from None


def render(rep: dict) -> str:
    hw = rep["hardware"]
    out = [f"CPU: {hw['cpu']}; float32 peak "
           + (f"{flops(hw['cpu_peak_flops'])} ({hw['cpu_peak_note']})" if hw["cpu_peak_flops"]
              else hw["cpu_peak_note"])]
    v = hw["vulkan"]
    if v:
        peak = flops(v["peak_flops"])
        out.append(f"{v['where']}: {v['name']} ({v['type']}; {v['driver']}); float32 peak {peak} ({v['peak_note']})")
    out.append("")
    rows = []
    for r in rep["rows"]:
        where = r["where"] + (f" by {r['computed_by']}" if r["computed_by"] != r["backend"] else "")
        spread = f"{seconds(r['min_s'])} - {seconds(r['max_s'])}"
        gpu = seconds(r.get("gpu_median_s")) if "gpu_median_s" in r else "-"
        rows.append([r["point"], r["backend"], where, r["op"], seconds(r["median_s"]), spread, str(r["n"]), gpu,
                     rate(r["updates_per_s"]), seconds(r["floor_s"])])
    out.append(table(["shape", "backend", "where", "op", "median", "min - max", "n", "GPU", "updates/s", "floor"],
                     rows, right={4, 5, 6, 7, 8, 9}))
    out.append("median, min - max: wall time per call over n calls after a warm-up; GPU: timestamps of the "
               "same calls; updates/s: S*T*H*P*N / median; floor: float32 FLOPs / peak "
               f"({rep['flops_per_update']['fwd']} per update fwd, {rep['flops_per_update']['bwd']} bwd)")
    for s in rep["skipped"]:
        out.append(f"skipped {s['backend']} on {s['shape']}: {s['reason']}")
    ld = rep.get("load")
    if ld and ld["before"]["loadavg_1min"] is not None:
        out.append(f"load: 1-minute load average {ld['before']['loadavg_1min']:.2f} before, "
                   f"{ld['after']['loadavg_1min']:.2f} after, {ld['before']['cores']} cores"
                   + (" (busy: see the warning)" if ld["busy"] else " (idle)"))
    return "\n".join(out)
