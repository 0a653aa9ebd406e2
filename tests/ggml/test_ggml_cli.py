"""`ssm-scan check`, `fuzz` and `bench` with ``--backend ssm_ggml:CPU``, as a ggml developer runs
them: in a child process, against the build of the session (SSM_GGML_LIB)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from children import REPO, child_env

from ssm_ref.testing.vectors import read_vectors


def ssm_scan(*args, timeout=300):
    env = child_env(SSM_GGML_LIB=os.environ["SSM_GGML_LIB"])
    return subprocess.run([sys.executable, "-m", "ssm_cli.main", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=timeout)


def test_check_quick_passes(ggml_lib):
    r = ssm_scan("check", "--quick", "--backend", "ssm_ggml:CPU")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ssm_ggml:CPU: 4 of 4 runs pass" in r.stdout
    assert "no backward" in r.stdout and "ggml has no SSM_SCAN_BACK" in r.stdout


def test_check_reports_the_unwritten_final_state_of_an_empty_scan(ggml_lib, empty_scan_unwritten, tmp_path):
    out = tmp_path / "check.json"
    r = ssm_scan("check", "--backend", "ssm_ggml:CPU", "--json", str(out))
    rep = json.loads(out.read_text())
    runs = {row["problem"]: row for row in rep["runs"]}
    assert all(row["where"] == "CPU" and row["error"] is None for row in runs.values())
    assert all(row["ok"] for name, row in runs.items() if name != "no-tokens"), r.stdout
    empty = runs["no-tokens"]
    assert set(empty["outputs"]) == {"y", "states"}    # gradients: not checked, not failed
    assert empty["outputs"]["y"]["ok"]
    if empty_scan_unwritten:   # CI's build: ggml's CPU leaves the state block unwritten for T = 0
        assert r.returncode == 1 and not empty["ok"] and not empty["outputs"]["states"]["ok"], r.stdout
        assert "nan at" in empty["outputs"]["states"]["message"]
        assert "no-tokens" in r.stdout and "FAIL" in r.stdout
    else:                      # a build of another version: the spec, states = s[ids]
        assert r.returncode == 0 and empty["ok"], r.stdout


def test_fuzz_of_the_forward_passes_past_the_empty_scan(ggml_lib):
    # Six seconds: the first round gives every property its batch whatever the time, and make test
    # fuzzes ggml's CPU for a quarter of a minute more on these properties (Makefile, ggml-check).
    r = ssm_scan("fuzz", "--backend", "ssm_ggml:CPU", "--minutes", "0.1", "--seed", "3", "--min-T", "1",
                 "--property", "oracle_forward", "--property", "permute_sequences", "--property", "deterministic",
                 "--property", "nonfinite_pattern", "--property", "oracle_backward")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not applicable: oracle_backward: no backward" in r.stdout
    checked = {ln.split()[1]: int(ln.split()[2]) for ln in r.stdout.splitlines()
               if ln.startswith("  ssm_ggml ") and "checked" in ln}
    assert checked.keys() == {"oracle_forward", "permute_sequences", "deterministic", "nonfinite_pattern"}
    assert min(checked.values()) > 0


def test_fuzz_shrinks_the_empty_scan_defect_to_a_reproducer_with_golden_vectors(ggml_lib, empty_scan_unwritten,
                                                                                 tmp_path):
    # Every drawn problem an empty scan (--max-T 0; the typical regime: long_decay draws T >= 1), so
    # the first draw reaches the defect whatever the time and the draws.
    r = ssm_scan("fuzz", "--backend", "ssm_ggml:CPU", "--minutes", "0.1", "--seed", "1", "--max-T", "0",
                 "--regime", "typical", "--property", "oracle_forward", "--save", str(tmp_path))
    if not empty_scan_unwritten:       # a build of another version: states = s[ids], as the spec says
        assert r.returncode == 0 and "FAIL" not in r.stdout, r.stdout + r.stderr
        assert not list(tmp_path.iterdir())
        return
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL ssm_ggml oracle_forward" in r.stdout
    assert "reproduce: ssm_ref.testing.cases.make_problem(" in r.stdout and "T=0" in r.stdout
    assert "ggml: s ne (d_state, head_dim, n_head, rows) = (1, 1, 1, 1)" in r.stdout
    folders = list(tmp_path.glob("*.vectors"))
    assert len(folders) == 1 and list(tmp_path.glob("*.json"))
    (golden,) = read_vectors(folders[0])
    assert golden.dims["T"] == 0 and golden.dims["N"] == 1
    np_states = golden.expected["states"]
    assert (np_states == golden.inputs["s"][golden.inputs["ids"]]).all()     # the spec: states = s[ids]


def test_bench_times_the_forward_and_skips_the_missing_backward(ggml_lib):
    r = ssm_scan("bench", "--backend", "ssm_ggml:CPU", "--shape", "demo", "--reps", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ssm_ggml:CPU" in r.stdout and "fwd" in r.stdout
    assert "bwd: ggml has no SSM_SCAN_BACK" in r.stdout
