"""The ``dt_softplus`` forms on every backend of the registry (docs/SPEC.md section 8): "ggml"
(the default), "log1p" (accurate far down the log branch: what mamba_ssm and PyTorch compute) and
None (dt is the step itself).

Values come from Python's math on the probe problem of tests/ref/test_softplus.py (y = the step,
d_dt = its derivative); whole scans are judged against the float64 oracle of the same form.
"""

import inspect
import math

import numpy as np
import pytest
from problems import make_problem
from registry import BACKENDS, assert_close, oracle_back, oracle_scan
from test_softplus import probe

import ssm_ref

FORMS = ["ggml", "log1p", None]
EPS = 2.0**-24
# A step far down the log branch (Mamba's dt initialisation reaches softplus(dt) = 1e-3, dt = -6.9),
# on both branches of 20, and a few where ggml's float32 form is off by far more than float32.
ZS = [-87.0, -50.0, -20.0, -16.7, -15.0, -12.0, -6.9, -1.0, -1e-3, 0.0, 1e-3, 3.0, 19.5, 20.0]


def via_scan(backend, dts, form):
    """(y, d_dt) of the probe problem: the step of each dt and its derivative, in float32."""
    H = len(dts)
    inp = probe(dts, np.float32)
    y = backend.module.ssm_scan(**inp, dt_softplus=form).y
    g = backend.module.ssm_scan_back(**inp, ids=None, g_y=np.ones((1, 1, H, 1), np.float32),
                                     g_states=np.zeros((1, H, 1, 1), np.float32), dt_softplus=form)
    host = [np.asarray(a.numpy() if hasattr(a, "numpy") else a, dtype=np.float64).reshape(H) for a in (y, g.d_dt)]
    return host[0], host[1]


def bound(z: float) -> float:
    """The relative error allowed: 12 float32 ulp at any ``z`` (measured: 4 on lavapipe and the
    CPU backends). ssm_vk computes the form with multiplies, adds and two divisions (Vulkan lets
    each division be off by 2.5 ulp), not with the device's exp, whose error Vulkan lets grow
    with |z| (lavapipe's: 4e-6 at z = -87)."""
    return 12.0 * EPS


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_every_backend_takes_the_keyword_with_the_default_ggml(backend):
    for f in (backend.module.ssm_scan, backend.module.ssm_scan_back):
        p = inspect.signature(f).parameters["dt_softplus"]
        assert p.kind is p.KEYWORD_ONLY and p.default == "ggml", f.__qualname__


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_log1p_steps_and_derivatives_are_accurate_down_the_log_branch(backend):
    zs32 = [float(np.float32(z)) for z in ZS]
    y, d = via_scan(backend, ZS, "log1p")
    for z, got, grad in zip(zs32, y, d, strict=True):
        want = math.log1p(math.exp(z))
        assert abs(got / want - 1) <= bound(z), f"{backend.name}: softplus({z}) = {got!r}, want {want!r}"
        sig = 1 / (1 + math.exp(-z))
        assert abs(grad / sig - 1) <= bound(z), f"{backend.name}: softplus'({z}) = {grad!r}, want {sig!r}"
    # ggml's form at the same points, on the same backend: 17% off at -15, 0 at -16.7 and below
    g, _ = via_scan(backend, ZS, "ggml")
    at = ZS.index(-15.0)
    assert abs(g[at] / math.log1p(math.exp(-15.0)) - 1) > 0.1 and np.all(g[:at] == 0.0)


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_log1p_is_the_identity_above_20_with_derivative_1(backend):
    dts = [float(np.nextafter(np.float32(20.0), np.float32(21.0))), 21.0, 1e4]
    y, d = via_scan(backend, dts, "log1p")
    assert np.array_equal(y, np.array(dts, dtype=np.float32)) and np.array_equal(d, np.ones(3))


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_none_takes_dt_as_the_step_with_derivative_1(backend):
    dts = [-2.5, -0.25, 0.0, 1e-30, 0.5, 20.0, 37.0]
    y, d = via_scan(backend, dts, None)
    assert np.array_equal(y, np.array(dts, dtype=np.float32)) and np.array_equal(d, np.ones(len(dts)))


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@pytest.mark.parametrize("form", FORMS, ids=str)
@pytest.mark.parametrize("variant", ["mamba2", "mamba1"])
def test_every_form_agrees_with_the_oracle_of_that_form(backend, form, variant):
    # dt over both branches and far down the log branch; for None, positive steps
    case = make_problem(np.random.default_rng(31), S=2, T=9, H=4, P=3, N=8, G=2, R=3, ids="unused",
                        variant=variant, dt_range=(-16.0, 4.0))
    args = case.args()
    if form is None:
        args["dt"] = (np.abs(args["dt"]) / 8).astype(np.float32)
    r = backend.module.ssm_scan(**args, dt_softplus=form)
    g = backend.module.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states, dt_softplus=form)
    o = oracle_scan(**args, dt_softplus=form)
    og = oracle_back(**args, g_y=case.g_y, g_states=case.g_states, dt_softplus=form)
    for k in ("y", "states"):
        assert_close(backend, k, getattr(r, k), getattr(o, k), label=str(form))
    for k in ssm_ref.GRAD_NAMES:
        assert_close(backend, k, getattr(g, k), getattr(og, k), label=str(form))
    if form != "ggml":    # and the form mattered: the default's results differ
        assert not np.array_equal(np.asarray(backend.module.ssm_scan(**args).y), np.asarray(r.y))


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@pytest.mark.parametrize("op", ["ssm_scan", "ssm_scan_back"])
def test_an_unknown_form_is_refused_by_name_before_the_arrays(backend, op):
    case = make_problem(np.random.default_rng(32))
    extra = dict(g_y=case.g_y, g_states=case.g_states) if op == "ssm_scan_back" else {}
    for bad in ("softplus", 0, 1, ["ggml"]):
        with pytest.raises(ValueError, match=r"^dt_softplus: expected 'ggml', 'log1p', None, "
                           r"True \(.*\) or False \(.*\), got "):
            getattr(backend.module, op)(**{**case.args(), "x": None}, **extra, dt_softplus=bad)
