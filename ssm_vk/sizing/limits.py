"""The device limits the planners respect, taken whole from a DeviceInfo, and the checks every
plan shares: the grid of a dispatch, the most elements one binding may cover, windows.

Pure Python (no Vulkan): tests build Limits of their own, down to the Vulkan spec's minimums.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["F32", "Limits", "TooLarge", "Window", "binding_cap", "grid", "most_that_fit", "SPEC_MINIMUMS"]

F32 = 4


class TooLarge(ValueError):
    """The problem cannot be cut into windows that fit this device's limits."""


@dataclass(frozen=True)
class Limits:
    """What the planners and the support decision respect, all from the device (``Limits.of``);
    tests may build smaller ones. The defaults of the later fields are the Vulkan 1.1 spec's
    minimums where that is the safe side, so a Limits made from the first fields alone never
    promises more than every device offers."""

    subgroup_size: int
    subgroup_ops: frozenset          # subgroup operation classes in compute shaders ("basic", ...)
    max_workgroup_invocations: int
    max_shared_memory: int
    max_workgroup_count: tuple       # (x, y, z)
    max_storage_buffer_range: int
    max_memory_allocation_size: int
    min_storage_buffer_offset_alignment: int
    max_workgroup_size: tuple = (128, 128, 64)
    max_push_constants_size: int = 128
    max_storage_buffers_per_stage: int = 32
    max_memory_allocation_count: int = 4096
    device_local_bytes: int = 1 << 62
    device_type: str = "other"       # DeviceInfo.type: "discrete", "integrated", "virtual", "cpu", "other"

    @classmethod
    def of(cls, info, no_subgroup: bool = False) -> Limits:
        """The Limits of device ``info`` (a DeviceInfo, possibly with lowered limits); without any
        subgroup operation when ``no_subgroup`` (the shared-memory row sums)."""
        return cls(
            subgroup_size=info.subgroup_size,
            subgroup_ops=frozenset() if no_subgroup else frozenset(info.subgroup_ops),
            max_workgroup_invocations=info.max_workgroup_invocations, max_shared_memory=info.max_shared_memory,
            max_workgroup_count=tuple(info.max_workgroup_count),
            max_storage_buffer_range=info.max_storage_buffer_range,
            max_memory_allocation_size=info.max_memory_allocation_size,
            min_storage_buffer_offset_alignment=info.min_storage_buffer_offset_alignment,
            max_workgroup_size=tuple(info.max_workgroup_size),
            max_push_constants_size=info.max_push_constants_size,
            max_storage_buffers_per_stage=info.max_storage_buffers_per_stage,
            max_memory_allocation_count=info.max_memory_allocation_count,
            device_local_bytes=info.device_local_bytes, device_type=info.type)


# The Vulkan 1.1 spec's minimums (required limits), for tests that plan on the weakest device.
SPEC_MINIMUMS = dict(
    max_workgroup_invocations=128, max_shared_memory=16384, max_workgroup_count=(65535, 65535, 65535),
    max_storage_buffer_range=1 << 27, max_workgroup_size=(128, 128, 64), max_push_constants_size=128,
    max_storage_buffers_per_stage=4, max_memory_allocation_count=4096,
)


# The token-sequential layouts' default checkpoint interval (sequential_planner's K): their token
# windows are multiples of it, and so are to_device's cuts of a long sequence (sizing.even_cuts).
DEFAULT_K = 8


def granule(offset_alignment: int) -> int:
    """The bytes a driver may round a storage buffer's memory up to (VkMemoryRequirements.size):
    taken as the device's minStorageBufferOffsetAlignment and at least 16 (NVIDIA's drivers round
    a buffer of 1608 bytes to 1616; lavapipe rounds less). A buffer of at most
    :func:`alloc_cap` bytes is then allocated within maxMemoryAllocationSize."""
    return max(16, offset_alignment)


def alloc_cap(max_allocation: int, offset_alignment: int, heap: int = 1 << 62) -> int:
    """The most bytes one buffer may hold: one allocation (maxMemoryAllocationSize), within the
    largest device-local heap, less what the driver's rounding (:func:`granule`) would add."""
    g = granule(offset_alignment)
    return min(max_allocation, heap) // g * g


def binding_cap(lim: Limits) -> int:
    """The most float32 elements one binding may cover, the slack of an aligned offset included:
    a binding lies in one buffer, so it is bounded by both the storage-buffer range and the
    allocation size (less the driver's rounding: :func:`granule`, at least the offset's slack)."""
    return (min(lim.max_storage_buffer_range, lim.max_memory_allocation_size)
            - granule(lim.min_storage_buffer_offset_alignment)) // F32


def rows_in_place(d, lim: Limits) -> bool:
    """Whether the token-sequential scan reads each sequence's initial state from the cache
    s[ids] in place (s fits one binding) rather than from the rows copied into the states."""
    n = d.R * d.H * d.P * d.N
    return d.S > 0 and 0 < n <= binding_cap(lim)


def most_that_fit(n: int, fits) -> int:
    """The largest k in [0, n] with ``fits(k)`` (0 when none), for a ``fits`` true up to some k
    and false beyond: the planners' windows (sequences, tokens or chunks per window)."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def grid(n_groups: int, lim: Limits) -> tuple[int, int]:
    """(gx, gy) with gx * gy >= n_groups inside maxComputeWorkGroupCount; shaders flatten it."""
    mx, my = lim.max_workgroup_count[0], lim.max_workgroup_count[1]
    gx = max(1, min(n_groups, mx))
    gy = max(1, -(-n_groups // gx))
    if gy > my:
        raise TooLarge(f"{n_groups} workgroups exceed maxComputeWorkGroupCount {lim.max_workgroup_count[:2]}")
    return gx, gy


@dataclass(frozen=True)
class Window:
    """Sequences [i0, i1) and tokens [t0, t1) that one round of dispatches covers."""

    i0: int
    i1: int
    t0: int
    t1: int

    @property
    def S(self) -> int:
        return self.i1 - self.i0

    @property
    def T(self) -> int:
        return self.t1 - self.t0
