"""Vulkan faults during a call: device lost, timeouts, device memory (too little for the problem,
or the driver out of memory). Each either falls back to the CPU (visible in ``where`` /
``backend``, logged once per reason) or raises a clear exception; afterwards the process carries
on and holds nothing it should not (device allocations and pool buffers counted through the
runtime). The faults of the environment -- no Vulkan, no glslc, a broken shader, fork -- are in
test_vk_environment.py; the whole policy is in docs/RELIABILITY.md, "Faults":

| fault                                             | ssm_vk                                        |
|---------------------------------------------------|-----------------------------------------------|
| a problem beyond the device's limits or memory    | falls back, decided before any allocation     |
| the driver runs out of memory during a call       | frees idle buffers, retries once; else raises |
|                                                   | OutOfDeviceMemory                             |
| device lost during a call                         | raises DeviceLost; the next call gets a fresh |
|                                                   | context                                       |
| a wait times out                                  | raises VulkanTimeout; the context carries on  |
|                                                   | (or is dropped if the work is still running)  |

Faults are injected through the runtime's seams, never by exhausting a real device, so this file
runs unchanged on lavapipe and on a discrete GPU.
"""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest
from faultcase import CASE, FALLBACK, OPS, args, backward, forward, fresh_context, held, kept_by, same
from problems import make_problem
from registry import F32_TOL, Backend, assert_close, oracle_back

import ssm_ref
import ssm_vk
from ssm_ref import check_backward, check_forward
from ssm_vk import budget
from ssm_vk import engine as vk_engine
from ssm_vk import runtime as rt
from ssm_vk.arrays import pool
from ssm_vk.registry import plan
from ssm_vk.sizing import Limits

VK = Backend(name="ssm_vk", module=ssm_vk, where=r"Vulkan\d+", tol=F32_TOL)


@pytest.fixture(params=["mapped", "staged"])
def transfers(request):
    """The faults during a call, twice: host transfers through mapped memory (lavapipe's only
    kind) and through staging copies (what a discrete GPU does; on an H200 the injected faults
    hit those copies until fail_next_submit skipped the runtime's own transfers)."""
    ctx = rt.get_context()
    ctx.seams.force_staging = request.param == "staged"
    yield request.param
    current = rt.current_context()
    for c in {ctx, current} - {None}:
        c.seams.force_staging = False


# -- faults during a call -----------------------------------------------------------------------

@pytest.mark.vulkan
@pytest.mark.parametrize("device", [False, True], ids=["host", "device"])
@pytest.mark.parametrize("op", OPS)
def test_device_lost_mid_call_raises_and_the_next_call_gets_a_fresh_context(transfers, op, device):
    run = OPS[op]
    want = run(args(False))[1]
    ctx = rt.get_context()
    a = args(device)                     # a user's device arrays live on the device that is lost
    ctx.seams.fail_next_submit(rt.DeviceLost)
    with pytest.raises(rt.DeviceLost, match="DEVICE_LOST") as info:
        run(a)
    # The failed call kept nothing, even while its exception (and so its frames) is still held,
    # as a caller that logs or retries holds it.
    assert ctx.lost and kept_by(info.value, a) == []
    del info
    res, got = run(args(False))          # the process carries on, on a new context
    assert res.where.startswith("Vulkan") and res.backend == "ssm_vk"
    same(got, want)
    fresh = rt.get_context()
    assert fresh is not ctx and ctx.closed and ctx.live_allocations.count == 0
    # the lost context keeps neither its pool nor its engine (workspaces, decisions, lanes)
    assert ctx.owned.extension("pool") is None and ctx.owned.extension("engine") is None
    if device:
        with pytest.raises(RuntimeError, match=r"released \(or its Vulkan context closed\)"):
            a["x"].numpy()                # a clear error, not a read of freed memory
        with pytest.raises(RuntimeError, match=r"released \(or its Vulkan context closed\)"):
            run(a)


@pytest.mark.vulkan
@pytest.mark.parametrize("device", [False, True], ids=["host", "device"])
@pytest.mark.parametrize("op", OPS)
def test_timeout_mid_call_raises_and_the_context_carries_on(transfers, op, device):
    run = OPS[op]
    a = args(device)
    want = run(a)[1]
    ctx = rt.get_context()
    seen = []
    for _ in range(6):  # repeated: what the context holds stops changing (the replay caches fill)
        ctx.seams.fail_next_submit(rt.VulkanTimeout)
        with pytest.raises(rt.VulkanTimeout, match="timed out") as info:
            run(a)
        assert not ctx.lost and kept_by(info.value, a) == []
        del info
        same(run(a)[1], want)
        seen.append(held(ctx))
    assert rt.get_context() is ctx
    (alloc, out) = seen[2]
    assert all(h[0].count <= alloc.count and h[0].nbytes <= alloc.nbytes and h[1] <= out for h in seen[3:]), seen


@pytest.mark.vulkan
def test_after_a_timeout_no_buffer_of_the_pending_work_is_written(transfers, monkeypatch):
    # A timed-out call leaves its work pending (it may still be running on a real GPU); the next
    # call of that shape must wait for it before uploading into the same buffers.
    a = args(False)
    want = backward(a)[1]
    ctx = rt.get_context()
    ctx.seams.fail_next_submit(rt.VulkanTimeout)
    with pytest.raises(rt.VulkanTimeout):
        backward(a)
    pending = [seq for ws in vk_engine.current().workspaces.values() for seq, _ in ws.sequences.values()
               if seq.pending]
    assert pending
    writes = []
    upload, put = rt.upload, rt.Stage.put

    def watched(buf, arr, *rest):
        writes.append(any(seq.pending for seq in pending))
        upload(buf, arr, *rest)

    def watched_put(stage, name, arr):   # the staged path's write: the slot the call's copies read
        writes.append(any(seq.pending for seq in pending))
        put(stage, name, arr)

    monkeypatch.setattr(rt, "upload", watched)
    monkeypatch.setattr(rt.Stage, "put", watched_put)
    same(backward(a)[1], want)
    assert writes and not any(writes), "an input was uploaded while the timed-out work was pending"


@pytest.mark.vulkan
def test_work_still_running_at_close_is_not_freed_under_the_gpu(transfers, monkeypatch):
    # Closing a sequence whose run outlives a second timeout would free memory the GPU may still
    # use: the context is given up instead, and freed after vkDeviceWaitIdle by its close.
    a = args(False)
    want = forward(a)[1]
    ctx = rt.get_context()
    ctx.seams.fail_next_submit(rt.VulkanTimeout)
    with pytest.raises(rt.VulkanTimeout):
        forward(a)
    pending = [seq for ws in vk_engine.current().workspaces.values() for seq, _ in ws.sequences.values()
               if seq.pending]
    assert len(pending) == 1

    def still_running(self, timeout_s=None):
        if self.pending:
            raise rt.VulkanTimeout("waiting for the GPU timed out (the test's hung GPU)", 2)

    monkeypatch.setattr(rt.Sequence, "wait", still_running)
    vk_engine.clear(ctx)                    # evicts the workspace: closes its sequences
    assert ctx.lost and not pending[0].closed
    monkeypatch.undo()
    same(forward(a)[1], want)                # a new context; the old one closed after its wait
    assert rt.get_context() is not ctx and ctx.closed and pending[0].closed
    assert ctx.live_allocations.count == 0


# -- memory ----------------------------------------------------------------------------------------

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
            ctx = fresh_context()
            with ctx.seams.override_limits(**({"max_storage_buffer_range": 2048} if small_range else {})):
                lim = Limits.of(ctx.info)
                chk = check_backward if backward else check_forward
                args = {**case.args(), **({"g_y": case.g_y, "g_states": case.g_states} if backward else {})}
                p = chk(**args)
                pl = plan(p.dims, lim, backward=backward)
                assert pl.plan.time_split == (small_range and k == 1)
                estimate = sum(budget.pooled(n, ctx.info.max_memory_allocation_size)
                               for n in budget.buffers(p.dims, pl, lim, backward).values())
                OPS[op](args if backward else case.args())
                made = sum(b.size for b in pool(ctx)._made.values())
            # At most the stand-in binding and the pair buffers of ids that did not repeat over.
            assert made <= estimate <= made + 256 * p.dims.S, (dims, small_range, made, estimate)


@pytest.mark.vulkan
@pytest.mark.parametrize("op", OPS)
def test_a_problem_larger_than_device_memory_falls_back_before_allocating(op, caplog):
    ctx = rt.get_context()
    OPS[op](args(False))
    before = held(ctx)
    with ctx.seams.override_limits(device_local_bytes=4096):   # "ask for more than the device has"
        sup = ssm_vk.supports(op, **CASE.args())
        assert not sup and "largest device-local heap" in sup.reason
        with caplog.at_level("WARNING", logger="ssm_vk"):
            res, got = OPS[op](args(False))
            OPS[op](args(False))
    assert res.where == "CPU" and res.backend == FALLBACK
    logged = [r.getMessage() for r in caplog.records]
    assert logged.count(f"ssm_vk falls back to ssm_fast on the CPU: {sup.reason}") == 1
    assert held(ctx) == before                         # nothing was allocated for it
    want = OPS[op](args(False))[1]
    for k, v in got.items():                            # and the CPU result is right
        np.testing.assert_allclose(v, want[k], rtol=1e-4, atol=1e-5, err_msg=k)


@pytest.mark.vulkan
@pytest.mark.parametrize("op", OPS)
def test_a_fallback_of_device_resident_inputs_returns_device_arrays(op):
    # Code written for the device path (results' .numpy(), results fed to the next call) must run
    # unchanged when a call falls back: the CPU's results come back on the inputs' device.
    ctx = rt.get_context()
    a = args(True)
    with ctx.seams.override_limits(device_local_bytes=256):   # less than the outputs need
        assert not ssm_vk.supports(op, **{k: v for k, v in a.items() if k not in ("g_y", "g_states")})
        res = (ssm_vk.ssm_scan(**{k: v for k, v in a.items() if k not in ("g_y", "g_states")}) if op == "ssm_scan"
               else ssm_vk.ssm_scan_back(**a))
    assert (res.where, res.backend) == ("CPU", FALLBACK)
    names = ("y", "states") if op == "ssm_scan" else ssm_ref.GRAD_NAMES
    cpu = sys.modules[FALLBACK]
    want = (cpu.ssm_scan(**CASE.args()) if op == "ssm_scan"
            else cpu.ssm_scan_back(**CASE.args(), g_y=CASE.g_y, g_states=CASE.g_states))
    for k in names:
        got = getattr(res, k)
        assert isinstance(got, ssm_vk.DeviceArray) and got.where == ctx.info.where, k
        np.testing.assert_array_equal(got.numpy(), getattr(want, k), err_msg=k)
    if op == "ssm_scan":   # a result feeds the next device call
        again = ssm_vk.ssm_scan(s=res.states, **{k: v for k, v in a.items() if k in ("x", "dt", "A", "B", "C")},
                                ids=None)
        assert again.where == ctx.info.where and isinstance(again.y, ssm_vk.DeviceArray)


@pytest.mark.vulkan
def test_a_cached_decision_never_outlives_the_limits_it_was_made_under():
    # supports() caches decisions by the identity of ctx.info, which override_limits swaps: the
    # limits of one override must not answer for the next one (whose object may reuse the freed
    # one's address).
    ctx = rt.get_context()
    for _ in range(5):
        with ctx.seams.override_limits(device_local_bytes=4096):
            assert not ssm_vk.supports("ssm_scan", **CASE.args())
        with ctx.seams.override_limits(device_local_bytes=ctx.hardware_info.device_local_bytes):
            assert ssm_vk.supports("ssm_scan", **CASE.args())


@pytest.mark.vulkan
def test_an_array_beyond_the_allocation_limit_falls_back():
    # Sixteen sequences share one cache row: the states (S, H, P, N) are 16x the cache s and the
    # largest array; with an allocation limit between the two, the call must fall back (it used
    # to be let through by supports() and die in the allocation with a ValueError).
    case = make_problem(np.random.default_rng(81), S=16, T=1, H=4, P=1, N=64, G=1, ids=[0] * 16, R=1)
    ctx = rt.get_context()
    row_bytes = 4 * 64 * 4
    with ctx.seams.override_limits(max_memory_allocation_size=4 * row_bytes):
        sup = ssm_vk.supports("ssm_scan", **case.args())
        assert not sup and "maxMemoryAllocationSize" in sup.reason and "states" in sup.reason
        r = ssm_vk.ssm_scan(**case.args())
    assert r.where == "CPU"
    np.testing.assert_allclose(r.states, ssm_vk.ssm_scan(**case.args()).states, rtol=1e-5, atol=1e-6)


@pytest.mark.vulkan
def test_out_of_device_memory_once_is_absorbed():
    # The driver refuses one allocation: the pool frees its idle buffers and tries again.
    ctx = rt.get_context()
    want = backward(args(False))[1]
    case = make_problem(np.random.default_rng(82), S=3, T=7, H=2, P=2, N=5, G=1)   # a shape not seen yet
    ctx.seams.fail_allocations(1)
    g = ssm_vk.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    assert g.where.startswith("Vulkan") and not ctx.seams.take_allocation_fault()
    # the call that absorbed the fault computed the gradients: the float64 oracle's, within float32's bounds
    oracle = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    for k in ssm_ref.GRAD_NAMES:
        assert_close(VK, k, getattr(g, k), getattr(oracle, k), label="after an absorbed allocation fault")
    same(backward(args(False))[1], want)


@pytest.mark.vulkan
@pytest.mark.parametrize("device", [False, True], ids=["host", "device"])
@pytest.mark.parametrize("op", OPS)
def test_out_of_device_memory_raises_keeps_nothing_and_the_next_call_works(op, device):
    ctx = rt.get_context()
    a = args(device)
    want = OPS[op](a)[1]
    vk_engine.clear(ctx)                              # the call must allocate again
    gc.collect()                                         # earlier tests' garbage gives its buffers back now
    pool(ctx).trim()
    before = held(ctx)
    ctx.seams.fail_allocations(10**6)                          # the device stays full
    try:
        with pytest.raises(rt.OutOfDeviceMemory, match="OUT_OF_DEVICE_MEMORY") as info:
            OPS[op](a)
        assert kept_by(info.value, a) == []
        del info
    finally:
        ctx.seams.fail_allocations(0)
    vk_engine.clear(ctx)
    pool(ctx).trim()
    assert held(ctx) == before and not ctx.lost
    same(OPS[op](a)[1], want)


@pytest.mark.vulkan
def test_a_prepared_call_through_a_timeout_and_a_lost_device():
    """A prepared call's run raises the fault as an ordinary call does: after a timeout it carries
    on (the same bits); after a device loss it keeps raising DeviceLost (it belongs to the lost
    device), closes without error, and a call prepared again on the new context gives the same bits."""
    case = make_problem(np.random.default_rng(77), S=2, T=1, H=2, P=4, N=16, G=1, ids="unused", R=4)
    host = {k: v for k, v in case.args().items() if k != "ids"}
    ctx = rt.get_context()
    step = ssm_vk.prepare_scan(**{k: ssm_vk.to_device(v) for k, v in host.items()}, ids=case.ids)
    want = step.run().y.numpy()
    ctx.seams.fail_next_submit(rt.VulkanTimeout)
    with pytest.raises(rt.VulkanTimeout):
        step.run()
    assert np.array_equal(step.run().y.numpy(), want)
    ctx.seams.fail_next_submit(rt.DeviceLost)
    with pytest.raises(rt.DeviceLost):
        step.run()
    with pytest.raises(rt.DeviceLost):
        step.run()
    step.close()
    with ssm_vk.prepare_scan(**{k: ssm_vk.to_device(v) for k, v in host.items()}, ids=case.ids) as again:
        assert again.where.startswith("Vulkan") and rt.get_context() is not ctx
        assert np.array_equal(again.run().y.numpy(), want)


@pytest.mark.vulkan
def test_preparing_a_call_out_of_device_memory_retries_once_then_raises_keeping_nothing():
    case = make_problem(np.random.default_rng(83), S=2, T=5, H=2, P=3, N=8, G=1)
    dev = {k: ssm_vk.to_device(v) for k, v in case.args().items() if k != "ids"}
    ctx = rt.get_context()
    want = ssm_vk.ssm_scan(**dev, ids=case.ids).y.numpy()
    ctx.seams.fail_allocations(2)   # the pool's own retry fails too: the prepare clears the workspaces, tries again
    with ssm_vk.prepare_scan(**dev, ids=case.ids) as step:
        assert not ctx.seams.take_allocation_fault()
        assert np.array_equal(step.run().y.numpy(), want)
    vk_engine.clear(ctx)
    gc.collect()
    pool(ctx).trim()
    before = held(ctx)
    ctx.seams.fail_allocations(10**6)
    try:
        with pytest.raises(rt.OutOfDeviceMemory):
            ssm_vk.prepare_scan(**dev, ids=case.ids)
    finally:
        ctx.seams.fail_allocations(0)
    gc.collect()
    pool(ctx).trim()
    assert held(ctx) == before and not ctx.lost
