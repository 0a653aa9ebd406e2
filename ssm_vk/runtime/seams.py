"""A context's test seams: faults made on purpose, limits lowered, the staging path forced.

Each context holds one :class:`Seams` (``ctx.seams``), made with it and lost with it, so a seam
armed on one context never reaches the next one. The runtime reads it where a real fault would
strike: ``Sequence.submit`` (:meth:`Seams.take_submit_fault`), ``Buffer`` (:meth:`Seams.take_allocation_fault`),
the transfers (``force_staging``); everything that splits work reads ``ctx.info``, which
:meth:`Seams.override_limits` swaps. docs/VULKAN.md ("Test seams") and docs/RELIABILITY.md say
what the tests do with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import device
from .binding import DeviceLost, VulkanTimeout

if TYPE_CHECKING:
    from .device import DeviceInfo


class Seams:
    """The seams of one context (``ctx.seams``). Attributes: ``submit_fault`` (the error armed by
    :meth:`fail_next_submit`, or None), ``force_staging`` (True: transfers and ``Buffer.peek`` of
    device buffers go through the staging path even when the memory is mappable, as on a
    discrete GPU; staging buffers stay mapped, as they are there)."""

    def __init__(self, ctx):
        self._ctx = ctx
        self.submit_fault: type[Exception] | None = None
        self.force_staging = False
        self._allocation_faults = 0   # allocations left to fail

    def override_limits(self, **limits) -> LimitOverride:
        """Lower device limits for tests: ``ctx.seams.override_limits(max_workgroup_count=(4, 4, 4))``.

        Every check of the runtime and every caller that splits work reads ``ctx.info``, so tiny
        limits exercise the splitting paths on any device. Returns a handle that restores the
        previous limits on ``restore()`` or at the end of a ``with`` block. Raises ValueError for
        an unknown limit or a value above the device's own.
        """
        ctx = self._ctx
        previous = ctx.info
        ctx.info = device.lowered(ctx.info, ctx.hardware_info, **limits)
        return LimitOverride(ctx, previous)

    def fail_next_submit(self, error: type[Exception] = DeviceLost) -> None:
        """Make the next ``Sequence.submit`` raise ``error`` (DeviceLost or VulkanTimeout).

        Only the caller's own sequences count: the runtime's internal transfer sequence (staging
        copies for upload/download on devices whose memory the host cannot map, such as a
        discrete GPU) never takes the fault, so a test hits the same submit on lavapipe and on a
        discrete GPU, not a staging copy.

        DeviceLost is raised without submitting and marks the context lost, as a real loss would.
        VulkanTimeout is raised after the work was submitted, as when a wait times out: the
        sequence stays pending and a later wait completes it. Raises ValueError for another type.
        """
        if error not in (DeviceLost, VulkanTimeout):
            raise ValueError(f"fail_next_submit: expected DeviceLost or VulkanTimeout, got {error!r}")
        self.submit_fault = error

    def take_submit_fault(self) -> type[Exception] | None:
        """The fault armed by :meth:`fail_next_submit`, disarming it (commands.py)."""
        fault, self.submit_fault = self.submit_fault, None
        return fault

    def fail_allocations(self, count: int = 1) -> None:
        """Make the next ``count`` device-memory allocations of this context fail with
        OutOfDeviceMemory, as a driver that ran out of memory would (0 disarms). Exhausting a real
        device would disturb everything else on it."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"fail_allocations: count must be an int >= 0, got {count!r}")
        with self._ctx.lock:
            self._allocation_faults = count

    def take_allocation_fault(self) -> bool:
        """True (and one fewer armed) when the allocation about to be made must fail (memory.py)."""
        with self._ctx.lock:   # read each time: a forked child's context renews its lock
            if self._allocation_faults <= 0:
                return False
            self._allocation_faults -= 1
            return True


class LimitOverride:
    """Handle returned by :meth:`Seams.override_limits`: restores the limits it replaced."""

    def __init__(self, ctx, previous: DeviceInfo):
        self._ctx, self._previous = ctx, previous

    def restore(self) -> None:
        self._ctx.info = self._previous

    def __enter__(self) -> LimitOverride:
        return self

    def __exit__(self, *exc) -> None:
        self.restore()
