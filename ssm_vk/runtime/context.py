"""The process's Vulkan context: logical device, compute queue, lock, and their lifetime.

One :class:`Context` is open per process at a time; :func:`get_context` creates it lazily and
:func:`close` (or ``atexit``) releases it. Every object of this package (buffers, kernels,
sequences, pools) is registered with the context that made it (``ctx.owned``, owned.py), and
``Context.close()`` releases whatever is still open, newest first, before the device. The
instance and the validation layer's messenger are instance.py's; the test seams (``ctx.seams``)
seams.py's.

Thread safety: ``Context.lock`` (a re-entrant lock) serialises queue submission, the kernel and
descriptor-set caches, allocation bookkeeping and the shared one-shot command sequence. A
``Sequence`` records into a command pool of its own, so different threads may record different
sequences at once; one sequence must not be used from two threads at a time.
"""

from __future__ import annotations

import atexit
import itertools
import os
import threading
from dataclasses import dataclass

from .. import config
from . import binding, device, instance
from .binding import DeviceLost, VulkanUnavailable
from .owned import Owned
from .seams import Seams

_current: Context | None = None          # the open context of this process, if any
_current_lock = threading.Lock()         # guards _current
_get_lock = threading.Lock()             # makes get_context's look-then-create atomic


@dataclass
class Stats:
    """Counters for tests and tuning: how often the costly Vulkan paths ran."""

    descriptor_writes: int = 0       # vkUpdateDescriptorSets calls (costly from Python: docs/VULKAN.md)
    descriptor_sets: int = 0         # descriptor sets allocated
    pipelines: int = 0               # compute pipelines created
    submits: int = 0                 # vkQueueSubmit calls
    uploads: int = 0                 # host arrays written toward device buffers (upload, Stage.put)
    uploaded_bytes: int = 0          # their bytes


@dataclass(frozen=True)
class Allocations:
    """Device memory held by a context: ``count`` VkDeviceMemory objects of ``nbytes`` in total."""

    count: int
    nbytes: int


class Context:
    """Vulkan instance + one logical device with one compute queue.

    Create it through :func:`get_context` (one per process). Attributes: ``info`` (the
    :class:`DeviceInfo` every request is checked against, possibly with lowered limits),
    ``validation`` (bool), ``validation_messages`` (list of str: every warning or error the
    validation layer reported), ``stats`` (:class:`Stats`), ``lock``, ``timeout_s`` (how long a
    wait may take before VulkanTimeout: ``$SSM_VK_TIMEOUT_S``, else 60 s, 600 s on a CPU), ``spin_s``
    (how long a wait polls the fence before it blocks; ``$SSM_VK_SPIN_US``), ``owned``
    (:class:`owned.Owned`: the objects made through it, its extensions), ``seams``
    (:class:`seams.Seams`: faults and lowered limits for tests).

    Raises VulkanUnavailable (no loader, driver, device, Vulkan 1.1, or validation layer), ValueError (a bad
    device index), RuntimeError (another context is open), VulkanError (device creation failed).
    """

    def __init__(self, device_index: int | str | None = None, validation: bool | None = None):
        global _current
        config.timeout_s()                       # the settings, checked before any Vulkan call
        want_stats = config.pipeline_stats()
        if validation is None:
            validation = config.validation()
        if not isinstance(validation, bool):
            raise TypeError(f"validation: expected bool or None, got {type(validation).__name__}")
        chosen = device.choose(device.list_devices(), device_index)  # raises before any Vulkan object exists
        # A short wait is caught sooner by polling the fence than by sleeping in the driver, which
        # wakes late (docs/VULKAN.md, "Devices measured"); on a CPU implementation the poll would
        # take a core from the work it waits for, so it does not poll unless asked to.
        spin_s = config.spin_us(0 if chosen.type == "cpu" else 200) / 1e6
        timeout_s = config.timeout_s(cpu=chosen.type == "cpu")
        if chosen.api_version < (1, 1):
            raise VulkanUnavailable(f"{chosen.name} offers Vulkan {chosen.api_version}; 1.1 is needed (subgroups)")
        vk = binding.require()
        self.validation = validation
        self.validation_messages: list[str] = []
        self.stats = Stats()
        self.lock = threading.RLock()
        self.timeout_s = timeout_s
        self.spin_s = spin_s                     # how long a wait polls its fence before blocking
        self.closed = False
        self.ready = False                       # True once built: current_context() hands out only these
        self.lost = False
        self.retired = False                     # closed for new work, destroyed when the last call leaves
        self._inside: set = set()                # tokens of the calls inside the context now (enter/leave)
        self._tokens = itertools.count(1)
        self._closing = False
        self._calls_lock = threading.Lock()      # serialises close()
        self.hardware_info = chosen               # the device's own limits; ``info`` may lower them
        self.info: device.DeviceInfo = chosen
        self._vk = vk
        self.owned = Owned(self)                 # the objects made through it, its extensions; closed with it
        self.seams = Seams(self)                 # the test seams: injected faults, lowered limits
        self._alloc_count = 0
        self._alloc_bytes = 0
        self.closures = 0                        # buffers and kernels closed so far (commands.py: a Sequence
                                                 # checks its own for closed ones when this moved)
        self.pending: set = set()               # commands.py: sequences submitted and not yet waited for
                                                 # (by their own thread; a hint for wait_idle)
        self._kernels: dict = {}                 # the pipeline cache: pipelines.py's key → Kernel
                                                 # (cached_kernel / cache_kernel)
        self.staging_chunk_bytes = 64 << 20      # transfer.py: largest staging buffer (bigger copies are chunked)
        self._instance = self._messenger = None
        self.handle = None                       # the VkDevice; callers check_usable() before new work
        self.calibration: str | None = None      # the calibrated-timestamps extension enabled, if any
                                                 # (commands.Sequence.host_times)
        # Compile statistics (Kernel.statistics): asked for by SSM_VK_PIPELINE_STATS, read before
        # any Vulkan call; kept when the device offers them, else why not.
        self.pipeline_stats = False
        self.pipeline_stats_missing = "" if want_stats else \
            "not asked for (set SSM_VK_PIPELINE_STATS=1 before the Vulkan context is made)"
        with _current_lock:
            if _current is not None and not _current.closed:
                raise RuntimeError("a Vulkan context is already open in this process; "
                                   "use get_context() or close it first")
            _current = self
        try:
            self._create(chosen)
        except BaseException:
            self._destroy_core()
            with _current_lock:
                _current = None
            raise
        atexit.register(self.close)
        self.ready = True

    # -- creation ---------------------------------------------------------------------------------

    def _create(self, chosen: device.DeviceInfo) -> None:
        vk = self._vk
        ffi = vk.ffi
        self._instance = instance.process_instance(self.validation)
        if self.validation:
            self._messenger = instance.Messenger(self._instance, self.validation_messages)
        physical = device.physical_devices(self._instance)[chosen.index]
        family, _ = device.compute_queue_family(physical)
        extensions = device.device_extensions(physical)
        self.calibration = device.calibration_extension(self._instance, physical, extensions)
        feats, atomic = device.query_features(physical, extensions)
        # Enable exactly the optional features DeviceInfo reports, so shaders may use what it promises.
        wanted = ffi.new("VkPhysicalDeviceFeatures2*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2})
        wanted.features.shaderFloat64 = feats.features.shaderFloat64
        wanted.features.shaderInt64 = feats.features.shaderInt64
        wanted.features.shaderInt16 = feats.features.shaderInt16
        device_extensions = device.base_extensions(self.calibration, extensions)
        if atomic is not None and atomic.shaderBufferFloat32AtomicAdd:
            want_atomic = ffi.new("VkPhysicalDeviceShaderAtomicFloatFeaturesEXT*", {
                "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT,
                "shaderBufferFloat32Atomics": 1, "shaderBufferFloat32AtomicAdd": 1})
            wanted.pNext = want_atomic
            device_extensions.append(device.ATOMIC_FLOAT_EXTENSION)
        if not self.pipeline_stats_missing:
            stats_feature = device.pipeline_stats_feature(physical, extensions)
            if stats_feature is None:
                self.pipeline_stats_missing = f"{chosen.name} does not offer {device.PIPELINE_STATS_EXTENSION}"
            else:
                stats_feature.pNext = wanted.pNext
                wanted.pNext = stats_feature
                device_extensions.append(device.PIPELINE_STATS_EXTENSION)
                self.pipeline_stats = True
        queue_info = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=family, queueCount=1, pQueuePriorities=[1.0])
        info = vk.VkDeviceCreateInfo(pNext=wanted, queueCreateInfoCount=1, pQueueCreateInfos=[queue_info],
                                     enabledExtensionCount=len(device_extensions),
                                     ppEnabledExtensionNames=device_extensions or None)
        with binding.translated("vkCreateDevice"):
            self.handle = vk.vkCreateDevice(physical, info, None)
        self.queue_family = family
        self.queue = vk.vkGetDeviceQueue(self.handle, family, 0)
        mem = vk.vkGetPhysicalDeviceMemoryProperties(physical)
        # (property flags, heap index) per memory type and (size, flags) per heap, copied at once.
        self.memory_types = [(int(mem.memoryTypes[i].propertyFlags), int(mem.memoryTypes[i].heapIndex))
                             for i in range(int(mem.memoryTypeCount))]
        self.memory_heaps = [(int(mem.memoryHeaps[i].size), int(mem.memoryHeaps[i].flags))
                             for i in range(int(mem.memoryHeapCount))]

    # -- state used by the other modules ------------------------------------------------------------

    def check_usable(self) -> None:
        """Raise DeviceLost if the device was lost, RuntimeError if the context is closed."""
        if self.lost:
            raise DeviceLost("the Vulkan device was lost; close this context and call get_context() again")
        if self.closed:
            raise RuntimeError("this Vulkan context is closed")

    def enter(self) -> int:
        """A call starts using the context (its device, queue and objects): until the matching
        :meth:`leave` of the token returned, nothing destroys them -- a lost context that
        :func:`get_context` replaces, or a :meth:`close` from another thread, waits for the last
        call to leave. Raises DeviceLost (lost) or RuntimeError (closed or retired): the call must
        not start.

        No lock (each call): a token's next() and a set's add are atomic; the call registers
        itself, then looks at the flags, while close() sets its flag, then looks at the calls --
        so one of the two always sees the other."""
        token = next(self._tokens)
        self._inside.add(token)
        if self.lost or self.closed or self.retired or self._closing:
            self._inside.discard(token)
            self.check_usable()
            raise RuntimeError("this Vulkan context is being closed")
        return token

    def leave(self, token: int) -> None:
        """End :meth:`enter`; the last call to leave a retired context closes it."""
        self._inside.discard(token)
        if self.retired and not self._inside:
            self.close()

    @property
    def calls(self) -> int:
        """How many calls are inside the context now."""
        return len(self._inside)

    def mark_lost(self) -> None:
        """Record that the device is gone: every later use raises DeviceLost; get_context() makes a new one."""
        self.lost = True

    def track_allocation(self, nbytes: int, count: int) -> None:
        """Book ``count`` (+1 or -1) VkDeviceMemory objects of ``nbytes`` each."""
        with self.lock:
            self._alloc_count += count
            self._alloc_bytes += count * nbytes

    def wait_idle(self) -> None:
        """If any sequence may still run, wait until the queue is idle, so that objects it could
        use may be destroyed. Raises DeviceLost (and marks the context lost), VulkanError.

        It waits on the queue, not on the sequences' fences: another thread may be closing its
        sequence, and waiting on a fence being destroyed hung (the validation layer saw it).
        """
        with self.lock:  # vkQueueWaitIdle needs the queue to itself
            if not self.pending or self.handle is None:
                return
            result = self._vk.lib.vkQueueWaitIdle(self.queue)
        if result != 0:
            error = binding.error_for_result(result, "vkQueueWaitIdle")
            if isinstance(error, DeviceLost):
                self.mark_lost()
            raise error

    def cached_kernel(self, key):
        """The Kernel cached under ``key`` (runtime/pipelines.py's key), or None (also when it was
        closed)."""
        kernel = self._kernels.get(key)
        return kernel if kernel is not None and not kernel.closed else None

    def cache_kernel(self, key, make):
        """The Kernel cached under ``key``: ``make()``'s, called under the context's lock, unless
        another thread cached one first."""
        with self.lock:
            kernel = self._kernels.get(key)
            if kernel is None or kernel.closed:
                kernel = self._kernels[key] = make()
            return kernel

    def cached_kernels(self) -> list:
        """Every Kernel in the pipeline cache now (tests count their descriptor sets)."""
        with self.lock:
            return list(self._kernels.values())

    def buffer_closed(self, serial: int) -> None:
        """Drop the cached descriptor sets that point at a closed buffer (memory.py calls this)."""
        with self.lock:
            self.closures += 1  # after the buffer's ``closed``: a submit that sees this checks it
            for kernel in self._kernels.values():
                kernel.forget_buffer(serial)

    @property
    def live_allocations(self) -> Allocations:
        """Device memory this context holds now (for leak tests)."""
        with self.lock:
            return Allocations(self._alloc_count, self._alloc_bytes)

    # -- teardown -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for the GPU, release every object made through this context, then the device and
        instance. Safe to call twice, after a device loss, and from ``atexit``. Never raises a
        Vulkan error (a lost device cannot fail its cleanup in a useful way)."""
        global _current
        with self._calls_lock:
            self._closing = True
            if self._inside and not self.closed:
                # A call is inside: retire instead -- no new work, no longer the process's
                # context -- and let the last call to leave destroy it.
                self.retired = True
                with _current_lock:
                    if _current is self:
                        _current = None
                return
        with self.lock:
            if self.closed:
                return
            self.closed = True
        vk = self._vk
        if self.handle is not None:
            try:
                vk.vkDeviceWaitIdle(self.handle)
            except (vk.VkError, vk.VkException):
                self.lost = True  # nothing is running any more on a lost device; destroying is allowed
        self.owned.close()
        self._kernels.clear()
        self._destroy_core()
        atexit.unregister(self.close)
        with _current_lock:
            if _current is self:
                _current = None

    def _destroy_core(self) -> None:
        vk = self._vk
        if self.handle is not None:
            vk.vkDestroyDevice(self.handle, None)
            self.handle = None
        if self._messenger is not None:
            self._messenger.destroy()
            self._messenger = None
        self._instance = None   # the process's, shared: destroyed at exit (instance.process_instance)

    def abandon(self) -> None:
        """Give the context up without a Vulkan call: in a forked child, whose process has the
        parent's handles but not its device. Everything made through it then refuses work."""
        self.closed = self.lost = True
        self.lock = threading.RLock()  # the parent's may have been held by a thread that is gone
        self._calls_lock = threading.Lock()
        self._inside = set()
        atexit.unregister(self.close)

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "lost" if self.lost else "open"
        return f"<Context {self.info.where} {self.info.name!r} {state}{' validation' if self.validation else ''}>"


def get_context(device_index: int | str | None = None, validation: bool | None = None) -> Context:
    """The process's open context, created on first use (device per ``device.choose``; validation
    per ``$SSM_VK_VALIDATION`` unless given). A lost or closed context is replaced by a new one.

    Raises ValueError when an open context differs from an explicit ``device_index`` or
    ``validation``, and whatever :class:`Context` raises.
    """
    with _get_lock:
        ctx = _current
        if ctx is not None and ctx.lost:
            ctx.close()  # at once, or -- while calls are inside it -- when the last one leaves
        if ctx is None or ctx.closed or ctx.retired:
            return Context(device_index, validation)
    if device_index is not None and str(device_index).strip() != str(ctx.info.index):
        raise ValueError(f"device_index={device_index}: the open context uses device {ctx.info.index}; "
                         "close() it first")
    if validation is not None and validation != ctx.validation:
        raise ValueError(f"validation={validation}: the open context has validation={ctx.validation}; close() it first")
    return ctx


def _after_fork_in_child() -> None:
    """A forked child inherits the parent's context but not its device (on lavapipe its threads;
    on a GPU its driver state): using it hung until VulkanTimeout. Abandon it -- never destroy
    what the parent still uses -- and renew the locks a parent thread may have held at the fork;
    the child's first call makes a context of its own."""
    global _current, _current_lock, _get_lock
    _current_lock, _get_lock = threading.Lock(), threading.Lock()
    if _current is not None:
        _current.abandon()
    _current = None
    instance.forget_after_fork()  # the parent's instances: never destroyed here


os.register_at_fork(after_in_child=_after_fork_in_child)


def current_context() -> Context | None:
    """The open context, or None; creates nothing. A context another thread is still building is
    not open yet (its device does not exist): None, and get_context() waits for it."""
    ctx = _current
    return ctx if ctx is not None and ctx.ready and not ctx.closed and not ctx.retired else None


def close() -> None:
    """Close the process's context if one is open (idempotent)."""
    ctx = _current
    if ctx is not None:
        ctx.close()
