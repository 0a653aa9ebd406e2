"""The Mamba-3 reference forward (ssm_ref.mamba3_scan): float32 against the float64 oracle within
the declared tolerance, the cache update, the caller's arrays, T = 0, SISO as MIMO of rank 1,
the result and gradient types, the declaration, and every bad input of the design with its
exception type and the argument its message names. (The backward against finite differences:
test_mamba3_gradients.py; against mamba_ssm's reference functions: test_mamba3_vs_mamba_ssm.py.)
"""

import numpy as np
import pytest
from m3_problems import INPUTS, OUTPUTS, make

import ssm_ref
from ssm_ref import ops
from ssm_ref.tolerance import MAMBA3_F32_TOL, compare, scaled

SHAPES = {
    "siso": dict(S=2, T=5, H=4, P=3, N=8, G=2, F=3, ids="duplicates"),
    "siso-no-states": dict(S=3, T=4, H=2, P=2, N=6, G=1, F=1, states=False),
    "mimo": dict(S=2, T=6, H=2, P=3, N=8, G=1, M=3, F=4, ids="permutation"),
    "mimo-no-psi": dict(S=1, T=3, H=4, P=2, N=4, G=2, M=2, F=2, psi=False, ids="identity"),
}


def _problem(name, rotation="interleaved", seed=0):
    return make(np.random.default_rng(seed + len(name)), rotation=rotation, **SHAPES[name])


@pytest.mark.parametrize("rotation", ["interleaved", "halved"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_float32_is_within_the_declared_tolerance_of_float64(name, rotation):
    args, cot = _problem(name, rotation)
    args = {k: (v if v is None or k == "ids" else np.asarray(v, np.float32)) for k, v in args.items()}
    tol = scaled(MAMBA3_F32_TOL, SHAPES[name]["T"])
    for fn, extra in ((ssm_ref.mamba3_scan, {}), (ssm_ref.mamba3_scan_back, cot)):
        r32 = fn(**args, **extra, rotation=rotation)
        r64 = fn(**args, **extra, rotation=rotation, dtype=np.float64)
        names = OUTPUTS if fn is ssm_ref.mamba3_scan else [n for n in r64 if r64[n] is not None]
        for n in names:
            got, want = getattr(r32, n), getattr(r64, n)
            assert got.dtype == np.float32 and want.dtype == np.float64, n
            c = compare(n, got, want, tol[n])
            assert c.ok, (n, c)


def test_the_tolerance_table_bounds_every_output_and_gradient():
    op = ops.get("mamba3_scan")
    assert set(op.tol()) == set(op.output_names) | set(op.grad_names)


def test_the_declaration():
    op = ops.get("mamba3_scan")
    assert op is ops.MAMBA3
    assert op.input_names == (*INPUTS, "ids")
    assert op.output_names == OUTPUTS
    assert op.backward_name == "mamba3_scan_back"
    assert op.grad_of == {n: "d_" + n for n in INPUTS}
    assert op.state == (("s_theta", "theta"), ("s_h", "h"), ("s_k", "k"), ("s_v", "v"))
    assert set(op.letters) >= set("STHPNGMFR")
    args, cot = _problem("mimo")
    assert op.forward(**args, dtype=np.float64).y.shape == (2, 6, 3, 2, 3)
    assert list(op.backward(**args, **cot, dtype=np.float64)) == list(op.grad_names)


def test_result_unpacks_as_five_and_grads_are_a_mapping():
    args, cot = _problem("siso")
    r = ssm_ref.mamba3_scan(**args)
    y, theta, h, k, v = r
    assert len(r) == 5 and r.where == "CPU" and y is r.y and v is r.v
    assert (y.shape, theta.shape, h.shape, k.shape, v.shape) == ((2, 5, 4, 3), (2, 4, 3), (2, 4, 3, 8), (2, 4, 8),
                                                                  (2, 4, 3))
    g = ssm_ref.mamba3_scan_back(**args, **cot)
    assert isinstance(g, ssm_ref.Mamba3Grads) and g.where == "CPU"
    assert list(g) == list(g.keys()) == ["d_" + n for n in INPUTS] and len(g) == 14
    assert g["d_x"] is g.d_x and dict(g)["d_B"] is g.d_B and "d_psi" in g and g.get("nope") is None
    assert g.d_psi is None   # SISO
    with pytest.raises(KeyError):
        g["d_s"]
    with pytest.raises(AttributeError):
        g.d_x = None   # frozen


def test_siso_is_mimo_of_rank_one_with_psi_ones():
    args, cot = _problem("siso")
    r = ssm_ref.mamba3_scan(**args, dtype=np.float64)
    m = dict(args, B=args["B"][:, :, None], C=args["C"][:, :, None], B_bias=args["B_bias"][:, None],
             C_bias=args["C_bias"][:, None], s_k=args["s_k"][:, :, None], s_v=args["s_v"][:, :, None])
    rm = ssm_ref.mamba3_scan(**m, dtype=np.float64)
    for n, axis in (("y", 2), ("theta", None), ("h", None), ("k", 2), ("v", 2)):
        want = getattr(r, n)
        got = getattr(rm, n) if axis is None else np.take(getattr(rm, n), 0, axis=axis)
        np.testing.assert_array_equal(got, want, err_msg=n)
    gm = ssm_ref.mamba3_scan_back(**m, g_y=cot["g_y"][:, :, None], g_theta=cot["g_theta"], g_h=cot["g_h"],
                                  g_k=cot["g_k"][:, :, None], g_v=cot["g_v"][:, :, None], dtype=np.float64)
    g = ssm_ref.mamba3_scan_back(**args, **cot, dtype=np.float64)
    np.testing.assert_array_equal(gm.d_x, g.d_x)
    np.testing.assert_array_equal(gm.d_B[:, :, 0], g.d_B)
    np.testing.assert_array_equal(gm.d_s_k[:, :, 0], g.d_s_k)


def test_f0_rotates_nothing_and_both_conventions_agree():
    args, _ = _problem("mimo")
    args = dict(args, dtheta=args["dtheta"][..., :0], s_theta=args["s_theta"][..., :0])
    a = ssm_ref.mamba3_scan(**args, rotation="interleaved", dtype=np.float64)
    b = ssm_ref.mamba3_scan(**args, rotation="halved", dtype=np.float64)
    for n in OUTPUTS:
        np.testing.assert_array_equal(getattr(a, n), getattr(b, n))
    assert a.theta.shape == (2, 2, 0)


@pytest.mark.parametrize("name", ["siso", "mimo"])
def test_update_cache_writes_exactly_the_rows_of_ids(name):
    args, _ = make(np.random.default_rng(3), **{**SHAPES[name], "ids": "permutation", "R": 5})
    want = ssm_ref.mamba3_scan(**args, dtype=np.float64)
    caches = {n: args[n].copy() for n in ("s_theta", "s_h", "s_k", "s_v")}
    before = {n: c.copy() for n, c in caches.items()}
    r = ssm_ref.mamba3_scan(**{**args, **caches}, dtype=np.float64, update_cache=True)
    assert (r.theta, r.h, r.k, r.v) == (None, None, None, None)
    np.testing.assert_array_equal(r.y, want.y)
    ids = args["ids"]
    rest = np.setdiff1d(np.arange(5), ids)
    for n, o in (("s_theta", "theta"), ("s_h", "h"), ("s_k", "k"), ("s_v", "v")):
        np.testing.assert_array_equal(caches[n][ids], getattr(want, o), err_msg=n)
        np.testing.assert_array_equal(caches[n][rest], before[n][rest], err_msg=n)
    # float32 caches get the float32 run's states; a decode step (T = 1) continues from them
    c32 = {n: np.asarray(c, np.float32) for n, c in before.items()}
    r32 = ssm_ref.mamba3_scan(**{**args, **c32}, update_cache=True)
    assert r32.y.dtype == np.float32 and c32["s_h"].dtype == np.float32


def test_a_two_part_run_equals_one_run_through_the_cache():
    args, _ = make(np.random.default_rng(4), **{**SHAPES["mimo"], "T": 6, "ids": "permutation", "R": 4})
    whole = ssm_ref.mamba3_scan(**args, dtype=np.float64)
    caches = {n: args[n].copy() for n in ("s_theta", "s_h", "s_k", "s_v")}
    ys = []
    for lo, hi in ((0, 4), (4, 5), (5, 6)):   # a prefill, then two decode steps
        part = {k: (v[:, lo:hi] if k in ("x", "dt", "dA", "lam", "B", "C", "dtheta") else v) for k, v in args.items()}
        ys.append(ssm_ref.mamba3_scan(**{**part, **caches}, dtype=np.float64, update_cache=True).y)
    np.testing.assert_allclose(np.concatenate(ys, axis=1), whole.y, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(caches["s_h"][args["ids"]], whole.h, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_callers_arrays_are_not_written(name):
    args, cot = _problem(name)
    args = {k: (v if v is None else np.asarray(v, np.float32)) if k != "ids" else v for k, v in args.items()}
    copies = {k: np.array(v, copy=True) for k, v in {**args, **cot}.items() if v is not None}
    flags = {k: v.flags.writeable for k, v in {**args, **cot}.items() if isinstance(v, np.ndarray)}
    ssm_ref.mamba3_scan(**args)
    ssm_ref.mamba3_scan_back(**args, **cot)
    ssm_ref.mamba3_scan_back(**args, **cot, dtype=np.float64)
    for k, v in {**args, **cot}.items():
        if v is not None:
            np.testing.assert_array_equal(v, copies[k], err_msg=k)
            assert v.flags.writeable == flags[k], k


@pytest.mark.parametrize("name", list(SHAPES))
def test_t0_outputs_are_the_start_state(name):
    args, _ = _problem(name)
    a0 = {k: (v[:, :0] if k in ("x", "dt", "dA", "lam", "B", "C", "dtheta") else v) for k, v in args.items()}
    r = ssm_ref.mamba3_scan(**a0, dtype=np.float64)
    assert r.y.shape == a0["x"].shape[:1] + (0,) + ((SHAPES[name]["M"],) if "M" in SHAPES[name] else ()) \
        + a0["x"].shape[2:]
    ids = args.get("ids")
    for n, o in (("s_theta", "theta"), ("s_h", "h"), ("s_k", "k"), ("s_v", "v")):
        if args.get(n) is None:
            assert np.all(getattr(r, o) == 0)
        else:
            rows = args[n][np.arange(args["x"].shape[0]) if ids is None else ids]
            np.testing.assert_array_equal(getattr(r, o), rows)


# ---- bad input: (what is changed, the exception, the argument the message names) ----

def _bad_cases():
    S, T, H, P, N, G, M, F = 2, 3, 4, 2, 6, 2, 2, 2
    yield "x 3-D", dict(x=np.zeros((S, T, H))), ValueError, "x"
    yield "x int", dict(x=np.zeros((S, T, H, P), np.int32)), TypeError, "x"
    yield "dt wrong T", dict(dt=np.zeros((S, T + 1, H))), ValueError, "dt"
    yield "dA wrong H", dict(dA=np.zeros((S, T, H + 1))), ValueError, "dA"
    yield "lam complex", dict(lam=np.zeros((S, T, H), np.complex64)), TypeError, "lam"
    yield "B 3-D", dict(B=np.zeros((S, T, N))), ValueError, "B"
    yield "B G not dividing H", dict(B=np.zeros((S, T, 3, N)), C=np.zeros((S, T, 3, N))), ValueError, "B"
    yield "C other N", dict(C=np.zeros((S, T, G, N + 2))), ValueError, "C"
    yield "C MIMO with SISO B", dict(C=np.zeros((S, T, M, G, N))), ValueError, "C"
    yield "B_bias MIMO with SISO", dict(B_bias=np.zeros((H, M, N))), ValueError, "B_bias"
    yield "C_bias wrong N", dict(C_bias=np.zeros((H, N + 1))), ValueError, "C_bias"
    yield "dtheta 3-D", dict(dtheta=np.zeros((S, T, H))), ValueError, "dtheta"
    yield "F > N/2", dict(dtheta=np.zeros((S, T, H, N // 2 + 1))), ValueError, "dtheta"
    yield "N odd with F > 0", dict(B=np.zeros((S, T, G, 5)), C=np.zeros((S, T, G, 5)), B_bias=np.zeros((H, 5)),
                                   C_bias=np.zeros((H, 5)), s_h=np.zeros((S, H, P, 5)), s_k=np.zeros((S, H, 5))), \
        ValueError, "dtheta"
    yield "psi with SISO", dict(psi=np.ones((H, 1, P))), ValueError, "psi"
    yield "some state parts", dict(s_v=None), ValueError, "s_v"
    yield "only s_theta", dict(s_h=None, s_k=None, s_v=None), ValueError, "s_h"
    yield "s_h wrong P", dict(s_h=np.zeros((S, H, P + 1, N))), ValueError, "s_h"
    yield "s_k rank axis with SISO", dict(s_k=np.zeros((S, H, M, N))), ValueError, "s_k"
    yield "s_theta wrong F", dict(s_theta=np.zeros((S, H, F + 1))), ValueError, "s_theta"
    yield "s_v int", dict(s_v=np.zeros((S, H, P), np.int64)), TypeError, "s_v"
    yield "ids out of range", dict(ids=np.array([0, 2])), ValueError, "ids"
    yield "ids float", dict(ids=np.array([0.0, 1.0])), TypeError, "ids"
    yield "ids wrong length", dict(ids=np.array([0])), ValueError, "ids"
    yield "ids without states", dict(s_theta=None, s_h=None, s_k=None, s_v=None, ids=np.array([0, 1])), \
        ValueError, "ids"
    yield "rotation unknown", dict(rotation="rope"), ValueError, "rotation"
    yield "dtype float16", dict(dtype=np.float16), TypeError, "dtype"


def _bad_mimo_cases():
    S, T, H, P, N, G, M, _F = 2, 3, 4, 2, 6, 2, 2, 2
    yield "B_bias rank mismatch", dict(B_bias=np.zeros((H, M + 1, N))), ValueError, "B_bias"
    yield "C rank mismatch", dict(C=np.zeros((S, T, M + 1, G, N))), ValueError, "C"
    yield "C SISO with MIMO B", dict(C=np.zeros((S, T, G, N))), ValueError, "C"
    yield "psi wrong rank", dict(psi=np.ones((H, M + 1, P))), ValueError, "psi"
    yield "s_k without rank axis", dict(s_k=np.zeros((S, H, N))), ValueError, "s_k"
    yield "s_v wrong rank", dict(s_v=np.zeros((S, H, M + 1, P))), ValueError, "s_v"


def _base(mimo):
    S, T, H, P, N, G, M, F = 2, 3, 4, 2, 6, 2, 2, 2
    rank = (M,) if mimo else ()
    z = np.zeros
    return dict(x=z((S, T, H, P)), dt=z((S, T, H)), dA=z((S, T, H)), lam=z((S, T, H)), B=z((S, T, *rank, G, N)),
                C=z((S, T, *rank, G, N)), B_bias=z((H, *rank, N)), C_bias=z((H, *rank, N)), dtheta=z((S, T, H, F)),
                psi=np.ones((H, M, P)) if mimo else None, s_theta=z((S, H, F)), s_h=z((S, H, P, N)),
                s_k=z((S, H, *rank, N)), s_v=z((S, H, *rank, P)), ids=np.array([1, 0]))


@pytest.mark.parametrize("case", [*_bad_cases(), *(("mimo " + c[0], *c[1:], True) for c in _bad_mimo_cases())],
                         ids=lambda c: c[0])
def test_bad_input_raises_naming_the_argument(case):
    _what, change, exc, name = case[:4]
    mimo = len(case) > 4
    kw = {**_base(mimo), **change}
    for fn in (ssm_ref.mamba3_scan, ssm_ref.mamba3_scan_back):
        with pytest.raises(exc, match=rf"^{name}\b"):
            fn(**kw)
    assert ssm_ref.mamba3_scan(**_base(mimo)).y.shape[1] == 3   # the unchanged call is valid


@pytest.mark.parametrize("change,exc,name", [
    (dict(g_y=np.zeros((2, 3, 4, 3))), ValueError, "g_y"),
    (dict(g_theta=np.zeros((2, 4, 3))), ValueError, "g_theta"),
    (dict(g_h=np.zeros((2, 4, 2, 6), np.int8)), TypeError, "g_h"),
    (dict(g_k=np.zeros((2, 4, 2, 6))), ValueError, "g_k"),
    (dict(g_v=np.zeros((2, 4, 3))), ValueError, "g_v"),
])
def test_bad_cotangents(change, exc, name):
    with pytest.raises(exc, match=rf"^{name}\b"):
        ssm_ref.mamba3_scan_back(**_base(False), **change)


@pytest.mark.parametrize("change,exc,name", [
    (dict(update_cache=1), TypeError, "update_cache"),
    (dict(s_theta=None, s_h=None, s_k=None, s_v=None, ids=None), ValueError, "s_theta"),
    (dict(s_h=[[[[0.0] * 6] * 2] * 4] * 2), TypeError, "s_h"),
    (dict(s_k=np.zeros((2, 4, 6), np.int32)), TypeError, "s_k"),
    (dict(ids=np.array([1, 1])), ValueError, "ids"),
])
def test_bad_update_cache(change, exc, name):
    kw = {**_base(False), "update_cache": True, **change}
    with pytest.raises(exc, match=rf"^{name}\b"):
        ssm_ref.mamba3_scan(**kw)


def test_read_only_cache_with_update_cache():
    kw = _base(False)
    kw["s_v"].flags.writeable = False
    with pytest.raises(ValueError, match=r"^s_v\b"):
        ssm_ref.mamba3_scan(**kw, update_cache=True)
