"""The three port tools agree (docs/PORTING.md, "The port interface"): ``ssm_ref.testing.verify``,
``ssm-scan check --backend`` and ``ssm-scan fuzz --backend`` accept a port that returns plain
tuples and dicts, report a wrong output with its worst index and the values there, and report a
raising port with its traceback. The ports are files written here; the commands run as a user
runs them (a subprocess, without the current directory on sys.path, as the console script)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ssm_ref
import ssm_ref.testing
from ssm_ref.ops import SCAN
from ssm_ref.testing import ports
from ssm_ref.tolerance import Tol, compare, share_text

ROOT = Path(__file__).resolve().parents[2]

# A correct port whose results are plain tuples and dicts (no result types, no where/backend).
GOOD = '''
import ssm_ref

NAME = "good_port"


def supports(op, s, x, dt, A, B, C, ids=None):
    return True, "every shape"


def ssm_scan(s, x, dt, A, B, C, ids=None):
    r = ssm_ref.ssm_scan(s, x, dt, A, B, C, ids)
    return r.y, r.states


def ssm_scan_back(s, x, dt, A, B, C, ids, g_y, g_states):
    return ssm_ref.ssm_scan_back(s, x, dt, A, B, C, ids, g_y, g_states).as_dict()
'''

# Wrong at exactly one element: the last entry of y is 0.05 too large.
OFFSET = 0.05
WRONG = GOOD.replace('"good_port"', '"wrong_port"').replace(
    "    return r.y, r.states\n",
    "    y = r.y.copy()\n    if y.size:\n        y[-1, -1, -1, -1] += OFFSET\n    return y, r.states\n",
).replace("import ssm_ref\n", f"import ssm_ref\n\nOFFSET = {OFFSET}\n")

# The backward raises from a helper, so the traceback has two frames of the port.
RAISING = GOOD.replace('"good_port"', '"raising_port"').replace(
    "    return ssm_ref.ssm_scan_back(s, x, dt, A, B, C, ids, g_y, g_states).as_dict()\n",
    "    return _deep_inside(g_y)\n\n\ndef _deep_inside(g):\n    raise RuntimeError('boom from the port')\n")

# Writes a marker file when called: shows whether a command started its work.
MARKER = GOOD.replace('"good_port"', '"marker_port"').replace(
    "def ssm_scan(s, x, dt, A, B, C, ids=None):\n",
    "def ssm_scan(s, x, dt, A, B, C, ids=None):\n    open(__file__ + '.called', 'w').close()\n")


@pytest.fixture(scope="module")
def port_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ports")
    for name, text in (("good_port", GOOD), ("wrong_port", WRONG), ("raising_port", RAISING),
                       ("marker_port", MARKER)):
        (d / f"{name}.py").write_text(text)
    return d


def _module(port_dir: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"_test_{name}", port_dir / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cli(*argv, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    """``ssm-scan argv...`` as the console script runs it: -P keeps the current directory off
    sys.path (python -m would put it there)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("SSM_VK_VALIDATION", None)
    return subprocess.run([sys.executable, "-P", "-m", "ssm_cli.main", *map(str, argv)], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=timeout, check=False)


# --- ssm_ref.testing.ports: the one reading of a result ------------------------------------------

def _problem():
    from ssm_ref.testing.cases import make_problem

    case = make_problem(3, S=2, T=3, H=2, P=2, N=3, G=1, R=3, ids="permutation")
    a = case.args()
    pos = ports.args_of(a)
    return pos, case, ssm_ref.ssm_scan(*pos), ssm_ref.ssm_scan_back(*pos, case.g_y, case.g_states)


def test_every_documented_result_form_reads_the_same():
    _pos, case, r, g = _problem()
    a = case.args()
    forward_forms = [r, {"y": r.y, "states": r.states}, (r.y, r.states), [r.y, r.states], r.packed()]
    for form in forward_forms:
        got = ports.normalise(SCAN, form, a, backend="mine")
        # a ScanResult carries its K = 1 snapshot slot (the states) too
        assert set(got.arrays) == {"y", "states"} | ({"snapshots"} if form is r else set()), type(form)
        assert np.array_equal(got["y"], r.y) and np.array_equal(got["states"], r.states)
    seven = tuple(getattr(g, k) for k in ssm_ref.GRAD_NAMES)
    six = seven[1:]
    full = [g, g.as_dict(), seven, list(seven)]
    without_d_s = [six, g.packed(), {k: v for k, v in g.as_dict().items() if k != "d_s"}]
    for form in full + without_d_s:
        got = ports.normalise(SCAN, form, a, backward=True)
        assert set(got.arrays) == set(ssm_ref.GRAD_NAMES) - ({"d_s"} if any(form is f for f in without_d_s) else set())
        for k, v in got.arrays.items():
            assert np.array_equal(v, getattr(g, k)), (type(form), k)
    # where/backend from the result when it has them, else "unknown" and the port's name
    assert ports.normalise(SCAN, r, a, backend="mine").where == "CPU"
    plain = ports.normalise(SCAN, (r.y, r.states), a, backend="mine")
    assert (plain.where, plain.backend) == ("unknown", "mine")


@pytest.mark.parametrize("op, form, fragment", [
    ("ssm_scan", 42, "ssm_scan returned int"),
    ("ssm_scan", (1, 2, 3, 4), "tuple of 4 items"),
    ("ssm_scan", {"y": 0}, "without ['states']"),
    ("ssm_scan_back", {"d_S": 0}, "unknown keys ['d_S']"),
    ("ssm_scan_back", (0,) * 5, "tuple of 5 items"),
    ("ssm_scan", np.zeros(7, np.float32), "packed forward"),
    ("ssm_scan", (None, None), "expected an array of real numbers"),
])
def test_a_result_of_no_documented_form_is_a_type_error_naming_both(op, form, fragment):
    _pos, case, *_ = _problem()
    with pytest.raises(TypeError, match=re.escape(fragment)):
        ports.normalise(SCAN, form, case.args(), backward=op == "ssm_scan_back")


def test_supports_may_answer_with_a_support_a_bool_or_a_pair():
    assert ports.support(ssm_ref.Support(False, "no")) == ssm_ref.Support(False, "no")
    assert ports.support(True) == ssm_ref.Support(True, "")
    assert ports.support((False, "too big")) == ssm_ref.Support(False, "too big")
    with pytest.raises(TypeError, match="supports returned str"):
        ports.support("yes")


def test_comparison_names_the_worst_element_and_says_how_far_beyond_the_bound():
    want = np.linspace(-1, 1, 24).reshape(2, 3, 4)
    got = want.copy()
    got[1, 2, 0] += 1e-3
    c = compare("y", got, want, Tol(1e-6, 0.0))
    assert not c.ok and c.index == (1, 2, 0)
    assert c.got == pytest.approx(want[1, 2, 0] + 1e-3) and c.want == pytest.approx(want[1, 2, 0])
    assert c.rel_bound == pytest.approx(1e-6)
    assert "worst at (1, 2, 0)" in c.message() and "x the bound" in c.message()
    nan = want.copy()
    nan[0, 1, 3] = np.nan
    c = compare("y", nan, want, Tol(1e-6, 0.0))
    assert c.index == (0, 1, 3) and np.isnan(c.got)
    assert share_text(0.02) == "2.0%" and share_text(23.4) == "23.4 x the bound"
    assert share_text(63253818281.5) == "6.3e10 x the bound" and share_text(6759.0, short=True) == "6759 x"


# --- verify -------------------------------------------------------------------------------------

def test_verify_passes_the_tuple_port_as_a_module_and_as_callables(port_dir):
    good = _module(port_dir, "good_port")
    report = ssm_ref.testing.verify(good)
    k1 = sum(recipe.get("K", 1) == 1 for _, recipe in ssm_ref.testing.GOLDEN.values())   # it takes no K
    assert report.ok and len(report.rows) == 9 * k1 == 99, str(report)
    assert ssm_ref.testing.verify(good.ssm_scan, good.ssm_scan_back, cases=["shared_rows"]).ok


def test_verify_reports_the_wrong_element_with_its_values(port_dir):
    wrong = _module(port_dir, "wrong_port")
    report = ssm_ref.testing.verify(wrong.ssm_scan, None, cases=["tiny_mamba2", "mamba1_groups"])
    bad = report.failures()
    assert [(r.case, r.output) for r in bad] == [("tiny_mamba2", "y"), ("mamba1_groups", "y")]
    for r in bad:
        g = next(x for x in ssm_ref.testing.vectors.golden_cases([r.case]))
        last = tuple(n - 1 for n in g.expected["y"].shape)
        assert r.comparison.index == last
        assert r.comparison.got - r.comparison.want == pytest.approx(OFFSET, abs=1e-5)
        assert r.comparison.want == pytest.approx(g.expected["y"][last])
        assert str(last) in str(report)


def test_verify_reports_a_raising_port_with_its_traceback(port_dir):
    raising = _module(port_dir, "raising_port")
    report = ssm_ref.testing.verify(raising, cases=["one_token"])
    err = next(r for r in report.rows if r.output == "backward")
    assert err.error == "RuntimeError: boom from the port"
    assert "raising_port.py" in err.traceback and "_deep_inside" in err.traceback
    assert "verification.py" not in err.traceback          # the tool's frames are left out
    assert "_deep_inside" in str(report) and not report.ok


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(vectors="missing/"), "vectors: cannot read golden vectors from 'missing/'"),
    (dict(cases=["nope"]), "cases: unknown case 'nope'"),
    (dict(cases=3), "cases: expected case names"),
    (dict(tol={"y": 1}), "tol: expected a Tol"),
])
def test_verify_reports_bad_arguments_instead_of_raising(kwargs, fragment):
    report = ssm_ref.testing.verify(ssm_ref.ssm_scan, **kwargs)
    assert not report.ok and fragment in str(report)
    assert any(r.case == "-" and fragment in r.error for r in report.rows)
    assert not ssm_ref.testing.verify(object()).ok and not ssm_ref.testing.verify(None, None).ok


# --- ssm-scan check -----------------------------------------------------------------------------

def test_check_passes_the_tuple_port_named_as_a_module_in_the_current_directory(port_dir, tmp_path):
    out = tmp_path / "check.json"
    p = cli("check", "--quick", "--backend", "good_port", "--json", out, cwd=port_dir)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.rstrip().endswith("check: PASS")
    rep = json.loads(out.read_text())
    assert len(rep["runs"]) == 4
    for r in rep["runs"]:
        assert r["ok"] and r["where"] == "unknown" and r["computed_by"] == "good_port"
        assert len(r["outputs"]) == 9 and r["not_given"] == []


def test_check_reports_the_wrong_element_by_index_with_got_and_want(port_dir, tmp_path):
    out = tmp_path / "check.json"
    p = cli("check", "--quick", "--backend", port_dir / "wrong_port.py", "--json", out, cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    rep = json.loads(out.read_text())
    dims = {pr["name"]: pr["dims"] for pr in rep["problems"]}
    for r in rep["runs"]:
        assert [k for k, o in r["outputs"].items() if not o["ok"]] == ["y"]
        y = r["outputs"]["y"]
        d = dims[r["problem"]]
        assert y["index"] == [d["S"] - 1, d["T"] - 1, d["H"] - 1, d["P"] - 1]
        assert y["got"] - y["want"] == pytest.approx(OFFSET, abs=1e-5)
        assert f"worst at {tuple(y['index'])}" in p.stdout and f"{y['got']:.9g}" in p.stdout
    assert "%" not in p.stdout.split("wrong_port: 0 of 4 runs pass")[1].splitlines()[0]   # "N x the bound"
    assert "x the bound" in p.stdout


def test_check_reports_a_raising_port_with_its_traceback(port_dir, tmp_path):
    out = tmp_path / "check.json"
    p = cli("check", "--quick", "--backend", port_dir / "raising_port.py", "--json", out, cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAIL: RuntimeError: boom from the port" in p.stdout
    assert "_deep_inside" in p.stdout and "raising_port.py" in p.stdout
    assert p.stdout.count("Traceback (most recent call last)") == 1        # once, with the problems it hit
    for r in json.loads(out.read_text())["runs"]:
        assert r["error"] == "RuntimeError: boom from the port" and "_deep_inside" in r["traceback"]


def test_check_reads_a_port_without_d_s_and_leaves_d_s_unchecked(tmp_path):
    (tmp_path / "six_port.py").write_text(GOOD.replace('"good_port"', '"six_port"').replace(
        ".as_dict()", ".packed()"))
    out = tmp_path / "check.json"
    p = cli("check", "--quick", "--backend", "six_port.py", "--json", out, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "six_port: gives no d_s (-: not checked)" in p.stdout
    assert all(r["not_given"] == ["d_s"] and "d_s" not in r["outputs"] for r in json.loads(out.read_text())["runs"])


# --- ssm-scan fuzz ------------------------------------------------------------------------------

def test_fuzz_passes_the_tuple_port_named_as_a_module_in_the_current_directory(port_dir):
    p = cli("fuzz", "--minutes", "0.05", "--backend", "good_port", "--seed", "1", cwd=port_dir)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [x for x in p.stdout.splitlines() if x.startswith("  good_port ")]
    assert lines and all(x.endswith(" ok") for x in lines)
    counts = [int(x.split()[2]) for x in lines]
    assert sum(counts) > 0 and counts[lines.index(next(x for x in lines if " oracle_forward " in x))] > 0


def test_fuzz_reports_the_wrong_element_with_its_values(port_dir, tmp_path):
    p = cli("fuzz", "--minutes", "0.2", "--backend", port_dir / "wrong_port.py", "--property", "oracle_forward",
            "--seed", "2", cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAIL wrong_port oracle_forward" in p.stdout
    m = re.search(r"y: error .* x the bound: .*worst at \((\d+), (\d+), (\d+), (\d+)\): got (\S+), want (\S+)",
                  p.stdout)
    assert m, p.stdout
    dims = re.search(r"make_problem\(\d+, S=(\d+), T=(\d+), H=(\d+), P=(\d+)", p.stdout)
    assert [int(v) for v in m.groups()[:4]] == [int(v) - 1 for v in dims.groups()]   # the last element
    assert float(m.group(5)) - float(m.group(6)) == pytest.approx(OFFSET, abs=1e-5)


def test_fuzz_reports_a_raising_port_with_its_traceback(port_dir, tmp_path):
    p = cli("fuzz", "--minutes", "0.2", "--backend", port_dir / "raising_port.py", "--property", "oracle_backward",
            "--seed", "3", cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAIL raising_port oracle_backward" in p.stdout
    assert "RuntimeError: boom from the port" in p.stdout
    assert "_deep_inside" in p.stdout and "raising_port.py" in p.stdout


# --- bench, and outputs checked before any work -------------------------------------------------

def test_bench_times_a_port_named_by_its_file(port_dir, tmp_path):
    p = cli("bench", "--backend", port_dir / "good_port.py", "--shape", "custom:1,4,2,2,4,1", "--reps", "1",
            "--pass", "fwd", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["rows"]
    assert [(r["backend"], r["where"], r["computed_by"]) for r in rows] == [("good_port", "unknown", "good_port")]


@pytest.mark.parametrize("argv, flag", [
    (["check", "--quick", "--json", "{bad}/out.json"], "--json"),
    (["bench", "--shape", "custom:1,4,2,2,4,1", "--json", "{bad}/out.json"], "--json"),
    (["bench", "--shape", "custom:1,4,2,2,4,1", "--plot", "{bad}/out.png"], "--plot"),
    (["fuzz", "--minutes", "5", "--save", "{bad}/regressions"], "--save"),
])
def test_an_unwritable_output_is_exit_3_before_any_work(port_dir, tmp_path, argv, flag):
    bad = tmp_path / "a_file"
    bad.write_text("")
    marker = Path(str(port_dir / "marker_port.py") + ".called")
    marker.unlink(missing_ok=True)
    p = cli(*[a.format(bad=bad) for a in argv], "--backend", port_dir / "marker_port.py", cwd=tmp_path)
    assert p.returncode == 3, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and f"error: {flag} {bad}/" in lines[0] and "is a file, not a folder" in lines[0]
    assert not marker.exists()              # the port was never called
