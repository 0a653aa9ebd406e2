"""ssm_ref.testing.fuzzing and ``ssm-scan fuzz``: a broken port is caught, shrunk, reported with a
reproducer and saved as a regression file that loads back to the same case; a correct one
passes; bad arguments are refused."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

import ssm_ref
import ssm_ref.testing
from ssm_cli.main import main
from ssm_ref import ScanGrads
from ssm_ref.testing.fuzzing import fuzz, reproducer
from ssm_ref.testing.regressions import load_case


def _back_negated_dx(s, x, dt, A, B, C, ids, g_y, g_states):
    g = ssm_ref.ssm_scan_back(s, x, dt, A, B, C, ids, g_y, g_states).as_dict()
    # A bug that needs P >= 2 to show: channel 1 of d_x has the wrong sign.
    g["d_x"][..., 1:2] *= np.float32(-1)
    return ScanGrads(**g, where="CPU", backend="broken")


BROKEN = SimpleNamespace(NAME="broken", ssm_scan=ssm_ref.ssm_scan, ssm_scan_back=_back_negated_dx,
                         supports=ssm_ref.supports)


def test_fuzz_finds_shrinks_reports_and_saves_a_failure(tmp_path):
    report = fuzz([BROKEN], minutes=0.5, properties=["oracle_backward"], regimes=["typical"], seed=5,
                  save_dir=tmp_path)
    assert not report.ok and len(report.failures) == 1
    f = report.failures[0]
    assert f.backend == "broken" and f.property == "oracle_backward" and "d_x" in f.message
    d = f.case.dims
    assert d["P"] == 2 and d["T"] == 1 and d["S"] == 1 and d["H"] == 1    # shrunk to the least that shows it
    assert reproducer(f.case).startswith("ssm_ref.testing.cases.make_problem(")
    saved = load_case(f.saved)
    assert saved.property == "oracle_backward" and saved.found_on == "broken"
    for k, v in f.case.inputs.items():
        assert (v is None and saved.case.inputs[k] is None) or np.array_equal(v, saved.case.inputs[k]), k
    assert np.array_equal(saved.case.g_y, f.case.g_y)
    with pytest.raises(AssertionError):
        ssm_ref.testing.properties.PROPERTIES["oracle_backward"].check(BROKEN, saved.case, ssm_ref.tolerance.F32_TOL)
    assert "FAIL broken oracle_backward" in report.summary() and "reproduce:" in report.summary()


def test_a_port_whose_results_vary_between_runs_is_reported_not_a_crash():
    # Wrong on every third call only (a kernel that reads memory it does not own, say): hypothesis
    # sees a case fail and then pass on the same input while it shrinks (its Flaky errors); the
    # fuzzer reports a failure with a case that failed, and goes on.
    calls = {"n": 0}

    def sometimes_wrong(s, x, dt, A, B, C, ids):
        r = ssm_ref.ssm_scan(s, x, dt, A, B, C, ids)
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            return type(r)(y=r.y + np.float32(1.0), states=r.states, where="CPU", backend="flaky")
        return r

    flaky = SimpleNamespace(NAME="flaky", ssm_scan=sometimes_wrong, ssm_scan_back=ssm_ref.ssm_scan_back,
                            supports=ssm_ref.supports)
    report = fuzz([flaky], minutes=0.2, properties=["oracle_forward"], regimes=["typical"], seed=3)
    assert not report.ok and len(report.failures) == 1
    f = report.failures[0]
    assert f.backend == "flaky" and f.property == "oracle_forward" and f.case.dims["T"] >= 1
    assert "FAIL flaky oracle_forward" in report.summary()


def test_fuzz_on_the_reference_passes_and_counts_its_checks():
    report = fuzz([ssm_ref], minutes=0.05, properties=["split_tokens", "scatter_of_d_s0"], seed=1, batch=5)
    assert report.ok
    assert report.checked[("ssm_ref", "split_tokens")] >= 5
    assert report.checked[("ssm_ref", "scatter_of_d_s0")] >= 5


def test_time_running_out_while_hypothesis_replays_ends_the_fuzz_not_a_crash(monkeypatch):
    # hypothesis replays a case it saw pass; if the time runs out right then, that replay raises
    # the fuzzer's own stop, and hypothesis reports the two runs' disagreement as FlakyFailure. That
    # is the end of the time, not a failure; any other disagreement with no failing case is raised.
    from hypothesis.errors import FlakyFailure

    from ssm_ref.testing import fuzzing

    def replay_stopped(strategy, fails, **kw):
        raise FlakyFailure("Inconsistent results from replaying a test case!", [fuzzing._TimeUp()])

    monkeypatch.setattr(fuzzing, "find", replay_stopped)
    report = fuzz([ssm_ref], minutes=0.01, properties=["deterministic"], regimes=["typical"], seed=1)
    assert report.ok and not report.failures

    def replay_broken(strategy, fails, **kw):
        raise FlakyFailure("Inconsistent results from replaying a test case!", [ValueError("other")])

    monkeypatch.setattr(fuzzing, "find", replay_broken)
    with pytest.raises(FlakyFailure):
        fuzz([ssm_ref], minutes=0.01, properties=["deterministic"], regimes=["typical"], seed=1)


def test_fuzz_refuses_unknown_properties_and_regimes():
    with pytest.raises(ValueError, match="properties"):
        fuzz([ssm_ref], minutes=0.01, properties=["telepathy"])
    with pytest.raises(ValueError, match="regimes"):
        fuzz([ssm_ref], minutes=0.01, regimes=["stormy"])


def test_cli_fuzz_exit_status_and_saved_case(tmp_path, capsys, monkeypatch):
    import sys

    mod = tmp_path / "broken_port.py"
    mod.write_text("import numpy as np, ssm_ref\nNAME = 'broken_port'\nssm_scan_back = ssm_ref.ssm_scan_back\n"
                   "supports = ssm_ref.supports\n"
                   "def ssm_scan(*a, **k):\n    r = ssm_ref.ssm_scan(*a, **k)\n"
                   "    return ssm_ref.ScanResult(y=r.y * np.float32(1.001), states=r.states, where='CPU',"
                   " backend=NAME)\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    save = tmp_path / "regressions"
    rc = main(["fuzz", "--minutes", "0.3", "--backend", "broken_port", "--property", "oracle_forward",
               "--seed", "2", "--save", str(save)])
    out = capsys.readouterr().out
    assert rc == 1 and "FAIL broken_port oracle_forward" in out and "saved:" in out
    files = list(save.glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["property"] == "oracle_forward"

    rc = main(["fuzz", "--minutes", "0.02", "--backend", "ssm_ref", "--property", "deterministic"])
    assert rc == 0 and "ok" in capsys.readouterr().out
    assert main(["fuzz", "--minutes", "0.01", "--backend", "no_such_module_here"]) == 2
    assert "--backend no_such_module_here: no such module" in capsys.readouterr().err
    assert main(["fuzz", "--minutes", "0.01", "--backend", "ssm_ref", "--property", "telepathy"]) == 2
