"""``ssm-scan check``'s invariance rows: whether a backend is batch and split invariant here, bit
for bit (docs/SPEC.md section 3.2), on a few drawn arrangements -- information beside the
correctness table, never part of its PASS/FAIL; for an op that declares its invariance reports
(ssm_ref.ops: the scan's). For ssm_vk, its invariant mode's rows too."""

from __future__ import annotations

from dataclasses import replace

from . import backends as bk


def rows(b: bk.Backend, op, seed: int) -> list[dict]:
    """The rows of one backend (and of its invariant mode, where it has one: ssm_vk) for ``op``:
    none for an op that declares no ``invariance`` (ssm_ref.ops)."""
    from ssm_ref.testing.properties.invariance import invariant_port

    if op.invariance is None:
        return []
    out = check_invariance(b, op, seed)
    inv = invariant_port(b.module)
    if inv is not None:
        out += check_invariance(replace(b, name=f"{b.name} invariant=True", module=inv), op, seed)
    return out


def check_invariance(b: bk.Backend, op, seed: int) -> list[dict]:
    """The invariance rows of one backend: for "batch" and "split", per output the number of
    entries whose bits differed over the op's drawn cases (its declared ``invariance``; None: not
    compared), the largest difference, whether every compared output was the same bits, or the
    error the backend raised."""
    from ssm_ref.testing import ports

    reports = ports.kit_part(op, "invariance")
    rows = []
    for kind in ("batch", "split"):
        row = {"backend": b.name, "kind": kind, "cases": None, "holds": None, "outputs": {}, "snapshots": None,
               "error": None}
        try:
            reps = reports(b.module, kind, seed)
        except Exception as e:  # information only: the correctness rows report a broken backend
            row["error"] = ports.error_text(e)
            rows.append(row)
            continue
        row["cases"] = len(reps)
        for rep in reps:
            for name, d in rep.compared.items():
                o = row["outputs"].setdefault(name, {"differ": 0, "size": 0, "max_abs": 0.0})
                o["differ"] += d.differ
                o["size"] += d.size
                o["max_abs"] = max(o["max_abs"], d.max_abs)
        row["holds"] = all(r.holds for r in reps)
        rows.append(row)
    return rows


def table_rows(inv: list[dict], cols: tuple, where: dict) -> list[list[str]]:
    """The table's rows of the invariance results ``inv`` (columns ``cols``; ``where`` by backend)."""
    out = []
    for r in inv:
        cells = [f"{r['kind']} invariance", r["backend"], where.get(r["backend"].split()[0], "-")]
        if r["error"]:
            cells += [""] * len(cols) + [f"(info) {r['error']}"]
        else:
            cells += [("-" if o not in r["outputs"] else "=" if not r["outputs"][o]["differ"] else "diff")
                      for o in cols]
            cells.append("(info) " + ("bitwise" if r["holds"] else "not bitwise"))
        out.append(cells)
    return out


def notes(inv: list[dict]) -> list[str]:
    """The lines under the table that explain the invariance rows."""
    if not inv:
        return []
    n = next((r["cases"] for r in inv if r["cases"]), 0)
    out = [f"invariance rows (information, not part of PASS/FAIL; docs/SPEC.md section 3.2): on {n} drawn "
           "cases, = the same bits alone and anywhere in a batch (batch) or in one call and in calls "
           "carrying the state (split), diff some entries differ, - not compared (d_A: a sum over "
           "sequences and tokens)"]
    snaps = sorted({r["backend"] for r in inv if "snapshots" in r["outputs"]})
    if snaps:
        out.append(f"  snapshots compared too for {', '.join(snaps)}: "
                   + ", ".join(f"{r['backend']} {r['kind']} "
                               + ("=" if not r["outputs"]["snapshots"]["differ"] else "diff")
                               for r in inv if "snapshots" in r["outputs"]))
    return out
