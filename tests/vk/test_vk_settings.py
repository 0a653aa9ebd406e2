"""ssm_vk's settings and the device's limits: an illegal knob or environment value is a ValueError
naming the variable before any work; at the Vulkan spec's minimum limits every call runs
correctly on the device or falls back -- supports() says which, and the call never raises."""

from __future__ import annotations

import numpy as np
import pytest
from faultcase import fresh_context
from problems import make_problem
from registry import assert_close, oracle_back, oracle_scan

import ssm_vk
from ssm_vk import config
from ssm_vk import runtime as rt
from ssm_vk.runtime import hostcopy
from ssm_vk.sizing import SPEC_MINIMUMS

CASE = make_problem(np.random.default_rng(700), S=2, T=5, H=4, P=3, N=6, G=2, ids="duplicates")


@pytest.mark.parametrize(("tune", "match"), [
    ("LN=3", "LN=3: LN .* must be a power of two from 1 to 256"),
    ("LN=0", "LN=0"),
    ("WG=100000", "WG=100000"),
    ("WG=96", "WG=96"),
    ("GWG=100", "GWG=100"),
    ("K=0", "K=0"),
    ("TB=-1", "TB=-1"),
    ("CHUNK=8", "CHUNK=8"),
    ("ROW_SUM=7", "ROW_SUM=7"),
    ("KEEP_STATES=2", "KEEP_STATES=2"),
    ("FOO=1", "unknown knob 'FOO'"),
    ("LN", "'LN' is not NAME=value"),
    ("LN=abc", "LN='abc' is not an integer"),
    ("LN=4,LN=8", "LN given twice"),
])
def test_an_illegal_knob_is_refused_before_any_work(monkeypatch, tune, match):
    ctx = rt.get_context()
    submits = ctx.stats.submits
    monkeypatch.setenv("SSM_VK_TUNE", tune)
    for call in (lambda: ssm_vk.supports("ssm_scan", **CASE.args()),
                 lambda: ssm_vk.ssm_scan(**CASE.args()),
                 lambda: ssm_vk.ssm_scan_back(**CASE.args(), g_y=CASE.g_y, g_states=CASE.g_states)):
        with pytest.raises(ValueError, match=rf"^SSM_VK_TUNE: {match}"):
            call()
    assert ctx.stats.submits == submits           # nothing ran


@pytest.mark.parametrize("tune", [{"LN": 3}, {"WG": 100000}, {"GWG": 100}, {"CHUNK": 8}, {"FOO": 1}, {"K": True},
                                  {"K": 2.0}])
def test_configure_refuses_what_the_environment_refuses(tune, monkeypatch):
    monkeypatch.delenv("SSM_VK_TUNE", raising=False)
    with pytest.raises(ValueError, match=r"^configure\(tune=...\): "):
        config.configure(tune=tune)
    assert config.settings().tune == ()   # and nothing was set


@pytest.mark.parametrize("value", ["abc", "-1", "0", "nan", "inf", ""])
def test_the_timeout_is_a_positive_number_of_seconds(monkeypatch, value):
    monkeypatch.setenv("SSM_VK_TIMEOUT_S", value)
    if value == "":
        assert config.timeout_s() == 60.0
        assert config.timeout_s(cpu=True) == 600.0
        return
    with pytest.raises(ValueError, match=r"^SSM_VK_TIMEOUT_S: expected a number of seconds > 0"):
        config.timeout_s()
    # read before any Vulkan object is made (here before "a context is already open")
    with pytest.raises(ValueError, match="SSM_VK_TIMEOUT_S"):
        rt.Context()


def test_the_wait_limit_follows_the_device_type_unless_set(monkeypatch):
    """Unset, a context on a CPU implementation (which compiles each kernel inside its first
    dispatch's wait) waits TIMEOUT_S_CPU, on a GPU TIMEOUT_S_GPU; a set value holds on either."""
    monkeypatch.delenv("SSM_VK_TIMEOUT_S", raising=False)
    ctx = fresh_context()
    cpu = ctx.info.type == "cpu"
    assert ctx.timeout_s == (config.TIMEOUT_S_CPU if cpu else config.TIMEOUT_S_GPU)
    monkeypatch.setenv("SSM_VK_TIMEOUT_S", "7.5")
    assert fresh_context().timeout_s == 7.5
    monkeypatch.delenv("SSM_VK_TIMEOUT_S")
    fresh_context()


BOUNDED = [  # (variable, illegal value, what its message expects, the call that reads it)
    *(("SSM_VK_SPIN_US", v, "expected microseconds from 0 to 1000000", rt.Context)
      for v in ("abc", "-1", "nan", "inf", "2e6")),
    *(("SSM_VK_COPY_THREADS", v, "expected a number of threads from 1 to 256", hostcopy.threads)
      for v in ("0", "-2", "many", "257", "1.5")),
]


@pytest.mark.parametrize(("name", "value", "expected", "reader"), BOUNDED)
def test_the_numeric_settings_are_bounded(monkeypatch, name, value, expected, reader):
    # the fence poll's microseconds, the host copies' threads
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=rf"^{name}: {expected}"):
        config.check_environment()
    with pytest.raises(ValueError, match=name):
        reader()


def test_the_fence_poll_defaults_by_device_type(monkeypatch):
    monkeypatch.delenv("SSM_VK_SPIN_US", raising=False)
    ctx = rt.get_context()   # (made now, or by an earlier test, with the setting unset: the context reads it once)
    assert config.spin_us(200) == 200.0 and config.spin_us(0) == 0.0
    monkeypatch.setenv("SSM_VK_SPIN_US", "35")
    assert config.spin_us(200) == 35.0
    assert ctx.spin_s == (0.0 if ctx.info.type == "cpu" else 200e-6)


@pytest.mark.parametrize(("name", "value"), [("SSM_VK_NO_SUBGROUP", "yes please"), ("SSM_VK_VALIDATION", "2"),
                                             ("SSM_VK_PROFILE", "on")])
def test_flags_take_their_documented_values_only(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"^{name}: expected"):
        config.check_environment()


def test_configure_overrides_the_environment_and_restores_it(monkeypatch):
    monkeypatch.setenv("SSM_VK_TUNE", "K=4")
    assert config.settings().knob("K") == 4
    with config.configure(tune={"K": 16, "TB": 2}):
        s = config.settings()
        assert s.knob("K") == 16 and s.knob("TB") == 2
        with config.configure(no_subgroup=True):
            assert config.settings().no_subgroup
        assert not config.settings().no_subgroup
    assert config.settings().tune == (("K", 4),)


def _run_both(args):
    r = ssm_vk.ssm_scan(**args)
    g = ssm_vk.ssm_scan_back(**args, g_y=CASE.g_y, g_states=CASE.g_states)
    return r, g


@pytest.mark.vulkan
@pytest.mark.parametrize("limit", sorted(SPEC_MINIMUMS))
@pytest.mark.parametrize("shape", ["sequential", "chunked", "mamba1"])
def test_at_the_spec_minimum_of_each_limit_a_call_runs_right_or_falls_back(limit, shape, knobs):
    if shape == "chunked":
        knobs(CHUNK=16, CHUNK_MIN_T=1)
    case = make_problem(np.random.default_rng(710), S=2, T=40 if shape == "chunked" else 6, H=4, P=8, N=16,
                        G=2, ids="duplicates", variant="mamba1" if shape == "mamba1" else "mamba2")
    ctx = fresh_context()                       # no kernel built under the device's own limits
    real = getattr(ctx.hardware_info, limit)
    value = SPEC_MINIMUMS[limit]
    value = tuple(min(v, r) for v, r in zip(value, real, strict=True)) if isinstance(value, tuple) else min(value, real)
    if limit == "max_memory_allocation_count":
        value = min(real, ctx.live_allocations.count + 6)   # fewer than a call needs, whatever the device
    with ctx.seams.override_limits(**{limit: value}):
        a = case.args()
        sups = [ssm_vk.supports(op, **a) for op in ("ssm_scan", "ssm_scan_back")]
        r = ssm_vk.ssm_scan(**a)
        g = ssm_vk.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states)
    for sup, res in zip(sups, (r, g), strict=True):
        assert bool(sup) == res.where.startswith("Vulkan"), (limit, sup, res.where)
    o, og = oracle_scan(**case.args()), oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    from registry import BACKENDS
    vk = next(b for b in BACKENDS if b.name == "ssm_vk")
    for k in ("y", "states"):
        assert_close(vk, k, getattr(r, k), getattr(o, k), label=f"{limit} {shape}")
    for k, v in og.as_dict().items():
        assert_close(vk, k, getattr(g, k), v, label=f"{limit} {shape}")
    if limit == "max_storage_buffers_per_stage":
        assert not sups[0] and "storage buffers" in sups[0].reason   # the forward binds 8, the minimum is 4
