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
| the process forks                                 | the child abandons the inherited context and  |
|                                                   | makes its own; the parent is untouched        |

Faults are injected through the runtime's seams or provoked in a subprocess, never by exhausting a
real device, so this file runs unchanged on lavapipe and on a discrete GPU.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from children import child_env
from problems import make_problem
from registry import BACKENDS

import ssm_vk
from ssm_ref import check_backward, check_forward
from ssm_vk import arrays, budget, launch
from ssm_vk import runtime as rt
from ssm_vk.arrays import pool
from ssm_vk.plan import plan
from ssm_vk.runtime import shaders

REPO = Path(__file__).resolve().parents[1]
FALLBACK = "ssm_fast" if any(b.name == "ssm_fast" for b in BACKENDS) else "ssm_ref"
CASE = make_problem(np.random.default_rng(71), S=2, T=5, H=4, P=3, N=6, G=2, ids="duplicates")


def _args(device: bool):
    a = {**CASE.args(), "g_y": CASE.g_y, "g_states": CASE.g_states}
    if device:
        a = {k: (v if k == "ids" else ssm_vk.to_device(v)) for k, v in a.items()}
    return a


def _host(d: dict) -> dict:
    return {k: (v.numpy() if isinstance(v, ssm_vk.DeviceArray) else v) for k, v in d.items()}


def _forward(a):
    r = ssm_vk.ssm_scan(**{k: v for k, v in a.items() if k not in ("g_y", "g_states")})
    return r, _host({"y": r.y, "states": r.states})


def _backward(a):
    g = ssm_vk.ssm_scan_back(**a)
    return g, _host(g.as_dict())


OPS = {"ssm_scan": _forward, "ssm_scan_back": _backward}


def _held(ctx):
    """What a context holds: device allocations and pool buffers out (the per-shape workspaces
    keep theirs between calls, so these are compared before and after, never with zero)."""
    return ctx.live_allocations, pool(ctx).in_use


def _kept_by(exc: BaseException, mine: dict) -> list:
    """Device arrays the frames of ``exc``'s traceback still hold, alive and owning a buffer,
    other than the caller's own inputs ``mine``: what a caller holding the exception would keep."""
    skip = {id(v) for v in mine.values()}
    found, tb = {}, exc.__traceback__
    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            items = value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else [value]
            for v in items:
                if (isinstance(v, ssm_vk.DeviceArray) and id(v) not in skip and v._finalizer is not None
                        and v._finalizer.alive):
                    found[id(v)] = v
        tb = tb.tb_next
    return list(found.values())


def _same(got: dict, want: dict):
    for k, v in want.items():
        assert np.array_equal(got[k], v), k


# -- faults during a call -----------------------------------------------------------------------

@pytest.mark.vulkan
@pytest.mark.parametrize("device", [False, True], ids=["host", "device"])
@pytest.mark.parametrize("op", OPS)
def test_device_lost_mid_call_raises_and_the_next_call_gets_a_fresh_context(op, device):
    run = OPS[op]
    want = run(_args(False))[1]
    ctx = rt.get_context()
    a = _args(device)                     # a user's device arrays live on the device that is lost
    ctx.fail_next_submit(rt.DeviceLost)
    with pytest.raises(rt.DeviceLost, match="DEVICE_LOST") as info:
        run(a)
    # The failed call kept nothing, even while its exception (and so its frames) is still held,
    # as a caller that logs or retries holds it.
    assert ctx.lost and _kept_by(info.value, a) == []
    del info
    res, got = run(_args(False))          # the process carries on, on a new context
    assert res.where.startswith("Vulkan") and res.backend == "ssm_vk"
    _same(got, want)
    fresh = rt.get_context()
    assert fresh is not ctx and ctx.closed and ctx.live_allocations.count == 0
    assert list(arrays._pools.values()) == [pool(fresh)]  # the lost context's pool is not kept either
    assert all(owner is fresh for owner, _ in launch._caches.values())  # nor its workspaces
    if device:
        with pytest.raises(RuntimeError, match=r"released \(or its Vulkan context closed\)"):
            a["x"].numpy()                # a clear error, not a read of freed memory
        with pytest.raises(RuntimeError, match=r"released \(or its Vulkan context closed\)"):
            run(a)


@pytest.mark.vulkan
@pytest.mark.parametrize("device", [False, True], ids=["host", "device"])
@pytest.mark.parametrize("op", OPS)
def test_timeout_mid_call_raises_and_the_context_carries_on(op, device):
    run = OPS[op]
    a = _args(device)
    want = run(a)[1]
    ctx = rt.get_context()
    held = []
    for _ in range(6):  # repeated: what the context holds stops changing (the replay caches fill)
        ctx.fail_next_submit(rt.VulkanTimeout)
        with pytest.raises(rt.VulkanTimeout, match="timed out") as info:
            run(a)
        assert not ctx.lost and _kept_by(info.value, a) == []
        del info
        _same(run(a)[1], want)
        held.append(_held(ctx))
    assert rt.get_context() is ctx
    (alloc, out) = held[2]
    assert all(h[0].count <= alloc.count and h[0].nbytes <= alloc.nbytes and h[1] <= out for h in held[3:]), held


@pytest.mark.vulkan
def test_after_a_timeout_no_buffer_of_the_pending_work_is_written(monkeypatch):
    # A timed-out call leaves its work pending (it may still be running on a real GPU); the next
    # call of that shape must wait for it before uploading into the same buffers.
    a = _args(False)
    want = _backward(a)[1]
    ctx = rt.get_context()
    ctx.fail_next_submit(rt.VulkanTimeout)
    with pytest.raises(rt.VulkanTimeout):
        _backward(a)
    pending = [seq for _, cache in launch._caches.values() for ws in cache.values()
               for seq, _ in ws.sequences.values() if seq.pending]
    assert pending
    writes = []
    upload = rt.upload

    def watched(buf, arr, *rest):
        writes.append(any(seq.pending for seq in pending))
        upload(buf, arr, *rest)

    monkeypatch.setattr(rt, "upload", watched)
    _same(_backward(a)[1], want)
    assert writes and not any(writes), "an input was uploaded while the timed-out work was pending"


@pytest.mark.vulkan
def test_work_still_running_at_close_is_not_freed_under_the_gpu(monkeypatch):
    # Closing a sequence whose run outlives a second timeout would free memory the GPU may still
    # use: the context is given up instead, and freed after vkDeviceWaitIdle by its close.
    a = _args(False)
    want = _forward(a)[1]
    ctx = rt.get_context()
    ctx.fail_next_submit(rt.VulkanTimeout)
    with pytest.raises(rt.VulkanTimeout):
        _forward(a)
    pending = [seq for _, cache in launch._caches.values() for ws in cache.values()
               for seq, _ in ws.sequences.values() if seq.pending]
    assert len(pending) == 1

    def still_running(self, timeout_s=None):
        if self.pending:
            raise rt.VulkanTimeout("waiting for the GPU timed out (the test's hung GPU)", 2)

    monkeypatch.setattr(rt.Sequence, "wait", still_running)
    launch.clear_cache(ctx)                    # evicts the workspace: closes its sequences
    assert ctx.lost and not pending[0].closed
    monkeypatch.undo()
    _same(_forward(a)[1], want)                # a new context; the old one closed after its wait
    assert rt.get_context() is not ctx and ctx.closed and pending[0].closed
    assert ctx.live_allocations.count == 0


# -- memory ----------------------------------------------------------------------------------------

def _fresh_context():
    """A new context: empty pool, no workspaces, no kernels."""
    rt.close()
    return rt.get_context()


@pytest.mark.vulkan
@pytest.mark.parametrize("op", OPS)
def test_the_memory_estimate_covers_what_a_call_allocates(op):
    # supports() decides by budget.buffers(); it must not under-count what a call takes.
    backward = op == "ssm_scan_back"
    shapes = [dict(S=2, T=5, H=4, P=3, N=6, G=2, ids="duplicates"),
              dict(S=3, T=40, H=2, P=2, N=16, G=1, ids="permutation", variant="mamba1")]
    for k, dims in enumerate(shapes):
        case = make_problem(np.random.default_rng(80 + k), **dims)
        for small_range in (False, True):   # whole sequences, then token windows
            ctx = _fresh_context()
            with ctx.override_limits(**({"max_storage_buffer_range": 2048} if small_range else {})):
                lim = launch.limits_of(ctx.info)
                chk = check_backward if backward else check_forward
                args = {**case.args(), **({"g_y": case.g_y, "g_states": case.g_states} if backward else {})}
                p = chk(**args)
                pl = plan(p.dims, lim, backward=backward)
                assert pl.time_split == (small_range and k == 1)
                estimate = sum(budget._pooled(n, ctx.info.max_memory_allocation_size)
                               for n in budget.buffers(p.dims, pl, lim, backward).values())
                OPS[op](args if backward else case.args())
                made = sum(b.size for b in pool(ctx)._made.values())
            # At most the stand-in binding and the pair buffers of ids that did not repeat over.
            assert made <= estimate <= made + 256 * p.dims.S, (dims, small_range, made, estimate)


@pytest.mark.vulkan
@pytest.mark.parametrize("op", OPS)
def test_a_problem_larger_than_device_memory_falls_back_before_allocating(op, caplog):
    ctx = rt.get_context()
    OPS[op](_args(False))
    before = _held(ctx)
    with ctx.override_limits(device_local_bytes=4096):   # "ask for more than the device has"
        sup = ssm_vk.supports(op, **CASE.args())
        assert not sup and "largest device-local heap" in sup.reason
        with caplog.at_level("WARNING", logger="ssm_vk"):
            res, got = OPS[op](_args(False))
            OPS[op](_args(False))
    assert res.where == "CPU" and res.backend == FALLBACK
    logged = [r.getMessage() for r in caplog.records]
    assert logged.count(f"ssm_vk falls back to ssm_fast on the CPU: {sup.reason}") == 1
    assert _held(ctx) == before                         # nothing was allocated for it
    want = OPS[op](_args(False))[1]
    for k, v in got.items():                            # and the CPU result is right
        np.testing.assert_allclose(v, want[k], rtol=1e-4, atol=1e-5, err_msg=k)


@pytest.mark.vulkan
def test_a_cached_decision_never_outlives_the_limits_it_was_made_under():
    # supports() caches decisions by the identity of ctx.info, which override_limits swaps: the
    # limits of one override must not answer for the next one (whose object may reuse the freed
    # one's address).
    ctx = rt.get_context()
    for _ in range(5):
        with ctx.override_limits(device_local_bytes=4096):
            assert not ssm_vk.supports("ssm_scan", **CASE.args())
        with ctx.override_limits(device_local_bytes=ctx.hardware_info.device_local_bytes):
            assert ssm_vk.supports("ssm_scan", **CASE.args())


@pytest.mark.vulkan
def test_an_array_beyond_the_allocation_limit_falls_back():
    # Sixteen sequences share one cache row: the states (S, H, P, N) are 16x the cache s and the
    # largest array; with an allocation limit between the two, the call must fall back (it used
    # to be let through by supports() and die in the allocation with a ValueError).
    case = make_problem(np.random.default_rng(81), S=16, T=1, H=4, P=1, N=64, G=1, ids=[0] * 16, R=1)
    ctx = rt.get_context()
    row_bytes = 4 * 64 * 4
    with ctx.override_limits(max_memory_allocation_size=4 * row_bytes):
        sup = ssm_vk.supports("ssm_scan", **case.args())
        assert not sup and "maxMemoryAllocationSize" in sup.reason and "states" in sup.reason
        r = ssm_vk.ssm_scan(**case.args())
    assert r.where == "CPU"
    np.testing.assert_allclose(r.states, ssm_vk.ssm_scan(**case.args()).states, rtol=1e-5, atol=1e-6)


@pytest.mark.vulkan
def test_out_of_device_memory_once_is_absorbed():
    # The driver refuses one allocation: the pool frees its idle buffers and tries again.
    ctx = rt.get_context()
    want = _backward(_args(False))[1]
    case = make_problem(np.random.default_rng(82), S=3, T=7, H=2, P=2, N=5, G=1)   # a shape not seen yet
    ctx.fail_allocations(1)
    g = ssm_vk.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    assert g.where.startswith("Vulkan") and not ctx.take_allocation_fault()
    _same(_backward(_args(False))[1], want)


@pytest.mark.vulkan
@pytest.mark.parametrize("device", [False, True], ids=["host", "device"])
@pytest.mark.parametrize("op", OPS)
def test_out_of_device_memory_raises_keeps_nothing_and_the_next_call_works(op, device):
    ctx = rt.get_context()
    a = _args(device)
    want = OPS[op](a)[1]
    launch.clear_cache(ctx)                              # the call must allocate again
    pool(ctx).trim()
    before = _held(ctx)
    ctx.fail_allocations(10**6)                          # the device stays full
    try:
        with pytest.raises(rt.OutOfDeviceMemory, match="OUT_OF_DEVICE_MEMORY") as info:
            OPS[op](a)
        assert _kept_by(info.value, a) == []
        del info
    finally:
        ctx.fail_allocations(0)
    launch.clear_cache(ctx)
    pool(ctx).trim()
    assert _held(ctx) == before and not ctx.lost
    _same(OPS[op](a)[1], want)


# -- shaders ---------------------------------------------------------------------------------------

@pytest.mark.vulkan
def test_glslc_missing_with_nothing_cached_falls_back(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))                       # no glslc
    monkeypatch.setenv("SSM_SCAN_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(shaders, "PACKAGED_SPIRV", tmp_path / "no-package")
    ctx = _fresh_context()                                          # no kernel built yet
    for op in OPS:
        sup = ssm_vk.supports(op, **CASE.args())
        assert not sup and "glslc is not on PATH" in sup.reason
        with caplog.at_level("WARNING", logger="ssm_vk"):
            res, _ = OPS[op](_args(False))
        assert res.where == "CPU" and res.backend == FALLBACK
    assert any("glslc is not on PATH" in r.getMessage() for r in caplog.records)
    assert ctx.live_allocations.count == 0 and pool(ctx).in_use == 0
    monkeypatch.undo()                                              # glslc back: the GPU again
    res, _ = _backward(_args(False))
    assert res.where.startswith("Vulkan")


@pytest.mark.vulkan
def test_a_shader_that_fails_to_compile_raises_and_keeps_nothing(monkeypatch, tmp_path):
    broken = tmp_path / "glsl"
    shutil.copytree(REPO / "glsl", broken)
    with (broken / "ssm_scan_back.comp").open("a") as f:
        f.write("\nthis is not GLSL;\n")
    monkeypatch.setenv("SSM_SCAN_CACHE", str(tmp_path / "cache"))
    ctx = rt.get_context()
    a = _args(True)
    want = _backward(a)[1]
    before = pool(ctx).in_use
    monkeypatch.setattr(shaders, "REPO_GLSL", broken)
    with pytest.raises(shaders.ShaderBuildError, match="glslc failed") as info:
        _backward(a)
    assert "this is not GLSL" in info.value.stderr or "error" in info.value.stderr
    assert _kept_by(info.value, a) == []
    del info
    launch.clear_cache(ctx)
    assert pool(ctx).in_use <= before and not ctx.lost
    monkeypatch.setattr(shaders, "REPO_GLSL", REPO / "glsl")
    _same(_backward(a)[1], want)


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
    env = child_env(*([pythonpath_first] if pythonpath_first else []), **env_extra)
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
    env = child_env(SSM_VK_DEVICE="99")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                         check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("ValueError: SSM_VK_DEVICE=99: no such device") == 2, run.stdout


# -- fork -----------------------------------------------------------------------------------------

FORK = textwrap.dedent("""
    import json, os, signal, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    from problems import make_problem
    import ssm_vk
    from ssm_vk.runtime import context
    signal.alarm(100)                # neither process outlives a hang (the child inherits it)
    case = make_problem(np.random.default_rng(73), S=2, T=5, H=2, P=3, N=4, G=1, ids="duplicates")
    want = ssm_vk.ssm_scan(**case.args()).y
    kept = ssm_vk.to_device(case.inputs["x"])
    r, w = os.pipe()
    with context._get_lock:          # a lock held at the fork (here by the forking thread itself)
        pid = os.fork()
    if pid == 0:
        signal.alarm(60)
        os.close(r)
        out = {{}}
        try:
            res = ssm_vk.ssm_scan(**case.args())
            out.update(where=res.where, same=bool(np.array_equal(res.y, want)))
            try:
                kept.numpy()
                out["kept"] = "read"
            except RuntimeError as exc:
                out["kept"] = str(exc)
        except BaseException as exc:
            out["error"] = repr(exc)
        os.write(w, json.dumps(out).encode())
        os.close(w)
        sys.exit(0)                  # a normal exit: atexit runs in the child too
    os.close(w)
    child = json.loads(os.read(r, 1 << 16).decode())
    _, status = os.waitpid(pid, 0)
    ok = np.array_equal(ssm_vk.ssm_scan(**case.args()).y, want) and np.array_equal(kept.numpy(), case.inputs["x"])
    print(json.dumps(dict(child=child, status=status, parent_ok=bool(ok))))
""")


@pytest.mark.vulkan
def test_a_forked_child_makes_its_own_context_and_leaves_the_parents_alone():
    # The child inherits the parent's context but not its device: calls on it hung until
    # VulkanTimeout. Now the child abandons it (no Vulkan call on the parent's handles, its locks
    # renewed), makes its own, and exits cleanly; the parent carries on.
    env = child_env(SSM_VK_TIMEOUT_S="20")
    run = subprocess.run([sys.executable, "-c", FORK.format(tests=str(REPO / "tests"))], capture_output=True,
                         text=True, env=env, timeout=300, check=False)
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["status"] == 0 and out["parent_ok"], out
    child = out["child"]
    assert "error" not in child, child
    assert child["where"].startswith("Vulkan") and child["same"], child
    assert "released (or its Vulkan context closed)" in child["kept"], child
