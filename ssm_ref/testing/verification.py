"""``ssm_ref.testing.verify``: check a callable implementation against the golden vectors, with a
report.

    from ssm_ref.testing import verify
    report = verify(my_forward, my_backward)        # or vectors="golden/" (a directory)
    report = verify(my_port)                        # a module with ssm_scan, ssm_scan_back
    print(report)                                   # one line per case and output
    assert report.ok

What the callables get and may return: docs/PORTING.md, "The port interface" (ssm_ref.testing.ports,
the reading ``ssm-scan check`` and ``ssm-scan fuzz`` use too).

* ``fn_forward(s, x, dt, A, B, C, ids)``: float32 numpy arrays of SPEC.md's shapes (A in the
  shape the case gives it: (H,), (H, 1) or (H, N)); ids int32 (S,).
* ``fn_backward(s, x, dt, A, B, C, ids, g_y, g_states)``: the same plus g_y (S,T,H,P) and
  g_states (S,H,P,N). A result without d_s (a 6-tuple, a packed array) leaves d_s unchecked.

Either callable may be None (not checked). Both are called positionally, with fresh copies of the
inputs each call. The cases of state snapshots (``snapshots_*``: K in their dims) are checked on a
port that declares SNAPSHOTS (or callables given ``snapshots="all"`` / ``"ggml"``): the forward
is called with ``snapshots=K`` (K > 1) and its snapshots compared (a "ggml" port: the slots k < T),
the backward with ``g_snapshots=``; the cases of K > 1 are left out for one that does not (an
ERROR row when named in ``cases``), and the K = 1 case checks its y and states. ``verify`` never
raises: bad arguments (neither callable, a missing vectors directory, unknown case names) and
whatever the callables raise become ERROR rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ssm_ref.ops import SCAN
from ssm_ref.tolerance import F32_TOL, OUTPUTS, Comparison, compare, scaled, share_text, value_text

from . import ports

__all__ = ["VerifyReport", "VerifyRow", "verify"]

BLOCKS = ("d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C")


@dataclass(frozen=True)
class VerifyRow:
    """One output of one case. ``comparison`` is None when the call failed or an argument was
    bad: ``error`` says what ("RuntimeError: device lost"), ``traceback`` holds the formatted
    traceback of an exception (the callable's own frames)."""

    case: str
    output: str
    comparison: Comparison | None
    error: str = ""
    traceback: str = ""

    @property
    def ok(self) -> bool:
        return self.comparison is not None and self.comparison.ok


def _cells(r: VerifyRow) -> list[str]:
    c = r.comparison
    if c is None:
        return [r.case, r.output, "", "", "", "", "", "", f"ERROR {r.error}"]
    verdict = "PASS" if c.ok else "FAIL" + (f" ({c.detail})" if c.detail else "")
    if c.detail:
        nums = ["", "", ""]
    else:
        nums = [f"{c.rel:.2e}", f"{c.rel_bound:.2e}", share_text(c.used, short=True)]
    worst = ["", "", ""] if c.index is None else [str(c.index), value_text(c.got), value_text(c.want)]
    return [r.case, r.output, *nums, *worst, verdict]


@dataclass
class VerifyReport:
    """Every row of a verification; ``ok`` iff there are rows and every row passed. ``str(report)``
    is a table: case, output, norm-relative error, the bound as a norm-relative error, the share
    of the bound used, the worst element (its index into the output, got and want there),
    PASS/FAIL/ERROR; then the traceback of each exception."""

    rows: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows)

    def failures(self) -> list:
        return [r for r in self.rows if not r.ok]

    def __str__(self) -> str:
        head = ["case", "output", "rel err", "bound", "of bound", "worst at", "got", "want", "result"]
        body = [_cells(r) for r in self.rows]
        widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head) - 1)]
        right = {2, 3, 4, 6, 7}

        def line(cells):
            out = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths,
                                                                                          strict=False))]
            return "  ".join([*out, cells[-1]]).rstrip()

        lines = [line(head), "-" * len(line(head))] + [line(c) for c in body]
        for r in self.rows:
            if r.traceback:
                lines += ["", f"{r.case} {r.output}: {r.error}",
                          *("  " + x for x in r.traceback.splitlines())]
        n_bad = len(self.failures())
        lines.append(f"{len(self.rows) - n_bad} of {len(self.rows)} passed" + ("" if n_bad else ": all PASS"))
        return "\n".join(lines)


def _args(g, *extra) -> tuple:
    """Fresh copies of the inputs, positional, in the port interface's order."""
    return tuple(np.array(g.inputs[k]) for k in (*SCAN.input_names, *extra))


def _check(rows: list, g, label: str, fn, op: str, extra: tuple, names, tol: dict, backend: str,
           kind: str = "") -> None:
    K = g.K if kind else 1
    try:
        got = ports.call(fn, op, _args(g, *extra), backend=backend, K=K,
                         g_snapshots=g.inputs.get("g_snapshots") if op == "ssm_scan_back" else None)
    except Exception as e:  # the port's own error: reported, not raised
        rows.append(VerifyRow(g.name, label, None, ports.error_text(e), ports.traceback_text(e)))
        return
    for k in names:
        if k in got:
            rows.append(VerifyRow(g.name, k, compare(k, got[k], g.expected[k], tol[k])))
    if op == "ssm_scan" and kind and "snapshots" in g.expected:
        n = ports.compared_slots(kind, K, g.dims["T"])
        snaps = got["snapshots"] if "snapshots" in got else got["states"][None] if K == 1 and "states" in got \
            else None                           # K = 1: the one slot is the states (y | states packed)
        if snaps is None:
            rows.append(VerifyRow(g.name, "snapshots", None, f"TypeError: {op} returned no snapshots (K = {K})"))
        else:
            c = compare("snapshots", snaps[:n], g.expected["snapshots"][:n], tol["states"])
            rows.append(VerifyRow(g.name, "snapshots" if n == K else f"snapshots[:{n}]", c))


def _callables(fn_forward, fn_backward) -> tuple:
    """(forward, backward, name, problems, kind): a port module becomes its two functions and its
    SNAPSHOTS kind ("" for callables)."""
    if fn_forward is not None and not callable(fn_forward) and hasattr(fn_forward, "ssm_scan"):
        port = fn_forward
        problems = [f"fn_forward: the port {ports.port_name(port)} {p}" for p in ports.interface_problems(port)]
        if fn_backward is not None:
            problems.append("fn_backward: give a port module alone (its ssm_scan_back is used), not with "
                            "fn_backward")
        if problems:
            return None, None, "", problems, ""
        return port.ssm_scan, port.ssm_scan_back, ports.port_name(port), [], ports.snapshot_kind(port)
    problems = []
    if fn_forward is None and fn_backward is None:
        problems.append("give fn_forward, fn_backward or both (or a port module as fn_forward)")
    for what, fn in (("fn_forward", fn_forward), ("fn_backward", fn_backward)):
        if fn is not None and not callable(fn):
            problems.append(f"{what}: expected a callable (or None), got {type(fn).__name__}")
    name = getattr(fn_forward if fn_forward is not None else fn_backward, "__module__", "") or ""
    return fn_forward, fn_backward, name, problems, ""


def _tol_problem(tol) -> str:
    if tol is None:
        return ""
    if not isinstance(tol, Mapping):
        return f"tol: expected a mapping output -> Tol (ssm_ref.tolerance.F32_TOL), got {type(tol).__name__}"
    missing = [k for k in OUTPUTS if k not in tol]
    bad = [k for k in OUTPUTS if k in tol and not all(
        isinstance(getattr(tol[k], a, None), int | float) and math.isfinite(getattr(tol[k], a)) and
        getattr(tol[k], a) >= 0 for a in ("rtol", "atol"))]
    if missing or bad:
        return (f"tol: expected a Tol (finite rtol, atol >= 0) for every output of {list(OUTPUTS)}"
                + (f"; missing {missing}" if missing else "") + (f"; not a Tol: {bad}" if bad else ""))
    return ""


def _case_names(cases) -> tuple[list | None, str]:
    if cases is None:
        return None, ""
    if isinstance(cases, str):
        return [cases], ""
    if not isinstance(cases, Iterable):
        return [], f"cases: expected case names (a list of str), got {type(cases).__name__}"
    names = list(cases)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        return [], f"cases: expected names (str), got {bad[0]!r}"
    return names, ""


def verify(fn_forward, fn_backward=None, *, vectors=None, cases=None, tol=None, snapshots=None) -> VerifyReport:
    """Check ``fn_forward`` / ``fn_backward`` against the golden vectors; returns a VerifyReport.

    fn_forward may also be a port module (NAME, ssm_scan, ssm_scan_back, supports; docs/PORTING.md,
    "The port interface") with fn_backward None: both of its functions are checked.
    vectors: None (compute the golden cases now with ssm_ref) or a directory written by
    ``ssm-scan vectors`` / ``ssm_ref.testing.vectors.write_vectors``. cases: names to check (default all;
    see ssm_ref.testing.vectors.GOLDEN; one name as a str is fine). Each output passes when
    ||got - want|| <= rtol * ||want|| + atol * sqrt(size) (non-finite entries must match exactly),
    with ``tol`` (an output -> Tol table; default ssm_ref.tolerance.F32_TOL, F64_TOL for a
    float64 implementation) scaled for the case's T. snapshots: what the callables take of K
    (a port's SNAPSHOTS: None, "all" or "ggml"; module docstring); default: the port module's
    own declaration, none for callables.
    Never raises: an exception from a callable becomes an ERROR row of that case (with its
    traceback), a bad argument an ERROR row of case "-"; either makes the report not ok.
    """
    from .vectors import GOLDEN, golden_cases, read_vectors

    report = VerifyReport()

    def arg_error(output: str, message: str) -> None:
        report.rows.append(VerifyRow("-", output, None, message))

    fwd, back, name, problems, kind = _callables(fn_forward, fn_backward)
    for msg in problems:
        arg_error("arguments", msg)
    if snapshots is not None:
        try:
            kind = ports.snapshot_kind(type("Port", (), {"SNAPSHOTS": snapshots}))
        except TypeError:
            arg_error("snapshots", f"snapshots: expected None, 'all' or 'ggml', got {snapshots!r}")
    why = _tol_problem(tol)
    if why:
        arg_error("tol", why)
    names, why = _case_names(cases)
    if why:
        arg_error("cases", why)
    if report.rows:
        return report
    if vectors is None:
        available = list(GOLDEN)
    else:
        try:
            goldens = read_vectors(vectors)
        except Exception as e:  # missing directory, unreadable or foreign files
            arg_error("vectors", f"vectors: cannot read golden vectors from {str(vectors)!r}: {ports.error_text(e)}")
            return report
        available = [g.name for g in goldens]
    unknown = [n for n in names or () if n not in available]
    for n in unknown:
        arg_error("cases", f"cases: unknown case {n!r}; the cases are: {', '.join(available)}")
    wanted = [n for n in (available if names is None else names) if n in available]
    if vectors is None:
        goldens = golden_cases(wanted)
    else:
        goldens = [g for g in goldens if g.name in set(wanted)]
    for g in goldens:
        if g.K > 1 and not kind:
            if names is not None and g.name in names:
                arg_error("cases", f"cases: {g.name} asks for K = {g.K} state snapshots; this port takes no "
                                   "snapshots=K (declare SNAPSHOTS, docs/PORTING.md)")
            continue
        t = scaled(F32_TOL if tol is None else tol, g.dims["T"])
        if fwd is not None:
            _check(report.rows, g, "forward", fwd, "ssm_scan", (), SCAN.output_names, t, name, kind)
        if back is not None:
            _check(report.rows, g, "backward", back, "ssm_scan_back", SCAN.cotangent_names, ("d_s", *BLOCKS), t,
                   name, kind)
    return report
