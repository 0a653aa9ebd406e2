"""ssm_vk: the selective scan and its backward as Vulkan compute shaders (ssm_vk/glsl/ and each kernel
family's ssm_vk/<family>/glsl/), driven from
Python through the ``vulkan`` binding.

Same names as ssm_ref / ssm_fast (``ssm_scan``, ``ssm_scan_back``, ``supports``, ``NAME``; the
Mamba-3 scan's ``mamba3_scan``, ``mamba3_scan_back``: ssm_vk/mamba3/), plus
device-resident work: ``devices()``, ``to_device()``, ``DeviceArray``, and calls prepared once
and replayed (``prepare_scan``, ``prepare_scan_back``, ``prepare_mamba3_scan``,
``prepare_mamba3_scan_back``). ``SSM_VK_DEVICE=<index>``
picks the device (default: first discrete GPU, else integrated, else a CPU implementation such
as lavapipe); every setting is in :mod:`ssm_vk.config`. Importing works without Vulkan; the
functions then fall back to ssm_fast and say so. The layers, one way down: api -> prepared,
replay_cache -> replay -> run, support -> engine -> workspace -> decision -> registry -> the
kernel families (sequential/, chunked/, m1/) -> recording -> family, kernel_specs -> sizing/ ->
config; runtime under all (docs/ARCHITECTURE.md; tests/test_layers.py holds them).
"""

from __future__ import annotations

from ssm_ref._version import __version__

from . import config, runtime
from .api import NAME, ssm_scan, ssm_scan_back, supports
from .arrays import DeviceArray, to_device
from .mamba3_api import mamba3_scan, mamba3_scan_back
from .mamba3_prepared import prepare_mamba3_scan, prepare_mamba3_scan_back
from .prepared import PreparedCall, prepare_scan, prepare_scan_back
from .runtime import DeviceInfo

# K state snapshots (docs/SPEC.md section 3.1): every slot written, as ssm_ref's (docs/PORTING.md).
SNAPSHOTS = "all"


def devices() -> list[DeviceInfo]:
    """Every Vulkan device of this machine (index, name, type, subgroup size, memory, limits);
    empty without a Vulkan loader or driver."""
    ok, _ = runtime.available()
    return runtime.list_devices() if ok else []


def __dir__():
    # The public names only: the modules that imports attach (api, engine, replay_cache, workspace, ...)
    # are internals, imported by their path (``import ssm_vk.engine``).
    return sorted(__all__)


__all__ = ["NAME", "SNAPSHOTS", "__version__", "config", "DeviceArray", "DeviceInfo", "PreparedCall", "devices",
           "mamba3_scan", "mamba3_scan_back", "prepare_mamba3_scan", "prepare_mamba3_scan_back", "prepare_scan",
           "prepare_scan_back", "runtime", "ssm_scan",
           "ssm_scan_back", "supports", "to_device"]
