"""Finding the backends a command runs: the three of this package, or any module that exposes the
interface of docs/API.md (NAME, ssm_scan, ssm_scan_back, supports) -- a port under test."""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass
from types import ModuleType

from .common import UsageError

KNOWN = ("ssm_ref", "ssm_fast", "ssm_vk")
ALIASES = {"ref": "ssm_ref", "fast": "ssm_fast", "vk": "ssm_vk", "numpy": "ssm_ref", "numba": "ssm_fast",
           "vulkan": "ssm_vk"}
INTERFACE = ("NAME", "ssm_scan", "ssm_scan_back", "supports")
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@dataclass
class Backend:
    """A backend module, or the reason it cannot run here (``module`` None)."""

    name: str
    module: ModuleType | None
    reason: str = ""
    requested: bool = False   # named on the command line (then it must run)

    @property
    def available(self) -> bool:
        return self.module is not None

    @property
    def is_vulkan(self) -> bool:
        return self.name == "ssm_vk"

    def device(self):
        """The Vulkan DeviceInfo ssm_vk uses (None for CPU backends)."""
        if not self.is_vulkan or self.module is None:
            return None
        return self.module.runtime.get_context().info

    def where(self) -> str:
        """Where it runs, in ggml's words, with the device's name."""
        info = self.device()
        return "CPU" if info is None else f"{info.where} ({info.name})"


def _interface_missing(mod: ModuleType) -> list[str]:
    return [a for a in INTERFACE if not hasattr(mod, a)]


def load(name: str, requested: bool = False) -> Backend:
    """The backend ``name`` (an alias, one of :data:`KNOWN`, or a module path).

    Raises UsageError for a name that is no module, or a module of yours that lacks the interface.
    A known backend that cannot run here (not built yet; no Vulkan device) comes back with
    ``module=None`` and the reason.
    """
    name = ALIASES.get(name, name)
    if not _MODULE.fullmatch(name):
        raise UsageError(f"--backend {name}: not a module name")
    try:
        mod = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if name in KNOWN:
            return Backend(name, None, f"not installed ({e})", requested)
        raise UsageError(f"--backend {name}: no such module (known: {', '.join(KNOWN)}, or a module "
                         "of yours with NAME, ssm_scan, ssm_scan_back, supports on PYTHONPATH)") from None
    missing = _interface_missing(mod)
    if missing:
        if name in KNOWN:
            return Backend(name, None, f"not built yet (lacks {', '.join(missing)})", requested)
        raise UsageError(f"--backend {name}: the module lacks {', '.join(missing)} "
                         "(docs/API.md: NAME, ssm_scan, ssm_scan_back, supports)")
    if name == "ssm_vk":
        ok, why = mod.runtime.available()
        if not ok:
            return Backend(name, None, f"no Vulkan device ({why})", requested)
        try:
            mod.runtime.get_context()
        except ValueError as e:  # SSM_VK_DEVICE out of range: the user's setting
            raise UsageError(str(e)) from None
        except mod.runtime.VulkanUnavailable as e:
            return Backend(name, None, f"no Vulkan device ({e})", requested)
    return Backend(name, mod, "", requested)


def resolve(names: list[str] | None, device: str | None = None) -> list[Backend]:
    """The backends of ``--backend`` (every known one when None), in order. ``device`` sets
    SSM_VK_DEVICE first (before any Vulkan context exists)."""
    if device is not None:
        if not re.fullmatch(r"\d+", str(device)):
            raise UsageError(f"--device {device}: expected a device index (see ssm-scan info)")
        os.environ["SSM_VK_DEVICE"] = str(device)
    if not names:
        return [load(n) for n in KNOWN]
    out = []
    for n in names:
        b = load(n, requested=True)
        if b.name not in [o.name for o in out]:
            out.append(b)
    return out
