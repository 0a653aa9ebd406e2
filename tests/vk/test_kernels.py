"""Runtime kernels and sequences: dispatch against numpy, caches, replay, timestamps, limits, faults."""

import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ssm_vk import runtime as rt
from ssm_vk.runtime import pipelines

TEST_GLSL = Path(__file__).resolve().parents[1] / "glsl"  # the test shaders

pytestmark = pytest.mark.vulkan

LOCAL = 64
SCALE = 0.5


def saxpy(ctx, offset=None):
    """tests/glsl/saxpy.comp: y = a*x + SCALE*y + OFFSET; bindings x, y, sums; push (uint n, float a)."""
    return rt.Kernel.get(ctx, "saxpy", bindings=3, push_size=8, local_size=(LOCAL, 1, 1), spec=(SCALE,),
                         defines=None if offset is None else {"OFFSET": offset}, search_path=TEST_GLSL)


def push(n, a):
    return struct.pack("<If", n, a)


@pytest.fixture
def data(ctx):
    """x, y on the host and in buffers; ``sums`` for the subgroup partials."""
    n = 1000
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    groups = -(-n // LOCAL)
    bufs = [rt.Buffer(ctx, 4 * n), rt.Buffer(ctx, 4 * n), rt.Buffer(ctx, 4 * groups * LOCAL)]
    rt.upload(bufs[0], x)
    rt.upload(bufs[1], y)
    rt.fill(bufs[2], 0)
    yield n, x, y, groups, bufs
    for b in bufs:
        b.close()


def test_dispatch_matches_numpy_with_push_spec_define_and_subgroups(ctx, glslc, data):
    n, x, y, groups, (bx, by, bs) = data
    k = saxpy(ctx, offset=0.25)
    with rt.Sequence(ctx) as seq:
        seq.dispatch(k, [bx, by, bs], push(n, 3.0), groups=groups)
        seq.finish()
        seq.submit()
    want = 3.0 * x + np.float32(SCALE) * y + np.float32(0.25)
    got = rt.download(by, (n, np.float32))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # subgroupAdd partials: however the device lays out its subgroups, they add up to the total.
    sums = rt.download(bs, (groups * LOCAL, np.float32))
    assert np.count_nonzero(sums) >= groups  # at least one subgroup per workgroup wrote
    np.testing.assert_allclose(sums.sum(dtype=np.float64), got.sum(dtype=np.float64), rtol=1e-4, atol=1e-3)


def test_kernels_are_cached_per_arguments(ctx, glslc):
    a = saxpy(ctx)
    pipelines = ctx.stats.pipelines
    assert saxpy(ctx) is a and ctx.stats.pipelines == pipelines
    c = rt.Kernel.get(ctx, "saxpy", bindings=3, push_size=8, local_size=(32, 1, 1), spec=(SCALE,),
                      search_path=TEST_GLSL)
    d = rt.Kernel.get(ctx, "saxpy", bindings=3, push_size=8, local_size=(64, 1, 1), spec=(1,),  # int 1, not 1.0
                      search_path=TEST_GLSL)
    assert len({id(a), id(c), id(d)}) == 3 and ctx.stats.pipelines == pipelines + 2


def test_descriptor_sets_are_written_once_per_binding_list(ctx, glslc, data):
    n, _, _, groups, (bx, by, bs) = data
    k = saxpy(ctx)
    with rt.Sequence(ctx) as seq:
        writes = ctx.stats.descriptor_writes
        seq.dispatch(k, [bx, by, bs], push(n, 1.0), groups=groups)
        assert ctx.stats.descriptor_writes == writes + 1
        seq.barrier()
        seq.dispatch(k, [bx, by, bs], push(n, 1.0), groups=groups)  # the same list: cache hit
        seq.barrier()
        seq.dispatch(k, [bx, (by, 0, 4 * n), bs], push(n, 1.0), groups=groups)  # same triples, spelled out
        assert ctx.stats.descriptor_writes == writes + 1
        seq.barrier()
        seq.dispatch(k, [bx, (by, 16, 4 * n - 16), bs], push(n - 4, 1.0), groups=groups)  # another range
        assert ctx.stats.descriptor_writes == writes + 2
    sets = ctx.stats.descriptor_sets
    with rt.Buffer(ctx, 4 * n) as other:
        _, key = k.acquire_set([bx, other, bs])
        k.release_set(key)                  # no sequence binds it any more
    with rt.Buffer(ctx, 4 * n) as another:  # the closed buffer's set is rewritten, not a new one allocated
        _, key = k.acquire_set([bx, another, bs])
        k.release_set(key)
    assert ctx.stats.descriptor_sets == sets + 1


def test_a_descriptor_set_a_sequence_binds_is_never_rewritten(ctx, glslc, data):
    # While referenced (a recorded command buffer binds it), a set is neither handed to another
    # binding list nor rewritten -- not even when one of its buffers closes -- and once let go
    # it is reused rather than a new one allocated.
    n, _, _, _, (bx, _, bs) = data
    k = saxpy(ctx)
    held = rt.Buffer(ctx, 4 * n)
    dset, key = k.acquire_set([bx, held, bs])
    held.close()                                      # its sequence can no longer run, but still exists
    others = [rt.Buffer(ctx, 4 * n) for _ in range(3)]
    for other in others:                              # new binding lists never get the referenced set
        other_set, other_key = k.acquire_set([bx, other, bs])
        assert other_set != dset
        k.release_set(other_key)
        other.close()                                 # (their sets go to the free list)
    k.release_set(key)                                # let go: now it is the next to be rewritten
    with rt.Buffer(ctx, 4 * n) as third:
        sets = ctx.stats.descriptor_sets
        third_set, third_key = k.acquire_set([bx, third, bs])
        k.release_set(third_key)
    assert third_set == dset and ctx.stats.descriptor_sets == sets  # reused, not allocated


def test_sequence_replays(ctx, glslc, data):
    n, x, y, groups, (bx, by, bs) = data
    k = saxpy(ctx)
    with rt.Sequence(ctx) as seq:
        seq.dispatch(k, [bx, by, bs], push(n, 2.0), groups=groups)
        seq.finish()
        for _ in range(3):
            seq.submit()
    want = y.copy()
    for _ in range(3):
        want = np.float32(2.0) * x + np.float32(SCALE) * want
    np.testing.assert_allclose(rt.download(by, (n, np.float32)), want, rtol=1e-5, atol=1e-5)


def test_timestamps(ctx, glslc, data):
    n, _, _, groups, (bx, by, bs) = data
    k = saxpy(ctx)
    with rt.Sequence(ctx) as seq:
        seq.timestamp("start")
        seq.dispatch(k, [bx, by, bs], push(n, 1.0), groups=groups)
        seq.timestamp("saxpy")
        with pytest.raises(ValueError, match="not used before"):
            seq.timestamp("saxpy")
        seq.finish()
        with pytest.raises(RuntimeError, match="submit"):
            seq.gpu_times()
        seq.submit()
        times = seq.gpu_times()
        assert list(times) == ["start", "saxpy"] and times["start"] == 0 and times["saxpy"] > 0
        seq.submit(wait=False)
        assert seq.gpu_times()["saxpy"] > 0  # waits for the pending run


def _timed_chain(ctx, data, count: int):
    """A finished sequence: "start", ``count`` saxpy dispatches one after another, "end"."""
    n, _, _, groups, (bx, by, bs) = data
    k = saxpy(ctx)
    seq = rt.Sequence(ctx)
    seq.timestamp("start")
    for _ in range(count):
        seq.dispatch(k, [bx, by, bs], push(n, 1.0), groups=groups)
        seq.barrier()
    seq.timestamp("end")
    seq.finish()
    return seq


def test_host_times_place_the_gpu_between_submit_and_wait(ctx, glslc, data, monkeypatch):
    """Sequence.host_times: the GPU's timestamps on time.monotonic's clock lie after the submit
    began and before the wait returned, and their differences are gpu_times' (the calibration
    maps ticks to nanoseconds with the same period)."""
    if not ctx.calibration:
        pytest.skip(f"{ctx.info.name} offers no calibrated timestamps on CLOCK_MONOTONIC")
    with _timed_chain(ctx, data, 20) as seq:
        with pytest.raises(RuntimeError, match="submit"):
            seq.host_times()
        for _ in range(5):
            t0 = time.monotonic()
            seq.submit()
            t1 = time.monotonic()
            host, gpu = seq.host_times(), seq.gpu_times()
            slack = 50e-6   # the calibration's own deviation and clock reads
            assert t0 - slack <= host["start"] <= host["end"] <= t1 + slack, (t0, host, t1)
            assert abs((host["end"] - host["start"]) * 1e9 - gpu["end"]) < 1e3
        monkeypatch.setattr(ctx, "calibration", None)
        with pytest.raises(RuntimeError, match="calibrated"):
            seq.host_times()


def test_the_poll_window_follows_the_last_run_within_its_cap():
    from ssm_vk.runtime.commands import POLL_CAP_S, poll_window
    assert poll_window(200e-6, None) == 200e-6
    assert poll_window(200e-6, 100e-6) == 200e-6            # the last run fit in the poll
    assert poll_window(200e-6, 200e-6) == pytest.approx(270e-6)   # just past it: a quarter more + 20 us
    assert poll_window(200e-6, POLL_CAP_S) == 200e-6        # longer runs sleep as before
    assert poll_window(0.0, 300e-6) == 0.0                  # 0: never poll, whatever the last run
    assert poll_window(2e-3, 300e-6) == 2e-3                # a longer setting is kept


def test_a_wait_measures_the_run_it_waited_for(ctx, glslc, data, monkeypatch):
    """last_run_s: from the submit to the end the wait saw -- not shorter than the GPU's own time
    and not longer than the submit call -- polling or sleeping."""
    with _timed_chain(ctx, data, 10) as seq:
        assert seq.last_run_s is None
        for spin in (0.0, 0.5):   # sleeping in the driver, then polling (a generous window)
            monkeypatch.setattr(ctx, "spin_s", spin)
            t0 = time.perf_counter()
            seq.submit()
            took = time.perf_counter() - t0
            assert seq.gpu_times()["end"] / 1e9 <= seq.last_run_s <= took


def test_limits_override_makes_callers_split(ctx, glslc, data):
    n, _, _, _, (bx, by, bs) = data
    k = saxpy(ctx)
    with (ctx.seams.override_limits(max_workgroup_count=(4, 1, 1), max_storage_buffer_range=1024),
          rt.Sequence(ctx) as seq):
        with pytest.raises(ValueError, match="max_workgroup_count"):
            seq.dispatch(k, [(bx, 0, 1024), (by, 0, 1024), (bs, 0, 1024)], push(256, 1.0), groups=5)
        with pytest.raises(ValueError, match="max_storage_buffer_range = 1024"):
            seq.dispatch(k, [(bx, 0, 1028), (by, 0, 1024), (bs, 0, 1024)], push(256, 1.0), groups=4)
        with pytest.raises(ValueError, match="max_storage_buffer_range"):
            seq.dispatch(k, [bx, by, bs], push(n, 1.0), groups=4)  # a whole 4000-byte buffer
        # What a caller does instead: one dispatch per 1024-byte window, within the group limit.
        for start in range(0, 4 * n, 1024):
            m = min(1024, 4 * n - start)
            seq.dispatch(k, [(bx, start, m), (by, start, m), (bs, 0, 1024)], push(m // 4, 1.0), groups=4)
        seq.finish()
        seq.submit()
    assert ctx.info.max_workgroup_count == ctx.hardware_info.max_workgroup_count


def test_dispatch_arguments_are_checked(ctx, glslc, data):
    n, _, _, _, (bx, by, bs) = data
    k = saxpy(ctx)
    with rt.Sequence(ctx) as seq:
        for bad_groups in (0, (1, 0, 1), (1, 1), 1.5):
            with pytest.raises(ValueError, match="groups"):
                seq.dispatch(k, [bx, by, bs], push(n, 1.0), groups=bad_groups)
        with pytest.raises(ValueError, match="push must be 8 bytes"):
            seq.dispatch(k, [bx, by, bs], b"1234", groups=1)
        with pytest.raises(ValueError, match="expected 3 bindings"):
            seq.dispatch(k, [bx, by], push(n, 1.0), groups=1)
        with pytest.raises(ValueError, match="min_storage_buffer_offset_alignment"):
            seq.dispatch(k, [(bx, 4, 64), by, bs], push(n, 1.0), groups=1)
        with pytest.raises(TypeError):
            seq.dispatch(k, [bx, by, "buffer"], push(n, 1.0), groups=1)
        seq.finish()
        with pytest.raises(RuntimeError, match="finished"):
            seq.barrier()


@pytest.mark.parametrize(("kw", "match"), [
    (dict(bindings=0), "bindings"), (dict(push_size=6), "push_size"), (dict(push_size=4096), "max_push_constants"),
    (dict(local_size=(2048, 1, 1)), "max_workgroup_size"), (dict(local_size=(64, 64, 1)), "invocations"),
    (dict(spec=("x",)), "spec"),
])
def test_kernel_arguments_are_checked(ctx, kw, match):
    args = dict(bindings=3, push_size=8, local_size=(64, 1, 1), spec=(), search_path=TEST_GLSL) | kw
    with pytest.raises((TypeError, ValueError), match=match):
        rt.Kernel.get(ctx, "saxpy", **args)


def test_fixed_workgroup_size_must_match(ctx, glslc, tmp_path):
    (tmp_path / "fixed.comp").write_text(
        "#version 450\nlayout(local_size_x = 32) in;\n"
        "layout(std430, binding = 0) buffer B { float b[]; };\nvoid main() { b[gl_GlobalInvocationID.x] = 1.0; }\n")
    with pytest.raises(ValueError, match=r"fixes local_size \(32, 1, 1\)"):
        rt.Kernel.get(ctx, "fixed", bindings=1, local_size=(64, 1, 1), search_path=tmp_path)
    assert rt.Kernel.get(ctx, "fixed", bindings=1, local_size=(32, 1, 1), search_path=tmp_path).local_size == (32, 1, 1)
    spirv = rt.compile_shader("saxpy", search_path=TEST_GLSL)
    pipelines.check_workgroup_size(spirv, (7, 3, 2))  # fully specialisable: any size


def test_submit_refuses_closed_buffers(ctx, glslc, data):
    n, _, _, groups, (bx, _, bs) = data
    scratch = rt.Buffer(ctx, 4 * n)
    with rt.Sequence(ctx) as seq:
        seq.dispatch(saxpy(ctx), [bx, scratch, bs], push(n, 1.0), groups=groups)
        seq.finish()
        scratch.close()
        with pytest.raises(RuntimeError, match="closed"):
            seq.submit()


def test_submit_refuses_what_closed_after_earlier_submits(ctx, glslc, data):
    # A replayed sequence checks its buffers and kernels again only when one of the context's
    # closed since its last check: one closed between two submits is still refused.
    n, _, _, groups, (bx, by, bs) = data
    scratch = rt.Buffer(ctx, 4 * n)
    with rt.Sequence(ctx) as seq:
        seq.dispatch(saxpy(ctx), [bx, scratch, bs], push(n, 1.0), groups=groups)
        seq.finish()
        seq.submit()
        rt.Buffer(ctx, 16).close()  # another buffer closing: the check runs again and passes
        seq.submit()
        seq.submit()
        scratch.close()
        with pytest.raises(RuntimeError, match=r"submit: <Buffer #\d+ .* closed> used by this sequence is closed"):
            seq.submit()
    k = rt.Kernel.get(ctx, "saxpy", bindings=3, push_size=8, local_size=(LOCAL, 1, 1), spec=(0.25,),
                      search_path=TEST_GLSL)
    with rt.Sequence(ctx) as seq:
        seq.dispatch(k, [bx, by, bs], push(n, 1.0), groups=groups)
        seq.finish()
        seq.submit()
        seq.submit()
        k.close()
        with pytest.raises(RuntimeError, match=r"submit: <Kernel .* used by this sequence is closed"):
            seq.submit()


def test_copy_and_one_shot(ctx):
    with rt.Buffer(ctx, 64) as a, rt.Buffer(ctx, 64) as b:
        rt.upload(a, np.arange(16, dtype=np.uint32))
        with rt.oneshot(ctx) as seq:
            seq.copy(a, b, 32, src_offset=8, dst_offset=4)
        assert np.array_equal(rt.download(b, (8, np.uint32), offset=4), np.arange(2, 10))
        with pytest.raises(ValueError, match="overlap"), rt.oneshot(ctx) as seq:
            seq.copy(a, a, 16, 0, 8)
        with pytest.raises(ZeroDivisionError), rt.oneshot(ctx) as seq:
            seq.fill(b, 7)
            1 / 0  # noqa: B018  (a block that fails: nothing it recorded runs)
        assert np.array_equal(rt.download(b, (8, np.uint32), offset=4), np.arange(2, 10))
        rt.fill(b, 9)
        assert (rt.download(b, (16, np.uint32)) == 9).all()


def test_sequences_from_threads(ctx, glslc):
    k = saxpy(ctx)
    n, errors = 256, []

    def work(seed):
        try:
            x = np.full(n, seed, np.float32)
            with rt.Buffer(ctx, 4 * n) as bx, rt.Buffer(ctx, 4 * n) as by, rt.Buffer(ctx, 4 * n) as bs:
                rt.upload(bx, x)
                rt.fill(by, 0)
                with rt.Sequence(ctx) as seq:
                    seq.dispatch(k, [bx, by, bs], push(n, 1.0), groups=n // LOCAL)
                    seq.finish()
                    for _ in range(5):
                        seq.submit()
                # y_{k+1} = x + SCALE * y_k, from y_0 = 0
                want = x * sum(SCALE**i for i in range(5))
                np.testing.assert_allclose(rt.download(by, (n, np.float32)), want, rtol=1e-6)
        except Exception as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i + 1,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_validation_layer_reports_a_missing_barrier(ctx, glslc, data):
    # The canary of this test session: lavapipe runs the two commands in order and gives the right
    # answer, only synchronization validation sees that the dispatch may overtake the fill.
    n, _, _, groups, (bx, by, bs) = data
    with rt.Sequence(ctx) as seq:
        seq.fill(by, 0)
        seq.dispatch(saxpy(ctx), [bx, by, bs], push(n, 1.0), groups=groups)  # no barrier() before it
        seq.finish()
        seq.submit()
    messages, ctx.validation_messages[:] = list(ctx.validation_messages), []
    assert any("SYNC-HAZARD-WRITE-AFTER-WRITE" in m for m in messages), messages


# -- faults -----------------------------------------------------------------------------------------

def test_device_lost_then_a_fresh_context(ctx, glslc, data):
    n, x, y, groups, (bx, by, bs) = data
    seq = rt.Sequence(ctx)
    seq.dispatch(saxpy(ctx), [bx, by, bs], push(n, 1.0), groups=groups)
    seq.finish()
    ctx.seams.fail_next_submit(rt.DeviceLost)
    with pytest.raises(rt.DeviceLost, match="injected"):
        seq.submit()
    assert ctx.lost
    with pytest.raises(rt.DeviceLost):
        seq.submit()
    with pytest.raises(rt.DeviceLost):
        rt.Buffer(ctx, 4)
    fresh = rt.get_context()  # closes the lost context and opens another
    assert fresh is not ctx and ctx.closed and seq.closed and bx.closed
    assert ctx.live_allocations.count == 0 and not ctx.validation_messages
    with rt.Buffer(fresh, 4 * n) as b2, rt.Buffer(fresh, 4 * n) as b1, rt.Buffer(fresh, 4 * LOCAL * groups) as b3:
        rt.upload(b1, x)
        rt.upload(b2, y)
        with rt.oneshot(fresh) as s:
            s.dispatch(saxpy(fresh), [b1, b2, b3], push(n, 1.0), groups=groups)
        np.testing.assert_allclose(rt.download(b2, (n, np.float32)), x + np.float32(SCALE) * y, rtol=1e-6)


def test_timeout_leaves_the_work_pending(ctx, glslc, data):
    n, x, y, groups, (bx, by, bs) = data
    with rt.Sequence(ctx) as seq:
        seq.dispatch(saxpy(ctx), [bx, by, bs], push(n, 1.0), groups=groups)
        seq.finish()
        ctx.seams.fail_next_submit(rt.VulkanTimeout)
        with pytest.raises(rt.VulkanTimeout):
            seq.submit()
        assert seq.pending and not ctx.lost
        seq.wait()
    np.testing.assert_allclose(rt.download(by, (n, np.float32)), x + np.float32(SCALE) * y, rtol=1e-6)
    with pytest.raises(ValueError):
        ctx.seams.fail_next_submit(RuntimeError)


class _FenceLib:
    """The binding's functions, with vkGetFenceStatus answering ``status`` (None: the real one)
    and vkWaitForFences refused: a wait must end by polling."""

    def __init__(self, lib, status=None):
        self._lib, self._status = lib, status

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def vkGetFenceStatus(self, device, fence):
        return self._lib.vkGetFenceStatus(device, fence) if self._status is None else self._status

    def vkWaitForFences(self, *args):
        raise AssertionError("the wait blocked instead of polling")


def test_a_polled_wait_ends_when_the_work_has(ctx, glslc, data, monkeypatch):
    n, x, y, groups, (bx, by, bs) = data
    monkeypatch.setattr(ctx, "spin_s", 10.0)
    want = y.copy()
    with rt.Sequence(ctx) as seq:
        seq.dispatch(saxpy(ctx), [bx, by, bs], push(n, 1.0), groups=groups)
        seq.finish()
        seq._lib = _FenceLib(seq._lib)
        for _ in range(3):           # each replay reads what the previous one wrote
            seq.submit()
            assert not seq.pending
            want = x + np.float32(SCALE) * want
            np.testing.assert_allclose(rt.download(by, (n, np.float32)), want, rtol=1e-5)
        monkeypatch.setattr(ctx, "spin_s", 0.0)   # no polling: the blocking wait is the one used
        with pytest.raises(AssertionError, match="blocked"):
            seq.submit()
        seq._lib = seq._lib._lib
        seq.wait()


def test_a_poll_that_reports_a_lost_device_raises_device_lost(ctx, glslc, data, monkeypatch):
    n, _, _, groups, (bx, by, bs) = data
    monkeypatch.setattr(ctx, "spin_s", 10.0)
    seq = rt.Sequence(ctx)
    seq.dispatch(saxpy(ctx), [bx, by, bs], push(n, 1.0), groups=groups)
    seq.finish()
    seq._lib = _FenceLib(seq._lib, status=-4)      # VK_ERROR_DEVICE_LOST
    with pytest.raises(rt.DeviceLost, match="vkGetFenceStatus"):
        seq.submit()
    assert ctx.lost
    fresh = rt.get_context()
    assert fresh is not ctx and seq.closed and bx.closed


def _offers_pipeline_stats(index: int) -> bool:
    """Whether device ``index`` lists VK_KHR_pipeline_executable_properties (asked of the loader
    directly, not through the context under test)."""
    from ssm_vk.runtime import binding, device
    instance = device.create_instance()
    try:
        return device.PIPELINE_STATS_EXTENSION in device.device_extensions(device.physical_devices(instance)[index])
    finally:
        binding.require().vkDestroyInstance(instance, None)


def test_compile_statistics_only_when_asked_and_offered(glslc, monkeypatch):
    rt.close()
    monkeypatch.setenv("SSM_VK_PIPELINE_STATS", "maybe")
    with pytest.raises(ValueError, match="SSM_VK_PIPELINE_STATS"):
        rt.get_context()
    assert rt.current_context() is None
    monkeypatch.delenv("SSM_VK_PIPELINE_STATS")
    ctx = rt.get_context()
    try:
        assert not ctx.pipeline_stats
        for ask in (saxpy(ctx).statistics, saxpy(ctx).representations):
            with pytest.raises(RuntimeError, match="SSM_VK_PIPELINE_STATS=1"):
                ask()
    finally:
        rt.close()
    monkeypatch.setenv("SSM_VK_PIPELINE_STATS", "1")
    ctx = rt.get_context()
    try:
        offered = _offers_pipeline_stats(ctx.info.index)
        assert ctx.pipeline_stats == offered
        k = saxpy(ctx, offset=0.5)
        if not offered:
            for ask in (k.statistics, k.representations):
                with pytest.raises(RuntimeError, match="does not offer VK_KHR_pipeline_executable_properties"):
                    ask()
            return
        # what the driver made of the code: none, or (executable, name, description, text or bytes)
        for index, name, _, content in k.representations():
            assert index == 0 and name and isinstance(content, str | bytes) and content
        stats = k.statistics()
        assert stats and all(isinstance(n, str) and n for n in stats)
        assert all(isinstance(v, bool | int | float) for v in stats.values())
        assert k.defines == {"OFFSET": "0.5"}
        assert saxpy(ctx).statistics().keys() == stats.keys()   # the same driver reports the same names
        # the kernel still computes with statistics kept
        n = 256
        x = np.arange(n, dtype=np.float32)
        bx, by, bs = rt.Buffer(ctx, 4 * n), rt.Buffer(ctx, 4 * n), rt.Buffer(ctx, 4 * n)
        rt.upload(bx, x)
        rt.upload(by, x)
        with rt.Sequence(ctx) as seq:
            seq.dispatch(k, [bx, by, bs], push(n, 2.0), groups=n // LOCAL)
            seq.finish()
            seq.submit()
        np.testing.assert_allclose(rt.download(by, (n, np.float32)), 2.5 * x + 0.5)
        for b in (bx, by, bs):
            b.close()
        assert not ctx.validation_messages
    finally:
        rt.close()
