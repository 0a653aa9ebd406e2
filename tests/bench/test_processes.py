"""The benchmarks' several-process summary (benchmarks/processes.py and the two scripts that use
it): the spread is over processes, and a ratio's range comes from ratios formed within each
process, never from one side's median over another's."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from children import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import processes


def test_spread_and_its_format():
    s = processes.spread([684.2, None, 675.0, float("nan"), 680.1])
    assert (s.lo, s.med, s.hi, s.n) == (675.0, 680.1, 684.2, 3)
    assert str(s) == "680 (675-684)"
    assert processes.fmt(processes.spread([0.714, 0.72]), 2) == "0.72 (0.71-0.72)"
    assert processes.fmt(processes.spread([31.4, 31.4])) == "31.4"     # one figure: no range
    assert processes.spread([None]) is None and processes.fmt(None) == "-"


def test_children_are_fresh_processes_with_their_share_of_the_budget(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys
        a = sys.argv[1:]
        out = a[a.index("--json") + 1]
        json.dump({"pid": os.getpid(), "argv": a}, open(out, "w"))
        sys.exit(3 if "--fail" in a else 0)
    """))
    reps = processes.children(script, ["--x", "1"], 3, first_extra=["--first"], rest_extra=["--fail"],
                              budget_s=90)
    assert [r["process"] for r in reps] == [0, 1, 2]
    assert len({r["pid"] for r in reps}) == 3
    assert "--first" in reps[0]["argv"] and "--first" not in reps[1]["argv"]
    assert "exit_status" not in reps[0] and reps[1]["exit_status"] == 3
    budgets = [float(r["argv"][r["argv"].index("--budget-s") + 1]) for r in reps]
    # a third of 90 s, then half of what is left, then the rest (the probes take next to nothing)
    assert budgets == pytest.approx([30, 45, 90], abs=3)


def _row(peer, ours, workload="m2-train", op="fwd", err=None):
    r = dict(workload=workload, op=op, family="mamba2", shape="S=8", peer={"gpu_med_us": peer, "wall_med_us": peer},
             ours={"gpu_med_us": ours, "wall_med_us": ours}, ratio_gpu=peer / ours, ratio_wall=peer / ours)
    if err is not None:
        r["ours_err"] = {"y": err}
    return r


def test_a_child_past_its_share_of_the_budget_is_killed_and_the_next_runs(tmp_path):
    # a child whose one step outlasts its share (it sleeps, never checking its budget) is killed at
    # its share plus the grace, reported as failed, and the next child still gets its turn
    script = tmp_path / "slow.py"
    script.write_text(textwrap.dedent("""
        import json, sys, time
        a = sys.argv[1:]
        if "--slow" in a:
            time.sleep(60)
        json.dump({"budget": float(a[a.index("--budget-s") + 1])}, open(a[a.index("--json") + 1], "w"))
    """))
    import time

    t0 = time.monotonic()
    reps = processes.children(script, [], 2, first_extra=["--slow"], budget_s=4, grace_s=1)
    took = time.monotonic() - t0
    assert "killed" in reps[0]["failed"] and reps[0]["process"] == 0
    assert "failed" not in reps[1] and reps[1]["process"] == 1 and reps[1]["budget"] >= 1
    assert took < 30, took


def test_vs_mamba_ssm_ratios_are_formed_within_each_process():
    import vs_mamba_ssm

    reports = [{"rows": [_row(100.0, 50.0, err=3e-7)]}, {"rows": [_row(200.0, 200.0)]},
               {"rows": [_row(150.0, 125.0)]}]
    (row,) = vs_mamba_ssm.summarise(reports)
    assert row["processes"] == 3
    assert (row["peer_gpu"].lo, row["peer_gpu"].hi) == (100.0, 200.0)
    # per process: 2.0, 1.0, 1.2 -- not median(peer) / median(ours) = 150 / 125
    assert (row["ratio_gpu"].lo, row["ratio_gpu"].med, row["ratio_gpu"].hi) == (1.0, 1.2, 2.0)
    assert row["ours_err"] == {"y": 3e-7}     # from the process that checked


def test_vs_mamba_ssm_merges_runs_of_separate_commands(tmp_path, capsys):
    import vs_mamba_ssm

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"rows": [_row(100.0, 50.0)], "header": {"date": "d1"}}))
    b.write_text(json.dumps({"processes": [{"rows": [_row(300.0, 100.0)], "header": {"date": "d2"}},
                                           {"rows": [_row(80.0, 100.0)], "header": {"date": "d2"}}]}))
    md = tmp_path / "out.md"
    assert vs_mamba_ssm.main(["--merge", str(a), str(b), "--md", str(md)]) == 0
    text = md.read_text()
    assert "processes: 3 (0 failed)" in text and "date: d1, d2" in text
    line = next(x for x in text.splitlines() if x.startswith("| m2-train"))
    assert "| 2.00 (0.80-3.00) |" in line
