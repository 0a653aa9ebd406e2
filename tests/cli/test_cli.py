"""The ``ssm-scan`` command, run as a user runs it: a subprocess, its output, files and exit code.
The tests of argument parsing, help texts and the errors before any work call main() in this
process instead (ssm_scan_here: the same stdout, stderr and status, without an interpreter start
and the imports each time); the status main() returns is the process's (``sys.exit(main())``),
which the tests through a subprocess check.

Exit codes: 0 success, 1 a check failed, 2 a usage error (one line on stderr, no traceback), 3 an
I/O error (an output that cannot be written).
Shapes stay tiny: lavapipe is slow.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import once
import pytest

from ssm_cli.main import COMMANDS, main
from ssm_ref.extras import install_hint
from ssm_vk import runtime as rt
from ssm_vk.sizing import Limits

ROOT = Path(__file__).resolve().parents[2]
VULKAN, NO_VULKAN_REASON = rt.available()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def ssm_scan(*argv, extra_path: Path | None = None, timeout: float = 120, env_extra: dict | None = None
             ) -> subprocess.CompletedProcess:
    """Run ``ssm-scan argv...`` (the console script's target, through this interpreter)."""
    env = dict(os.environ)
    env.pop("SSM_VK_VALIDATION", None)  # the suite's validation layer: slow, and nobody reads it here
    env.update(env_extra or {})
    paths = [str(ROOT), *([str(extra_path)] if extra_path else [])]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-m", "ssm_cli.main", *map(str, argv)], capture_output=True,
                          text=True, env=env, timeout=timeout, check=False, cwd=ROOT)


def ssm_scan_here(*argv, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """``ssm-scan argv...`` run by main() in this process: its status, stdout and stderr, as
    ssm_scan returns them. Help is as wide as in a child whose output is a pipe (80 columns)
    unless env_extra sets COLUMNS; the root logger main() sets up is put back afterwards."""
    out, err = io.StringIO(), io.StringIO()
    env = {"COLUMNS": "80", **(env_extra or {})}
    saved_env = {k: os.environ.get(k) for k in env}
    root = logging.getLogger()
    saved_log = root.handlers[:], root.level
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main([str(a) for a in argv])
            except SystemExit as e:  # argparse: --help (0) and usage errors (2)
                status = e.code
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        root.handlers[:], root.level = saved_log
    return subprocess.CompletedProcess(["ssm-scan", *map(str, argv)], status, out.getvalue(), err.getvalue())


def assert_one_line_error(p: subprocess.CompletedProcess, *fragments: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr and lines[0].startswith("ssm-scan")
    assert ": error: " in lines[0]
    for f in fragments:
        assert f in lines[0], lines[0]


def _run_and_publish(folder: Path, *argv) -> None:
    try:
        p = ssm_scan(*argv)
    except Exception as e:  # the timeout: the tests that wait report it
        once.publish(folder, [None, "", f"ssm-scan {argv[0]} did not finish: {e!r}"])
    else:
        once.publish(folder, [p.returncode, p.stdout, p.stderr])


@pytest.fixture(scope="module")
def slow_runs(tmp_path_factory):
    """The two commands that compile the most shader variants (info's support table, build-shaders),
    started together at the first test that needs either, each in its own process and folder, once
    in the session (tests/once.py: the worker that claims each runs it): name -> (a function that
    waits for its CompletedProcess, its folder)."""
    shared = once.shared_dir(tmp_path_factory, "cli-slow-runs")
    info, built = shared / "info", shared / "build-shaders"
    build = ["build-shaders", "--out", built / "out", "--n", "16"] + (
        ["--chunked-n", "16", "--p", "64"] if VULKAN else [])
    runs = {"info": (info, ["info", "--json", info / "info.json"]), "build-shaders": (built, build)}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for folder, argv in runs.values():
            if once.claim(folder):
                pool.submit(_run_and_publish, folder, *argv)

        def result(folder: Path, argv: list) -> subprocess.CompletedProcess:
            return subprocess.CompletedProcess(argv, *once.wait(folder, 600))

        yield {"info": (lambda: result(info, runs["info"][1]), info),
               "build-shaders": (lambda: result(built, build), built / "out")}


def test_the_console_script_is_this_main():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"ssm-scan": "ssm_cli.main:main"}


@pytest.mark.parametrize("command", ["", *[name for name, _ in COMMANDS]])
def test_help_works_for_every_command(command):
    p = ssm_scan_here(*([command] if command else []), "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"usage: ssm-scan {command}".rstrip())
    assert "exit codes: 0 success, 1 a check failed, 2 usage error" in " ".join(p.stdout.split())
    assert "3 I/O error" in " ".join(p.stdout.split())
    if not command:  # the top level lists every command
        for name, _ in COMMANDS:
            assert name in p.stdout


def test_info_reports_versions_backends_devices_and_placement(slow_runs):
    result, folder = slow_runs["info"]
    p, out = result(), folder / "info.json"
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""  # quiet by default
    text = p.stdout
    assert f"numpy {np.__version__}" in text and "glslc" in text and "CPU:" in text
    rep = json.loads(out.read_text())
    assert [b["name"] for b in rep["backends"]] == ["ssm_ref", "ssm_fast", "ssm_vk"]
    assert rep["backends"][0]["available"] and rep["versions"]["numpy"] == np.__version__
    rows = {r["shape"]: r for r in rep["support"]}
    assert {"demo", "prefill", "batch", "mamba1", "train", "long"} <= set(rows)
    assert rows["mamba1"]["ggml_vulkan"] == {"fwd": "CPU: Mamba-1", "bwd": "CPU: Mamba-1"}
    assert rows["demo"]["ggml_vulkan"]["fwd"] == "GPU" and rows["p8"]["ggml_vulkan"]["fwd"].startswith("CPU")
    assert rows["demo"]["backends"]["ssm_ref"]["fwd"]["where"] == "CPU"
    if VULKAN:
        names = [d.name for d in rt.list_devices()]
        assert [d["name"] for d in rep["vulkan"]["devices"]] == names
        assert names[rep["vulkan"]["selected"]] in text and "subgroup size" in text
        vk = rows["demo"]["backends"]["ssm_vk"]
        assert vk["fwd"]["ok"] and vk["fwd"]["where"].startswith("Vulkan") and vk["bwd"]["plan"]["windows"] >= 1
    else:
        assert "Vulkan: not available" in text and rep["vulkan"]["devices"] == []


def test_info_json_on_stdout_is_only_json():
    p = ssm_scan("info", "--json")
    assert p.returncode == 0, p.stderr
    assert set(json.loads(p.stdout)) >= {"versions", "cpu", "backends", "vulkan", "support"}


def test_check_quick_passes_on_every_available_backend(tmp_path):
    out = tmp_path / "check.json"
    p = ssm_scan("check", "--quick", "--json", out)
    assert p.returncode == 0, p.stdout + p.stderr
    # nothing on stderr but, when ssm_fast's kernels were not compiled yet, its one-line note
    assert [line for line in p.stderr.splitlines() if not line.startswith("compiling ssm_fast kernels")] == []
    assert "oracle: ssm_ref float64 gradients vs 4th-order finite differences" in p.stdout
    assert p.stdout.rstrip().endswith("check: PASS")
    rep = json.loads(out.read_text())
    assert rep["ok"] and rep["oracle_ok"] and rep["quick"]
    ran = {r["backend"] for r in rep["runs"]}
    assert {"ssm_ref", "ssm_fast"} <= ran  # numba is a dependency: ssm_fast always runs
    assert ("ssm_vk" in ran) == VULKAN
    for r in rep["runs"]:
        snaps = {"snapshots"} if r["problem"] == "snapshots" else set()     # K = 4 state snapshots
        assert r["ok"] and set(r["outputs"]) == {"y", "states", "d_s", "d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C",
                                                 *snaps}
        assert all(0 <= o["rel"] < 1e-5 for o in r["outputs"].values())
        if r["backend"] == "ssm_vk":
            assert r["where"].startswith("Vulkan")
    # the snapshot problem runs on the backends that declare SNAPSHOTS, the others say why not
    snap_ran = {r["backend"] for r in rep["runs"] if r["problem"] == "snapshots"}
    assert "ssm_ref" in snap_ran and snap_ran | {n["backend"] for n in rep["not_run"]} == ran
    if VULKAN:
        assert any(r["problem"].endswith("(device)") for r in rep["runs"])  # device-resident inputs too


BROKEN_PORT = '''
"""A port with a bug: d_A is 0.1% too large."""
import dataclasses

import ssm_ref

NAME = "broken_port"
supports = ssm_ref.supports


def ssm_scan(*args, **kw):
    return dataclasses.replace(ssm_ref.ssm_scan(*args, **kw), backend=NAME)


def ssm_scan_back(*args, **kw):
    g = ssm_ref.ssm_scan_back(*args, **kw)
    return dataclasses.replace(g, d_A=g.d_A * 1.001, backend=NAME)
'''

RAISING_PORT = '''
"""A port whose backward crashes."""
import ssm_ref

NAME = "raising_port"
supports = ssm_ref.supports
ssm_scan = ssm_ref.ssm_scan


def ssm_scan_back(*args, **kw):
    raise RuntimeError("boom")
'''


def test_check_fails_with_exit_1_when_a_backend_is_wrong_or_crashes(tmp_path):
    (tmp_path / "broken_port.py").write_text(BROKEN_PORT)
    (tmp_path / "raising_port.py").write_text(RAISING_PORT)
    out = tmp_path / "check.json"
    p = ssm_scan("check", "--quick", "--backend", "broken_port,raising_port", "--json", out, extra_path=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    assert p.stdout.rstrip().splitlines()[-1].startswith("check: FAIL")
    assert "FAIL: RuntimeError: boom" in p.stdout
    rep = json.loads(out.read_text())
    assert not rep["ok"] and rep["oracle_ok"]
    broken = [r for r in rep["runs"] if r["backend"] == "broken_port"]
    assert broken and all(not r["ok"] for r in broken)
    for r in broken:  # exactly d_A fails, by its 1e-3 relative error
        assert [k for k, o in r["outputs"].items() if not o["ok"]] == ["d_A"]
        assert r["outputs"]["d_A"]["rel"] == pytest.approx(1e-3, rel=1e-2)
    assert all(r["error"] == "RuntimeError: boom" for r in rep["runs"] if r["backend"] == "raising_port")


BATCH_DEPENDENT_PORT = '''
"""A correct port whose y depends, in its last bits, on the batch size: not batch invariant."""
import dataclasses

import numpy as np

import ssm_ref

NAME = "batch_dependent_port"
supports = ssm_ref.supports
ssm_scan_back = ssm_ref.ssm_scan_back


def ssm_scan(s, x, dt, A, B, C, ids=None):
    r = ssm_ref.ssm_scan(s, x, dt, A, B, C, ids)
    bump = np.float32(1) + np.float32(2.0 ** -22) * np.float32(np.shape(x)[0] > 1)
    return dataclasses.replace(r, y=r.y * bump, backend=NAME)
'''


def test_check_reports_invariance_as_information_not_as_a_failure(tmp_path):
    """The invariance rows (docs/SPEC.md section 3.2): ssm_ref's hold bit for bit; a port that is
    correct but not batch invariant is reported so, with exit code 0 (not part of the contract)."""
    (tmp_path / "batch_dependent_port.py").write_text(BATCH_DEPENDENT_PORT)
    out = tmp_path / "check.json"
    p = ssm_scan("check", "--quick", "--backend", "ref,batch_dependent_port", "--json", out, extra_path=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.rstrip().endswith("check: PASS")
    rep = json.loads(out.read_text())
    rows = {(r["backend"], r["kind"]): r for r in rep["invariance"]}
    assert set(rows) == {(b, k) for b in ("ssm_ref", "batch_dependent_port") for k in ("batch", "split")}
    for kind in ("batch", "split"):
        ref = rows["ssm_ref", kind]
        assert ref["holds"] and "d_A" not in ref["outputs"] and ref["outputs"]["snapshots"]["differ"] == 0
        assert all(o["differ"] == 0 for o in ref["outputs"].values())
    bad = rows["batch_dependent_port", "batch"]
    assert bad["holds"] is False and bad["outputs"]["y"]["differ"] > 0
    assert [k for k, o in bad["outputs"].items() if o["differ"]] == ["y"]
    assert rows["batch_dependent_port", "split"]["holds"]        # the same S in every call of a split
    lines = p.stdout.splitlines()
    assert any(line.startswith("batch invariance") and "batch_dependent_port" in line
               and line.rstrip().endswith("(info) not bitwise") for line in lines)
    assert any(line.startswith("split invariance") and "ssm_ref" in line
               and line.rstrip().endswith("(info) bitwise") for line in lines)


# A loader pointed at a driver manifest that does not exist finds no driver: a machine whose
# Vulkan driver is missing or broken.
NO_DRIVER = {"VK_DRIVER_FILES": "/nonexistent/icd.json", "VK_ICD_FILENAMES": "/nonexistent/icd.json"}


def test_without_a_vulkan_driver_info_says_why_and_a_named_vk_is_exit_2():
    p = ssm_scan("info", env_extra=NO_DRIVER)
    assert p.returncode == 0, p.stderr
    assert "Vulkan: not available" in p.stdout and "ssm_vk    not available: no Vulkan device" in p.stdout
    # A backend that cannot run here is a request this machine cannot serve (2), not a failed check (1).
    for command in (["check", "--quick"], ["fuzz", "--minutes", "0.01"]):
        p = ssm_scan(*command, "--backend", "vk", env_extra=NO_DRIVER)
        assert_one_line_error(p, "--backend ssm_vk: not available here: no Vulkan device")
        assert p.stdout == ""
    assert_one_line_error(ssm_scan("bench", "--backend", "vk", env_extra=NO_DRIVER),
                          "--backend ssm_vk: not available here: no Vulkan device")


@pytest.mark.parametrize("argv, fragments", [
    (["check", "--backend", "no_such_module"], ["--backend no_such_module: no such module"]),
    (["check", "--backend", "json"], ["--backend json: the module lacks NAME"]),
    (["check", "--device", "x"], ["--device x"]),
    (["bench", "--shape", "nonsense"], ["--shape nonsense"]),
    (["bench", "--shape", "custom:1,8,3,64,128,2"], ["H % G must be 0"]),
    (["bench", "--sweep", "Q=1,2"], ["--sweep Q=1,2"]),
    (["bench", "--pass", "sideways"], ["invalid choice: 'sideways'"]),
    (["bench", "--op", "fwd"], ["--op fwd: --op names the op (ssm_scan)", "alone is --pass fwd"]),
    (["bench", "--op", "decayed"], ["--op decayed: expected one of 'ssm_scan'"]),
    (["bench", "--reps", "0"], ["--reps must be >= 1"]),
    (["bench", "--shape", "train", "--backend", "ssm_ref"], ["nothing to measure", "--force"]),
    (["build-shaders", "--subgroup-sizes", "12"], ["12 is not a power of two"]),
    (["build-shaders", "--n", "16,x"], ["--n: expected comma-separated integers"]),
    (["frobnicate"], ["invalid choice: 'frobnicate'"]),
    (["fuzz", "--minutes", "-1"], ["--minutes: expected a finite number > 0, got '-1'"]),
    (["fuzz", "--minutes", "0"], ["--minutes: expected a finite number > 0, got '0'"]),
    (["fuzz", "--minutes", "nan"], ["--minutes: expected a finite number > 0, got 'nan'"]),
    (["fuzz", "--minutes", "inf"], ["--minutes: expected a finite number > 0, got 'inf'"]),
    (["fuzz", "--minutes", "soon"], ["--minutes: expected a number > 0, got 'soon'"]),
    (["fuzz", "--minutes", "1", "--tol-scale", "-2"], ["--tol-scale: expected a finite number > 0"]),
    (["fuzz", "--minutes", "1", "--max-S", "0"], ["--max-S: expected an integer >= 1, got 0"]),
    (["fuzz", "--minutes", "1", "--backend", "no_such_module"], ["--backend no_such_module: no such module"]),
    (["vectors", "--out", "x", "--case", "nonesuch"], ["--case nonesuch: unknown"]),
])
def test_a_bad_argument_is_one_line_and_exit_2(argv, fragments):
    assert_one_line_error(ssm_scan_here(*argv), *fragments)


# What each command needs besides -v to parse.
REQUIRED = {"fuzz": ["--minutes", "1"], "vectors": ["--out", "x"]}


@pytest.mark.parametrize("command", [name for name, _ in COMMANDS])
def test_v_is_accepted_after_every_command(command):
    from ssm_cli.main import build_parser

    args = build_parser().parse_args([command, *REQUIRED.get(command, []), "-v", "-v"])
    assert args.verbose == 2


def test_fuzz_takes_the_backend_aliases_of_check_and_bench(capsys):
    from ssm_cli.main import main

    assert main(["fuzz", "--minutes", "0.01", "--backend", "ref", "--property", "deterministic", "-v"]) == 0
    out = capsys.readouterr().out
    assert "fuzzing ssm_ref for" in out and "ssm_ref    deterministic" in out


def test_an_output_folder_that_cannot_be_made_is_exit_3(tmp_path, capsys):
    from ssm_cli.main import main

    (tmp_path / "file").write_text("")
    assert main(["vectors", "--out", str(tmp_path / "file" / "golden")]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out" in err and "is a file, not a folder" in err


def _without(module: str, *argv, timeout: float = 300) -> subprocess.CompletedProcess:
    """``ssm-scan argv...`` in a process where ``import module`` fails (as if not installed)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("SSM_VK_VALIDATION", None)
    code = f"import sys; sys.modules[{module!r}] = None; from ssm_cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *map(str, argv)], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False, cwd=ROOT)


def test_demo_without_matplotlib_skips_the_plot_in_one_line(tmp_path):
    p = _without("matplotlib", "demo", "--quick", "--out", tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    notes = [line for line in p.stdout.splitlines() if "matplotlib" in line]
    assert notes[0] == f"demo: matplotlib is not installed: no plot (to draw it: {install_hint('plot', 'matplotlib')})"
    assert "pip install matplotlib (or" in notes[0] and "pip install '.[plot]'" in notes[0]
    assert "--plot" not in p.stdout and "check: PASS" in p.stdout
    assert not (tmp_path / "ssm-scan-demo.png").exists()
    assert json.loads((tmp_path / "ssm-scan-demo.json").read_text())["rows"]


def test_demo_help_names_the_files_it_writes():
    p = ssm_scan("demo", "--help")
    assert p.returncode == 0 and "OUT/ssm-scan-demo.png" in p.stdout and "OUT/ssm-scan-demo.json" in p.stdout


def test_a_missing_vulkan_binding_says_how_to_install_it():
    p = _without("vulkan", "info")
    assert p.returncode == 0, p.stderr
    assert "Vulkan: not available: the Vulkan binding could not be loaded" in p.stdout
    assert install_hint("vulkan", "vulkan") in p.stdout and "pip install vulkan (or" in p.stdout


def test_bench_plot_without_sweep_sweeps_each_shape_around_its_own_T(tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    p = ssm_scan("bench", "--shape", "demo", "mamba1", "--plot", png, "--json", out, "--backend", "fast",
                 "--pass", "fwd", "--reps", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads(out.read_text())
    got = {}
    for r in rep["rows"]:
        got.setdefault(r["shape"], set()).add(r["dims"]["T"])
    assert got == {"demo": {4, 16, 64}, "mamba1": {32, 128, 512}}     # 1/16, 1/4 and 1 of each shape's T
    assert rep["sweep_per_shape"] == {"demo": [4, 16, 64], "mamba1": [32, 128, 512]}
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_bench_times_every_backend_and_draws_the_plot(tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    backends = "ssm_ref,ssm_fast,ssm_vk" if VULKAN else "ssm_ref,ssm_fast"
    p = ssm_scan("bench", "--shape", "custom:1,8,2,8,16,1", "--sweep", "T=4,8", "--reps", "2",
                 "--backend", backends, "--json", out, "--plot", png, "-v")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[0/" in p.stderr  # -v shows progress when stderr is not a terminal
    assert "updates/s" in p.stdout and f"plot: {png}" in p.stdout
    rep = json.loads(out.read_text())
    assert rep["sweep"] == {"axis": "T", "values": [4, 8]}
    rows = rep["rows"]
    assert sorted((r["backend"], r["op"], r["dims"]["T"]) for r in rows) == sorted(
        (b, op, t) for b in backends.split(",") for op in ("fwd", "bwd") for t in (4, 8))
    for r in rows:
        assert r["n"] == 2 and 0 < r["min_s"] <= r["median_s"] <= r["max_s"]
        assert r["updates"] == 16 * 8 * 2 * r["dims"]["T"]
        assert r["updates_per_s"] == pytest.approx(r["updates"] / r["median_s"])
        if r["backend"] == "ssm_vk":
            assert r["where"].startswith("Vulkan")
            assert 0 < r["gpu_median_s"] and r["gpu_n"] == 2  # GPU timestamps beside wall time
        else:
            assert r["where"] == "CPU" and "gpu_median_s" not in r
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000


def test_bench_refuses_the_reference_only_where_it_would_take_minutes():
    import ssm_ref
    from ssm_cli.backends import Backend
    from ssm_cli.bench import too_slow
    from ssm_cli.shapes import SHAPES

    ref = Backend("ssm_ref", ssm_ref)
    refused = {name for name, shape in SHAPES.items() if too_slow(ref, shape)}
    assert refused == {"train", "long"}
    assert "12.9 GB" in too_slow(ref, SHAPES["train"]) and "--force" in too_slow(ref, SHAPES["long"])
    assert too_slow(Backend("my_port", ssm_ref), SHAPES["long"]) is None  # other backends: no limit


def test_bench_json_on_stdout_is_only_json():
    p = ssm_scan("bench", "--shape", "custom:1,4,2,2,4,1", "--backend", "ssm_ref", "--reps", "1", "--pass", "fwd",
                 "--json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["rows"]
    assert [(r["backend"], r["op"]) for r in rows] == [("ssm_ref", "fwd")]


def test_build_shaders_writes_what_the_runtime_looks_up(slow_runs):
    result, tmp_path = slow_runs["build-shaders"]
    p = result()
    if not VULKAN:
        assert_one_line_error(p, "--subgroup-sizes local: no Vulkan device")
        return
    from ssm_ref import Dims
    from ssm_vk.runtime import shaders, spirv
    from ssm_vk.runtime.device import choose
    from ssm_vk.sequential import sequential_specs as specs
    from ssm_vk.sequential.sequential_planner import sequential_plan as plan

    assert p.returncode == 0, p.stderr
    index = json.loads((tmp_path / "index.json").read_text())
    assert p.stdout.startswith(f"wrote {len(index)} SPIR-V variants")
    for entry in index.values():
        assert (tmp_path / entry["file"]).read_bytes()[:4] == spirv.SPIRV_MAGIC
    # Every kernel a forward and a backward at N = 16 request on this device is in the index.
    lim = Limits.of(choose(rt.list_devices()))
    for mamba1 in (False, True):
        d = Dims(S=2, T=5, H=3, P=1 if mamba1 else 4, N=16, G=1, R=2, mamba1=mamba1,
                 a_shape=(3, 16) if mamba1 else (3,))
        f, b = plan(d, lim, backward=False).layout, plan(d, lim, backward=True).layout
        for spec in (specs.fwd_spec(d, f, False), specs.fwd_spec(d, b, True), specs.bwd_spec(d, b),
                     specs.reduce_spec(0), specs.reduce_spec(1), specs.rows_spec()):
            assert shaders._variant_id(spec.name, shaders.normalize_defines(dict(spec.defines))) in index
    # ... and the wheel ships them: the package-data globs of pyproject match the files.
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["ssm_vk"]
    for name in [e["file"] for e in index.values()] + ["index.json"]:
        assert any(Path("spirv", name).match(g) for g in globs), name


def test_demo_runs_info_check_and_bench_and_names_its_plot(tmp_path):
    p = ssm_scan("demo", "--quick", "--out", tmp_path, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    for step in ("=== ssm-scan info", "=== ssm-scan check --quick", "=== ssm-scan bench"):
        assert step in p.stdout
    assert "check: PASS" in p.stdout
    plot = tmp_path / "ssm-scan-demo.png"
    assert p.stdout.rstrip().splitlines()[-1].endswith(f"plot {plot}")
    assert plot.read_bytes()[:8] == PNG_MAGIC
    assert json.loads((tmp_path / "ssm-scan-demo.json").read_text())["rows"]



# --- --version ----------------------------------------------------------------------------------

def test_version_names_the_package_python_and_the_backends_libraries_without_starting_vulkan():
    import importlib.util
    import platform

    from ssm_cli.machine import version_of

    code = ("import sys; from ssm_cli.main import main\n"
            "try:\n    main(['--version'])\nexcept SystemExit as e:\n    code = e.code\n"
            "loaded = [m for m in ('vulkan', 'ssm_vk', 'ssm_fast', 'numba', 'torch', 'jax') if m in sys.modules]\n"
            "print('exit', code, 'loaded', loaded)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                       check=False, cwd=ROOT)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    *lines, last = p.stdout.strip().splitlines()
    assert last == "exit 0 loaded []"     # read from package metadata: nothing imported, no context, no build
    assert lines[0].startswith("ssm-scan ") and lines[1].startswith(f"Python {platform.python_version()}")
    assert f"numpy {np.__version__}" in lines and any(x.startswith("numba ") for x in lines)
    assert any(x.startswith("vulkan (the Python binding) ") for x in lines)
    assert any(x.startswith("glslc ") for x in lines)
    for dist in ("torch", "jax"):
        if importlib.util.find_spec(dist) is not None:
            assert f"{dist} {version_of(dist)}" in lines
    q = ssm_scan("--version")
    assert q.returncode == 0 and q.stdout.strip().splitlines() == lines


# --- every help opens with a sentence of its own, in plain text ---------------------------------

@pytest.mark.parametrize("command", ["", *[name for name, _ in COMMANDS]])
def test_every_help_opens_with_one_complete_plain_sentence(command):
    p = ssm_scan_here(*([command] if command else []), "--help", env_extra={"COLUMNS": "100"})
    assert p.returncode == 0, p.stderr
    text = p.stdout
    assert "`" not in text                     # no reST markup
    after_usage = text.split("\n\n", 1)[1].splitlines()
    first = after_usage[0]
    assert first[0].isupper() and first.endswith(".") and first.count(". ") == 0, first
    assert len(first) <= 100 and after_usage[1] == "", after_usage[:2]    # not cut, not run on
    if not command:
        listed = text.split("COMMAND\n", 1)[1].split("\n\n", 1)[0]
        assert "`" not in listed and "build-shaders" in listed


def test_build_shaders_help_says_what_it_does_not_how():
    p = ssm_scan_here("build-shaders", "--help")
    description = p.stdout.split("\n\n")[1:3]
    assert "packaged SPIR-V" in description[1] and "glslc" in description[1]
    for internal in ("push constants", "plan.py", "kernels.py", "lanes"):
        assert internal not in p.stdout


# --- the choices are listed ---------------------------------------------------------------------

def test_the_choices_of_property_case_regime_and_backend_are_listed():
    from ssm_ref.testing.cases import REGIMES
    from ssm_ref.testing.properties import PROPERTIES
    from ssm_ref.testing.vectors import GOLDEN

    fuzz = " ".join(ssm_scan_here("fuzz", "--help").stdout.split())
    assert all(name in fuzz for name in PROPERTIES) and all(r in fuzz for r in REGIMES)
    vectors = " ".join(ssm_scan_here("vectors", "--help").stdout.split())
    assert all(name in vectors for name in GOLDEN)
    for command in ("check", "bench", "fuzz", "demo"):
        text = " ".join(ssm_scan_here(command, "--help").stdout.split())
        assert "the built-in ssm_ref, ssm_fast, ssm_vk (or ref, fast, vk)" in text
        assert "ssm_ggml:DEVICE" in text and "dotted module path" in text and ".py file" in text


def test_an_unknown_property_stops_fuzz_before_it_starts():
    p = ssm_scan_here("fuzz", "--minutes", "0.01", "--backend", "ref", "--property", "nope")
    assert_one_line_error(p, "--property nope: unknown", "oracle_forward", "deterministic")
    assert p.stdout == ""                      # nothing printed, "fuzzing ..." included


# --- --shape custom: the Python API's order -----------------------------------------------------

def test_a_custom_shape_takes_the_python_api_order_or_names():
    from ssm_cli.shapes import parse_shapes

    (a,) = parse_shapes(["custom:2,64,16,32,128"])
    assert (a.S, a.T, a.H, a.P, a.N, a.G, a.mamba1) == (2, 64, 16, 32, 128, 1, False)
    (b,) = parse_shapes(["custom:N=128,P=32,H=16,T=64,S=2,G=4"])
    assert (b.S, b.T, b.H, b.P, b.N, b.G) == (2, 64, 16, 32, 128, 4)
    c, d = parse_shapes(["custom:1,8,4,1,16,1,mamba1 demo"])
    assert c.mamba1 and (c.H, c.P, c.N) == (4, 1, 16) and d.name == "demo"


@pytest.mark.parametrize("argv, translation", [
    (["custom", "128,64,16,1,64,1"], "custom:1,64,16,64,128,1"),
    (["128,64,16,2,64,4"], "custom:4,64,16,64,128,2"),
    (["custom", "16,1,8,1,32,1,mamba1"], "custom:1,32,8,1,16,1,mamba1"),
])
def test_ggml_order_is_refused_naming_both_orders(argv, translation):
    p = ssm_scan_here("bench", "--backend", "ref", "--shape", *argv)
    assert_one_line_error(p, "custom:S,T,H,P,N[,G] (the Python API's order)", "N,P,H,G,T,S (ggml's order)",
                          f"this is {translation}")
    assert p.stdout == ""


@pytest.mark.parametrize("shape, fragment", [
    ("custom:1,2", "five or six integers"),
    ("custom:S=1,T=2", "H, P, N missing"),
    ("custom:S=1,2,3,4,5", "all sizes by position or all by name"),
    ("custom:1,8,3,64,128,2", "H % G must be 0"),
])
def test_a_malformed_custom_shape_is_exit_2(shape, fragment):
    assert_one_line_error(ssm_scan_here("bench", "--backend", "ref", "--shape", shape), fragment)


# --- each exit code of each command (0, 1, 2, 3 where a command can give it) --------------------
# Elsewhere in this file: check 0 and 1, bench 0, demo 0, fuzz 0, info 0, vectors 2 and 3,
# build-shaders 0 and 2; tests/test_port_tools.py: check, bench and fuzz 3 before any work.

WRONG_FORWARD = '''
"""A port with a bug: y is 1% too large."""
import dataclasses

import ssm_ref

NAME = "wrong_forward"
supports = ssm_ref.supports


def ssm_scan(*args, **kw):
    r = ssm_ref.ssm_scan(*args, **kw)
    return dataclasses.replace(r, y=r.y * 1.01, backend=NAME)


def ssm_scan_back(*args, **kw):
    return dataclasses.replace(ssm_ref.ssm_scan_back(*args, **kw), backend=NAME)
'''


@pytest.fixture
def wrong_package(tmp_path):
    """tmp_path holding the package ``myports`` with the module ``wrong_forward`` (a dotted path)."""
    (tmp_path / "myports").mkdir()
    (tmp_path / "myports" / "__init__.py").write_text("")
    (tmp_path / "myports" / "wrong_forward.py").write_text(WRONG_FORWARD)
    return tmp_path


def test_fuzz_exit_1_for_a_port_named_by_its_dotted_module_path(wrong_package):
    p = ssm_scan("fuzz", "--minutes", "0.05", "--seed", "1", "--backend", "myports.wrong_forward",
                 "--property", "oracle_forward", extra_path=wrong_package)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAIL wrong_forward oracle_forward" in p.stdout and "Traceback" not in p.stderr


def test_demo_exit_1_when_its_check_fails(wrong_package, tmp_path):
    p = ssm_scan("demo", "--quick", "--backend", "myports.wrong_forward", "--out", tmp_path / "out",
                 extra_path=wrong_package, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "check: FAIL" in p.stdout and "=== ssm-scan bench" in p.stdout      # the bench still ran
    assert p.stdout.rstrip().splitlines()[-1].startswith("demo finished") and "check FAIL" in p.stdout


def test_vectors_exit_0_writes_the_cases_asked_for(tmp_path):
    p = ssm_scan("vectors", "--out", tmp_path, "--case", "tiny_mamba2", "--case", "no_tokens")
    assert p.returncode == 0, p.stderr
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert json.dumps(manifest).count("tiny_mamba2") >= 1 and (tmp_path / "no_tokens.npz").exists()


@pytest.mark.parametrize("argv, fragments", [
    (["info", "--nope"], ["unrecognized arguments: --nope"]),
    (["check", "--quick", "--seed", "x"], ["--seed: invalid int value"]),
    (["demo", "--quick", "--backend", "no_such_module"], ["--backend no_such_module: no such module"]),
    (["fuzz", "--minutes", "1", "--regime", "nope"], ["invalid choice: 'nope'"]),
    (["vectors"], ["the following arguments are required: --out"]),
    (["build-shaders", "--p", "0"], ["--p: values must be >= 1"]),
])
def test_exit_2_for_each_command(argv, fragments):
    p = ssm_scan_here(*argv)
    assert_one_line_error(p, *fragments)
    assert p.stdout == ""


@pytest.mark.parametrize("argv, flag", [
    (["info", "--json", "{bad}/info.json"], "--json"),
    (["check", "--quick", "--backend", "ref", "--json", "{bad}/check.json"], "--json"),
    (["bench", "--backend", "ref", "--json", "{bad}/bench.json"], "--json"),
    (["build-shaders", "--subgroup-sizes", "32", "--n", "1", "--out", "{bad}/spirv"], "--out"),
    (["demo", "--quick", "--out", "{bad}/out"], "--out"),
    (["fuzz", "--minutes", "1", "--backend", "ref", "--save", "{bad}/regressions"], "--save"),
    (["vectors", "--out", "{bad}/golden"], "--out"),
])
def test_exit_3_for_each_command_before_any_work(tmp_path, argv, flag):
    bad = tmp_path / "a_file"
    bad.write_text("")
    p = ssm_scan_here(*[a.format(bad=bad) for a in argv])
    assert p.returncode == 3, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and f"error: {flag} {bad}/" in lines[0] and "is a file, not a folder" in lines[0]
    assert "Traceback" not in p.stderr and p.stdout == ""
