"""ssm_vk's defaults on device-resident calls (docs/API.md): ``s=None`` and ``g_y`` / ``g_states``
None with DeviceArray inputs, repeated (the calls that repeat take lanes and the validator's
shortcut, which must not take a None for an array), and in prepared calls (prepare_scan /
prepare_scan_back keep the zeros on the device); mamba_ssm's dt_softplus booleans in a prepared
call. Each bit for bit the call with zeros (or the form) on the device, that call against the
float64 oracle."""

from __future__ import annotations

import numpy as np
import pytest
from problems import make_problem
from registry import BACKENDS, assert_close, oracle_back, oracle_scan

import ssm_ref
import ssm_vk

pytestmark = pytest.mark.vulkan

VK = next(b for b in BACKENDS if b.name == "ssm_vk")
FLOATS = ("x", "dt", "A", "B", "C")


def _problem(variant="mamba2", seed=0):
    case = make_problem(np.random.default_rng(seed), S=2, T=6, H=4, P=3, N=8, G=2, ids="none", variant=variant)
    d = case.dims
    return case, np.zeros((d["S"], d["H"], d["P"], d["N"]), np.float32)


def _same(a, b) -> bool:
    a, b = np.asarray(a.numpy() if hasattr(a, "numpy") else a), np.asarray(b.numpy() if hasattr(b, "numpy") else b)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("variant", ["mamba2", "mamba1"])
def test_device_calls_with_defaults_repeat_bit_for_bit(variant):
    case, zeros = _problem(variant)
    dev = [ssm_vk.to_device(case.inputs[k]) for k in FLOATS]
    z = ssm_vk.to_device(zeros)
    g_y = ssm_vk.to_device(case.g_y)
    want = ssm_vk.ssm_scan(z, *dev)
    want_b = ssm_vk.ssm_scan_back(z, *dev, None, g_y, ssm_vk.to_device(np.zeros_like(case.g_states)))
    oracle = oracle_scan(s=zeros, **{k: case.inputs[k] for k in FLOATS})
    oracle_b = oracle_back(s=zeros, **{k: case.inputs[k] for k in FLOATS}, g_y=case.g_y,
                           g_states=np.zeros_like(case.g_states))
    for _ in range(3):   # the second and third calls repeat the first's signature
        r = ssm_vk.ssm_scan(None, *dev)
        assert r.where.startswith("Vulkan") and _same(r.y, want.y) and _same(r.states, want.states)
        g = ssm_vk.ssm_scan_back(None, *dev, g_y=g_y)
        for k in ssm_ref.GRAD_NAMES:
            assert _same(g[k], want_b[k]), k
    assert_close(VK, "y", r.y.numpy(), oracle.y)
    for k in ssm_ref.GRAD_NAMES:
        assert_close(VK, k, g[k].numpy(), oracle_b[k])
    # the packed g_y still takes g_states=None, and a structured one with None after it means zeros
    packed = ssm_vk.to_device(ssm_ref.pack_forward(case.g_y, np.zeros_like(case.g_states)))
    for _ in range(2):
        gp = ssm_vk.ssm_scan_back(z, *dev, None, packed, None)
        gs = ssm_vk.ssm_scan_back(z, *dev, None, g_y, None)
        for k in ssm_ref.GRAD_NAMES:
            assert _same(gp[k], want_b[k]) and _same(gs[k], want_b[k]), k
    # g_y None beside a device g_states, and neither: zeros
    g_states = ssm_vk.to_device(case.g_states)
    want_s = ssm_vk.ssm_scan_back(z, *dev, None, ssm_vk.to_device(np.zeros_like(case.g_y)), g_states)
    for _ in range(2):
        gn = ssm_vk.ssm_scan_back(z, *dev, g_states=g_states)
        zero = ssm_vk.ssm_scan_back(z, *dev)
        for k in ssm_ref.GRAD_NAMES:
            assert _same(gn[k], want_s[k]) and not np.any(zero[k].numpy()), k


def test_prepared_calls_take_the_defaults():
    case, zeros = _problem("mamba2", seed=1)
    dev = [ssm_vk.to_device(case.inputs[k]) for k in FLOATS]
    z = ssm_vk.to_device(zeros)
    g_y = ssm_vk.to_device(case.g_y)
    want = ssm_vk.ssm_scan(z, *dev, dt_softplus="log1p")
    with ssm_vk.prepare_scan(None, *dev, dt_softplus=True) as call:
        for _ in range(2):
            r = call.run()
            assert _same(r.y, want.y) and _same(r.states, want.states)
    want_b = ssm_vk.ssm_scan_back(z, *dev, None, g_y, ssm_vk.to_device(np.zeros_like(case.g_states)),
                                  dt_softplus=None)
    with ssm_vk.prepare_scan_back(None, *dev, g_y=g_y, dt_softplus=False) as call:
        g = call.run()
        for k in ssm_ref.GRAD_NAMES:
            assert _same(g[k], want_b[k]), k
    oracle_b = oracle_back(s=zeros, **{k: case.inputs[k] for k in FLOATS}, g_y=case.g_y,
                           g_states=np.zeros_like(case.g_states), dt_softplus=None)
    for k in ssm_ref.GRAD_NAMES:
        assert_close(VK, k, want_b[k].numpy(), oracle_b[k])
    with ssm_vk.prepare_scan_back(z, *dev) as call:   # neither gradient: zeros
        g = call.run()
        for k in ssm_ref.GRAD_NAMES:
            assert not np.any(g[k].numpy()), k
    with pytest.raises(ValueError, match=r"^s: update_cache=True writes the new states into s, got None"):
        ssm_vk.prepare_scan(None, *dev, update_cache=True)
    with pytest.raises(ValueError, match=r"^ids: s is None"):
        ssm_vk.prepare_scan(None, *dev, np.arange(2))
    with pytest.raises(TypeError, match=r"^prepare_scan: x must be a DeviceArray"):
        ssm_vk.prepare_scan(None, case.inputs["x"], *dev[1:])
