"""The Vulkan runtime under ``ssm_vk``: device, memory, shaders, kernels, command sequences.

Objects and lifetimes (see docs/VULKAN.md)::

    ctx = get_context()                        # one per process; close() or atexit releases it
    buf = Buffer(ctx, nbytes)                  # device-local storage buffer
    upload(buf, array); download(buf, (shape, dtype)); fill(buf, 0)
    k = Kernel.get(ctx, "name", bindings=3, push_size=8, local_size=(64, 1, 1), spec=(...), defines={...})
    with Sequence(ctx) as seq:
        seq.dispatch(k, [a, b, (c, 0, 256)], push=struct.pack("<If", n, alpha), groups=(g, 1, 1))
        seq.finish(); seq.submit()

Importing this package never needs Vulkan: :func:`available` says whether it can be used.
"""

from .binding import DeviceLost, OutOfDeviceMemory, VulkanError, VulkanTimeout, VulkanUnavailable
from .commands import Sequence, oneshot
from .context import Context, close, current_context, get_context
from .device import DeviceInfo, available, list_devices
from .memory import Buffer
from .pieces import Pieces
from .pipelines import Kernel
from .pool import BufferPool
from .shaders import GlslcMissing, ShaderBuildError, compile_shader
from .transfer import Stage, direct, download, fill, upload

__all__ = [
    "Buffer", "BufferPool", "Context", "DeviceInfo", "DeviceLost", "GlslcMissing", "Kernel", "OutOfDeviceMemory",
    "Pieces", "Sequence", "ShaderBuildError", "Stage", "VulkanError", "VulkanTimeout", "VulkanUnavailable", "available",
    "close", "compile_shader", "current_context", "direct", "download", "fill", "get_context", "list_devices",
    "oneshot", "upload",
]
