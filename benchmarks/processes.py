"""Several fresh processes per measurement, and the spread across them.

mamba_ssm's Triton kernels pick their configurations by timing them anew in every process, and
its GPU time at one shape has been seen to move by up to 2x from one process to the next; one
process is therefore not a measurement to act on. ``vs_mamba_ssm.py`` and
``torch_side_by_side.py`` run their whole measurement in ``--processes`` fresh interpreters (3 by
default), each writing its own JSON, and report per row the minimum, median and maximum over the
processes of each side and of the ratio formed *within* each process (both sides of a ratio
always come from the same process, interleaved round by round).

    children(script, argv, n, ...)   -> the n processes' JSON reports, in order
    without(argv, ("--json",))       -> argv without those flags and their values
    spread([680.1, 675.0, 684.2])    -> Spread(lo=675.0, med=680.1, hi=684.2, n=3)
    str(spread(...))                 -> "680 (675-684)"

Imported by the two scripts; not run on its own.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Spread:
    """Minimum, median and maximum of one figure over the processes that measured it."""

    lo: float
    med: float
    hi: float
    n: int

    def __str__(self) -> str:
        return fmt(self)

    def as_dict(self) -> dict:
        return {"min": self.lo, "median": self.med, "max": self.hi, "processes": self.n}


def spread(values) -> Spread | None:
    """The spread of the finite values, or None when there is none."""
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not v:
        return None
    return Spread(min(v), statistics.median(v), max(v), len(v))


def _num(v: float, digits: int) -> str:
    if digits:
        return f"{v:.{digits}f}"
    return f"{v:.1f}" if abs(v) < 100 else f"{v:.0f}"


def fmt(s: Spread | None, digits: int = 0) -> str:
    """"median (min-max)", the median alone when every process gave the same figure (to the shown
    digits) or one process ran; "-" for None. ``digits`` 0: times (one decimal below 100, else
    none); 2: ratios."""
    if s is None:
        return "-"
    lo, med, hi = _num(s.lo, digits), _num(s.med, digits), _num(s.hi, digits)
    return med if lo == hi else f"{med} ({lo}-{hi})"


def children(script: str | Path, argv: list[str], n: int, *, json_flag: str = "--json",
             first_extra: list[str] = (), rest_extra: list[str] = (), budget_s: float | None = None,
             budget_flag: str = "--budget-s", env: dict | None = None, grace_s: float | None = None) -> list[dict]:
    """Run ``python script *argv`` in ``n`` fresh processes one after another, each with
    ``json_flag FILE`` of its own (the caller's argv must not carry one), ``first_extra`` added to
    the first process's arguments and ``rest_extra`` to the others'. With ``budget_s``, process i
    gets ``budget_flag`` set to an equal share of what is left (the time left over n - i), and is
    killed ``grace_s`` past it (default a quarter of its share, at least 30 s): a child checks its budget between its
    steps, and one step (a compiler's autotuning, a float64 check) can outlast it, which would
    take the time of the processes after it and of the caller's summary. Their output goes to
    this process's output as it comes. Returns the reports in order; a process that failed, was
    killed or wrote no JSON gives ``{"failed": "..."}`` in its place."""
    out = []
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="procs_"))
    for i in range(n):
        path = tmp / f"process{i}.json"
        cmd = [sys.executable, str(script), *argv, *(first_extra if i == 0 else rest_extra), json_flag, str(path)]
        kill_s = None
        if budget_s is not None:
            share = max((budget_s - (time.monotonic() - t0)) / (n - i), 1.0)
            cmd += [budget_flag, f"{share:.0f}"]
            kill_s = share + (max(30.0, share / 4) if grace_s is None else grace_s)
        print(f"\n== process {i + 1} of {n}: {' '.join(cmd[1:])}", flush=True)
        try:
            rc = subprocess.run(cmd, env={**os.environ, **(env or {})}, timeout=kill_s).returncode
        except subprocess.TimeoutExpired:
            print(f"== process {i + 1} of {n}: killed {kill_s:.0f} s after its start (its budget's share "
                  f"{share:.0f} s)", flush=True)
            out.append({"failed": f"killed after {kill_s:.0f} s (budget share {share:.0f} s)", "process": i})
            continue
        try:
            rep = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            rep = {"failed": f"exit status {rc}, no report: {type(e).__name__}: {e}"}
        if rc and "failed" not in rep:
            rep["exit_status"] = rc
        rep["process"] = i
        out.append(rep)
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def without(argv: list[str], flags: tuple) -> list[str]:
    """``argv`` without ``flags`` and their values (``--flag v`` or ``--flag=v``): a parent's
    arguments for its children, which get those of their own."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in flags:
            skip = True
            continue
        if any(a.startswith(f + "=") for f in flags):
            continue
        out.append(a)
    return out
