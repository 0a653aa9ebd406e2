"""Vulkan faults of the environment: no loader, no driver, a bad device index, glslc missing with
nothing cached, a shader that fails to compile, and fork. Policy (docs/RELIABILITY.md, "Faults"):

| fault                                             | ssm_vk                                        |
|---------------------------------------------------|-----------------------------------------------|
| no Vulkan loader / binding, no driver, no device  | falls back (supports() says why)              |
| SSM_VK_DEVICE names no device                     | raises ValueError (a configuration mistake)   |
| glslc missing and no SPIR-V packaged or cached    | falls back                                    |
| a shader that fails to compile (another glslc)    | falls back; supports() gives glslc's error    |
| the process forks                                 | the child abandons the inherited context and  |
|                                                   | makes its own; the parent is untouched        |

Provoked in subprocesses or through monkeypatched paths, so this file runs unchanged on lavapipe
and on a discrete GPU.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from children import child_env
from faultcase import CASE, FALLBACK, OPS, REPO, args, backward, fresh_context, same

import ssm_vk
from ssm_vk import engine as vk_engine
from ssm_vk import runtime as rt
from ssm_vk.arrays import pool
from ssm_vk.runtime import shaders

# -- shaders ---------------------------------------------------------------------------------------

@pytest.mark.vulkan
def test_glslc_missing_with_nothing_cached_falls_back(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))                       # no glslc
    monkeypatch.setenv("SSM_SCAN_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(shaders, "PACKAGED_SPIRV", tmp_path / "no-package")
    ctx = fresh_context()                                          # no kernel built yet
    for op in OPS:
        sup = ssm_vk.supports(op, **CASE.args())
        assert not sup and "glslc is not on PATH" in sup.reason
        with caplog.at_level("WARNING", logger="ssm_vk"):
            res, _ = OPS[op](args(False))
        assert res.where == "CPU" and res.backend == FALLBACK
    assert any("glslc is not on PATH" in r.getMessage() for r in caplog.records)
    assert ctx.live_allocations.count == 0 and pool(ctx).in_use == 0
    monkeypatch.undo()                                              # glslc back: the GPU again
    res, _ = backward(args(False))
    assert res.where.startswith("Vulkan")


@pytest.mark.vulkan
def test_a_shader_that_fails_to_compile_falls_back_with_the_error_and_keeps_nothing(monkeypatch, tmp_path, caplog):
    # supports() compiles what the call would, so a glslc that rejects a source (an older
    # shaderc, an edited shader) gives a refusal with the compiler's error, never a raise.

    broken = tmp_path / "glsl"
    shutil.copytree(shaders.PACKAGE_GLSL, broken)
    # math.glsl is included by both kernel families (token-sequential and chunked)
    with (broken / "math.glsl").open("a") as f:
        f.write("\nthis is not GLSL;\n")
    monkeypatch.setenv("SSM_SCAN_CACHE", str(tmp_path / "cache"))
    ctx = rt.get_context()
    a = args(True)
    want = backward(a)[1]
    before = pool(ctx).in_use
    # the shared glsl/ broken, every family's glsl/ as it is (they include math.glsl through the -I dirs)
    monkeypatch.setattr(shaders, "PACKAGE_GLSL_DIRS", (broken, *shaders.PACKAGE_GLSL_DIRS[1:]))
    monkeypatch.setattr(shaders, "PACKAGED_SPIRV", tmp_path / "no-package")
    vk_engine.clear(ctx)      # else the call replays the sequence recorded above (same buffers)
    vk_engine.clear()
    sup = ssm_vk.supports("ssm_scan_back", **CASE.args())
    assert not sup and "glslc failed" in sup.reason and "math.glsl" in sup.reason
    with caplog.at_level("WARNING", logger="ssm_vk"):
        res, got = backward(a)
    assert (res.where, res.backend) == ("CPU", FALLBACK)
    assert any("glslc failed" in r.getMessage() for r in caplog.records)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=1e-5, err_msg=k)
    vk_engine.clear(ctx)
    assert pool(ctx).in_use <= before and not ctx.lost
    monkeypatch.undo()
    monkeypatch.setenv("SSM_SCAN_CACHE", str(tmp_path / "cache"))
    vk_engine.clear()
    res, got = backward(a)
    assert res.where.startswith("Vulkan")
    same(got, want)


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
    import json, multiprocessing, os, signal, sys
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
            out.update(where=res.where, same=bool(np.array_equal(res.y, want)),
                       close=bool(np.allclose(res.y, want, rtol=1e-5, atol=1e-6)),
                       reason=ssm_vk.supports("ssm_scan", **case.args()).reason)
            try:
                kept.numpy()
                out["kept"] = "read"
            except RuntimeError as exc:
                out["kept"] = str(exc)
        except BaseException as exc:
            out["error"] = repr(exc)
        os.write(w, json.dumps(out).encode())
        os.close(w)
        os._exit(0)                  # as multiprocessing's fork children leave (see the test)
    os.close(w)
    child = json.loads(os.read(r, 1 << 16).decode())
    _, status = os.waitpid(pid, 0)
    ok = np.array_equal(ssm_vk.ssm_scan(**case.args()).y, want) and np.array_equal(kept.numpy(), case.inputs["x"])

    def work(k):                     # a multiprocessing pool of forked workers, the common case
        r = ssm_vk.ssm_scan(**case.args())
        exact = r.where.startswith("Vulkan") and np.array_equal(r.y, want)
        return r.where, bool(exact or np.allclose(r.y, want, rtol=1e-5, atol=1e-6))

    with multiprocessing.get_context("fork").Pool(2) as workers:
        pool_out = workers.map(work, range(4))
    print(json.dumps(dict(child=child, status=status, parent_ok=bool(ok), pool=pool_out)))
""")


@pytest.mark.vulkan
def test_a_forked_child_makes_its_own_context_and_leaves_the_parents_alone():
    # The child inherits the parent's context but not its device: calls on it hung until
    # VulkanTimeout. Now the child abandons it (no Vulkan call on the parent's handles, its locks
    # renewed) and makes its own; the parent carries on; a fork Pool's workers compute right.
    # The children leave with os._exit, as multiprocessing's do: a raw fork child that used
    # lavapipe and then calls exit() crashes in lavapipe's own exit handler, which joins the
    # parent's rendering threads (gdb: pthread_join from libvulkan_lvp.so's atexit handler).
    env = child_env(SSM_VK_TIMEOUT_S="20")
    run = subprocess.run([sys.executable, "-c", FORK.format(tests=str(REPO / "tests"))], capture_output=True,
                         text=True, env=env, timeout=300, check=False)
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["status"] == 0 and out["parent_ok"], out
    child = out["child"]
    assert "error" not in child, child
    if child["where"].startswith("Vulkan"):
        assert child["same"], child
    else:
        # NVIDIA's driver (580, H200) will not open the device in a forked child
        # (VK_ERROR_INITIALIZATION_FAILED): the child's calls fall back to the CPU and say why.
        assert child["where"] == "CPU" and child["close"], child
        assert "could not be opened in this process" in child["reason"], child
    assert "released (or its Vulkan context closed)" in child["kept"], child
    assert len(out["pool"]) == 4 and all(ok for _, ok in out["pool"]), out
    assert {w for w, _ in out["pool"]} == {child["where"]}, out   # the workers do as the child
