"""``ssm-scan`` on Mamba-3's scan, run as a user runs it (a subprocess, its output, files and exit
code): check, fuzz, vectors and verify with ``--op mamba3_scan`` (or its short name ``mamba3``),
on ssm_ref's port and on a port file with one planted bug."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from children import REPO, child_env

# A port file: ssm_ref's Mamba-3 with the trapezoid's previous-token term (beta) 1% too large.
WRONG_M3 = '''
import numpy as np
import ssm_ref

NAME = "wrong_m3"
supports = ssm_ref.supports


def mamba3_scan(x, dt, dA, lam, *rest, rotation="interleaved", update_cache=False):
    # beta = alpha * dt * (1 - lam): lam' = lam - 0.01 * (1 - lam) makes 1 - lam, so beta, 1% larger
    lam = (lam - np.float32(0.01) * (1 - lam)).astype(np.float32)
    return ssm_ref.mamba3_scan(x, dt, dA, lam, *rest, rotation=rotation, update_cache=update_cache)


def mamba3_scan_back(*args, rotation="interleaved"):
    return ssm_ref.mamba3_scan_back(*args, rotation=rotation)
'''


def cli(*argv, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ssm_cli", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env=child_env(), cwd=REPO, check=False)


@pytest.fixture(scope="module")
def wrong_port(tmp_path_factory):
    p = tmp_path_factory.mktemp("ports") / "wrong_m3.py"
    p.write_text(WRONG_M3)
    return p


def test_check_passes_ssm_ref_with_every_output_and_gradient():
    r = cli("check", "--op", "mamba3", "--quick")      # the short name; the built-in backends that compute it
    assert r.returncode == 0, r.stdout + r.stderr
    assert "check: PASS" in r.stdout
    assert all(f"{b}: " in r.stdout for b in ("ssm_ref", "ssm_fast", "ssm_vk")), r.stdout[-3000:]
    header = next(line for line in r.stdout.splitlines() if line.startswith("problem")).split()
    assert header[3:8] == ["y", "theta", "h", "k", "v"] and header[8:-1][-4:] == ["d_s_theta", "d_s_h", "d_s_k",
                                                                                  "d_s_v"]
    assert r.stdout.count("float64 gradients vs 4th-order finite differences") == 2


def test_check_fails_a_wrong_port(wrong_port):
    r = cli("check", "--op", "mamba3_scan", "--quick", "--backend", wrong_port)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "check: FAIL" in r.stdout and "y" in r.stdout


def test_fuzz_runs_every_property_and_catches_a_wrong_port(wrong_port, tmp_path):
    from ssm_ref.testing.properties.mamba3 import PROPERTIES

    r = cli("fuzz", "--op", "mamba3", "--backend", "ref", "--minutes", "0.05", "--seed", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [x.split() for x in r.stdout.splitlines() if x.startswith("  ssm_ref")]
    assert sorted(x[1] for x in lines) == sorted(PROPERTIES) and all(x[-1] == "ok" for x in lines)
    r = cli("fuzz", "--op", "mamba3", "--backend", wrong_port, "--minutes", "0.05", "--seed", "2",
            "--property", "oracle_forward", "--save", tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL wrong_m3 oracle_forward" in r.stdout
    assert "reproduce: ssm_ref.testing.ports.kit_part(ssm_ref.ops.get('mamba3_scan'), 'make_case')(" in r.stdout
    # the shrunk failure is saved as golden vectors of one case, which replay it
    (saved,) = tmp_path.glob("mamba3_scan-wrong_m3-oracle_forward-*.vectors")
    assert f"golden vectors: {saved}" in r.stdout
    assert cli("verify", "--backend", wrong_port, "--vectors", saved).returncode == 1
    assert cli("verify", "--backend", "ref", "--vectors", saved).returncode == 0


def test_vectors_then_verify_of_a_port(tmp_path, wrong_port):
    r = cli("vectors", "--op", "mamba3", "--out", tmp_path, "--case", "siso_tiny", "--case", "mimo_halved")
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert [c["name"] for c in m["cases"]] == ["siso_tiny", "mimo_halved"] and m["ops"] == ["mamba3_scan"]
    r = cli("verify", "--backend", "ref", "--vectors", tmp_path)      # the op is the folder's
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mamba3_scan golden cases from" in r.stdout and "verify: PASS" in r.stdout
    r = cli("verify", "--backend", wrong_port, "--vectors", tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL" in r.stdout and "verify: FAIL" in r.stdout


@pytest.mark.parametrize("argv, fragment", [
    (["vectors", "--op", "mamba3", "--out", "{tmp}", "--case", "tiny_mamba2"], "--case tiny_mamba2: unknown for "
                                                                                "mamba3_scan"),
    (["vectors", "--op", "mamba4", "--out", "{tmp}"], "--op mamba4: expected one of"),
    (["verify", "--op", "mamba3", "--backend", "ref", "--case", "nope"], None),
])
def test_bad_names_are_one_line_or_an_error_row(tmp_path, argv, fragment):
    r = cli(*(a.format(tmp=tmp_path) for a in argv))
    if fragment is None:      # verify reports an unknown case as an ERROR row: a failed check
        assert r.returncode == 1 and "unknown case 'nope'" in r.stdout
        return
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and fragment in r.stderr, r.stderr
