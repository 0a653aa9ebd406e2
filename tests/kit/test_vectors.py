"""Golden vectors (ssm_ref.testing.vectors, ``ssm-scan vectors``) and ssm_ref.testing.verify: the files can be
read without numpy as the manifest describes, hold what the spec says (checked against scalar
loops and finite differences, not against the code that wrote them), every backend verifies,
and a broken implementation gets a readable FAIL."""

import json
import struct

import numpy as np
import pytest
from oracles import fd_grad, naive_forward
from registry import BACKENDS

import ssm_ref
import ssm_ref.testing
from ssm_cli.main import main
from ssm_ref.testing.vectors import GOLDEN, golden_cases, read_vectors, write_vectors


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    d = tmp_path_factory.mktemp("golden")
    write_vectors(d)
    return d


def _read_like_c(directory, case: str, name: str):
    """What a C or R reader does: find the entry in the manifest, seek, read little-endian values."""
    manifest = json.loads((directory / "manifest.json").read_text())
    entry = next(c for c in manifest["cases"] if c["name"] == case)
    a = next(e for e in entry["arrays"] if e["name"] == name)
    code = {"float32": "f", "float64": "d", "int32": "i"}[a["dtype"]]
    with open(directory / entry["bin"], "rb") as f:
        f.seek(a["offset"])
        raw = f.read(a["nbytes"])
    return list(struct.unpack("<" + code * (a["nbytes"] // struct.calcsize(code)), raw)), a


def test_manifest_describes_every_file_and_array(written):
    m = json.loads((written / "manifest.json").read_text())
    assert m["format"] == "ssm-scan golden vectors 1" and m["byte_order"] == "little"
    assert [c["name"] for c in m["cases"]] == list(GOLDEN)
    for c in m["cases"]:
        size = (written / c["bin"]).stat().st_size
        names = [e["name"] for e in c["arrays"]]
        assert names[:10] == ["s", "x", "dt", "A", "B", "C", "ids", "g_y", "g_states", "g_packed"]
        for e in c["arrays"]:
            assert e["offset"] % 8 == 0 and e["offset"] + e["nbytes"] <= size
            assert e["ne"] == e["shape"][::-1]
            assert e["nbytes"] == int(np.prod(e["shape"])) * np.dtype(e["dtype"]).itemsize
        assert set(c["tolerance"]) >= {"y", "d_A"}


def test_bin_read_without_numpy_equals_npz_and_memory(written):
    mem = {g.name: g for g in golden_cases()}
    for case in ("shared_rows", "overflow"):
        npz = np.load(written / f"{case}.npz")
        for name in ("s", "ids", "y", "d_s", "bwd_packed"):
            values, entry = _read_like_c(written, case, name)
            want = npz[name]
            assert list(want.shape) == entry["shape"]
            assert np.array_equal(np.array(values, dtype=want.dtype).reshape(want.shape), want, equal_nan=True)
            both = {**mem[case].inputs, **mem[case].expected}
            assert np.array_equal(both[name], want, equal_nan=True)


def test_read_vectors_round_trips(written):
    for a, b in zip(golden_cases(), read_vectors(written), strict=True):
        assert a.name == b.name and a.dims == b.dims
        for k in (*a.inputs, *a.expected):
            x = a.inputs.get(k, a.expected.get(k))
            y = b.inputs.get(k, b.expected.get(k))
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y, equal_nan=True), (a.name, k)


def test_golden_forward_matches_scalar_loops_from_the_spec():
    for g in golden_cases():
        if g.regime == "overflow" or g.dims["N"] > 16:
            continue                                          # scalar loops: small, finite cases
        ins = {k: g.inputs[k] for k in ("s", "x", "dt", "A", "B", "C", "ids")}
        y, states = naive_forward(**ins)
        assert np.allclose(g.expected["y"], y, rtol=1e-12, atol=1e-14), g.name
        assert np.allclose(g.expected["states"], states, rtol=1e-12, atol=1e-14), g.name


@pytest.mark.parametrize("case", ["tiny_mamba2", "shared_rows"])
def test_golden_gradients_match_finite_differences(case):
    (g,) = golden_cases([case])
    ins = {k: g.inputs[k].astype(np.float64) if k != "ids" else g.inputs[k]
           for k in ("s", "x", "dt", "A", "B", "C", "ids")}
    for name, grad in (("s", "d_s"), ("x", "d_x"), ("dt", "d_dt"), ("A", "d_A"), ("B", "d_B"), ("C", "d_C")):
        fd = fd_grad(ins, name, g.inputs["g_y"], g.inputs["g_states"])
        want = g.expected[grad]
        assert np.linalg.norm(fd - want) <= 1e-7 * np.linalg.norm(fd) + 1e-11, (case, grad)


def test_packed_blocks_are_the_structured_outputs_in_float32():
    for g in golden_cases():
        e = g.expected
        assert e["fwd_packed"].dtype == np.float32 and e["bwd_packed"].dtype == np.float32
        slots = e["snapshots"] if g.K > 1 else e["states"]             # y, then the K state slots
        assert np.array_equal(e["fwd_packed"], ssm_ref.pack_forward(e["y"], slots), equal_nan=True)
        blocks = [e[k] for k in ("d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C")]
        assert np.array_equal(e["bwd_packed"], ssm_ref.pack_backward(*blocks), equal_nan=True)
        g_slots = g.inputs["g_snapshots"] if g.K > 1 else g.inputs["g_states"]
        assert np.array_equal(g.inputs["g_packed"], ssm_ref.pack_forward(g.inputs["g_y"], g_slots))


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_every_backend_verifies_structured_and_packed(backend, written):
    m = backend.module
    report = ssm_ref.testing.verify(m.ssm_scan, m.ssm_scan_back)
    assert report.ok, str(report)
    k1 = [n for n, (_, recipe) in GOLDEN.items() if recipe.get("K", 1) == 1]   # callables declare no K
    assert len(report.rows) == len(k1) * 9
    packed = ssm_ref.testing.verify(lambda *a: m.ssm_scan(*a).packed(), lambda *a: m.ssm_scan_back(*a).packed(),
                            vectors=written)
    assert packed.ok, str(packed)
    assert len(packed.rows) == len(k1) * 8                     # no d_s in the packed backward


def test_verify_accepts_tuples_and_mappings():
    def fwd(*a):
        r = ssm_ref.ssm_scan(*a)
        return r.y, r.states

    def back(*a):
        return ssm_ref.ssm_scan_back(*a).as_dict()

    assert ssm_ref.testing.verify(fwd, back, cases=["tiny_mamba2", "no_tokens"]).ok


def test_verify_reports_a_wrong_output_an_exception_and_a_wrong_return_type():
    def back(*a):
        g = ssm_ref.ssm_scan_back(*a).as_dict()
        g["d_dt"] = -g["d_dt"]
        return g

    report = ssm_ref.testing.verify(None, back, cases=["tiny_mamba2"])
    assert not report.ok
    assert [r.output for r in report.failures()] == ["d_dt"]
    text = str(report)
    assert "d_dt" in text and "FAIL" in text and "PASS" in text and "6 of 7 passed" in text

    def boom(*a):
        raise RuntimeError("device lost")

    report = ssm_ref.testing.verify(boom, lambda *a: 42, cases=["one_token"])
    assert [r.error.split(":")[0] for r in report.rows] == ["RuntimeError", "TypeError"]
    assert "ERROR RuntimeError: device lost" in str(report) and not report.ok
    neither = ssm_ref.testing.verify(None, None)                # a bad argument is an ERROR row, not an exception
    assert not neither.ok and "ERROR give fn_forward, fn_backward or both" in str(neither)


def test_cli_vectors_writes_the_directory(tmp_path, capsys):
    assert main(["vectors", "--out", str(tmp_path / "g"), "--case", "tiny_mamba2"]) == 0
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == ["manifest.json", "tiny_mamba2.bin",
                                                                 "tiny_mamba2.npz"]
    assert "tiny_mamba2" in capsys.readouterr().out
    assert main(["vectors", "--out", str(tmp_path / "h"), "--case", "nonesuch"]) == 2


# oracle64 (a test tool of ssm_fast, not a backend) sums d_A outside an errstate: inf + -inf in the
# overflow case warns there.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_a_float64_implementation_verifies_to_float64_accuracy():
    from ssm_fast.oracle64 import scan64, scan_back64
    from ssm_ref.tolerance import F64_TOL

    assert ssm_ref.testing.verify(scan64, scan_back64, tol=F64_TOL).ok              # float64, other order
    f32 = ssm_ref.testing.verify(ssm_ref.ssm_scan, ssm_ref.ssm_scan_back, tol=F64_TOL, cases=["tiny_mamba2"])
    assert not f32.ok and all(r.comparison.rel > 1e-9 for r in f32.failures())   # float32 is not
