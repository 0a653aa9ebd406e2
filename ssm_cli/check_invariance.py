"""``ssm-scan check``'s invariance rows: whether a backend is batch and split invariant here, bit
for bit (docs/SPEC.md section 3.2), on a few drawn arrangements -- information beside the
correctness table, never part of its PASS/FAIL. For ssm_vk, its invariant mode's rows too."""

from __future__ import annotations

from dataclasses import replace

from . import backends as bk

# The drawn set of the invariance rows (ssm_ref.testing.cases.make_problem; the arrangements are
# drawn from the case): a small Mamba-2 with groups and shuffled rows, a Mamba-1 with shared rows,
# and a Mamba-2 of 64 tokens (long enough for a backend to choose another plan by batch size).
INVARIANCE_CASES = (
    dict(S=3, T=5, H=4, P=3, N=5, G=2, ids="permutation", variant="mamba2"),
    dict(S=3, T=17, H=2, P=4, N=8, G=1, ids="duplicates", variant="mamba1"),
    dict(S=4, T=64, H=4, P=16, N=16, G=1, ids="permutation", variant="mamba2"),
)

def rows(b: bk.Backend, seed: int) -> list[dict]:
    """The rows of one backend (and of its invariant mode, where it has one: ssm_vk)."""
    from ssm_ref.testing.properties.invariance import invariant_port

    out = check_invariance(b, seed)
    inv = invariant_port(b.module)
    if inv is not None:
        out += check_invariance(replace(b, name=f"{b.name} invariant=True", module=inv), seed)
    return out


def check_invariance(b: bk.Backend, seed: int) -> list[dict]:
    """The invariance rows of one backend: for "batch" and "split", per output the number of
    entries whose bits differed over :data:`INVARIANCE_CASES` (None: not compared), the largest
    difference, whether every compared output was the same bits, or the error the backend raised."""
    from ssm_ref.testing import ports
    from ssm_ref.testing.cases import make_problem
    from ssm_ref.testing.properties.invariance import batch_report, split_report

    rows = []
    for kind, report in (("batch", batch_report), ("split", split_report)):
        row = {"backend": b.name, "kind": kind, "cases": len(INVARIANCE_CASES), "holds": None, "outputs": {},
               "snapshots": None, "error": None}
        try:
            reps = [report(b.module, make_problem(seed + k, **c)) for k, c in enumerate(INVARIANCE_CASES)]
        except Exception as e:  # information only: the correctness rows report a broken backend
            row["error"] = ports.error_text(e)
            rows.append(row)
            continue
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
    n = inv[0]["cases"]
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
