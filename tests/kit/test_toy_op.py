"""An op of the tests' own (tests/kit/toy_op.py: a decayed cumulative sum, its numpy reference, a
numba port) declared and registered by docs/ARCHITECTURE.md's recipe, through the testing kit's
op-generic properties and ``ssm-scan check --op``: the seam a second op goes through."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from children import REPO, child_env
from hypothesis import given, settings
from hypothesis import strategies as st

import ssm_ref
from ssm_ref.testing.properties import PropertyFailed
from ssm_ref.testing.properties.generic import GENERIC

sys.path.insert(0, str(REPO / "tests" / "kit"))
import toy_op  # (registers its op)

OP = toy_op.OP
TOY = REPO / "tests" / "kit" / "toy_op.py"


def test_the_declaration_is_what_every_tool_reads():
    assert ssm_ref.ops.get("decayed_cumsum") is OP
    assert OP.input_names == ("s", "x", "a") and OP.output_names == ("y", "last")
    assert OP.cotangent_names == ("g_y", "g_last") and OP.backward_name == "decayed_cumsum_back"
    assert OP.grad_of == {"s": "d_s", "x": "d_x", "a": "d_a"}
    with pytest.raises(ValueError, match=r"^op: 'decayed_cumsum' is declared already"):
        ssm_ref.ops.register(dataclasses.replace(OP, summary="another"))
    assert ssm_ref.ops.register(OP) is OP          # the same declaration again: a no-op


def test_the_reference_backward_is_the_forwards_gradient():
    # central differences of the float64 reference's loss, every entry of every input
    c = toy_op.make_case(5, S=2, T=4, H=2)
    args = c.args(np.float64)
    cot = {k: v.astype(np.float64) for k, v in c.cotangents.items()}
    g = toy_op.reference_back(**args, **cot, dtype=np.float64)

    def loss(**over):
        r = toy_op.reference(**{**args, **over}, dtype=np.float64)
        return float(np.sum(r["y"] * cot["g_y"]) + np.sum(r["last"] * cot["g_last"]))

    h = 1e-6
    for name, gname in OP.grad_of.items():
        fd = np.empty_like(args[name])
        for i in np.ndindex(fd.shape):
            up, down = args[name].copy(), args[name].copy()
            up[i] += h
            down[i] -= h
            fd[i] = (loss(**{name: up}) - loss(**{name: down})) / (2 * h)
        np.testing.assert_allclose(g[gname], fd, rtol=1e-7, atol=1e-9)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 4), st.integers(1, 40), st.integers(1, 5), st.integers(0, 2**31))
def test_every_generic_property_holds_on_the_port(S, T, H, seed):
    case = toy_op.make_case(seed, S=S, T=T, H=H)
    for prop in GENERIC.values():
        prop.check(toy_op, case, OP.tol())


class _Broken:
    """The toy port with one planted defect."""

    NAME = "broken"
    supports = staticmethod(toy_op.supports)

    def __init__(self, defect: str):
        self.defect = defect
        self.calls = 0

    def decayed_cumsum(self, s, x, a):
        if self.defect == "ignores_s":
            s = None
        r = toy_op.decayed_cumsum(s, x, a)
        if self.defect == "y":
            r["y"] = r["y"] * np.float32(1.001)
        if self.defect == "noise":
            self.calls += 1
            r["y"] = r["y"] + np.float32(1e-7) * self.calls
        return r

    def decayed_cumsum_back(self, *args):
        g = toy_op.decayed_cumsum_back(*args)
        if self.defect == "d_a":
            g["d_a"] = np.roll(g["d_a"], 1, axis=1)
        if self.defect == "d_s_first_token":   # the start state's gradient misses the first token's decay
            g["d_s"] = g["d_s"] / np.where(args[2][:, 0] == 0, 1, args[2][:, 0])
        return g


@pytest.mark.parametrize("prop,defect", [("oracle_forward", "y"), ("oracle_backward", "d_a"),
                                         ("split_tokens", "ignores_s"), ("decode_steps", "ignores_s"),
                                         ("split_tokens", "d_s_first_token"), ("deterministic", "noise"),
                                         ("permute_sequences", "y_by_position")])
def test_each_property_catches_a_defect(prop, defect):
    case = toy_op.make_case(11, S=3, T=12, H=2)
    port = _Broken(defect)
    if defect == "y_by_position":   # the first sequence's result written over the others'
        def fwd(s, x, a):
            r = toy_op.decayed_cumsum(s, x, a)
            r["y"] = r["y"] + np.float32(1e-3) * np.arange(r["y"].shape[0], dtype=np.float32)[:, None, None]
            return r
        port.decayed_cumsum = fwd
    with pytest.raises(PropertyFailed, match=f"^{prop} fails"):
        GENERIC[prop].check(port, case, OP.tol())


def _cli(command, *argv):
    return subprocess.run([sys.executable, "-m", "ssm_cli", command, *argv], capture_output=True, text=True,
                          timeout=300, env=child_env(), cwd=REPO)


def _check(*argv):
    return _cli("check", *argv)


def test_check_runs_the_op_on_its_port():
    r = _check("--op", "decayed_cumsum", "--backend", str(TOY))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "check: PASS" in r.stdout
    header = next(line for line in r.stdout.splitlines() if line.startswith("problem"))
    assert header.split()[3:8] == ["y", "last", "d_s", "d_x", "d_a"]
    fd = "oracle: decayed_cumsum's reference in float64 gradients vs 4th-order finite differences"
    assert r.stdout.count(fd) == 2


def test_check_fails_a_broken_port_of_the_op(tmp_path):
    broken = tmp_path / "toy_broken.py"
    broken.write_text(TOY.read_text().replace("d_a[i, t, h] = lam * (", "d_a[i, t, h] = 1.01 * lam * ("))
    r = _check("--op", "decayed_cumsum", "--backend", str(broken))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "d_a" in r.stdout and "check: FAIL" in r.stdout


def test_check_names_an_unknown_op():
    r = _check("--op", "no_such_op", "--backend", str(TOY))
    assert r.returncode == 2
    assert "--op no_such_op: expected one of" in r.stderr and "'decayed_cumsum'" in r.stderr


def test_fuzz_runs_every_property_of_the_op(tmp_path):
    r = _cli("fuzz", "--op", "decayed_cumsum", "--backend", str(TOY), "--minutes", "0.05", "--seed", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [x.split() for x in r.stdout.splitlines() if x.startswith("  toy_fast")]
    assert sorted(x[1] for x in lines) == sorted(GENERIC) and all(x[-1] == "ok" and int(x[2]) > 0 for x in lines)
    broken = tmp_path / "toy_broken.py"
    broken.write_text(TOY.read_text().replace("lam *= a[i, t, h]", "lam *= a[i, t, h] * 1.01"))
    r = _cli("fuzz", "--op", "decayed_cumsum", "--backend", str(broken), "--minutes", "0.05", "--seed", "1",
             "--property", "oracle_backward")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL toy_fast oracle_backward" in r.stdout
    assert "reproduce: ssm_ref.testing.ports.kit_part(ssm_ref.ops.get('decayed_cumsum'), 'make_case')(" in r.stdout
