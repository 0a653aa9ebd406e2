"""Mamba-3's testing kit (ssm_ref.testing.mamba3_cases, ssm_ref.testing.properties.mamba3, the golden
vectors and verify of any declared op): every property holds on ssm_ref's port, each one rejects a
port with one plausible bug that the reference passes, and the golden vectors hold what the
recurrence says at its edges (checked from the definition, not from the code that wrote them),
read back bit for bit, and verify a port."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings

import ssm_ref
from ssm_ref import ops
from ssm_ref.testing import mamba3_cases as mc
from ssm_ref.testing import verify
from ssm_ref.testing.properties import PropertyFailed
from ssm_ref.testing.properties.mamba3 import OWN, PROPERTIES
from ssm_ref.testing.vectors import golden_cases, golden_table, read_vectors, write_vectors

OP = ops.MAMBA3
TOL = OP.tol()


@settings(max_examples=20, deadline=None)
@given(mc.strategy(max_T_long=24))
def test_every_property_holds_on_the_reference(case):
    for prop in PROPERTIES.values():
        prop.check(ssm_ref, case, TOL)


@pytest.mark.parametrize("case", mc.cases(quick=True), ids=lambda c: c.label)
def test_every_property_holds_on_the_fixed_cases(case):
    applied = [name for name, prop in PROPERTIES.items() if prop.check(ssm_ref, case, TOL)]
    assert {"oracle_forward", "oracle_backward", "deterministic", "no_writes", "lam_one_is_mamba2"} <= set(applied)


def test_the_kit_is_what_the_declaration_names():
    from ssm_ref.testing import ports

    assert ports.kit_part(OP, "properties") is PROPERTIES
    assert ports.kit_part(OP, "make_case") is mc.make_case and ports.kit_part(OP, "golden") is mc.GOLDEN
    assert OP.state == (("s_theta", "theta"), ("s_h", "h"), ("s_k", "k"), ("s_v", "v"))
    c = mc.make_case(3, M=2, rotation="halved", ids="permutation")
    assert c.keywords == {"rotation": "halved"} and c.recipe["seed"] == 3
    again = mc.make_case(**c.recipe)
    assert all(np.array_equal(again.inputs[k], v) for k, v in c.inputs.items() if v is not None)


@pytest.mark.parametrize("kw, fragment", [
    (dict(F=3, N=4), "F: expected 0 <= F <= N/2"), (dict(F=1, N=5), "N even"), (dict(H=3, G=2), "G: expected"),
    (dict(states=False, ids="permutation"), "ids: without start states"), (dict(rotation="split"), "rotation"),
    (dict(M=0), "M: expected None"), (dict(regime="hot"), "regime"),
])
def test_make_case_names_the_bad_argument(kw, fragment):
    with pytest.raises(ValueError, match=fragment):
        mc.make_case(0, **kw)


# -- each property can fail -------------------------------------------------------------------------

class Mutant:
    """ssm_ref's Mamba-3 with one planted defect: ``args(a, kw)`` rewrites the arguments of every
    call, ``fwd(a, out)`` the forward's outputs, ``back(a, grads)`` the gradients."""

    NAME = "mutant"

    def __init__(self, args=None, fwd=None, back=None):
        self.args, self.fwd, self.back = args, fwd, back
        self.calls = itertools.count()

    @staticmethod
    def supports(op, *args, **kw):
        return ssm_ref.Support(True, "CPU")

    def mamba3_scan(self, *args, rotation="interleaved", update_cache=False):
        a, kw = dict(zip(OP.input_names, args, strict=True)), dict(rotation=rotation, update_cache=update_cache)
        if self.args:
            a, kw = self.args(a, kw)
        r = ssm_ref.mamba3_scan(**a, **kw)
        out = {k: getattr(r, k) for k in OP.output_names}
        return self.fwd(self, a, out) if self.fwd else out

    def mamba3_scan_back(self, *args, rotation="interleaved"):
        a, kw = dict(zip(OP.input_names + OP.cotangent_names, args, strict=True)), dict(rotation=rotation)
        if self.args:
            a, kw = self.args(a, kw)
        g = ssm_ref.mamba3_scan_back(**a, **kw).as_dict()
        return self.back(a, g) if self.back else g


def _zero(name):
    def args(a, kw):
        return ({**a, name: None if a[name] is None else np.zeros_like(a[name])}, kw)
    return args


def _rank_weighted_psi(a, kw):
    """Rank r's value weighted by 1 + r/100: the result depends on where a rank sits."""
    if a["B"].ndim == 5:
        H, M, P = a["B_bias"].shape[0], a["B"].shape[2], a["x"].shape[3]
        psi = np.ones((H, M, P), np.float32) if a["psi"] is None else a["psi"]
        a = {**a, "psi": (psi * (1 + 0.01 * np.arange(M, dtype=np.float32))[None, :, None]).astype(np.float32)}
    return a, kw


class SkipsTheta(Mutant):
    """update_cache=True writes h, k, v but puts the angle cache's rows back as they were."""

    def mamba3_scan(self, *args, rotation="interleaved", update_cache=False):
        s_theta = args[OP.input_names.index("s_theta")]
        keep = None if s_theta is None else s_theta.copy()
        out = super().mamba3_scan(*args, rotation=rotation, update_cache=update_cache)
        if update_cache and keep is not None:
            s_theta[...] = keep
        return out


def _writes_x(self, a, out):
    a["x"][...] = 0
    return out


def _noise(self, a, out):
    return {**out, "y": out["y"] + np.float32(1e-6) * next(self.calls)}


def _by_position(self, a, out):
    S = out["y"].shape[0]
    step = np.arange(S, dtype=np.float32).reshape(S, *[1] * (out["y"].ndim - 1))
    return {**out, "y": out["y"] + np.float32(1e-3) * step}


SENSITIVITY = [
    # (property, the defect, the port, the case)
    ("oracle_forward", "y 0.1% off", Mutant(fwd=lambda m, a, o: {**o, "y": o["y"] * np.float32(1.001)}), dict()),
    ("oracle_backward", "d_lam one token late", Mutant(back=lambda a, g: {**g, "d_lam": np.roll(g["d_lam"], 1, 1)}),
     dict()),
    ("split_tokens", "ignores the start key s_k", Mutant(args=_zero("s_k")), dict()),
    ("split_tokens", "no gradient for the start value s_v",
     Mutant(back=lambda a, g: {**g, "d_s_v": np.zeros_like(g["d_s_v"])}), dict()),
    ("decode_steps", "ignores the start angles s_theta", Mutant(args=_zero("s_theta")), dict(F=2)),
    ("permute_sequences", "y depends on the sequence's position", Mutant(fwd=_by_position), dict()),
    ("deterministic", "a different y on each call", Mutant(fwd=_noise), dict()),
    ("mimo_rank1_is_siso", "MIMO drops the key bias",
     Mutant(args=lambda a, kw: ({**a, "B_bias": np.zeros_like(a["B_bias"])} if a["B"].ndim == 5 else a, kw)),
     dict()),
    ("rank_permutation", "a rank's weight depends on its index", Mutant(args=_rank_weighted_psi), dict(M=3)),
    ("rotation_conventions", "ignores the rotation keyword",
     Mutant(args=lambda a, kw: (a, {**kw, "rotation": "interleaved"})), dict(F=2, rotation="halved")),
    ("lam_one_is_mamba2", "beta and gamma swap their lam weights",
     Mutant(args=lambda a, kw: ({**a, "lam": (1 - a["lam"]).astype(np.float32)}, kw)), dict()),
    ("lam_one_is_mamba2", "d_dA 1% off", Mutant(back=lambda a, g: {**g, "d_dA": g["d_dA"] * np.float32(1.01)}),
     dict(M=2)),
    ("decode_in_place", "update_cache leaves the angle rows", SkipsTheta(), dict(F=2)),
    ("no_writes", "writes into x", Mutant(fwd=_writes_x), dict()),
]


def test_every_own_property_has_a_sensitivity_case():
    assert set(OWN) | {"oracle_forward", "oracle_backward", "split_tokens", "decode_steps", "permute_sequences",
                       "deterministic"} == {p for p, *_ in SENSITIVITY} == set(PROPERTIES)


@pytest.mark.parametrize("prop, defect, port, kw", SENSITIVITY, ids=[f"{p}-{d}" for p, d, *_ in SENSITIVITY])
def test_each_property_rejects_a_wrong_port(prop, defect, port, kw):
    case = mc.make_case(21, **{**dict(S=2, T=5, H=2, P=2, N=4, G=1, F=1, R=3, ids="permutation"), **kw})
    assert PROPERTIES[prop].check(ssm_ref, case, TOL)            # the reference passes the same case
    with pytest.raises(PropertyFailed, match=f"^{prop} fails"):
        PROPERTIES[prop].check(port, case, TOL)


# -- golden vectors and verify ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def golden_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("golden_m3")
    write_vectors(d, op=OP)
    return d


def test_the_manifest_names_the_op_its_keywords_and_the_declared_arrays(golden_dir):
    m = json.loads((golden_dir / "manifest.json").read_text())
    assert m["ops"] == ["mamba3_scan"] and [c["name"] for c in m["cases"]] == list(mc.GOLDEN)
    for c in m["cases"]:
        assert c["op"] == "mamba3_scan" and c["keywords"]["rotation"] in ("interleaved", "halved")
        names = [e["name"] for e in c["arrays"] if e["role"] == "input"]
        declared = [n for n in (*OP.input_names, *OP.cotangent_names) if n in names]
        assert names == declared and {"x", "dt", "dA", "lam", "g_y", "g_h"} <= set(names)
        for e in c["arrays"]:
            assert e["ne"] == e["shape"][::-1] and e["offset"] % 8 == 0
        assert set(c["tolerance"]) == set(OP.output_names) | set(OP.grad_names)


def test_read_vectors_round_trips(golden_dir):
    for a, b in zip(golden_cases(op=OP), read_vectors(golden_dir), strict=True):
        assert (a.name, a.op, a.keywords, a.dims) == (b.name, b.op, b.keywords, b.dims)
        for part in ("inputs", "expected"):
            x, y = getattr(a, part), getattr(b, part)
            assert x.keys() == y.keys()
            for k in x:
                assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k], equal_nan=True), (a.name, k)


def test_the_edge_cases_hold_what_the_recurrence_says(golden_dir):
    g = {c.name: c for c in read_vectors(golden_dir)}
    # T = 0: no tokens; the outputs are the start states read at ids, their gradients the cotangents
    z = g["no_tokens"]
    ids = z.inputs["ids"]
    assert z.expected["y"].size == 0 and z.inputs["ids"].dtype == np.int32
    for state, out in OP.state:
        np.testing.assert_array_equal(z.expected[out], z.inputs[state][ids])
        want = np.zeros_like(z.inputs[state], dtype=np.float64)
        np.add.at(want, ids, z.inputs["g_" + out])
        np.testing.assert_array_equal(z.expected["d_" + state], want)
    # psi None: no psi, no d_psi; no start states: no states, no ids, per-sequence start gradients
    assert "psi" not in g["mimo_psi_none"].inputs and "d_psi" not in g["mimo_psi_none"].expected
    n = g["no_states"]
    assert not {"s_theta", "s_h", "s_k", "s_v", "ids"} & set(n.inputs)
    assert n.expected["d_s_h"].shape == (n.dims["S"], *n.expected["h"].shape[1:])
    # one token from cached states: theta = (s_theta[ids] + dtheta) mod 2 pi, v = psi * x
    d = g["decode_step"]
    want = np.mod(d.inputs["s_theta"][d.inputs["ids"]].astype(np.float64) + d.inputs["dtheta"][:, 0], 2 * np.pi)
    np.testing.assert_allclose(d.expected["theta"], want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(d.expected["v"], d.inputs["psi"][None] * d.inputs["x"][:, 0][:, :, None].astype(
        np.float64), rtol=1e-12)


def test_a_port_verifies_against_the_files_and_a_wrong_one_fails(golden_dir):
    r = verify(ssm_ref, vectors=golden_dir)
    assert r.ok, str(r)
    assert {row.case for row in r.rows} == set(mc.GOLDEN) and "d_psi" not in {
        row.output for row in r.rows if row.case == "mimo_psi_none"}
    bad = verify(Mutant(back=lambda a, g: {**g, "d_lam": np.roll(g["d_lam"], 1, 1)}), vectors=golden_dir,
                 cases=["siso_tiny", "mimo_halved"])
    failed = {(row.case, row.output) for row in bad.failures()}
    assert not bad.ok and failed == {("siso_tiny", "d_lam"), ("mimo_halved", "d_lam")}
    # callables, and the case computed now (no folder): the forward alone
    r = verify(ssm_ref.mamba3_scan, op="mamba3_scan", cases="decode_step")
    assert r.ok and {row.output for row in r.rows} == set(OP.output_names)
    # a folder of another op's vectors: a clear error row, no exception
    r = verify(ssm_ref, vectors=golden_dir, op="ssm_scan")
    assert not r.ok and "holds no case of ssm_scan" in r.rows[0].error


def test_an_op_without_a_golden_table_writes_its_fixed_cases(tmp_path):
    import sys

    from children import REPO

    sys.path.insert(0, str(REPO / "tests" / "kit"))
    import toy_op

    table = golden_table(toy_op.OP)
    assert list(table) == [f"decayed_cumsum_{k}" for k in range(len(toy_op.cases()))]
    write_vectors(tmp_path, op=toy_op.OP)
    assert verify(toy_op, vectors=tmp_path).ok


def test_op_state_must_name_pairs_of_the_ops_inputs_and_outputs():
    import dataclasses

    for bad in (("s_h", "h"), (("s_h", "nope"),), ()):
        with pytest.raises(ValueError, match="state must be a non-empty tuple of"):
            ops.register(dataclasses.replace(OP, name="m3_bad_state", state=bad))
