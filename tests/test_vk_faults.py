"""Vulkan faults: each either falls back to the CPU (visible in ``where``/``backend``, logged once
per reason) or raises a clear exception; afterwards the process carries on and holds nothing it
should not (device allocations and pool buffers counted through the runtime).

The policy (docs/RELIABILITY.md, "Faults"):

| fault                                             | ssm_vk                                        |
|---------------------------------------------------|-----------------------------------------------|
| no Vulkan loader / binding, no driver, no device  | falls back (supports() says why)              |
| glslc missing and no SPIR-V packaged or cached    | falls back                                    |
| a problem beyond the device's limits or memory    | falls back                                    |
| a shader that fails to compile                    | raises ShaderBuildError (a defect: not hidden)|
| the driver runs out of memory during a call       | trims the pool, retries once; else raises     |
|                                                   | OutOfDeviceMemory                             |
| device lost during a call                         | raises DeviceLost; the next call gets a fresh |
|                                                   | context                                       |
| a wait times out                                  | raises VulkanTimeout; the context carries on  |
|                                                   | (or is dropped if the work is still running)  |

Faults are injected through the runtime's seams or provoked in a subprocess, never by exhausting a
real device, so this file runs unchanged on lavapipe and on a discrete GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from problems import make_problem
from registry import BACKENDS

import ssm_vk
from ssm_vk import arrays
from ssm_vk import runtime as rt
from ssm_vk.arrays import pool

REPO = Path(__file__).resolve().parents[1]
FALLBACK = "ssm_fast" if any(b.name == "ssm_fast" for b in BACKENDS) else "ssm_ref"
CASE = make_problem(np.random.default_rng(71), S=2, T=5, H=4, P=3, N=6, G=2, ids="duplicates")


def _forward(**kw):
    r = ssm_vk.ssm_scan(**CASE.args(), **kw)
    return r, {"y": r.y, "states": r.states}


def _backward(**kw):
    g = ssm_vk.ssm_scan_back(**CASE.args(), g_y=CASE.g_y, g_states=CASE.g_states, **kw)
    return g, g.as_dict()


OPS = {"ssm_scan": _forward, "ssm_scan_back": _backward}


def _held(ctx):
    """What a context holds: device allocations and pool buffers out."""
    return ctx.live_allocations, pool(ctx).in_use


def _same(got: dict, want: dict):
    for k, v in want.items():
        assert np.array_equal(got[k], v), k


# -- faults during a call -----------------------------------------------------------------------

@pytest.mark.vulkan
@pytest.mark.parametrize("op", OPS)
def test_device_lost_mid_call_raises_and_the_next_call_gets_a_fresh_context(op):
    run = OPS[op]
    want = run()[1]
    ctx = rt.get_context()
    kept = ssm_vk.to_device(CASE.inputs["x"])    # a user's device array on the device that is lost
    ctx.fail_next_submit(rt.DeviceLost)
    with pytest.raises(rt.DeviceLost, match="DEVICE_LOST") as info:
        run()
    # Only the user's array is out: the failed call kept nothing, even while its exception (and
    # so its frames) is still held, as a caller that logs or retries holds it.
    assert info.value.__traceback__ is not None
    assert ctx.lost and pool(ctx).in_use == 1
    del info
    res, got = run()                             # the process carries on, on a new context
    assert res.where.startswith("Vulkan") and res.backend == "ssm_vk"
    _same(got, want)
    fresh = rt.get_context()
    assert fresh is not ctx and ctx.closed and ctx.live_allocations.count == 0
    assert list(arrays._pools.values()) == [pool(fresh)]  # the lost context's pool is not kept either
    with pytest.raises(RuntimeError, match=r"released \(or its Vulkan context closed\)"):
        kept.numpy()                             # a clear error, not a read of freed memory
    with pytest.raises(RuntimeError, match=r"released \(or its Vulkan context closed\)"):
        ssm_vk.ssm_scan(**{**CASE.args(), "x": kept})
    assert pool(fresh).in_use == 0


@pytest.mark.vulkan
@pytest.mark.parametrize("op", OPS)
def test_timeout_mid_call_raises_and_the_context_carries_on(op):
    run = OPS[op]
    want = run()[1]
    ctx = rt.get_context()
    before = _held(ctx)
    ctx.fail_next_submit(rt.VulkanTimeout)
    with pytest.raises(rt.VulkanTimeout, match="timed out") as info:
        run()
    assert info.value.__traceback__ is not None   # held, with its frames: still nothing is kept
    assert not ctx.lost and _held(ctx) == before
    del info
    _same(run()[1], want)
    assert rt.get_context() is ctx and _held(ctx) == before


# -- no Vulkan at all (subprocesses) ----------------------------------------------------------------

CHILD = textwrap.dedent("""
    import json, logging, sys
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="LOG %(name)s: %(message)s")
    import numpy as np
    sys.path.insert(0, {tests!r})
    from problems import make_problem
    import ssm_vk
    case = make_problem(np.random.default_rng(72), S=2, T=4, H=2, P=2, N=3, G=1, ids="duplicates")
    a = case.args()
    out = {{"devices": len(ssm_vk.devices()), "calls": []}}
    for _ in range(2):
        sup = ssm_vk.supports("ssm_scan_back", **a)
        r = ssm_vk.ssm_scan(**a)
        g = ssm_vk.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states)
        cpu = sys.modules[g.backend]
        want = cpu.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states)
        same = all(np.array_equal(v, getattr(want, k)) for k, v in g.as_dict().items())
        same = same and np.array_equal(r.y, cpu.ssm_scan(**a).y)
        out["calls"].append(dict(ok=sup.ok, reason=sup.reason, where=[r.where, g.where],
                                 backend=[r.backend, g.backend], same=bool(same)))
    print(json.dumps(out))
""")


def _child(env_extra: dict, pythonpath_first: str | None = None) -> tuple[dict, str]:
    env = {**os.environ, **env_extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath_first, str(REPO)) if p)
    code = CHILD.format(tests=str(REPO / "tests"))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600,
                         check=False)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1]), run.stderr


def _assert_fell_back(out: dict, stderr: str, cause: str):
    assert out["devices"] == 0
    for call in out["calls"]:
        assert call["ok"] is False and cause in call["reason"], call["reason"]
        assert call["where"] == ["CPU", "CPU"] and call["backend"] == [FALLBACK, FALLBACK]
        assert call["same"], "the fallback's results differ from the CPU backend's own"
    lines = [ln for ln in stderr.splitlines() if ln.startswith("LOG ssm_vk: ssm_vk falls back")]
    assert len(lines) == 1 and cause in lines[0], stderr  # four calls, one reason: logged once


def test_no_vulkan_loader_falls_back(tmp_path):
    # A sitecustomize makes `import vulkan` raise OSError, as the binding does without libvulkan.so.1.
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent("""
        import sys
        class NoLoader:
            def find_spec(self, name, path=None, target=None):
                if name == "vulkan" or name.startswith("vulkan."):
                    raise OSError("libvulkan.so.1: cannot open shared object file: No such file or directory")
        sys.meta_path.insert(0, NoLoader())
    """))
    out, err = _child({}, pythonpath_first=str(tmp_path))
    _assert_fell_back(out, err, "libvulkan.so.1")


def test_no_vulkan_driver_falls_back():
    nowhere = "/nonexistent/ssm-scan-test/icd.json"
    out, err = _child({"VK_DRIVER_FILES": nowhere, "VK_ICD_FILENAMES": nowhere, "VK_ADD_DRIVER_FILES": ""})
    _assert_fell_back(out, err, "no usable driver")


@pytest.mark.vulkan
def test_a_bad_device_index_is_a_clear_error_in_a_fresh_process():
    # SSM_VK_DEVICE naming no device is a configuration mistake: ValueError naming the variable
    # (not a quiet fallback), and the process carries on.
    code = textwrap.dedent("""
        import numpy as np, ssm_vk
        a = dict(s=np.zeros((1, 1, 1, 1)), x=np.zeros((1, 1, 1, 1)), dt=np.zeros((1, 1, 1)), A=-np.ones(1),
                 B=np.zeros((1, 1, 1, 1)), C=np.zeros((1, 1, 1, 1)))
        for _ in range(2):
            try:
                ssm_vk.ssm_scan(**a)
            except ValueError as e:
                print("ValueError:", e)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO), "SSM_VK_DEVICE": "99"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                         check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("ValueError: SSM_VK_DEVICE=99: no such device") == 2, run.stdout
