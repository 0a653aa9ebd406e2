"""``ssm_ref.verify``: check a callable implementation against the golden vectors, with a report.

    import ssm_ref
    report = ssm_ref.verify(my_forward, my_backward)        # or vectors="golden/" (a directory)
    print(report)                                           # one line per case and output
    assert report.ok

What the callables get and may return (docs/PORTING.md):

* ``fn_forward(s, x, dt, A, B, C, ids)``: float32 numpy arrays of docs/SPEC.md's shapes (A in the
  shape the case gives it: (H,), (H, 1) or (H, N)); ids int32 (S,). Return any of: an object
  with ``.y`` and ``.states`` (e.g. ssm_ref.ScanResult), a mapping with keys "y" and "states",
  a tuple ``(y, states)``, or the packed 1-D array of length S*T*H*P + S*H*P*N (ggml SSM_SCAN).
* ``fn_backward(s, x, dt, A, B, C, ids, g_y, g_states)``: the same plus g_y (S,T,H,P) and
  g_states (S,H,P,N). Return any of: an object with attributes ``d_s0, d_x, d_dt, d_A, d_B, d_C``
  (and optionally ``d_s``), a mapping with those keys, or the packed 1-D array in ggmlR's
  SSM_SCAN_BACK layout (d_s0 | d_x | d_dt | d_A | d_B | d_C; d_s is then not checked).

Either callable may be None (not checked). Both are called positionally, with fresh copies of the inputs each call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .checks import Dims
from .packing import unpack_backward, unpack_forward
from .tolerance import F32_TOL, Comparison, compare, scaled

__all__ = ["VerifyReport", "VerifyRow", "verify"]

BLOCKS = ("d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C")


@dataclass(frozen=True)
class VerifyRow:
    """One output of one case. ``comparison`` is None when the call failed (see ``error``)."""

    case: str
    output: str
    comparison: Comparison | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.comparison is not None and self.comparison.ok


@dataclass
class VerifyReport:
    """Every row of a verification; ``ok`` iff every row passed. ``str(report)`` is a table:
    case, output, norm-relative error, max relative error (max|got - want| / max|want|), the share
    of the bound used, PASS/FAIL."""

    rows: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows)

    def failures(self) -> list:
        return [r for r in self.rows if not r.ok]

    def __str__(self) -> str:
        head = f"{'case':18s} {'output':10s} {'rel err':>10s} {'max rel':>10s} {'of bound':>9s}  result"
        lines = [head, "-" * len(head)]
        for r in self.rows:
            if r.comparison is None:
                lines.append(f"{r.case:18s} {r.output:10s} {'':>10s} {'':>10s} {'':>9s}  ERROR {r.error}")
                continue
            c = r.comparison
            used = "" if math.isinf(c.used) else f"{c.used:9.1%}"
            verdict = "PASS" if c.ok else "FAIL" + (f" ({c.detail})" if c.detail else "")
            lines.append(f"{r.case:18s} {r.output:10s} {c.rel:10.2e} {c.max_rel:10.2e} {used:>9s}  {verdict}")
        n_bad = len(self.failures())
        lines.append(f"{len(self.rows) - n_bad} of {len(self.rows)} passed" + ("" if n_bad else ": all PASS"))
        return "\n".join(lines)


def _dims(g) -> Dims:
    d = g.dims
    a_shape = tuple(np.shape(g.inputs["A"]))
    return Dims(S=d["S"], T=d["T"], H=d["H"], P=d["P"], N=d["N"], G=d["G"], R=d["R"],
                mamba1=g.variant == "mamba1", a_shape=a_shape)


def _get(out, names):
    """Arrays by name from an object with attributes or a mapping; missing names are left out."""
    got = {}
    for k in names:
        if isinstance(out, dict):
            if k in out:
                got[k] = out[k]
        elif hasattr(out, k):
            got[k] = getattr(out, k)
    return {k: (v.numpy() if hasattr(v, "numpy") and not isinstance(v, np.ndarray) else np.asarray(v))
            for k, v in got.items()}


def _forward_outputs(out, dims: Dims) -> dict:
    if isinstance(out, tuple) and len(out) == 2:
        return {"y": np.asarray(out[0]), "states": np.asarray(out[1])}
    if isinstance(out, np.ndarray) and out.ndim == 1:
        y, states = unpack_forward(out, dims)
        return {"y": y, "states": states}
    got = _get(out, ("y", "states"))
    if set(got) != {"y", "states"}:
        raise TypeError(f"fn_forward returned {type(out).__name__}: expected .y/.states, a (y, states) tuple, "
                        "a mapping or the packed 1-D array")
    return got


def _backward_outputs(out, dims: Dims) -> dict:
    if isinstance(out, np.ndarray) and out.ndim == 1:
        return unpack_backward(out, dims)
    got = _get(out, ("d_s", *BLOCKS))
    missing = [k for k in BLOCKS if k not in got]
    if missing:
        raise TypeError(f"fn_backward returned {type(out).__name__} without {missing}: expected attributes "
                        "or keys d_s0, d_x, d_dt, d_A, d_B, d_C (d_s optional) or the packed 1-D array")
    return got


def _args(g, *extra) -> tuple:
    """Fresh copies of the inputs, positional, in the order of docs/API.md."""
    return tuple(np.array(g.inputs[k]) for k in ("s", "x", "dt", "A", "B", "C", "ids", *extra))


def _check(rows: list, g, label: str, call, unpack, names, tol: dict) -> None:
    try:
        got = unpack(call(), _dims(g))
    except Exception as e:  # the port's own error: reported, not raised
        rows.append(VerifyRow(g.name, label, None, f"{type(e).__name__}: {e}"))
        return
    for k in names:
        if k in got:
            rows.append(VerifyRow(g.name, k, compare(k, got[k], g.expected[k], tol[k])))


def verify(fn_forward, fn_backward=None, *, vectors=None, cases=None, tol=None) -> VerifyReport:
    """Check ``fn_forward`` / ``fn_backward`` against the golden vectors; returns a VerifyReport.

    vectors: None (compute the golden cases now with ssm_ref) or a directory written by
    ``ssm-scan vectors`` / ``ssm_ref.vectors.write_vectors``. cases: names to check (default all;
    see ssm_ref.vectors.GOLDEN). Each output passes when ||got - want|| <= rtol * ||want|| +
    atol * sqrt(size) (non-finite entries must match exactly), with ``tol`` (an output -> Tol
    table; default ssm_ref.tolerance.F32_TOL, F64_TOL for a float64 implementation) scaled for
    the case's T.
    An exception from a callable becomes an ERROR row. Raises ValueError when both callables
    are None.
    """
    from .vectors import golden_cases, read_vectors

    if fn_forward is None and fn_backward is None:
        raise ValueError("verify: give fn_forward, fn_backward or both")
    goldens = golden_cases(cases) if vectors is None else read_vectors(vectors)
    if vectors is not None and cases is not None:
        goldens = [g for g in goldens if g.name in set(cases)]
    report = VerifyReport()
    for g in goldens:
        t = scaled(F32_TOL if tol is None else tol, g.dims["T"])
        if fn_forward is not None:
            _check(report.rows, g, "forward", lambda g=g: fn_forward(*_args(g)), _forward_outputs, ("y", "states"), t)
        if fn_backward is not None:
            _check(report.rows, g, "backward", lambda g=g: fn_backward(*_args(g, "g_y", "g_states")),
                   _backward_outputs, ("d_s", *BLOCKS), t)
    return report
