"""ssm_vk.runtime.gate and external.TimelineSemaphore: a call's submissions ordered on the GPU
against another API's work by a timeline semaphore (what ssm_torch's CUDA-tensor path uses).

The other API is the host here: it signals the entry value after the submission is queued, and
the tests check that the GPU work waited for it, that each gated submission
signals the value it was handed and reports it before anything waits for it, and that only the
gating thread's submissions are gated. Exporting the semaphore (VK_KHR_external_semaphore_fd,
which CUDA imports) is checked where the device offers it (a GPU; lavapipe does not).
"""

import os
import threading
import time

import numpy as np
import pytest
from vkcheck import missing

from ssm_vk import runtime as rt
from ssm_vk.runtime import external, gate

pytestmark = pytest.mark.vulkan


@pytest.fixture
def timeline(ctx):
    if not ctx.timeline_semaphores:
        missing(f"{ctx.info.name} has no timeline semaphores")
    sem = external.TimelineSemaphore(ctx)
    yield sem
    sem.close()


def test_the_host_signals_waits_and_reads(timeline):
    assert timeline.value() == 0
    timeline.signal(3)
    assert timeline.value() == 3
    timeline.wait(3)   # reached: returns at once
    t0 = time.perf_counter()
    with pytest.raises(rt.VulkanTimeout):
        timeline.wait(4, timeout_s=0.05)
    assert time.perf_counter() - t0 >= 0.04
    with pytest.raises(RuntimeError, match="without exported=True"):
        timeline.export_fd()


def test_a_closed_semaphore_says_so(ctx, timeline):
    timeline.close()
    timeline.close()   # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        timeline.value()


def _filler(ctx, nbytes=4096, value=0x3F800000):
    buf = rt.Buffer(ctx, nbytes)
    rt.fill(buf, 0)
    seq = rt.Sequence(ctx)
    seq.fill(buf, value)
    seq.finish()
    return buf, seq


def test_a_gated_submission_waits_for_the_entry_and_signals_its_value(ctx, timeline):
    # queued before the entry is signalled, it cannot finish until the host signals it (on this
    # thread: Debian 12's validation layer loses track when another thread signals during a wait)
    buf, seq = _filler(ctx)
    values = iter(range(10, 20))
    seen = []

    def submitted(value, internal):   # before anything waits: the entry is not signalled yet
        seen.append((value, internal, timeline.value()))

    try:
        with gate.gated(gate.Gate(ctx, timeline, 5, lambda: next(values), submitted)):
            seq.submit(wait=False)
        time.sleep(0.1)
        assert timeline.value() == 0     # the submission has not run: it waits for 5
        timeline.signal(5)
        seq.wait()
    finally:
        seq.close()
    assert seen == [(10, False, 0)]
    timeline.wait(10, timeout_s=5.0)     # it signals its own value (seen by the host a little after
    assert timeline.value() == 10        # the fence on lavapipe: a waiter waits for the value)
    assert np.all(rt.download(buf, ((1024,), np.uint32)) == 0x3F800000)
    buf.close()


def test_the_runtime_transfers_are_gated_and_say_so(ctx, timeline):
    buf = rt.Buffer(ctx, 256)
    seen = []
    timeline.signal(1)
    values = iter(range(2, 9))
    with gate.gated(gate.Gate(ctx, timeline, 1, lambda: next(values), lambda v, i: seen.append((v, i)))):
        with rt.oneshot(ctx) as seq:
            seq.fill(buf, 7)
    timeline.wait(2, timeout_s=5.0)
    assert seen == [(2, True)] and timeline.value() == 2
    buf.close()


def test_only_the_gating_thread_is_gated(ctx, timeline):
    # the entry value is never signalled: a submission gated by mistake would wait for ever
    buf, seq = _filler(ctx)
    outcome = []

    def other():
        outcome.append(gate.current(ctx))
        seq.submit(timeout_s=5.0)
        outcome.append(rt.download(buf, ((1,), np.uint32))[0])

    with gate.gated(gate.Gate(ctx, timeline, 1, lambda: 99, lambda v, i: outcome.append("gated"))):
        assert gate.current(ctx) is not None
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert gate.current(ctx) is None
    assert outcome == [None, 0x3F800000] and timeline.value() == 0
    seq.close()
    buf.close()


def test_exported_semaphores_where_the_device_offers_them(ctx):
    ok, why = external.semaphore_support(ctx)
    if not ok:
        assert why   # the reason, for the caller's error
        with pytest.raises(ValueError, match="timeline semaphore: "):
            external.TimelineSemaphore(ctx, exported=True)
        return
    sem = external.TimelineSemaphore(ctx, exported=True)
    try:
        fd = sem.export_fd()
        try:
            os.fstat(fd)   # an open descriptor, the caller's to close
        finally:
            os.close(fd)
    finally:
        sem.close()
