"""What ``ssm-scan check`` (ssm_cli.check) prints and writes, for any declared op: one output's
record in the JSON, and the report as text -- the oracle's finite-difference line, the table of
runs, what was not run or not given, each backend's summary and the failures."""

from __future__ import annotations

from . import check_invariance
from .table import sci, table

FD_SAMPLES = 4        # entries of each input's gradient checked against finite differences


def output_record(c, label: str) -> dict:
    """One output's comparison as check's JSON holds it."""
    return {"rel": c.rel, "max_rel": c.max_rel, "err": c.err, "bound": c.bound, "rel_bound": c.rel_bound,
            "used": c.used, "share": c.share, "ok": c.ok,
            "index": None if c.index is None else list(c.index), "got": c.got, "want": c.want,
            "message": "" if c.ok else c.message(label)}


def render(rep: dict) -> str:
    from ssm_ref.tolerance import share_text

    out = []
    for name, per in rep["oracle"].items():
        worst_k, worst = max(per.items(), key=lambda kv: kv[1]["err"] / kv[1]["bound"])
        ok = all(v["ok"] for v in per.values())
        used = worst["err"] / worst["bound"]
        out.append(f"oracle: {rep['reference']} float64 gradients vs 4th-order finite differences "
                   f"({FD_SAMPLES} entries of each input) on {name}: {'PASS' if ok else 'FAIL'}, worst {worst_k} "
                   f"|error| {sci(worst['err'])} = {share_text(used)}" + (" of its bound" if used <= 1 else ""))
    out.append("each float32 backend vs the float64 oracle: norm-relative error per output; "
               "PASS = every output within ssm_ref/tolerance.py (! marks a miss)")
    out.append("")
    rows = []
    cols = (*rep["columns"],
            *(("snapshots",) if any("snapshots" in r["outputs"] for r in rep["runs"]) else ()))
    for r in rep["runs"]:
        cells = [r["problem"], r["backend"], r["where"]
                 + (f" by {r['computed_by']}" if r["computed_by"]
                    and r["computed_by"] not in (r["backend"], r["backend"].partition(":")[0]) else "")]
        if r["error"]:
            cells += [""] * len(cols) + [f"FAIL: {r['error']}"]
        else:
            cells += [sci(r["outputs"][o]["rel"]) + ("" if r["outputs"][o]["ok"] else "!") if o in r["outputs"]
                      else "-" for o in cols]
            cells.append("PASS" if r["ok"] else "FAIL")
        rows.append(cells)
    inv = rep["invariance"]
    rows += check_invariance.table_rows(inv, cols, {r["backend"]: r["where"] for r in rep["runs"] if not r["error"]})
    if rows:
        out.append(table(["problem", "backend", "where", *cols, "result"], rows,
                         right=set(range(3, 3 + len(cols)))))
    out += check_invariance.notes(inv)
    not_given = sorted({(r["backend"], o) for r in rep["runs"] for o in r.get("not_given", ())})
    for backend, o in not_given:
        out.append(f"{backend}: gives no {o} (-: not checked)")
    no_bwd = {r["backend"]: r["no_backward"] for r in rep["runs"] if r.get("no_backward")}
    for backend, why in no_bwd.items():
        out.append(f"{backend}: no backward ({why}); its gradients are not checked (-)")
    for n in rep["not_run"]:
        out.append(f"{n['backend']}: {n['problem']} not run: {n['reason']}")
    for b in rep["backends"]:  # those asked for by name stopped the command before (exit code 2)
        if not b["available"]:
            out.append(f"{b['name']}: skipped, not available: {b['reason']}")
    out.append("")
    for b in rep["backends"]:
        runs = [r for r in rep["runs"] if r["backend"] == b["name"] and not r["error"]]
        if not runs:
            continue
        passed = sum(r["ok"] for r in runs)
        worst = max(((o["used"], k, r["problem"]) for r in runs for k, o in r["outputs"].items()), default=None)
        out.append(f"{b['name']}: {passed} of {len(runs)} runs pass" + (_worst_text(*worst) if worst else ""))
    for r in rep["runs"]:
        for o in r["outputs"].values():
            if not o["ok"]:
                out.append(f"  {o['message']}")
    seen: dict = {}
    for r in rep["runs"]:  # each traceback once per backend, with the problems it came from
        if r.get("traceback"):
            seen.setdefault((r["backend"], r["error"], r["traceback"]), []).append(r["problem"])
    for (backend, error, tb), probs in seen.items():
        out += ["", f"{backend} raised on {', '.join(probs)}: {error}", *("  " + x for x in tb.splitlines())]
    n_fail = sum(not r["ok"] for r in rep["runs"]) + (0 if rep["oracle_ok"] else 1)
    out.append("check: " + ("PASS" if rep["ok"] else f"FAIL ({n_fail} failing)"))
    return "\n".join(out)


def _worst_text(used: float, output: str, problem: str) -> str:
    """The summary's note on the output closest to (or furthest beyond) its bound."""
    import math

    from ssm_ref.tolerance import share_text

    if math.isinf(used):
        return f"; {output} on {problem} fails outright (non-finite entries or shapes differ)"
    if used <= 1.0:
        return f"; the largest error used {share_text(used)} of its bound ({output} on {problem})"
    return f"; the largest error is {share_text(used)} ({output} on {problem})"
