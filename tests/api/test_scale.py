"""Scale: the largest problem each backend accepts, the rule that decides it, and that no index
overflows on the way there (docs/RELIABILITY.md, "Limits").

- Host memory (every backend, ssm_ref.memory): the converted input copies, the outputs and the
  backend's workspace (ssm_ref's backward: T+1 states) must fit the host memory limit, else
  ValueError before anything is allocated.
- ssm_vk: windows within maxStorageBufferRange (plan.py), every buffer within
  maxMemoryAllocationSize and all of them within the device-local heap (ssm_vk/budget.py), else the
  CPU fallback with the reason. Indices in the shaders are uint32 relative to a window's binding:
  tested below over a grid of huge shapes with H200 and lavapipe limits.
- CPU backends: numpy and numba index with intp (int64); an array of more than 2^31 elements is
  run for real (zero pages, so it costs no memory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from children import child_env
from numpy.lib.stride_tricks import as_strided
from problems import make_problem
from registry import BACKENDS

import ssm_ref
import ssm_ref.checks
from ssm_ref import memory
from ssm_ref.scan import backward_workspace, forward_workspace


def _need(case, backward: bool) -> int:
    """The host memory rule's count for a case given as plain float32 arrays (no copies)."""
    d = ssm_ref.check_forward(**case.args()).dims
    work = np.dtype(np.float32)
    outputs = ssm_ref.checks.output_elems(d, backward) * 4
    ws = (backward_workspace if backward else forward_workspace)(d, work)
    return d.S * 8 + outputs + ws


# -- the host memory rule -----------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@pytest.mark.parametrize("op", ["ssm_scan", "ssm_scan_back"])
def test_beyond_the_host_memory_limit_nothing_is_allocated(backend, op, monkeypatch):
    # A problem of ~50 MB (inputs as zero-stride views: they would be copied) against a 4 MB limit:
    # ValueError, and the call allocates nothing on the way (numpy's allocations are traced).
    S, T, H, P, N, G = 2, 1000, 4, 64, 48, 1

    def view(*shape):
        return as_strided(np.full(1, 0.25, np.float32), shape=shape, strides=(0,) * len(shape))

    a = dict(s=view(S, H, P, N), x=view(S, T, H, P), dt=view(S, T, H), A=-np.ones(H, np.float32),
             B=view(S, T, G, N), C=view(S, T, G, N))
    monkeypatch.setenv(memory.HOST_MEMORY_ENV, str(4 << 20))
    m = backend.module
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"^\w+: the problem .* needs \d+ bytes of host memory .*"
                                             r"more than the 4194304 bytes this process may use"):
            if op == "ssm_scan":
                m.ssm_scan(**a)
            else:
                m.ssm_scan_back(**a, ids=None, g_y=view(S, T, H, P), g_states=view(S, H, P, N))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes were allocated before the refusal"


def test_the_rule_is_exact_at_the_limit(monkeypatch):
    case = make_problem(np.random.default_rng(90), S=2, T=6, H=2, P=3, N=5, G=1, ids="identity")
    for backward in (False, True):
        need = _need(case, backward)
        run = (lambda: ssm_ref.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)) if backward \
            else (lambda: ssm_ref.ssm_scan(**case.args()))
        monkeypatch.setenv(memory.HOST_MEMORY_ENV, str(need))
        run()                                                    # exactly the need: runs
        monkeypatch.setenv(memory.HOST_MEMORY_ENV, str(need - 1))
        with pytest.raises(ValueError, match=f"needs {need} bytes of host memory"):
            run()


def test_the_reference_backward_needs_T_plus_1_states(monkeypatch):
    # Between the forward's need and the backward's (its T+1 recomputed states): the forward runs,
    # the backward is refused, and supports() says so instead of raising.
    case = make_problem(np.random.default_rng(91), S=2, T=200, H=2, P=4, N=16, G=1, ids="identity")
    fwd, bwd = _need(case, False), _need(case, True)
    assert bwd > 2 * fwd
    monkeypatch.setenv(memory.HOST_MEMORY_ENV, str((fwd + bwd) // 2))
    assert ssm_ref.ssm_scan(**case.args()).y.shape == (2, 200, 2, 4)
    assert ssm_ref.supports("ssm_scan", **case.args())
    sup = ssm_ref.supports("ssm_scan_back", **case.args())
    assert not sup and "T+1 states" in sup.reason
    with pytest.raises(ValueError, match=r"workspace \d+"):
        ssm_ref.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)


@pytest.mark.parametrize("value,match", [("lots", "expected a number of bytes"), ("0", "expected a positive"),
                                         ("-5", "expected a positive")])
def test_a_bad_host_memory_setting_is_a_clear_error(monkeypatch, value, match):
    monkeypatch.setenv(memory.HOST_MEMORY_ENV, value)
    case = make_problem(np.random.default_rng(92), S=1, T=1, H=1, P=1, N=1, G=1)
    with pytest.raises(ValueError, match=f"^{memory.HOST_MEMORY_ENV}: {match}"):
        ssm_ref.ssm_scan(**case.args())


def test_the_machine_limit_is_the_physical_memory_or_less(monkeypatch):
    monkeypatch.delenv(memory.HOST_MEMORY_ENV, raising=False)
    have, source = memory.host_memory_bytes()
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < have <= physical and source


# -- more than 2^31 elements in one array, for real -------------------------------------------------

BIG_CHILD = r"""
import json, sys
import numpy as np
import {module} as m
N, T = 1024, 2**21 + 1                      # B and C: (1, T, 1, N), 2^31 + 1024 elements each
B = np.zeros((1, T, 1, N), np.float32)      # calloc'd: untouched pages are the zero page, no memory
C = np.zeros((1, T, 1, N), np.float32)
B[0, -1, 0, :] = 1.0                        # the last token lives at flat index 2^31 and beyond
C[0, -1, 0, :] = np.arange(N, dtype=np.float32)
B.flags.writeable = C.flags.writeable = False
s = np.zeros((1, 1, 1, N), np.float32)
x = np.ones((1, T, 1, 1), np.float32)
dt = np.full((1, T, 1), 30.0, np.float32)   # softplus(30) = 30 (identity branch)
A = np.zeros(1, np.float32)                 # no decay: the state only gathers B * x * 30
sup = m.supports("ssm_scan", s, x, dt, A, B, C)
r = m.ssm_scan(s, x, dt, A, B, C)
peak = [int(l.split()[1]) << 10 for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
print(json.dumps(dict(where=r.where, backend=r.backend, ok=sup.ok, reason=sup.reason,
                      y_last=float(r.y[0, -1, 0, 0]), y_rest=float(np.abs(r.y[0, :-1]).max()),
                      states=sorted(set(r.states.ravel().tolist())), peak_rss=peak)))
"""


def _big_forward(module: str) -> dict:
    env = child_env()
    run = subprocess.run([sys.executable, "-c", BIG_CHILD.format(module=module)], capture_output=True, text=True,
                         env=env, timeout=900, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _assert_big_forward_right(out: dict):
    # Only the last token adds to the state: states = 30 everywhere, y[-1] = 30 * sum(arange(1024)),
    # exact in float32; every earlier y is 0. An index that wrapped at 2^31 reads other memory.
    assert out["y_last"] == 30.0 * 523776 and out["y_rest"] == 0.0 and out["states"] == [30.0], out
    assert out["peak_rss"] < 1 << 30, f"peak RSS {out['peak_rss']} bytes: the 16 GiB inputs were copied"
    peak = out["peak_rss"] / 2**20
    print(f"\n2^31-element forward on {out['backend']} ({out['where']}): exact, peak RSS {peak:.0f} MiB")


CPU_FAST = [b.name for b in BACKENDS if b.name == "ssm_fast"]
VK_FALLBACK = "ssm_fast" if CPU_FAST else "ssm_ref"


@pytest.mark.parametrize("module", CPU_FAST)
def test_a_forward_over_arrays_of_more_than_2_31_elements(module):
    _assert_big_forward_right(_big_forward(module))


@pytest.mark.skipif(VK_FALLBACK != "ssm_fast", reason="ssm_vk falls back to ssm_ref here: the soak run covers it")
def test_ssm_vk_runs_arrays_beyond_one_allocation_or_hands_them_to_the_cpu():
    # 8 GiB for B alone, and as much for C: beyond maxMemoryAllocationSize of any device, so held in
    # pieces (docs/API.md, "Arrays beyond one allocation"). A device whose heap holds them (an
    # H100's 80 GiB) runs the call; lavapipe's 2 GiB heap does not, and the fallback says so.
    out = _big_forward("ssm_vk")
    _assert_big_forward_right(out)
    if out["ok"]:
        assert out["where"].startswith("Vulkan") and out["backend"] == "ssm_vk"
    else:
        assert out["where"] == "CPU" and out["backend"] == VK_FALLBACK
        assert "largest device-local heap" in out["reason"] or "no Vulkan device" in out["reason"]


@pytest.mark.soak
@pytest.mark.parametrize("module", ["ssm_ref", "ssm_vk"])
def test_soak_the_reference_forward_over_more_than_2_31_elements(module):
    # ssm_ref walks the 2^21 tokens in Python (about two minutes).
    out = _big_forward(module)
    _assert_big_forward_right(out)
    assert out["where"] == "CPU"


@pytest.mark.parametrize("module", CPU_FAST)
def test_ssm_fast_counts_its_backward_scratch(module, monkeypatch):
    # ssm_fast's backward keeps per-row partials and, when a group's rows are cut into chunks, two
    # (S, chunks, T, G, N) slabs of d_B / d_C partials: more than its outputs here. The host memory
    # rule counts them, exactly.
    import ssm_fast
    case = make_problem(np.random.default_rng(93), S=1, T=200, H=4, P=8, N=16, G=1, ids="identity")
    d = ssm_ref.check_forward(**case.args()).dims
    base = d.S * 8 + ssm_ref.checks.output_elems(d, True) * 4
    ws = ssm_fast.backward_workspace(d, np.dtype(np.float32))
    assert ws > base

    def run():
        return ssm_fast.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)

    monkeypatch.setenv(memory.HOST_MEMORY_ENV, str(base + ws))
    assert run().backend == "ssm_fast"
    monkeypatch.setenv(memory.HOST_MEMORY_ENV, str(base + ws - 1))
    with pytest.raises(ValueError, match=f"workspace {ws}\\)"):
        run()
