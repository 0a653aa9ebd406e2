"""Recorded command sequences: :class:`Sequence` and :func:`oneshot`.

A Sequence is a primary command buffer recorded once and submitted any number of times
(resubmitting costs a fraction of recording a dispatch afresh: docs/VULKAN.md, "Costs measured on
lavapipe"). It owns
its command pool, so sequences record independently on different threads; the queue submission
itself takes ``ctx.lock``. Each submission ends with a barrier that makes the sequence's writes
visible to later submissions and to the host.

One module of over 400 lines on purpose: it is one class, the Sequence, whose recording,
submission, waiting and timestamps share its command buffer, fence and query pool.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator

from . import binding
from .binding import DeviceLost, VulkanTimeout
from .checks import check_int
from .context import Context
from .device import CALIBRATION_STYPES, TIME_DOMAIN_DEVICE, TIME_DOMAIN_MONOTONIC
from .memory import Buffer, fill_range
from .owned import Slot
from .pieces import Pieces, split_copy
from .pipelines import Kernel

MAX_TIMESTAMPS = 64

_RECORDING, _READY = "recording", "ready"
_NOT_READY = 1   # VK_NOT_READY: a fence not signalled yet
POLL_CAP_S = 10e-3  # the longest a wait polls for a sequence whose last run took longer than ctx.spin_s


def poll_window(spin_s: float, last_run_s: float | None) -> float:
    """How long a wait polls its fence before it sleeps in the driver: ``spin_s`` (the context's,
    SSM_VK_SPIN_US), stretched to a quarter more than the sequence's last run (+ 20 us) when that
    run took longer and the stretch stays within POLL_CAP_S -- a call a little longer than the
    poll would otherwise sleep and wake late, every time (docs/VULKAN.md, "Devices measured").
    The cap is 10 ms: calls of a few ms gain from polling through (docs/API.md, SSM_VK_SPIN_US);
    past it the late wake-up is under 2% of the call. 0 stays 0 (no polling asked for); a run longer than the cap
    keeps ``spin_s``."""
    if spin_s <= 0 or last_run_s is None:
        return max(spin_s, 0.0)
    stretched = 1.25 * last_run_s + 20e-6
    return stretched if spin_s < stretched <= POLL_CAP_S else spin_s


class Sequence:
    """Commands recorded once, then submitted many times.

    Record with :meth:`dispatch`, :meth:`barrier`, :meth:`copy`, :meth:`fill`, :meth:`timestamp`;
    :meth:`finish`; then :meth:`submit` (and :meth:`wait`). :meth:`reset` starts a new recording.
    Consecutive commands may run concurrently: put a :meth:`barrier` between a command that writes
    and one that reads the same memory. Lives until ``close()``, the end of a ``with`` block, or
    the close of its context. Raises TypeError (ctx), DeviceLost/RuntimeError (unusable context),
    VulkanError.
    """

    def __init__(self, ctx: Context):
        if not isinstance(ctx, Context):
            raise TypeError(f"ctx: expected a Context, got {type(ctx).__name__}")
        ctx.check_usable()
        vk = binding.require()
        self.ctx = ctx
        self.closed = False
        self.pending = False
        self.internal = False  # the runtime's own transfer sequence (oneshot): test faults skip it
        self.last_run_s: float | None = None   # submit to the end seen by a wait, of the last run
        self._submit_t = 0.0
        self._pool = self._fence = self._queries = None
        self._set_keys: list = []  # (kernel, descriptor-set key) of each dispatch recorded
        device = ctx.handle
        try:
            with binding.translated("creating a Sequence"):
                pool_info = vk.VkCommandPoolCreateInfo(queueFamilyIndex=ctx.queue_family)
                self._pool = vk.vkCreateCommandPool(device, pool_info, None)
                self._cmd = vk.vkAllocateCommandBuffers(device, vk.VkCommandBufferAllocateInfo(
                    commandPool=self._pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
                self._fence = vk.vkCreateFence(device, vk.VkFenceCreateInfo(), None)
            # Built once in raw cffi and reused by every submit: the binding's wrappers would
            # double a pre-recorded submit+wait (docs/VULKAN.md, "Costs measured on lavapipe").
            ffi = vk.ffi
            self._lib = vk.lib
            self._fences = ffi.new("VkFence[1]", [self._fence])
            self._cmds = ffi.new("VkCommandBuffer[1]", [self._cmd])
            self._submit_info = ffi.new("VkSubmitInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "commandBufferCount": 1, "pCommandBuffers": self._cmds})
            ctx.owned.adopt(self)
        except BaseException:
            self._release()
            raise
        self._begin()

    # -- recording ----------------------------------------------------------------------------------

    def _release_sets(self) -> None:
        """Let go of the descriptor sets the recording binds (it is being discarded)."""
        keys, self._set_keys = self._set_keys, []
        for kernel, key in keys:
            if not kernel.closed:
                kernel.release_set(key)

    def _begin(self) -> None:
        vk = binding.require()
        self._release_sets()
        self._state = _RECORDING
        self._buffers: dict[int, Buffer] = {}   # serial → every buffer the commands use (checked at submit)
        self._kernels: set[Kernel] = set()
        self._labels: list[str] = []
        self._submitted = False
        self._checked = -1  # ctx.closures when the buffers and kernels used were last found open
        begin = vk.ffi.new("VkCommandBufferBeginInfo*", {"sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO})
        binding.check_result(vk.lib.vkBeginCommandBuffer(self._cmd, begin), "vkBeginCommandBuffer")

    def _recording(self) -> None:
        if self.closed:
            raise RuntimeError("this Sequence is closed")
        if self._state != _RECORDING:
            raise RuntimeError("this Sequence is finished; reset() it to record again")

    def dispatch(self, kernel: Kernel, bindings, push: bytes = b"", groups=(1, 1, 1)) -> None:
        """Record ``kernel`` over ``groups`` workgroups (an int or (x, y, z)) with ``bindings``
        (see ``Kernel.normalize_bindings``) and ``push``, exactly ``kernel.push_size`` bytes.

        Raises ValueError for a group count below 1 or above ``ctx.info.max_workgroup_count``
        (callers split the grid), a wrong push size or bad bindings; TypeError; RuntimeError
        (finished or closed).
        """
        self._recording()
        if not isinstance(kernel, Kernel) or kernel.ctx is not self.ctx or kernel.closed:
            raise TypeError(f"dispatch: expected an open Kernel of this context, got {kernel!r}")
        if isinstance(groups, int) and not isinstance(groups, bool):
            groups = (groups, 1, 1)
        limit = self.ctx.info.max_workgroup_count
        if (not isinstance(groups, tuple | list) or len(groups) != 3
                or any(isinstance(g, bool) or not isinstance(g, int) for g in groups)):
            raise ValueError(f"dispatch {kernel.name}: groups must be an int or 3 ints, got {groups!r}")
        if any(not 1 <= g <= m for g, m in zip(groups, limit, strict=True)):
            raise ValueError(f"dispatch {kernel.name}: groups {tuple(groups)} outside 1..max_workgroup_count "
                             f"{limit}; split the dispatch")
        if not isinstance(push, bytes | bytearray) or len(push) != kernel.push_size:
            got = len(push) if isinstance(push, bytes | bytearray) else type(push).__name__
            raise ValueError(f"dispatch {kernel.name}: push must be {kernel.push_size} bytes, got {got}")
        dset, set_key = kernel.acquire_set(bindings)  # checks the bindings, before any command is recorded
        self._set_keys.append((kernel, set_key))     # referenced until this recording is reset or closed
        vk = binding.vk
        lib, cmd = vk.lib, self._cmd  # raw calls: the binding's wrappers slow recording (docs/VULKAN.md)
        lib.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, kernel.pipeline)
        sets = vk.ffi.new("VkDescriptorSet[1]", [dset])
        lib.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, kernel.layout, 0, 1, sets, 0, vk.ffi.NULL)
        if push:
            data = binding.bytes_arg(push)  # alive until the call returns; the command copies it
            lib.vkCmdPushConstants(cmd, kernel.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(push), data)
        lib.vkCmdDispatch(cmd, *groups)
        self._kernels.add(kernel)
        for item in bindings:
            buf = item if isinstance(item, Buffer) else item[0]
            self._buffers[buf.serial] = buf

    def barrier(self) -> None:
        """Make the writes of earlier shaders and transfers visible to the later ones."""
        self._recording()
        self._memory_barrier(host=False)

    def _memory_barrier(self, host: bool) -> None:
        vk = binding.vk
        barrier, src_stages, dst_stages = _barrier(host)
        vk.lib.vkCmdPipelineBarrier(self._cmd, src_stages, dst_stages, 0, 1, barrier, 0, vk.ffi.NULL, 0, vk.ffi.NULL)

    def copy(self, src: Buffer, dst: Buffer, nbytes: int, src_offset: int = 0, dst_offset: int = 0) -> None:
        """Record a copy of ``nbytes`` bytes. Raises TypeError/ValueError (ranges outside the
        buffers, overlapping ranges of one buffer), RuntimeError."""
        self._recording()
        for name, b in (("src", src), ("dst", dst)):
            if not isinstance(b, Buffer) or b.ctx is not self.ctx or b.closed:
                if type(src) is Pieces or type(dst) is Pieces:   # an array in pieces: a copy per piece it covers
                    for s, d, n, so, do in split_copy(src, dst, check_int("copy: nbytes", nbytes, 1),
                                                      check_int("copy: src_offset", src_offset),
                                                      check_int("copy: dst_offset", dst_offset)):
                        self.copy(s, d, n, so, do)
                    return
                raise TypeError(f"copy: {name} must be an open Buffer of this context, got {b!r}")
        nbytes = check_int("copy: nbytes", nbytes, 1)
        src_offset = check_int("copy: src_offset", src_offset)
        dst_offset = check_int("copy: dst_offset", dst_offset)
        if src_offset + nbytes > src.size or dst_offset + nbytes > dst.size:
            raise ValueError(f"copy: {nbytes} bytes from {src_offset} of {src!r} to {dst_offset} of {dst!r} do not fit")
        if src is dst and abs(src_offset - dst_offset) < nbytes:
            raise ValueError("copy: source and destination ranges overlap")
        vk = binding.require()
        region = vk.VkBufferCopy(srcOffset=src_offset, dstOffset=dst_offset, size=nbytes)
        vk.vkCmdCopyBuffer(self._cmd, src.handle, dst.handle, 1, [region])
        self._buffers[src.serial] = src
        self._buffers[dst.serial] = dst

    def fill(self, buffer: Buffer, value: int, offset: int = 0, nbytes: int | None = None) -> None:
        """Record a fill with the 32-bit word ``value``; see ``memory.fill`` for the arguments
        (``buffer`` may be in Pieces: one fill per piece the range covers)."""
        self._recording()
        try:
            offset, nbytes = fill_range(buffer, value, offset, nbytes)
        except TypeError:
            if type(buffer) is not Pieces:
                raise
            n = buffer.size - offset if nbytes is None else nbytes
            for b, off, _, k in buffer.parts(check_int("fill: offset", offset), n // 4 * 4):
                self.fill(b, value, off, k)
            return
        if buffer.ctx is not self.ctx:
            raise ValueError("fill: the buffer belongs to another context")
        binding.require().vkCmdFillBuffer(self._cmd, buffer.handle, offset, nbytes, int(value))
        self._buffers[buffer.serial] = buffer

    def timestamp(self, label: str) -> None:
        """Record a GPU timestamp taken when the commands before it have finished.

        Raises ValueError (label not a new str; more than MAX_TIMESTAMPS), RuntimeError (the
        device has no timestamps on its compute queue: see ``ctx.info.timestamps``).
        """
        self._recording()
        if not isinstance(label, str) or label in self._labels:
            raise ValueError(f"timestamp: label must be a str not used before in this sequence, got {label!r}")
        if not self.ctx.info.timestamps:
            raise RuntimeError(f"timestamp: {self.ctx.info.name} has no timestamps on its compute queue")
        if len(self._labels) == MAX_TIMESTAMPS:
            raise ValueError(f"timestamp: at most {MAX_TIMESTAMPS} per sequence")
        vk = binding.require()
        if self._queries is None:
            with binding.translated("vkCreateQueryPool"):
                self._queries = vk.vkCreateQueryPool(self.ctx.handle, vk.VkQueryPoolCreateInfo(
                    queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=MAX_TIMESTAMPS), None)
        if not self._labels:  # queries must be reset before each write, and each submission replays this
            vk.vkCmdResetQueryPool(self._cmd, self._queries, 0, MAX_TIMESTAMPS)
        vk.vkCmdWriteTimestamp(self._cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, self._queries, len(self._labels))
        self._labels.append(label)

    def finish(self) -> None:
        """End recording. Adds the barrier that exposes the writes to later work and to the host."""
        self._recording()
        self._memory_barrier(host=True)
        binding.check_result(binding.vk.lib.vkEndCommandBuffer(self._cmd), "vkEndCommandBuffer")
        self._state = _READY

    def reset(self) -> None:
        """Discard the recording (waits if pending) and start a new one."""
        if self.closed:
            raise RuntimeError("this Sequence is closed")
        self.wait()
        binding.check_result(binding.vk.lib.vkResetCommandPool(self.ctx.handle, self._pool, 0), "vkResetCommandPool")
        self._begin()

    # -- execution ----------------------------------------------------------------------------------

    def submit(self, wait: bool = True, timeout_s: float | None = None) -> None:
        """Run the recorded commands (after the previous run of this sequence, if pending).

        ``wait=False`` returns at once; call :meth:`wait` before reading results. Raises
        RuntimeError (not finished; a buffer or kernel used was closed), DeviceLost (the context
        is then lost: get_context() makes a new one), VulkanTimeout, VulkanError.
        """
        if self.closed or self._state != _READY:
            raise RuntimeError("submit: the Sequence is closed or not finished")
        ctx = self.ctx
        closures = ctx.closures
        if closures != self._checked:  # else no buffer or kernel closed since they were last found open
            for buf in self._buffers.values():
                if buf.closed:
                    raise RuntimeError(f"submit: {buf!r} used by this sequence is closed; record it again")
            for kernel in self._kernels:
                if kernel.closed:
                    raise RuntimeError(f"submit: {kernel!r} used by this sequence is closed; record it again")
            self._checked = closures
        if ctx.lost or ctx.closed:
            ctx.check_usable()  # raises
        if self.pending:
            self.wait(timeout_s)
        seams = ctx.seams
        fault = None if self.internal or seams.submit_fault is None else seams.take_submit_fault()
        if fault is DeviceLost:
            ctx.mark_lost()
            raise DeviceLost("vkQueueSubmit failed: VK_ERROR_DEVICE_LOST (injected by fail_next_submit)", -4)
        lib = self._lib
        with ctx.lock:
            result = lib.vkResetFences(ctx.handle, 1, self._fences)
            if result == 0:
                self._submit_t = time.perf_counter()
                result = lib.vkQueueSubmit(ctx.queue, 1, self._submit_info, self._fence)
            if result != 0:
                raise self._failed(result, "vkQueueSubmit")
            ctx.stats.submits += 1
            self.pending = self._submitted = True
            ctx.pending.add(self)
        if fault is VulkanTimeout:
            raise VulkanTimeout("waiting for the GPU timed out (injected by fail_next_submit)", 2)
        if wait:
            self.wait(timeout_s)

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the last submission has finished (no-op when none is pending).

        Raises VulkanTimeout after ``timeout_s`` (default ``ctx.timeout_s``; the work stays
        pending), DeviceLost.
        """
        if not self.pending:
            return
        ctx = self.ctx
        timeout = ctx.timeout_s if timeout_s is None else timeout_s
        spin = poll_window(ctx.spin_s, self.last_run_s)
        if spin > 0 and self._polled(min(spin, timeout)):
            self.last_run_s = time.perf_counter() - self._submit_t
            self.pending = False
            ctx.pending.discard(self)
            return
        timeout_ns = int(timeout * 1e9)
        result = self._lib.vkWaitForFences(ctx.handle, 1, self._fences, 1, timeout_ns)
        if result != 0:
            raise self._failed(result, "vkWaitForFences")
        self.last_run_s = time.perf_counter() - self._submit_t   # (with the driver's wake-up in it)
        self.pending = False
        ctx.pending.discard(self)

    def _polled(self, seconds: float) -> bool:
        """Whether the fence signalled within ``seconds`` of polling it (raises what the poll
        reports other than VK_NOT_READY, DeviceLost above all)."""
        status, handle, fence = self._lib.vkGetFenceStatus, self.ctx.handle, self._fence
        end = time.perf_counter() + seconds
        while True:
            result = status(handle, fence)
            if result == 0:
                return True
            if result != _NOT_READY:
                raise self._failed(result, "vkGetFenceStatus")
            if time.perf_counter() >= end:
                return False

    def _failed(self, result: int, what: str):
        error = binding.error_for_result(result, what)
        if isinstance(error, DeviceLost):
            self.ctx.mark_lost()
        return error

    def gpu_times(self) -> dict[str, float]:
        """Nanoseconds from the first timestamp to each labelled one, for the last submission
        (waits for it). Raises RuntimeError when the sequence was never submitted since recorded."""
        ticks = self._ticks()
        if not ticks:
            return {}
        mask, period = self._tick_mask(), self.ctx.info.timestamp_period
        first = ticks[0]
        return {label: ((t - first) & mask) * period for label, t in zip(self._labels, ticks, strict=True)}

    def host_times(self) -> dict[str, float]:
        """Each labelled timestamp of the last submission on the host's clock: seconds of
        ``time.monotonic()`` (Linux's CLOCK_MONOTONIC, which ``time.perf_counter()`` also reads there),
        so GPU events can be placed between host events (benchmarks: where a call's wall time
        goes). Waits for the submission. Needs calibrated timestamps (``ctx.calibration``: the
        device offers VK_KHR/EXT_calibrated_timestamps with CLOCK_MONOTONIC). Raises RuntimeError
        without them or when the sequence was never submitted since recorded."""
        ctx = self.ctx
        if not ctx.calibration:
            raise RuntimeError(f"host_times: {ctx.info.name} has no calibrated timestamps on CLOCK_MONOTONIC")
        ticks = self._ticks()
        device_tick, host_ns = calibrate(ctx)
        mask, period = self._tick_mask(), ctx.info.timestamp_period
        half = (mask >> 1) + 1
        out = {}
        for label, t in zip(self._labels, ticks, strict=True):
            back = (device_tick - t) & mask   # ticks from the timestamp to the calibration sample
            if back >= half:
                back -= mask + 1              # (a timestamp after the sample: not expected, kept exact)
            out[label] = (host_ns - back * period) / 1e9
        return out

    def _ticks(self) -> list[int]:
        """The raw timestamps of the last submission, masked to the queue's valid bits (waits)."""
        if not self._submitted:
            raise RuntimeError("no timestamps yet: submit the sequence first")
        self.wait()
        if not self._labels:
            return []
        vk = binding.require()
        n = len(self._labels)
        ticks = vk.ffi.new("uint64_t[]", n)
        with binding.translated("vkGetQueryPoolResults"):
            vk.vkGetQueryPoolResults(self.ctx.handle, self._queries, 0, n, 8 * n, ticks, 8,
                                     vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
        mask = self._tick_mask()
        return [int(t) & mask for t in ticks]

    def _tick_mask(self) -> int:
        bits = self.ctx.info.timestamp_valid_bits
        return (1 << bits) - 1 if bits < 64 else (1 << 64) - 1

    # -- lifetime -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for a pending run (unless the device is lost), then free everything. Idempotent.

        A run still going when that wait times out is not freed under the GPU: the context is
        marked lost (later use raises DeviceLost and get_context() makes a new one) and this
        sequence stays registered with it, so Context.close frees it after vkDeviceWaitIdle.
        """
        if self.closed:
            return
        if self.pending and not self.ctx.lost:
            try:
                self.wait()
            except VulkanTimeout:
                self.ctx.mark_lost()
                return
            except binding.VulkanError:
                pass  # DeviceLost (marked by wait) or another failure: the run is over either way
        self.closed = True
        self.pending = False
        self.ctx.pending.discard(self)
        self.ctx.owned.forget(self)
        self._release()
        self._release_sets()

    def _release(self) -> None:
        vk = binding.require()
        device = self.ctx.handle
        if self._queries is not None:
            vk.vkDestroyQueryPool(device, self._queries, None)
            self._queries = None
        if self._fence is not None:
            vk.vkDestroyFence(device, self._fence, None)
            self._fence = None
        if self._pool is not None:
            vk.vkDestroyCommandPool(device, self._pool, None)  # frees its command buffer
            self._pool = None

    def __enter__(self) -> Sequence:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@functools.cache
def _barrier(host: bool):
    """(VkMemoryBarrier[1], src stages, dst stages): compute and transfer writes → later compute
    and transfer reads and writes, and host reads when ``host``. Built once; never freed."""
    vk = binding.require()
    stages = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
    dst_access = (vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
                  | vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT)
    dst_stages = stages
    if host:
        dst_stages |= vk.VK_PIPELINE_STAGE_HOST_BIT
        dst_access |= vk.VK_ACCESS_HOST_READ_BIT
    barrier = vk.ffi.new("VkMemoryBarrier[1]", [{
        "sType": vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER, "dstAccessMask": dst_access,
        "srcAccessMask": vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT}])
    return barrier, stages, dst_stages


@contextlib.contextmanager
def oneshot(ctx: Context) -> Iterator[Sequence]:
    """Record into the context's reusable sequence; on leaving the block it is finished,
    submitted and waited for (not when the block raised). Holds ``ctx.lock`` throughout.

    ``with oneshot(ctx) as seq: seq.copy(a, b, n)``. Raises what Sequence raises.
    """
    if not isinstance(ctx, Context):
        raise TypeError(f"ctx: expected a Context, got {type(ctx).__name__}")
    slot = ctx.owned.extension("oneshot", Slot)
    with ctx.lock:
        seq = slot.obj
        if seq is None or seq.closed:
            seq = slot.obj = Sequence(ctx)
            seq.internal = True
        else:
            seq.reset()  # also drops what a block that raised had recorded
        yield seq
        seq.finish()
        seq.submit(wait=True)


def calibrate(ctx: Context) -> tuple[int, int]:
    """One calibration sample: (the device's timestamp counter, CLOCK_MONOTONIC in ns) read
    together by vkGetCalibratedTimestamps, the pair whose deviation is smallest of three tries.
    Raises RuntimeError when ``ctx`` has no calibrated timestamps."""
    if not ctx.calibration:
        raise RuntimeError(f"calibrate: {ctx.info.name} has no calibrated timestamps on CLOCK_MONOTONIC")
    vk = binding.require()
    suffix = ctx.calibration.split("_")[1]
    fn = vk.vkGetDeviceProcAddr(ctx.handle, f"vkGetCalibratedTimestamps{suffix}")
    infos = vk.ffi.new("VkCalibratedTimestampInfoKHR[2]")
    for i, domain in enumerate((TIME_DOMAIN_DEVICE, TIME_DOMAIN_MONOTONIC)):
        infos[i].sType = CALIBRATION_STYPES[ctx.calibration]
        infos[i].timeDomain = domain
    best = None
    stamps = vk.ffi.new("uint64_t[2]")
    for _ in range(3):
        with binding.translated("vkGetCalibratedTimestamps"):
            deviation = int(fn(ctx.handle, 2, infos, stamps))
        if best is None or deviation < best[0]:
            best = (deviation, int(stamps[0]), int(stamps[1]))
    return best[1], best[2]
