"""Long runs: after a warm-up, forward + backward calls on small shapes -- host arrays, and for
ssm_vk device-resident ones -- keep host memory (RSS) and device memory (live VkDeviceMemory,
pool buffers out, runtime objects, descriptor sets, pipelines) flat; and a process that exits
without closing anything releases every Vulkan object cleanly under the validation layer.

CI runs 500 calls per mode; the soak run (``-m soak``) 10,000, printing its numbers.

The loops run in a subprocess without the validation layer: the layer keeps some state for every
command buffer ever destroyed (measured: ~14 KB each; ssm_vk records a new one whenever a call's
device-resident outputs land in other pool buffers), which is the layer's memory, not ours. The
exit test runs under the layer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from children import child_env
from registry import BACKENDS

REPO = Path(__file__).resolve().parents[2]
MODES = [(b.name, "host") for b in BACKENDS] + [("ssm_vk", "device") for b in BACKENDS if b.name == "ssm_vk"]

LOOP = textwrap.dedent(r"""
    import gc, json, sys, time
    import numpy as np
    sys.path.insert(0, {tests!r})
    from problems import make_problem
    import importlib
    m = importlib.import_module({module!r})
    device = {device!r}
    case = make_problem(np.random.default_rng(5), S=2, T=6, H=4, P=3, N=8, G=2, ids="duplicates")
    a = case.args()
    gy, gs = case.g_y, case.g_states
    if device:
        import ssm_vk
        a = {{k: (v if k == "ids" else ssm_vk.to_device(v)) for k, v in a.items()}}
        gy, gs = ssm_vk.to_device(gy), ssm_vk.to_device(gs)

    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096

    def device_state():
        if m.NAME != "ssm_vk":
            return None
        from ssm_vk import runtime as rt
        from ssm_vk.arrays import pool
        ctx = rt.current_context()
        return [ctx.live_allocations.count, ctx.live_allocations.nbytes, pool(ctx).in_use, len(ctx.owned),
                ctx.stats.descriptor_sets, ctx.stats.pipelines]

    def call():
        r = m.ssm_scan(**a)
        g = m.ssm_scan_back(**a, g_y=gy, g_states=gs)
        return r, g

    warm, n, every = {warm}, {calls}, {every}
    for _ in range(warm):  # as the measured loop below: the last results stay alive during a call
        r, g = call()
    samples = []
    t0 = time.perf_counter()
    for i in range(n + 1):
        if i % every == 0:
            gc.collect()
            samples.append(dict(call=i, rss=rss(), device=device_state()))
        if i < n:
            r, g = call()
    elapsed = time.perf_counter() - t0
    print(json.dumps(dict(samples=samples, seconds=elapsed, where=r.where, backend=r.backend)))
""")


def _loop(module: str, mode: str, calls: int, every: int, warm: int = 100) -> dict:
    code = LOOP.format(tests=str(REPO / "tests"), module=module, device=mode == "device", warm=warm, calls=calls,
                       every=every)
    env = child_env(SSM_VK_VALIDATION="0")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=3600,
                         check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _assert_flat(out: dict, rss_slack: int, label: str) -> str:
    s = out["samples"]
    growth = max(x["rss"] for x in s) - s[0]["rss"]
    assert growth <= rss_slack, f"{label}: RSS grew {growth / 2**20:.1f} MiB over {s[-1]['call']} calls"
    devices = [x["device"] for x in s]
    assert all(d == devices[0] for d in devices), f"{label}: device state moved: {devices}"
    if out["backend"] == "ssm_vk":
        assert out["where"].startswith("Vulkan")
    return (f"{label}: {s[-1]['call']} fwd+bwd calls in {out['seconds']:.1f} s, RSS {s[0]['rss'] / 2**20:.1f} -> "
            f"{s[-1]['rss'] / 2**20:.1f} MiB (max growth {growth / 2**20:.2f} MiB), device "
            f"[allocations, bytes, pool out, runtime objects, descriptor sets, pipelines] = {devices[-1]}")


@pytest.mark.parametrize("module,mode", MODES, ids=[f"{m}-{d}" for m, d in MODES])
def test_500_calls_keep_memory_flat(module, mode):
    _assert_flat(_loop(module, mode, calls=500, every=100), 4 << 20, f"{module} {mode}")


@pytest.mark.soak
@pytest.mark.parametrize("module,mode", MODES, ids=[f"{m}-{d}" for m, d in MODES])
def test_soak_10000_calls_keep_memory_flat(module, mode):
    print("\n" + _assert_flat(_loop(module, mode, calls=10_000, every=1000), 8 << 20, f"{module} {mode}"))


EXIT = textwrap.dedent(r"""
    import atexit, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    from ssm_vk import runtime as rt

    def report():  # registered before the context exists: runs after its atexit close
        ctx = holder[0]
        print("closed", ctx.closed, "allocations", ctx.live_allocations.count, flush=True)
        for msg in ctx.validation_messages:
            print("VALIDATION", msg, flush=True)

    holder = []
    atexit.register(report)
    import ssm_vk
    from problems import make_problem
    holder.append(rt.get_context())
    assert holder[0].validation == {validation}
    kept = []
    for k, n in enumerate((3, 8, 33)):
        case = make_problem(np.random.default_rng(k), S=2, T=5 + k, H=2, P=3, N=n, G=1, ids="duplicates")
        a = case.args()
        ssm_vk.ssm_scan(**a)
        ssm_vk.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states)
        d = {{key: (v if key == "ids" else ssm_vk.to_device(v)) for key, v in a.items()}}
        kept.append(ssm_vk.ssm_scan(**d))            # device results alive at exit
        kept.append(d)
    print("calls done", flush=True)
""")


@pytest.mark.vulkan
def test_exit_releases_everything_under_the_validation_layer():
    # Under the layer unless the session runs without it (SSM_VK_VALIDATION=0: a GPU host that has
    # only the driver); the allocation count is checked either way.
    validation = os.environ.get("SSM_VK_VALIDATION", "1") != "0"
    code = EXIT.format(tests=str(REPO / "tests"), validation=validation)
    env = child_env(SSM_VK_VALIDATION="1" if validation else "0")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600,
                         check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "calls done" in run.stdout and "closed True allocations 0" in run.stdout, run.stdout
    assert "VALIDATION" not in run.stdout, run.stdout
    for word in ("Validation", "VUID", "Exception ignored", "Traceback"):
        assert word not in run.stderr, run.stderr[-3000:]
