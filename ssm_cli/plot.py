"""The bench plot: time per call against the swept axis, one panel per shape, one line per backend
and op, log-log, labelled with the hardware. Needs matplotlib (the ``plot`` extra); drawn
off-screen (Agg)."""

from __future__ import annotations

from pathlib import Path

from .common import OutputError, UsageError

# One colour per backend, one marker and line style per op; GPU time (timestamps) dotted with
# hollow markers beside the wall time.
COLOURS = {"ssm_ref": "tab:gray", "ssm_fast": "tab:blue", "ssm_vk": "tab:red"}
STYLES = {"fwd": ("o", "-"), "bwd": ("s", "--")}
EXTRA_COLOURS = ("tab:green", "tab:purple", "tab:brown", "tab:olive", "tab:cyan")
AXIS_NAMES = {"T": "T (tokens per sequence)", "S": "S (sequences)", "H": "H (heads)", "P": "P (head_dim)",
              "N": "N (d_state)", "G": "G (groups)"}


def plot_bench(report: dict, path: str) -> Path:
    """Draw ``report`` (bench's JSON) into ``path`` (PNG, or any format matplotlib knows by the
    suffix). Returns the path. Raises UsageError without matplotlib or for an unknown format,
    OutputError for an unwritable path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter
    except ImportError:
        from ssm_ref.extras import install_hint

        raise UsageError(f"--plot needs matplotlib: {install_hint('plot', 'matplotlib')}") from None

    axis = (report.get("sweep") or {"axis": "T"})["axis"]
    rows = report["rows"]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))  # in the order measured
    colours = _colours(r["backend"] for r in rows)
    n = max(len(shapes), 1)
    fig, axes = plt.subplots(1, n, figsize=(6.0 * n + 3.2, 5.6), dpi=110, squeeze=False)
    handles: dict[str, object] = {}
    for ax, shape in zip(axes[0], shapes, strict=True):
        mine = [r for r in rows if r["shape"] == shape]
        _panel(ax, mine, axis, colours, handles)
        ax.set_xscale("log", base=2 if _powers_of_two(mine, axis) else 10)
        ax.set_yscale("log")
        xs = sorted({r["dims"][axis] for r in mine})
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="major", alpha=0.4)
        ax.grid(True, which="minor", alpha=0.12)
        ax.set_xlabel(AXIS_NAMES[axis])
        ax.set_title(f"{shape}\n{_fixed_dims(mine[0], axis)}", fontsize=10)
    axes[0][0].set_ylabel("time per call (ms; median, bars min - max)")
    fig.suptitle(f"ssm-scan bench: time per call against {axis}", fontsize=12)
    hw = report["hardware"]
    lines = [f"CPU: {hw['cpu']}"]
    if hw.get("vulkan"):
        v = hw["vulkan"]
        lines.append(f"{v['where']}: {v['name']} ({v['type']}), {v['driver']}")
    fig.text(0.5, 0.005, "\n".join(lines), ha="center", va="bottom", fontsize=8, color="0.3")
    labels = sorted(handles, key=_legend_key)
    fig.legend([handles[k] for k in labels], labels, fontsize=8, loc="upper left",
               bbox_to_anchor=(1 - 3.1 / (6.0 * n + 3.2), 0.9), borderaxespad=0)
    fig.tight_layout(rect=(0, 0.06, 1 - 3.2 / (6.0 * n + 3.2), 1))
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out)
    except OSError as e:
        raise OutputError(f"--plot {path}: cannot write: {e.strerror or e}") from None
    except ValueError as e:  # a suffix matplotlib does not know
        raise UsageError(f"--plot {path}: cannot write: {e}") from None
    finally:
        plt.close(fig)
    return out


def _panel(ax, rows: list[dict], axis: str, colours: dict, handles: dict) -> None:
    """One shape: wall (and GPU) time per backend and op, and the FLOP floors."""
    series: dict[tuple, list] = {}
    for r in rows:
        series.setdefault((r["backend"], r["op"]), []).append(r)
    for (backend, op), rs in series.items():
        rs = sorted(rs, key=lambda r: r["dims"][axis])
        xs = [r["dims"][axis] for r in rs]
        ms = [r["median_s"] * 1e3 for r in rs]
        err = [[m - r["min_s"] * 1e3 for m, r in zip(ms, rs, strict=True)],
               [r["max_s"] * 1e3 - m for m, r in zip(ms, rs, strict=True)]]
        marker, style = STYLES[op]
        label = f"{backend} {op} ({rs[0]['where']})"
        h = ax.errorbar(xs, ms, yerr=err, color=colours[backend], marker=marker, linestyle=style, capsize=3)
        handles.setdefault(f"{label}, wall", h)
        gpu = [r for r in rs if r.get("gpu_median_s")]
        if gpu:
            (h,) = ax.plot([r["dims"][axis] for r in gpu], [r["gpu_median_s"] * 1e3 for r in gpu],
                           color=colours[backend], marker=marker, markerfacecolor="none", linestyle=":")
            handles.setdefault(f"{label}, GPU timestamps", h)
    # FLOP floor per op and per peak (the CPU's; a Vulkan device's where known). A CPU Vulkan
    # device (lavapipe) has the CPU's peak: one line serves both.
    floors: dict[tuple, dict] = {}
    for r in rows:
        if r.get("floor_s"):
            dev = r["where"].split("/")[0] if r["where"].startswith("Vulkan") else "CPU"
            f = floors.setdefault((r["op"], r["floor_s"] / r["flops"]), {"devs": set(), "pts": {}})
            f["devs"].add(dev)
            f["pts"][r["dims"][axis]] = r["floor_s"] * 1e3
    for (op, _), f in floors.items():
        xs = sorted(f["pts"])
        (h,) = ax.plot(xs, [f["pts"][x] for x in xs], color="0.45", alpha=0.8, linestyle=STYLES[op][1],
                       linewidth=1)
        handles.setdefault(f"float32 FLOP floor {op} ({' = '.join(sorted(f['devs']))} peak)", h)


def _colours(backends) -> dict:
    out = dict(COLOURS)
    extra = iter(EXTRA_COLOURS)
    for b in backends:
        if b not in out:
            out[b] = next(extra, "black")
    return out


def _legend_key(label: str) -> tuple:
    """Backends in their usual order, fwd before bwd, wall before GPU time, floors last."""
    backend = label.split()[0]
    rank = list(COLOURS).index(backend) if backend in COLOURS else len(COLOURS)
    return (label.startswith("float32"), rank, backend, " bwd " in label, "GPU" in label)


def _powers_of_two(rows, axis) -> bool:
    return all(v > 0 and v & (v - 1) == 0 for v in {r["dims"][axis] for r in rows})


def _fixed_dims(row: dict, axis: str) -> str:
    dims = " ".join(f"{k}={v}" for k, v in row["dims"].items() if k != axis)
    return f"{dims}, {row['variant']}" if row.get("variant") else dims
