"""The bench plot: time per call against the swept axis, one line per backend and op, log-log,
labelled with the hardware. Needs matplotlib (the ``plot`` extra); drawn off-screen (Agg)."""

from __future__ import annotations

from pathlib import Path

from .common import UsageError

# One colour per backend, one line style per op; GPU time (timestamps) dotted beside wall time.
COLOURS = {"ssm_ref": "tab:gray", "ssm_fast": "tab:blue", "ssm_vk": "tab:red"}
STYLES = {"fwd": ("o", "-"), "bwd": ("s", "--")}
EXTRA_COLOURS = ("tab:green", "tab:purple", "tab:brown", "tab:olive", "tab:cyan")


def plot_bench(report: dict, path: str) -> Path:
    """Draw ``report`` (bench's JSON) into ``path`` (PNG, or any format matplotlib knows by the
    suffix). Returns the path. Raises UsageError without matplotlib or for an unwritable path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'ssm-scan[plot]'") from None

    sweep = report.get("sweep") or {"axis": "T", "values": []}
    axis = sweep["axis"]
    rows = report["rows"]
    series: dict[tuple, list] = {}
    for r in rows:
        series.setdefault((r["shape"], r["backend"], r["op"]), []).append(r)
    shapes = sorted({r["shape"] for r in rows})
    extra = iter(EXTRA_COLOURS)
    colours = dict(COLOURS)

    fig, ax = plt.subplots(figsize=(11, 6), dpi=110)
    for (shape, backend, op), rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: r["dims"][axis])
        xs = [r["dims"][axis] for r in rs]
        ms = [r["median_s"] * 1e3 for r in rs]
        lo = [m - r["min_s"] * 1e3 for m, r in zip(ms, rs, strict=True)]
        hi = [r["max_s"] * 1e3 - m for m, r in zip(ms, rs, strict=True)]
        if backend not in colours:
            colours[backend] = next(extra, "black")
        marker, style = STYLES[op]
        where = rs[0]["where"]
        label = f"{backend} {op} ({where})" + (f", {shape}" if len(shapes) > 1 else "")
        ax.errorbar(xs, ms, yerr=[lo, hi], color=colours[backend], marker=marker, linestyle=style,
                    capsize=3, label=f"{label}, wall")
        gpu = [r for r in rs if r.get("gpu_median_s")]
        if gpu:
            ax.plot([r["dims"][axis] for r in gpu], [r["gpu_median_s"] * 1e3 for r in gpu], color=colours[backend],
                    marker=marker, markerfacecolor="none", linestyle=":", label=f"{label}, GPU timestamps")
    # The FLOP floor per op and per peak (the CPU's; a Vulkan device's where known). A CPU Vulkan
    # device (lavapipe) has the CPU's peak: one line serves both.
    floors: dict[tuple, dict] = {}
    for r in rows:
        if r.get("floor_s"):
            dev = r["where"].split("/")[0] if r["where"].startswith("Vulkan") else "CPU"
            floors.setdefault((r["op"], r["floor_s"] / r["flops"]), {"devs": set(), "pts": {}})
            f = floors[(r["op"], r["floor_s"] / r["flops"])]
            f["devs"].add(dev)
            f["pts"][r["dims"][axis]] = r["floor_s"] * 1e3
    for (op, _), f in sorted(floors.items(), key=lambda kv: (kv[0][0] != "fwd", kv[0][1])):
        xs = sorted(f["pts"])
        devs = " = ".join(sorted(f["devs"]))
        ax.plot(xs, [f["pts"][x] for x in xs], color="0.45", alpha=0.8, linestyle=STYLES[op][1], linewidth=1,
                label=f"float32 FLOP floor {op} ({devs} peak)")

    ax.set_xscale("log", base=2 if _powers_of_two(rows, axis) else 10)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.grid(True, which="major", alpha=0.4)
    ax.grid(True, which="minor", alpha=0.12)
    ax.set_xlabel(_axis_name(axis))
    ax.set_ylabel("time per call (ms, median; bars: min - max)")
    fixed = _fixed_dims(rows, axis)
    ax.set_title(f"ssm-scan bench: {', '.join(shapes)} ({fixed}), {axis} swept", fontsize=11)
    hw = report["hardware"]
    lines = [f"CPU: {hw['cpu']}"]
    if hw.get("vulkan"):
        v = hw["vulkan"]
        lines.append(f"{v['where']}: {v['name']} ({v['type']}), {v['driver']}")
    fig.text(0.5, 0.005, "\n".join(lines), ha="center", va="bottom", fontsize=8, color="0.3")
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: _legend_key(labels[i]))
    ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out)
    except (OSError, ValueError) as e:
        raise UsageError(f"--plot {path}: cannot write: {e}") from None
    finally:
        plt.close(fig)
    return out


def _legend_key(label: str) -> tuple:
    """Backends in their usual order, fwd before bwd, wall before GPU time, floors last."""
    backend = label.split()[0]
    rank = list(COLOURS).index(backend) if backend in COLOURS else len(COLOURS)
    return (label.startswith("float32"), rank, backend, " bwd " in label, "GPU" in label)


def _powers_of_two(rows, axis) -> bool:
    vals = {r["dims"][axis] for r in rows}
    return all(v > 0 and v & (v - 1) == 0 for v in vals)


def _axis_name(axis: str) -> str:
    return {"T": "T (tokens per sequence)", "S": "S (sequences)", "H": "H (heads)", "P": "P (head_dim)",
            "N": "N (d_state)", "G": "G (groups)"}[axis]


def _fixed_dims(rows, axis) -> str:
    if not rows:
        return ""
    d = rows[0]["dims"]
    variant = rows[0].get("variant", "")
    return " ".join(f"{k}={v}" for k, v in d.items() if k != axis) + (f", {variant}" if variant else "")
