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

Any other declared op (``op="mamba3_scan"``) is verified against its own golden cases
(ssm_ref.testing.vectors: ``ssm-scan vectors --op NAME``) through its declaration: inputs,
outputs and gradients by name, the case's keyword arguments passed to every call.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from ssm_ref import ops
from ssm_ref.ops import SCAN
from ssm_ref.tolerance import Comparison, compare, share_text, value_text

from . import ports

__all__ = ["VerifyReport", "VerifyRow", "verify"]


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


def _check(rows: list, g, fn, op: ops.Op, backward: bool, tol: dict, backend: str, kind: str = "") -> None:
    """One golden case on ``fn`` (the op's forward, or with ``backward`` its backward), read through
    ssm_ref.testing.ports.call_op (fresh copies of the inputs; the case's keywords, and for a port
    of SNAPSHOTS ``kind`` its K state snapshots): a row per output (gradient) it gives, and the
    scan's snapshot slots."""
    fn_name = op.backward_name if backward else op.name
    port = SimpleNamespace(NAME=backend, **{fn_name: fn})
    args = {k: np.array(g.inputs[k]) for k in op.input_names if k in g.inputs}
    cot = {k: np.array(g.inputs[k]) for k in op.cotangent_names if k in g.inputs} if backward else None
    K = g.K if kind else 1
    kw = {**g.keywords, **ports.snapshot_keywords(K, g.inputs.get("g_snapshots"), backward)}
    try:
        got = ports.call_op(port, op, args, cot, keywords=kw)
    except Exception as e:  # the port's own error: reported, not raised
        rows.append(VerifyRow(g.name, "backward" if backward else "forward", None, ports.error_text(e),
                              ports.traceback_text(e)))
        return
    for k in op.grad_names if backward else op.output_names:
        if k not in got:                      # left out (the scan's d_s of a 6-tuple): not checked
            continue
        have, want = got[k], g.expected.get(k)
        if have is None and want is None:     # the gradient of an input left None: none on either side
            continue
        if want is None:
            rows.append(VerifyRow(g.name, k, None, f"TypeError: {fn_name} returned {k}, expected None (its input "
                                                   "was not given)"))
        elif have is None:
            rows.append(VerifyRow(g.name, k, None, f"TypeError: {fn_name} returned None for {k}"))
        else:
            rows.append(VerifyRow(g.name, k, compare(k, have, want, tol[k])))
    if not backward and kind and "snapshots" in g.expected:
        n = ports.compared_slots(kind, K, g.dims["T"])
        snaps = got["snapshots"] if "snapshots" in got else got["states"][None] if K == 1 and "states" in got \
            else None                           # K = 1: the one slot is the states (y | states packed)
        if snaps is None:
            rows.append(VerifyRow(g.name, "snapshots", None, f"TypeError: {fn_name} returned no snapshots (K = {K})"))
        else:
            c = compare("snapshots", snaps[:n], g.expected["snapshots"][:n], tol["states"])
            rows.append(VerifyRow(g.name, "snapshots" if n == K else f"snapshots[:{n}]", c))


def _callables(fn_forward, fn_backward, op: ops.Op = SCAN) -> tuple:
    """(forward, backward, name, problems, kind): a port module becomes its two functions of
    ``op`` and its SNAPSHOTS kind ("" for callables and for ops other than the scan)."""
    if fn_forward is not None and not callable(fn_forward) and hasattr(fn_forward, op.name):
        port = fn_forward
        problems = [f"fn_forward: the port {ports.port_name(port)} {p}" for p in ports.interface_problems(port, op)]
        if fn_backward is not None:
            problems.append(f"fn_backward: give a port module alone (its {op.backward_name} is used), not with "
                            "fn_backward")
        if problems:
            return None, None, "", problems, ""
        kind = ports.snapshot_kind(port) if op.name == SCAN.name else ""
        return getattr(port, op.name), getattr(port, op.backward_name), ports.port_name(port), [], kind
    problems = []
    if fn_forward is None and fn_backward is None:
        problems.append("give fn_forward, fn_backward or both (or a port module as fn_forward)")
    for what, fn in (("fn_forward", fn_forward), ("fn_backward", fn_backward)):
        if fn is not None and not callable(fn):
            problems.append(f"{what}: expected a callable (or None), got {type(fn).__name__}")
    name = getattr(fn_forward if fn_forward is not None else fn_backward, "__module__", "") or ""
    return fn_forward, fn_backward, name, problems, ""


def _op_of(op, goldens) -> tuple:
    """(the Op to verify, a problem or ""): ``op`` given (a name or an Op), else the one op of the
    vectors read (``goldens``), else the scan."""
    if op is None:
        found = sorted({g.op for g in goldens or ()})
        if len(found) > 1:
            return None, f"op: the vectors hold cases of {found}: name the op to verify"
        op = found[0] if found else SCAN
    if isinstance(op, ops.Op):
        return op, ""
    try:
        return ops.get(op), ""
    except ValueError as e:
        return None, str(e)


def _tol_problem(tol, op: ops.Op = SCAN) -> str:
    if tol is None:
        return ""
    if not isinstance(tol, Mapping):
        return f"tol: expected a mapping output -> Tol (ssm_ref.tolerance.F32_TOL), got {type(tol).__name__}"
    names = (*op.output_names, *op.grad_names)
    missing = [k for k in names if k not in tol]
    bad = [k for k in names if k in tol and not all(
        isinstance(getattr(tol[k], a, None), int | float) and math.isfinite(getattr(tol[k], a)) and
        getattr(tol[k], a) >= 0 for a in ("rtol", "atol"))]
    if missing or bad:
        return (f"tol: expected a Tol (finite rtol, atol >= 0) for every output of {list(names)}"
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


def verify(fn_forward, fn_backward=None, *, vectors=None, cases=None, tol=None, snapshots=None,
           op=None) -> VerifyReport:
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
    op: the declared op (ssm_ref.ops; a name or an Op) whose golden cases to check: default the op
    of the ``vectors`` folder, else ssm_scan. For another op than the scan, a port module gives
    its functions of that op (``mamba3_scan``, ``mamba3_scan_back``), the callables are called with
    the op's inputs positional in its declared order (an input the case leaves None passed as None;
    the backward then the cotangents) and the case's keywords (Mamba-3's ``rotation``), their
    results read by the op's names (ssm_ref.testing.ports.call_op), every output and gradient
    compared with the op's tolerance (``tol``: default the declaration's).
    Never raises: an exception from a callable becomes an ERROR row of that case (with its
    traceback), a bad argument an ERROR row of case "-"; either makes the report not ok.
    """
    from .vectors import golden_cases, golden_table, read_vectors

    report = VerifyReport()

    def arg_error(output: str, message: str) -> None:
        report.rows.append(VerifyRow("-", output, None, message))

    goldens = None
    if vectors is not None:
        try:
            goldens = read_vectors(vectors)
        except Exception as e:  # missing directory, unreadable or foreign files
            arg_error("vectors", f"vectors: cannot read golden vectors from {str(vectors)!r}: {ports.error_text(e)}")
            return report
    the_op, why = _op_of(op, goldens)
    if why:
        arg_error("op", why)
        return report
    fwd, back, name, problems, kind = _callables(fn_forward, fn_backward, the_op)
    for msg in problems:
        arg_error("arguments", msg)
    if snapshots is not None:
        try:
            kind = ports.snapshot_kind(type("Port", (), {"SNAPSHOTS": snapshots}))
        except TypeError:
            arg_error("snapshots", f"snapshots: expected None, 'all' or 'ggml', got {snapshots!r}")
    why = _tol_problem(tol, the_op)
    if why:
        arg_error("tol", why)
    names, why = _case_names(cases)
    if why:
        arg_error("cases", why)
    if report.rows:
        return report
    if goldens is None:
        available = list(golden_table(the_op))
    else:
        others = sorted({g.op for g in goldens if g.op != the_op.name})
        goldens = [g for g in goldens if g.op == the_op.name]
        if not goldens:
            arg_error("vectors", f"vectors: {str(vectors)!r} holds no case of {the_op.name}"
                                 + (f" (its cases are of {others})" if others else ""))
            return report
        available = [g.name for g in goldens]
    unknown = [n for n in names or () if n not in available]
    for n in unknown:
        arg_error("cases", f"cases: unknown case {n!r}; the cases are: {', '.join(available)}")
    wanted = [n for n in (available if names is None else names) if n in available]
    if vectors is None:
        goldens = golden_cases(wanted, the_op)
    else:
        goldens = [g for g in goldens if g.name in set(wanted)]
    for g in goldens:
        if g.K > 1 and not kind:
            if names is not None and g.name in names:
                arg_error("cases", f"cases: {g.name} asks for K = {g.K} state snapshots; this port takes no "
                                   "snapshots=K (declare SNAPSHOTS, docs/PORTING.md)")
            continue
        t = g.tol if tol is None else tol if the_op.scaled is None else the_op.scaled(tol, g.dims["T"])
        for fn, backward in ((fwd, False), (back, True)):
            if fn is not None:
                _check(report.rows, g, fn, the_op, backward, t, name, kind)
    return report
