"""ssm_ref's ``dt_softplus`` keyword (docs/SPEC.md sections 3, 4 and 8): "ggml" (the default),
"log1p" (the accurate form) and None (dt is the step).

Gradients are checked against finite differences of the float64 forward of the same form, values
against math written here (Python floats), float32 against the float64 oracle, and the validator
for what it refuses.
"""

import math
import zlib

import numpy as np
import pytest
from oracles import fd_grad
from problems import INPUT_NAMES, make_problem
from registry import BACKENDS, assert_close
from test_ref_gradients import FD_CASES, assert_matches_fd
from test_softplus import probe

import ssm_ref

FORMS = ["ggml", "log1p", None]
REF = next(b for b in BACKENDS if b.name == "ssm_ref")


def via_scan(dts, form, dtype=np.float64):
    """y = d and d_dt = d'(dt) of the probe problem (tests/ref/test_softplus.py) under ``form``."""
    H = len(dts)
    inp = probe(dts, dtype)
    y = ssm_ref.ssm_scan(**inp, dtype=dtype, dt_softplus=form).y.reshape(H)
    g = ssm_ref.ssm_scan_back(**inp, ids=None, g_y=np.ones((1, 1, H, 1)), g_states=np.zeros((1, H, 1, 1)),
                              dtype=dtype, dt_softplus=form)
    return y, g.d_dt.reshape(H)


@pytest.mark.parametrize("form", ["log1p", None])
@pytest.mark.parametrize("name", ["mamba2-G2-permuted-R>S", "mamba1-G1-duplicates", "mamba1-T1-P1-N7"])
def test_every_gradient_entry_matches_finite_differences(name, form):
    case = make_problem(np.random.default_rng(zlib.crc32(name.encode())), **FD_CASES[name])
    inputs = case.args(np.float64)
    if form is None:  # dt is the step itself: positive here, as a model's would be
        inputs["dt"] = np.abs(inputs["dt"]) + 0.05
    g = ssm_ref.ssm_scan_back(**inputs, g_y=case.g_y, g_states=case.g_states, dtype=np.float64, dt_softplus=form)
    for x in INPUT_NAMES:
        fd = fd_grad(inputs, x, case.g_y, case.g_states, dt_softplus=form)
        assert_matches_fd(getattr(g, "d_" + x), fd, f"{name} {form}: d_{x}")


def test_log1p_gradients_far_below_where_ggml_s_form_is_a_staircase():
    # dt in (-30, -20): float64's log(1 + exp(dt)) has a relative rounding error of 1e-16/exp(dt)
    # (up to 1e-3 here) and no finite difference can follow it; log1p is accurate there, so its
    # gradients match finite differences as well as anywhere.
    case = make_problem(np.random.default_rng(11), S=2, T=3, H=2, P=2, N=3, G=2, R=2, ids="identity",
                        dt_range=(-30.0, -20.0))
    inputs = case.args(np.float64)
    inputs["s"] = np.zeros_like(inputs["s"])  # the loss is then of the size of exp(dt), as d_dt
    g = ssm_ref.ssm_scan_back(**inputs, g_y=case.g_y, g_states=case.g_states, dtype=np.float64,
                              dt_softplus="log1p")
    for x in ("dt", "x", "B"):
        assert_matches_fd(getattr(g, "d_" + x), fd_grad(inputs, x, case.g_y, case.g_states, dt_softplus="log1p"),
                          f"d_{x}")


def test_none_gradients_with_negative_and_large_steps():
    # d = dt whatever its sign or size (no branch at 20): the derivative is 1 everywhere.
    case = make_problem(np.random.default_rng(12), S=2, T=3, H=2, P=2, N=3, G=1, R=3, ids="permutation",
                        dt_range=(-0.8, 30.0))
    inputs = case.args(np.float64)
    inputs["A"] = inputs["A"] * 0.02
    g = ssm_ref.ssm_scan_back(**inputs, g_y=case.g_y, g_states=case.g_states, dtype=np.float64, dt_softplus=None)
    for x in INPUT_NAMES:
        assert_matches_fd(getattr(g, "d_" + x), fd_grad(inputs, x, case.g_y, case.g_states, dt_softplus=None),
                          f"d_{x}")


def test_log1p_values_in_float64_and_float32():
    zs = [-103.0, -87.0, -50.0, -20.0, -16.7, -15.0, -6.9, -1.0, 0.0, 3.0, 19.5]
    want = [math.log1p(math.exp(z)) for z in zs]
    y64, d64 = via_scan(zs, "log1p")
    assert y64 == pytest.approx(want, rel=1e-15, abs=0)
    assert d64 == pytest.approx([1 / (1 + math.exp(-z)) for z in zs], rel=1e-15, abs=0)
    y32, _ = via_scan(zs, "log1p", np.float32)
    # float32 to 3e-7 relative down to -87 (measured 2.1e-7 at worst over (-87, 20]) of the exact
    # value at the float32-rounded input; -103 is subnormal, kept only to be positive.
    want = [math.log1p(math.exp(float(np.float32(z)))) for z in zs]
    assert y32[1:] == pytest.approx(want[1:], rel=3e-7, abs=0)
    assert y32[0] > 0
    # ggml's form at the same points: 17% off at -15, exactly 0 at -16.7 and below.
    g32, _ = via_scan(zs, "ggml", np.float32)
    assert abs(g32[5] / want[5] - 1) > 0.1 and np.all(g32[:5] == 0)


def test_log1p_branch_at_20_as_pytorch_s_softplus():
    y, d = via_scan([20.0, np.nextafter(20.0, 21.0), 21.0, 1e4], "log1p")
    assert y[0] == pytest.approx(math.log1p(math.exp(20.0)), rel=1e-15) and y[0] > 20.0
    assert d[0] == pytest.approx(1 / (1 + math.exp(-20.0)), rel=1e-15) and d[0] < 1.0
    assert np.array_equal(y[1:], [np.nextafter(20.0, 21.0), 21.0, 1e4])
    assert np.array_equal(d[1:], np.ones(3))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_none_is_the_step_itself(dtype):
    dts = [-2.5, -0.25, 0.0, 1e-30, 0.5, 20.0, 37.0]
    y, d = via_scan(dts, None, dtype)
    assert np.array_equal(y, np.array(dts, dtype=dtype))
    assert np.array_equal(d, np.ones(len(dts), dtype=dtype))


@pytest.mark.parametrize("form", FORMS)
def test_a_form_equals_the_identity_on_its_steps(form):
    # The scan with a softplus form is the scan with dt_softplus=None on the steps that form gives,
    # computed here from Python's math: the form only changes d.
    case = make_problem(np.random.default_rng(13), S=2, T=4, H=4, P=2, N=3, G=2, R=3, variant="mamba1",
                        dt_range=(-8.0, 21.0))
    inputs = case.args(np.float64)

    def step(z):
        if form is None or z > 20:
            return z
        return math.log1p(math.exp(z)) if form == "log1p" else math.log(1.0 + math.exp(z))

    steps = {**inputs, "dt": np.vectorize(step)(inputs["dt"])}
    a = ssm_ref.ssm_scan(**inputs, dtype=np.float64, dt_softplus=form)
    b = ssm_ref.ssm_scan(**steps, dtype=np.float64, dt_softplus=None)
    np.testing.assert_allclose(a.y, b.y, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(a.states, b.states, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("seed", [0, 1])
def test_float32_within_the_tolerance_table_of_the_oracle(form, seed):
    case = make_problem(np.random.default_rng(100 + seed), S=2, T=6, H=4, P=3, N=5, G=2, R=3,
                        variant=("mamba1", "mamba2")[seed])
    args = case.args()
    if form is None:
        args["dt"] = np.abs(args["dt"]).astype(np.float32)
    r32 = ssm_ref.ssm_scan(**args, dt_softplus=form)
    r64 = ssm_ref.ssm_scan(**args, dtype=np.float64, dt_softplus=form)
    g32 = ssm_ref.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states, dt_softplus=form)
    g64 = ssm_ref.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states, dtype=np.float64, dt_softplus=form)
    assert r32.y.dtype == np.float32 and g32.d_dt.dtype == np.float32
    for out in ("y", "states"):
        assert_close(REF, out, getattr(r32, out), getattr(r64, out), label=str(form))
    for out in ssm_ref.GRAD_NAMES:
        assert_close(REF, out, getattr(g32, out), getattr(g64, out), label=str(form))


def test_the_default_is_ggml_s_form():
    case = make_problem(np.random.default_rng(14), dt_range=(-12.0, 22.0))
    args = case.args()
    a, b = ssm_ref.ssm_scan(**args), ssm_ref.ssm_scan(**args, dt_softplus="ggml")
    assert np.array_equal(a.y, b.y) and np.array_equal(a.states, b.states)
    c = ssm_ref.ssm_scan(**args, dt_softplus="log1p")
    assert not np.array_equal(a.y, c.y)  # dt down to -12: the forms differ by up to 1%


@pytest.mark.parametrize("bad", ["GGML", "softplus", "", "none", "True", 0, 1, 1.0, np.float32])
@pytest.mark.parametrize("op", ["ssm_scan", "ssm_scan_back"])
def test_an_unknown_form_is_a_value_error_naming_dt_softplus(op, bad):
    case = make_problem(np.random.default_rng(15))
    args = case.args()
    extra = dict(g_y=case.g_y, g_states=case.g_states) if op == "ssm_scan_back" else {}
    with pytest.raises(ValueError, match=r"^dt_softplus: expected 'ggml', 'log1p', None, "
                       r"True \(.*\) or False \(.*\), got "):
        getattr(ssm_ref, op)(**args, **extra, dt_softplus=bad)
    with pytest.raises(ValueError, match=r"^dt_softplus: "):  # checked before the arrays
        getattr(ssm_ref, op)(**{**args, "x": None}, **extra, dt_softplus=bad)


def test_the_validator_is_shared():
    assert ssm_ref.DT_SOFTPLUS == ("ggml", "log1p", None)
    for ok in ssm_ref.DT_SOFTPLUS:
        assert ssm_ref.check_dt_softplus(ok) is ok
    with pytest.raises(ValueError, match=r"^dt_softplus: "):
        ssm_ref.check_dt_softplus("log")
