"""ggml's K state snapshots (ggml_ssm_scan(..., K), docs/SPEC.md section 3.1) through ssm_ggml,
against the float64 oracle: on a build that has K (the K build: SSM_GGML_K_LIB, see conftest.py)
the slots k < T ggml writes, the slots it leaves unwritten, the kit's tools (verify, the
properties, the fuzzer, ``ssm-scan check``) with K; on the build without K (SSM_GGML_LIB, ggml
0.15.3) K > 1 refused with the reason and K = 1 as before."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from children import REPO, child_env

import ssm_ref
from ssm_ref.ops import SCAN
from ssm_ref.testing import ports, verify
from ssm_ref.testing.cases import make_problem
from ssm_ref.testing.properties import PROPERTIES
from ssm_ref.testing.vectors import GOLDEN
from ssm_ref.tolerance import F32_TOL, compare, scaled

SNAPSHOT_CASES = [n for n in GOLDEN if n.startswith("snapshots_")]


def _problem(T, K, **kw):
    dims = dict(S=2, H=4, P=3, N=5, G=2, R=3, ids="permutation", variant="mamba2", a_form="h1")
    return make_problem(21 + T * 10 + K, **{**dims, **kw}, T=T, K=K)


def test_the_k_build_declares_its_snapshots(ggml_k):
    from ssm_ggml.lib import API_K

    info = ggml_k.build_info()
    assert info["has_k"] and info["build"]["api"] == API_K
    assert ggml_k.SNAPSHOTS == "ggml" and ports.snapshot_kind(ggml_k) == "ggml"


@pytest.mark.parametrize("T,K", [(6, 4), (5, 2), (3, 3), (2, 4), (1, 5), (4, 1)])
def test_slots_below_T_match_the_oracle_and_ggml_leaves_the_rest_unwritten(ggml_k, T, K):
    from ssm_ggml.graph import unwritten

    case = _problem(T, K)
    got = ggml_k.ssm_scan(**case.args(), snapshots=K)
    want = ssm_ref.ssm_scan(**case.args(), dtype=np.float64, snapshots=K)
    assert got.snapshots.shape == want.snapshots.shape == (K, 2, 4, 3, 5) and got.snapshots.dtype == np.float32
    tol = scaled(F32_TOL, T)
    n = min(K, T)
    for name, g, w in (("y", got.y, want.y), ("states", got.states, want.states),
                       ("snapshots", got.snapshots[:n], want.snapshots[:n])):
        c = compare(name, g, w, tol["states" if name == "snapshots" else name])
        assert c.ok, c.message(f"ssm_ggml T={T} K={K}")
    assert np.array_equal(got.snapshots[0], got.states)
    assert unwritten(got.snapshots[n:]).all()     # k >= T: never written (ggml copies after each token)
    assert np.isnan(got.snapshots[n:]).all()


def test_the_packed_layout_holds_y_then_the_k_slots(ggml_k):
    case = _problem(5, 3)
    r = ggml_k.ssm_scan(**case.args(), snapshots=3)
    packed = r.packed()
    assert packed.size == r.y.size + r.snapshots.size
    got = ports.normalise(SCAN, packed, case.args(), {"snapshots": 3})
    assert np.array_equal(got["snapshots"], r.snapshots) and np.array_equal(got["states"], r.states)


def test_in_process_calls_give_the_bits_of_the_worker_and_one_build_is_loaded_per_process(ggml_k, ggml_k_lib,
                                                                                         ggml_lib):
    case = _problem(4, 3)
    there = ggml_k.ssm_scan(**case.args(), snapshots=3)
    code = ("import sys, numpy as np, ssm_ggml\n"
            "from ssm_ref.testing.cases import make_problem\n"
            "from ssm_ggml.lib import GgmlNotFound, load\n"
            f"case = make_problem({21 + 4 * 10 + 3}, S=2, H=4, P=3, N=5, G=2, R=3, ids='permutation', "
            "variant='mamba2', a_form='h1', T=4, K=3)\n"
            "ssm_ggml.use('CPU', lib=sys.argv[1])\n"
            "r = ssm_ggml.ssm_scan(**case.args(), snapshots=3)\n"
            "sys.stdout.buffer.write(r.y.tobytes() + r.snapshots.tobytes())\n"
            "try:\n    load(sys.argv[2])\nexcept GgmlNotFound as e:\n    sys.stderr.write(str(e))\n")
    r = subprocess.run([sys.executable, "-c", code, ggml_k_lib, ggml_lib], capture_output=True, cwd=REPO,
                       env=child_env(), timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == there.y.tobytes() + there.snapshots.tobytes()
    assert b"this process has loaded the ggml build at" in r.stderr and b"isolate=True" in r.stderr


def test_mamba1_with_k_is_refused_as_ggml_asserts(ggml_k):
    case = _problem(4, 2, variant="mamba1")
    a = case.args()
    sup = ggml_k.supports("ssm_scan", **a, snapshots=2)
    assert not sup.ok and "asserts K == 1 for Mamba-1" in sup.reason
    with pytest.raises(ValueError, match="K == 1 for Mamba-1"):
        ggml_k.ssm_scan(**a, snapshots=2)
    probe = ggml_k.probe(**a, K=2)                 # ggml itself, without the validator: it aborts
    assert not probe.ok and "K == 1" in probe.assertion
    assert ggml_k.supports("ssm_scan", **a, snapshots=1).ok


def test_ggml_has_no_backward_of_the_snapshots(ggml_k):
    case = _problem(3, 2)
    with pytest.raises(NotImplementedError):
        ggml_k.ssm_scan_back(**case.args(), g_y=case.g_y, g_snapshots=case.g_snapshots)


def test_verify_passes_the_golden_cases_of_snapshots(ggml_k):
    report = verify(ggml_k.ssm_scan, snapshots="ggml", cases=SNAPSHOT_CASES)
    assert report.ok, str(report)
    rows = {(r.case, r.output) for r in report.rows}
    assert ("snapshots_k4_short", "snapshots[:2]") in rows and ("snapshots_k4", "snapshots") in rows
    assert ("snapshots_k1", "snapshots") in rows
    # the same cases held to every slot fail on the slots ggml leaves unwritten (T < K)
    strict = verify(ggml_k.ssm_scan, snapshots="all", cases=["snapshots_k4_short"])
    assert [r.output for r in strict.failures()] == ["snapshots"]


@pytest.mark.parametrize("prop", ["oracle_forward", "permute_sequences", "group_broadcast", "deterministic",
                                  "nonfinite_pattern", "mamba2_as_mamba1"])
def test_the_forward_properties_hold_with_k(ggml_k, prop):
    checked = 0
    for seed, (T, K) in enumerate([(6, 4), (2, 5), (3, 3), (5, 2)]):
        case = make_problem(300 + seed, S=2, T=T, H=4, P=2, N=3, G=2, R=3, ids="permutation", K=K,
                            regime="nonfinite" if prop == "nonfinite_pattern" else "typical")
        checked += bool(PROPERTIES[prop].check(ggml_k, case, F32_TOL))
    assert checked == 4


def test_the_fuzzer_draws_k_for_the_k_build(ggml_k):
    from ssm_ref.testing.fuzzing import fuzz

    report = fuzz([ggml_k], minutes=0.05, seed=5, min_T=1, properties=["oracle_forward", "permute_sequences"])
    assert report.ok, report.summary()
    assert all(report.with_k.get(("ssm_ggml", p), 0) > 0 for p in ("oracle_forward", "permute_sequences"))
    assert "K in 1..5, slots k < T compared" in report.summary()


def test_cli_check_runs_the_snapshot_problem(ggml_k_lib, tmp_path):
    out = tmp_path / "check.json"
    r = subprocess.run([sys.executable, "-m", "ssm_cli.main", "check", "--quick", "--backend", "ssm_ggml:CPU",
                        "--json", str(out)], capture_output=True, text=True, cwd=REPO, timeout=300,
                       env=child_env(SSM_GGML_LIB=ggml_k_lib))
    assert r.returncode == 0, r.stdout + r.stderr
    runs = {row["problem"]: row for row in json.loads(out.read_text())["runs"]}
    assert runs["snapshots"]["ok"] and set(runs["snapshots"]["outputs"]) == {"y", "states", "snapshots"}
    assert "ssm_ggml:CPU: 5 of 5 runs pass" in r.stdout


# --- the build without K (SSM_GGML_LIB: ggml-python 0.0.45's ggml 0.15.3) --------------------------

def test_a_build_without_k_refuses_k_and_runs_k_1(ggml):
    if ggml.build_info()["has_k"]:
        pytest.skip("SSM_GGML_LIB names a build with K: the refusal needs one without")
    assert ggml.SNAPSHOTS is None and ports.snapshot_kind(ggml) == ""
    case = _problem(4, 3)
    a = case.args()
    sup = ggml.supports("ssm_scan", **a, snapshots=3)
    assert not sup.ok and "without K" in sup.reason and "llama-cpp-python" in sup.reason
    with pytest.raises(ValueError, match="without K"):
        ggml.ssm_scan(**a, snapshots=3)
    r = ggml.ssm_scan(**a, snapshots=1)            # K = 1: the final states, as before
    assert r.snapshots.shape == (1, *r.states.shape) and np.array_equal(r.snapshots[0], r.states)
    # the kit checks it with K = 1 only: the K > 1 golden cases are left out, K = 1 passes
    report = verify(ggml.ssm_scan)
    # the one failure is ggml's known empty-scan defect (docs/PORTING.md section 5): no state written
    assert [(r.case, r.output) for r in report.failures()] == [("no_tokens", "states")], str(report)
    assert {r.case for r in report.rows} & set(SNAPSHOT_CASES) == {"snapshots_k1"}
