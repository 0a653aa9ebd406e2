"""Plain-text tables and number formats for the commands' output."""

from __future__ import annotations

import math


def table(headers: list[str], rows: list[list[str]], right: set[int] | None = None, indent: str = "") -> str:
    """Columns padded to their widest cell, two spaces apart; ``right`` holds the indices of the
    columns aligned right (numbers)."""
    right = right or set()
    cols = len(headers)
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(cols)]

    def line(cells):
        out = []
        for i, c in enumerate(cells):
            c = str(c)
            out.append(c.rjust(widths[i]) if i in right else c.ljust(widths[i]))
        return (indent + "  ".join(out)).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def seconds(s: float | None) -> str:
    """A duration in the unit that keeps 3 significant digits: 12.3 us, 4.56 ms, 1.23 s."""
    if s is None or not math.isfinite(s):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if s >= scale or unit == "ns":
            v = s / scale
            return f"{v:.3g} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return "-"


def bytes_(n: int | float) -> str:
    """1536 -> '1.5 KiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def sci(x: float | None) -> str:
    """2 significant digits in scientific notation; '0' for an exact zero, 'inf' for inf."""
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return "inf" if x > 0 else "nan"
    return f"{x:.1e}"


def rate(x: float | None) -> str:
    """3.4e9 -> '3.4 G'."""
    if x is None or not math.isfinite(x) or x <= 0:
        return "-"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} "


def flops(x: float | None) -> str:
    """2.69e11 -> '269 GFLOP/s'."""
    if not x:
        return "unknown"
    for unit, scale in (("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} FLOP/s"
