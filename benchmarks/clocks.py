"""The GPU's SM clock while each timing of a vk_speed.py run was taken.

    python benchmarks/clocks.py RESULTS.json CLOCKS.csv CLOCK_EPOCH.txt

CLOCKS.csv is the log benchmarks/gpu_env.sh keeps (nvidia-smi every 100 ms), CLOCK_EPOCH.txt the
host time when it started (its timestamps are the GPU host's local time: the first line is
aligned to it). Prints, per row, the GPU times beside the SM clocks (min / median / max, MHz)
sampled during the forward, backward and step measurements, and over the whole case (warm-ups
and the float64 check included).
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import statistics
import sys


def samples(path: str, epoch_path: str) -> list[tuple[float, float]]:
    rows = list(csv.reader(open(path)))[1:]
    rows = [r for r in rows if len(r) > 2 and "MHz" in r[1]]

    def t(s):
        return datetime.datetime.strptime(s.strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()

    off = float(open(epoch_path).read()) - t(rows[0][0])
    return [(t(r[0]) + off, float(r[1].split()[0])) for r in rows]


def log_samples(path: str | None = None) -> tuple[list | None, str]:
    """(samples, "") of the clock log at ``path`` (default: $OUT/clocks.csv, where gpu_env.sh keeps
    it), aligned by the clock_epoch.txt beside it; (None, "") where there is none; (None, why)
    where it cannot be read (a log cut short, another format)."""
    if path is None and os.environ.get("OUT"):
        path = os.path.join(os.environ["OUT"], "clocks.csv")
    if not path or not os.path.isfile(path):
        return None, ""
    try:
        return samples(path, os.path.join(os.path.dirname(path), "clock_epoch.txt")), ""
    except Exception as e:  # (the caller says it; its timings stand without clocks)
        return None, f"clock log {path} not read: {type(e).__name__}: {e}"


def during(clk, span) -> str:
    if not span or len(span) != 2 or None in span:
        return "-"
    v = [mhz for ts, mhz in clk if span[0] - 0.05 <= ts <= span[1] + 0.05]
    return f"{min(v):.0f}/{statistics.median(v):.0f}/{max(v):.0f}" if v else "-"


def main(argv=None) -> int:
    res, log, epoch = (argv or sys.argv[1:])[:3]
    clk = samples(log, epoch)
    for r in json.load(open(res))["rows"]:
        print(f"{r['shape']:7s} {r['variant']:16s} "
              f"fwd {r['fwd_gpu_us']:8.1f} us @ {during(clk, r.get('fwd_t')):>14s} MHz"
              f"   bwd {r['bwd_gpu_us']:8.1f} us @ {during(clk, r.get('bwd_t')):>14s} MHz"
              f"   step wall {r['step_wall_us']:8.1f} us @ {during(clk, r.get('step_t')):>14s} MHz"
              f"   (whole case {during(clk, [r.get('t_start'), r.get('t_end')]):>14s} MHz)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
