"""``ssm-scan check --op NAME``: an op other than the scan (ssm_ref.ops), by its declaration: its
own problems, its float64 reference held to finite differences, every backend's outputs and
gradients against that reference with the op's tolerance -- the report and table of ``check``
(ssm_cli/check.py, which also takes this module's finite-difference check of a reference)."""

from __future__ import annotations

import numpy as np

from . import common
from .check_report import FD_SAMPLES, output_record, render

FD_H = 1e-3           # SPEC.md section 10: 4th-order stencil, truncation and rounding near 1e-12
FD_RTOL, FD_ATOL = 1e-7, 1e-11


def fd_check(op, args: dict, cotangents: dict, rng, keywords: dict | None = None) -> dict:
    """The float64 reference's gradients of ``op`` (ssm_ref.ops) against finite differences of its
    forward, on :data:`FD_SAMPLES` entries of every float input given (not None), the loss the sum
    of each output times its cotangent, ``keywords`` (a case's, such as Mamba-3's rotation) passed
    to every call: {gradient: (max |fd - analytic|, bound)}."""
    from ssm_ref.testing.properties.generic import output_of, reference_of

    args = {k: (np.asarray(v, dtype=np.float64) if v is not None and np.asarray(v).dtype.kind == "f" else v)
            for k, v in args.items()}
    cot = {k: np.asarray(v, dtype=np.float64) for k, v in cotangents.items()}
    kw = dict(keywords or {})
    grads = reference_of(op, args, cot, kw)

    def loss(**over) -> float:
        r = op.forward(*(over.get(n, args.get(n)) for n in op.input_names), dtype=np.float64, **kw)
        return float(sum(np.sum(np.asarray(output_of(r, o)) * cot["g_" + o]) for o in op.output_names))

    out = {}
    for name, gname in op.grad_of.items():
        if args.get(name) is None or grads.get(gname) is None or np.asarray(args[name]).size == 0:
            continue
        base = args[name]
        grad = np.asarray(grads[gname], dtype=np.float64)
        fds, ans = [], []
        for flat in rng.choice(base.size, size=min(FD_SAMPLES, base.size), replace=False):
            i = np.unravel_index(flat, base.shape)
            f = {}
            for k in (-2, -1, 1, 2):
                moved = base.copy()
                moved[i] += k * FD_H
                f[k] = loss(**{name: moved})
            fds.append((f[-2] - 8 * f[-1] + 8 * f[1] - f[2]) / (12 * FD_H))
            ans.append(grad[i])
        fds_a, ans_a = np.array(fds), np.array(ans)
        err = float(np.max(np.abs(fds_a - ans_a))) if fds else 0.0
        bound = FD_RTOL * float(np.max(np.abs(fds_a), initial=0.0)) + FD_ATOL
        out[gname] = (err, bound)
    return out


def run(args, op, backs) -> int:
    """``check --op NAME`` of an op other than the scan (ssm_ref.ops): the op's own problems
    (``Op.cases``), its reference in float64 checked against finite differences on the first two,
    then each backend's every output and gradient against it with the op's tolerance."""
    from ssm_ref.testing import ports
    from ssm_ref.testing.properties.generic import keywords_of, reference
    from ssm_ref.tolerance import compare

    cases = list(ports.kit_part(op, "cases")(quick=bool(args.quick), seed=args.seed))
    tol = op.tol()
    cols = (*op.output_names, *op.grad_names)
    report = {"ok": True, "op": op.name, "reference": f"{op.name}'s reference in", "quick": bool(args.quick),
              "seed": args.seed, "columns": list(cols),
              "tolerance": {k: {"rtol": v.rtol, "atol": v.atol} for k, v in tol.items()},
              "problems": [{"name": c.label, "dims": c.dims} for c in cases],
              "backends": [{"name": b.name, "available": b.available, "reason": b.reason,
                            "where": b.where() if b.available else None} for b in backs],
              "oracle": {}, "runs": [], "not_run": [], "invariance": []}
    wants = []
    for k, c in enumerate(cases):
        wants.append(reference(op, c, backward=True))
        if k < 2:
            fd = fd_check(op, c.args(), c.cotangents, np.random.default_rng(args.seed + 100 + k), keywords_of(c))
            report["oracle"][c.label] = {n: {"err": e, "bound": bd, "ok": e <= bd} for n, (e, bd) in fd.items()}
    for b in (b for b in backs if b.available):
        for c, want in zip(cases, wants, strict=True):
            row = {"backend": b.name, "problem": c.label, "ok": False, "where": "-", "computed_by": None,
                   "outputs": {}, "not_given": [], "no_backward": None, "error": None, "traceback": None}
            try:
                kw = keywords_of(c)
                r = ports.call_op(b.module, op, c.args(), keywords=kw)
                row["where"], row["computed_by"] = r.where, r.backend
                got = dict(r.arrays)
                try:
                    got.update(ports.call_op(b.module, op, c.args(), c.cotangents, keywords=kw).arrays)
                except NotImplementedError:
                    row["no_backward"] = f"{op.backward_name} raised NotImplementedError"
            except Exception as e:   # a broken port is a failed check, reported, not a crash
                row["error"], row["traceback"] = ports.error_text(e), ports.traceback_text(e) or None
                report["runs"].append(row)
                continue
            ok = True
            for name in cols:
                if name in got and want.get(name) is None:
                    continue        # the gradient of an input the case left None (d_psi): nothing to check
                if name in got and got[name] is None:
                    row["not_given"].append(name)
                    ok = False
                elif name in got:
                    cmp = compare(name, got[name], want[name], tol[name])
                    row["outputs"][name] = output_record(cmp, f"{b.name} {c.label}")
                    ok &= cmp.ok
                elif not row["no_backward"]:
                    row["not_given"].append(name)
                    ok = False
            row["ok"] = ok
            report["runs"].append(row)
    report["oracle_ok"] = all(v["ok"] for per in report["oracle"].values() for v in per.values())
    report["ok"] = report["oracle_ok"] and all(r["ok"] for r in report["runs"])
    common.say(args, render(report))
    common.write_json(args, report)
    return common.EXIT_OK if report["ok"] else common.EXIT_FAIL
