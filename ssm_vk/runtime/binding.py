"""The one module that imports the ``vulkan`` binding, and the package's exceptions.

Everything else in ``ssm_vk.runtime`` reaches Vulkan through :data:`vk` after :func:`require` has
succeeded, so ``import ssm_vk`` works on a machine without a Vulkan loader (the binding's import
raises ``OSError`` there, not ``ImportError``: docs/VULKAN.md, the binding's sharp edge 1).

The helpers below exist for the binding's sharp edges (numbered in docs/VULKAN.md):
version numbers (2), explicit sizes instead of ``VK_WHOLE_SIZE`` (3), ``void*`` data that must
be cffi memory kept alive (5), and result codes of extensions that the binding maps with the wrong
sign (8).
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator, Sequence

try:
    import vulkan as vk
    from vulkan import _vulkan as _vk_module
except (OSError, ImportError) as exc:  # OSError: no libvulkan.so.1; ImportError: binding not installed
    vk = None
    _vk_module = None
    from ssm_ref.extras import install_hint

    _IMPORT_PROBLEM = f"the Vulkan binding could not be loaded: {type(exc).__name__}: {exc}" + (
        f" ({install_hint('vulkan', 'vulkan')})" if isinstance(exc, ImportError) else "")
else:
    _IMPORT_PROBLEM = ""


# ---------------------------------------------------------------------------------------------
# Exceptions. They do not depend on the binding, so callers can catch them on any machine.

class VulkanUnavailable(RuntimeError):
    """No usable Vulkan here: no loader, no binding, no driver, or no device."""


class VulkanError(RuntimeError):
    """A Vulkan call failed. ``result`` is the VkResult code when one is known, else None."""

    def __init__(self, message: str, result: int | None = None):
        super().__init__(message)
        self.result = result


class DeviceLost(VulkanError):
    """VK_ERROR_DEVICE_LOST: the logical device is gone; its context cannot be used any more."""


class OutOfDeviceMemory(VulkanError):
    """VK_ERROR_OUT_OF_DEVICE_MEMORY (or host memory) from an allocation or a submit."""


class VulkanTimeout(VulkanError):
    """A wait on the GPU did not finish within its timeout; the work may still be running."""


# ---------------------------------------------------------------------------------------------
# Loading

def require():
    """Return the ``vulkan`` module. Raises VulkanUnavailable when it cannot be imported."""
    if vk is None:
        raise VulkanUnavailable(_IMPORT_PROBLEM)
    return vk


def import_problem() -> str:
    """Why the binding could not be imported ("" when it could)."""
    return _IMPORT_PROBLEM


def make_version(major: int, minor: int, patch: int = 0) -> int:
    """VK_MAKE_API_VERSION(0, major, minor, patch): the binding has no VK_API_VERSION_1_x names."""
    return (major << 22) | (minor << 12) | patch


def split_version(version: int) -> tuple[int, int, int]:
    """(major, minor, patch) of a packed Vulkan API version (the variant bits are dropped)."""
    return ((version >> 22) & 0x7F, (version >> 12) & 0x3FF, version & 0xFFF)


# ---------------------------------------------------------------------------------------------
# cffi memory for void* arguments (sharp edge 5). The caller keeps the returned object alive
# until the Vulkan call that reads it has returned.

def bytes_arg(data: bytes | bytearray | memoryview):
    """cffi view of ``data`` for a ``const void*`` argument (push constants). Keep it alive."""
    return require().ffi.from_buffer(data)


def words_arg(values: Sequence[int | float | bool]):
    """4-byte words for specialisation data: ints as int32/uint32, floats as float32, bools as VkBool32.

    Returns ``(cdata, nbytes)``. Raises ValueError for a value that fits none of those.
    """
    packed = bytearray()
    for v in values:
        if isinstance(v, bool):
            packed += struct.pack("<I", int(v))
        elif isinstance(v, int):
            if not -(2**31) <= v < 2**32:
                raise ValueError(f"specialisation constant {v} does not fit 32 bits")
            packed += struct.pack("<i" if v < 0 else "<I", v)
        elif isinstance(v, float):
            packed += struct.pack("<f", v)
        else:
            raise ValueError(f"specialisation constant {v!r}: expected int, float or bool, got {type(v).__name__}")
    ffi = require().ffi
    cdata = ffi.new("uint32_t[]", max(1, len(packed) // 4))
    ffi.memmove(cdata, bytes(packed), len(packed))
    return cdata, len(packed)


def c_string(cdata) -> str:
    """A Python str from a ``char*``/``char[]`` cdata, or "" for NULL."""
    ffi = require().ffi
    if cdata is None or cdata == ffi.NULL:
        return ""
    return ffi.string(cdata).decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------------
# Result codes (sharp edge 8)

class _ResultCodes(dict):
    """The binding's code → exception-class table, made total.

    The binding stores extension error codes with a positive sign (1000069000 for
    VK_ERROR_OUT_OF_POOL_MEMORY, whose value is -1000069000), so such a failure surfaced as a
    KeyError. We add the negated entries and create a class on the fly for any code still unknown.
    """

    def __missing__(self, code):
        base = vk.VkError if isinstance(code, int) and code < 0 else vk.VkException
        cls = type(f"VkResult{code}", (base,), {})
        self[code] = cls
        _CODE_OF_CLASS[cls] = code
        return cls


_CODE_OF_CLASS: dict[type, int] = {}  # exception class → its VkResult, with the right sign


def _patch_result_codes() -> None:
    if isinstance(_vk_module.exception_codes, _ResultCodes):
        return
    fixed = _ResultCodes()
    for code, cls in _vk_module.exception_codes.items():
        if code is None:  # the binding lists a few classes without a value
            continue
        if code > 1_000_000_000 and issubclass(cls, vk.VkError):
            code = -code  # an error code is negative; the binding lost the sign of extension codes
        fixed[code] = cls
        _CODE_OF_CLASS.setdefault(cls, code)
    for code, cls in list(fixed.items()):
        if code < -1_000_000_000:
            fixed[-code] = cls  # keep the wrong-signed key too: the binding's constants carry it
    # The binding's functions look the table up as a module global at call time, so rebinding the
    # name is enough.
    _vk_module.exception_codes = fixed


if vk is not None:
    _patch_result_codes()


def exception_for_code(code: int):
    """The binding's exception class for a VkResult code (always one; never a KeyError)."""
    require()
    return _vk_module.exception_codes[code]


# VkResult values used in messages (the binding lacks or mis-signs some of them).
_RESULT_NAMES = {
    -1: "VK_ERROR_OUT_OF_HOST_MEMORY", -2: "VK_ERROR_OUT_OF_DEVICE_MEMORY", -3: "VK_ERROR_INITIALIZATION_FAILED",
    -4: "VK_ERROR_DEVICE_LOST", -5: "VK_ERROR_MEMORY_MAP_FAILED", -6: "VK_ERROR_LAYER_NOT_PRESENT",
    -7: "VK_ERROR_EXTENSION_NOT_PRESENT", -8: "VK_ERROR_FEATURE_NOT_PRESENT", -9: "VK_ERROR_INCOMPATIBLE_DRIVER",
    -10: "VK_ERROR_TOO_MANY_OBJECTS", -12: "VK_ERROR_FRAGMENTED_POOL", -13: "VK_ERROR_UNKNOWN",
    -1000069000: "VK_ERROR_OUT_OF_POOL_MEMORY", -1000161000: "VK_ERROR_FRAGMENTATION", 2: "VK_TIMEOUT",
}


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """Turn the binding's exceptions raised inside the block into this package's exceptions.

    ``what`` names the operation for the message. Raises DeviceLost, OutOfDeviceMemory,
    VulkanTimeout or VulkanError (with ``.result`` set); other exceptions pass through.
    """
    try:
        yield
    except (vk.VkError, vk.VkException) as exc:
        raise to_package_error(exc, what) from exc


def check_result(result: int, what: str) -> None:
    """Raise the package exception for a VkResult returned by a raw ``vk.lib`` call (0 passes).

    The hot paths (submit, wait, descriptor writes) call ``vk.lib`` directly: the binding's
    wrappers and struct constructors are most of a submit+wait's fixed cost (docs/VULKAN.md,
    "Costs measured on lavapipe").
    """
    if result != 0:
        raise error_for_result(result, what)


def to_package_error(exc: BaseException, what: str) -> VulkanError:
    """The package exception for one of the binding's exceptions (see :func:`translated`)."""
    return error_for_result(_CODE_OF_CLASS.get(type(exc)), what, type(exc).__name__)


def error_for_result(code: int | None, what: str, fallback_name: str = "unknown VkResult") -> VulkanError:
    """The package exception for a VkResult: DeviceLost, OutOfDeviceMemory, VulkanTimeout or VulkanError."""
    name = _RESULT_NAMES.get(code, fallback_name)
    message = f"{what} failed: {name}" + (f" ({code})" if code is not None else "")
    if code == -4:
        return DeviceLost(message, code)
    if code in (-1, -2):
        return OutOfDeviceMemory(message, code)
    if code == 2:
        return VulkanTimeout(message, code)
    return VulkanError(message, code)
