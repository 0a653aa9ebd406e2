"""ssm_vk's ``dt_softplus`` forms where its own machinery could mix them up: the chunked Mamba-2
kernels, the forward's tables a backward takes, the repeat-call lanes, the workspaces, and the CPU
fallback. Every kernel takes the form as a specialisation constant (ssm_vk/glsl/math.glsl), so a
call of one form must never run a pipeline, a recording or a table made for another.

The values of each form are checked on every backend in tests/ref/test_dt_softplus_backends.py;
here the results of each call are compared with the float64 oracle of its form, or bit for bit
with a host call of the same form (same kernels, same order of operations).
"""

from __future__ import annotations

import numpy as np
import pytest
from problems import make_problem
from registry import F32_TOL, Backend, assert_close, oracle_back, oracle_scan

import ssm_ref
import ssm_vk
from ssm_vk import config, replay_cache
from ssm_vk import engine as vk_engine
from ssm_vk import runtime as rt
from ssm_vk import support as vk_support

pytestmark = pytest.mark.vulkan

FORMS = ["ggml", "log1p", None]
FLOATS = ("s", "x", "dt", "A", "B", "C")
VK = Backend(name="ssm_vk", module=ssm_vk, where=r"Vulkan\d+", tol=F32_TOL)


@pytest.fixture
def chunked(monkeypatch, knobs):
    """The chunked kernels on small problems (chunks of 16 tokens from T = 1)."""
    monkeypatch.delenv("SSM_VK_TUNE", raising=False)
    knobs(CHUNK=16, CHUNK_MIN_T=1)
    yield
    vk_engine.clear()


def _case(seed: int, T: int = 40):
    # dt over both branches of 20's test and far down the log branch, where the forms differ
    return make_problem(np.random.default_rng(seed), S=3, T=T, H=4, P=3, N=5, G=2, ids="permutation",
                        dt_range=(-16.0, 4.0))


def _args(case, form) -> dict:
    a = case.args()
    if form is None:   # a step: positive, as a model's would be
        a["dt"] = (np.abs(a["dt"]) / 8).astype(np.float32)
    return a


def _device(args: dict) -> dict:
    return {k: (ssm_vk.to_device(v) if k in FLOATS else v) for k, v in args.items()}


def _host(a):
    return np.asarray(a.numpy() if isinstance(a, ssm_vk.DeviceArray) else a)


def _grads(g) -> dict:
    return {k: _host(getattr(g, k)) for k in ssm_ref.GRAD_NAMES}


def _chunked_plans(case) -> bool:
    """Whether the support decisions of ``case``'s forward and backward plan the chunked kernels."""
    p = ssm_ref.check_forward(**case.args(), keep_device=True)
    return all(vk_support.decision(op, p, config.settings()).planned.first.family.name == "chunked"
               for op in ("ssm_scan", "ssm_scan_back"))


@pytest.mark.parametrize("form", FORMS, ids=str)
def test_the_chunked_kernels_compute_every_form(chunked, form):
    case = _case(91)
    assert _chunked_plans(case)
    args = _args(case, form)
    r = ssm_vk.ssm_scan(**args, dt_softplus=form)
    g = ssm_vk.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states, dt_softplus=form)
    assert r.where.startswith("Vulkan") and g.where == r.where
    o = oracle_scan(**args, dt_softplus=form)
    og = oracle_back(**args, g_y=case.g_y, g_states=case.g_states, dt_softplus=form)
    for k in ("y", "states"):
        assert_close(VK, k, getattr(r, k), getattr(o, k), label=f"chunked {form}")
    for k in ssm_ref.GRAD_NAMES:
        assert_close(VK, k, getattr(g, k), getattr(og, k), label=f"chunked {form}")
    # each form has a workspace (and pipelines) of its own: the plan carries it
    ctx = rt.get_context()
    code = {"ggml": 0, "log1p": 1, None: 2}[form]
    spaces = [w for w in vk_engine.engine_of(ctx).workspaces.values() if w.dims == ssm_ref.check_forward(**args).dims]
    assert any(w.family.name == "chunked" and w.plan.softplus == code for w in spaces)


def test_a_backward_takes_its_forward_s_tables_only_for_the_same_form(chunked):
    # The tables (chunk states, M o C.B) hold the decays, which depend on the form: a backward of
    # another form on the same device arrays must recompute them, and give the host call's
    # results of its own form bit for bit.
    case = _case(92)
    args = case.args()
    dev = _device(args)
    gy, gs = ssm_vk.to_device(case.g_y), ssm_vk.to_device(case.g_states)
    want = {f: _grads(ssm_vk.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states, dt_softplus=f))
            for f in ("ggml", "log1p")}
    for forwards, bwd, reused in (
            (["log1p"], "ggml", False), (["ggml"], "log1p", False), (["log1p"], "log1p", True),
            (["ggml"], "ggml", True),
            # a forward of the other form in between runs in its own workspace: the tables of
            # this form's forward of these arrays are still there, and still right
            (["log1p", "ggml"], "log1p", True), (["ggml", "log1p"], "ggml", True)):
        vk_engine.clear()
        engine = vk_engine.current()
        before = engine.states_reused
        for fwd in forwards:
            ssm_vk.ssm_scan(**dev, dt_softplus=fwd)
        got = _grads(ssm_vk.ssm_scan_back(**dev, g_y=gy, g_states=gs, dt_softplus=bwd))
        assert engine.states_reused == before + reused, (forwards, bwd)
        for k in ssm_ref.GRAD_NAMES:
            assert got[k].tobytes() == want[bwd][k].tobytes(), (forwards, bwd, k)


def test_repeat_calls_alternating_forms_each_get_their_own_form(monkeypatch):
    # Device-resident calls of one signature but another form: lanes and recorded sequences are
    # per form; each call equals the host call of its form bit for bit.
    monkeypatch.delenv("SSM_VK_TUNE", raising=False)
    case = _case(93, T=7)
    args = case.args()
    dev = _device(args)
    want = {f: (_host(ssm_vk.ssm_scan(**args, dt_softplus=f).y),
                _grads(ssm_vk.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states, dt_softplus=f)))
            for f in ("ggml", "log1p")}
    assert not np.array_equal(want["ggml"][0], want["log1p"][0])
    gy, gs = ssm_vk.to_device(case.g_y), ssm_vk.to_device(case.g_states)
    fwd = tuple(dev[k] for k in FLOATS)
    for f in ("ggml", "log1p", "log1p", "ggml", "log1p", "ggml"):
        y = ssm_vk.ssm_scan(**dev, dt_softplus=f).y.numpy()
        g = _grads(ssm_vk.ssm_scan_back(**dev, g_y=gy, g_states=gs, dt_softplus=f))
        assert y.tobytes() == want[f][0].tobytes(), f
        for k in ssm_ref.GRAD_NAMES:
            assert g[k].tobytes() == want[f][1][k].tobytes(), (f, k)
    code = {"ggml": 0, "log1p": 1}
    found = {f: replay_cache.find(False, fwd, config.settings(), code[f])[0] for f in code}
    assert all(v is not None for v in found.values()) and found["ggml"].ws is not found["log1p"].ws
    assert found["ggml"].ws.plan.softplus == 0 and found["log1p"].ws.plan.softplus == 1


@pytest.mark.parametrize("form", ["log1p", None], ids=str)
def test_a_fallback_computes_the_form_asked_for(form):
    # Limits that refuse the call: the CPU computes it, in the form asked for, and device-resident
    # inputs still get DeviceArrays back.
    case = _case(94, T=5)
    args = _args(case, form)
    dev = _device(args)
    want = oracle_scan(**args, dt_softplus=form)
    wantg = oracle_back(**args, g_y=case.g_y, g_states=case.g_states, dt_softplus=form)
    with rt.get_context().seams.override_limits(device_local_bytes=512):
        assert not ssm_vk.supports("ssm_scan", **args)
        for inputs in (args, dev):
            r = ssm_vk.ssm_scan(**inputs, dt_softplus=form)
            g = ssm_vk.ssm_scan_back(**inputs, g_y=case.g_y, g_states=case.g_states, dt_softplus=form)
            assert r.where == "CPU" and g.where == "CPU"
            assert isinstance(r.y, ssm_vk.DeviceArray) == (inputs is dev)
            cpu = Backend(name=r.backend, module=None, where="CPU", tol=F32_TOL)
            for k in ("y", "states"):
                assert_close(cpu, k, _host(getattr(r, k)), getattr(want, k), label=f"fallback {form}")
            for k in ssm_ref.GRAD_NAMES:
                assert_close(cpu, k, _host(getattr(g, k)), getattr(wantg, k), label=f"fallback {form}")
        # and the form mattered here too
        assert not np.array_equal(_host(ssm_vk.ssm_scan(**args).y), _host(ssm_vk.ssm_scan(**args, dt_softplus=form).y))


def test_a_repeat_call_that_runs_out_of_device_memory_retries_in_its_own_form(monkeypatch):
    # A device-resident call through its lane whose outputs need new buffers while the driver is
    # out of memory: the retry after freeing the workspaces must run the form asked for (it once
    # took the default, ggml's), equal to the host call of that form bit for bit.
    monkeypatch.delenv("SSM_VK_TUNE", raising=False)
    ctx = rt.get_context()
    case = _case(95, T=7)
    args = case.args()
    want = _host(ssm_vk.ssm_scan(**args, dt_softplus="log1p").y)
    assert not np.array_equal(want, _host(ssm_vk.ssm_scan(**args, dt_softplus="ggml").y))
    dev = _device(args)
    # Results held: every recorded set of output buffers stays busy, so the next call allocates.
    held = [ssm_vk.ssm_scan(**dev, dt_softplus="log1p") for _ in range(6)]
    fwd = tuple(dev[k] for k in FLOATS)
    assert replay_cache.find(False, fwd, config.settings(), 1)[0] is not None  # the next call takes its lane
    ctx.seams.fail_allocations(2)   # the pool's own retry meets the second: the call's retry runs
    try:
        r = ssm_vk.ssm_scan(**dev, dt_softplus="log1p")
        assert not ctx.seams.take_allocation_fault()   # both faults were met
    finally:
        ctx.seams.fail_allocations(0)
    assert r.y.numpy().tobytes() == want.tobytes()
    del held
