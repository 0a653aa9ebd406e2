"""ssm_vk: the selective scan and its backward as Vulkan compute shaders (ssm_vk/glsl/), driven from
Python through the ``vulkan`` binding.

Same names as ssm_ref / ssm_fast (``ssm_scan``, ``ssm_scan_back``, ``supports``, ``NAME``), plus
device-resident work: ``devices()``, ``to_device()``, ``DeviceArray``. ``SSM_VK_DEVICE=<index>``
picks the device (default: first discrete GPU, else integrated, else a CPU implementation such
as lavapipe). Importing works without Vulkan; the functions then fall back to ssm_fast and say so.
"""

from __future__ import annotations

from ssm_ref._version import __version__

from . import runtime
from .arrays import DeviceArray, to_device
from .backend import NAME, ssm_scan, ssm_scan_back, supports
from .runtime import DeviceInfo


def devices() -> list[DeviceInfo]:
    """Every Vulkan device of this machine (index, name, type, subgroup size, memory, limits);
    empty without a Vulkan loader or driver."""
    ok, _ = runtime.available()
    return runtime.list_devices() if ok else []


__all__ = ["NAME", "__version__", "DeviceArray", "DeviceInfo", "devices", "runtime", "ssm_scan", "ssm_scan_back",
           "supports", "to_device"]
