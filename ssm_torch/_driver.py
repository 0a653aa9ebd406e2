"""CUDA's driver API, the few calls ssm_torch/cuda.py needs, through ctypes on ``libcuda.so.1``
(every CUDA install has it, so no package is needed): a device's UUID, and the import of Vulkan
memory exported as a file descriptor (cuImportExternalMemory) mapped as a device pointer. Each call
runs with the device's primary context current, the one torch's CUDA runtime uses.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading

from ssm_vk.runtime import external

_CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD = 1
_CUDA_EXTERNAL_MEMORY_DEDICATED = 0x1


class _Win32(ctypes.Structure):
    _fields_ = [("handle", ctypes.c_void_p), ("name", ctypes.c_void_p)]


class _Handle(ctypes.Union):
    _fields_ = [("fd", ctypes.c_int), ("win32", _Win32), ("nvSciBufObject", ctypes.c_void_p)]


class _MemoryHandleDesc(ctypes.Structure):   # CUDA_EXTERNAL_MEMORY_HANDLE_DESC (104 bytes)
    _fields_ = [("type", ctypes.c_int), ("handle", _Handle), ("size", ctypes.c_ulonglong),
                ("flags", ctypes.c_uint), ("reserved", ctypes.c_uint * 16)]


class _BufferDesc(ctypes.Structure):         # CUDA_EXTERNAL_MEMORY_BUFFER_DESC (88 bytes)
    _fields_ = [("offset", ctypes.c_ulonglong), ("size", ctypes.c_ulonglong), ("flags", ctypes.c_uint),
                ("reserved", ctypes.c_uint * 16)]


class Driver:
    """The few driver-API functions the import needs. Each runs with the device's primary context
    current (the one torch's runtime uses), pushed and popped around it."""

    def __init__(self):
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise RuntimeError(f"CUDA's driver library could not be loaded (libcuda.so.1: {exc})") from None
        self.lib = lib
        try:
            for name in ("cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease_v2",
                         "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2", "cuImportExternalMemory",
                         "cuExternalMemoryGetMappedBuffer", "cuDestroyExternalMemory", "cuMemFree_v2",
                         "cuGetErrorName"):
                getattr(lib, name).restype = ctypes.c_int
            # the GPU's UUID, as Vulkan's deviceUUID has it (cuDeviceGetUuid; its _v2, which differs
            # only under MIG, where the first is gone)
            self._get_uuid = getattr(lib, "cuDeviceGetUuid", None) or lib.cuDeviceGetUuid_v2
        except AttributeError as exc:
            raise RuntimeError(f"libcuda.so.1 lacks a function CUDA tensors through ssm_vk need ({exc}): "
                               "the NVIDIA driver is too old") from None
        self._get_uuid.restype = ctypes.c_int
        self._get_uuid.argtypes = [ctypes.c_char_p, ctypes.c_int]
        lib.cuExternalMemoryGetMappedBuffer.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p,
                                                        ctypes.POINTER(_BufferDesc)]
        lib.cuDestroyExternalMemory.argtypes = [ctypes.c_void_p]
        lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        lib.cuCtxPushCurrent_v2.argtypes = [ctypes.c_void_p]
        self.check(lib.cuInit(0), "cuInit")

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what} failed: {(name.value or b'CUDA error').decode()} ({rc})")

    def device(self, ordinal: int) -> int:
        dev = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), ordinal), f"cuDeviceGet({ordinal})")
        return dev.value

    def uuid(self, ordinal: int) -> bytes:
        out = ctypes.create_string_buffer(16)
        self.check(self._get_uuid(out, self.device(ordinal)), "cuDeviceGetUuid")
        return out.raw

    @contextlib.contextmanager
    def current(self, ordinal: int):
        dev = self.device(ordinal)
        ctx = ctypes.c_void_p()
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        try:
            self.check(self.lib.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
            try:
                yield
            finally:
                self.lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
        finally:
            self.lib.cuDevicePrimaryCtxRelease_v2(dev)

    def import_buffer(self, ordinal: int, buffer: external.ExportableBuffer) -> tuple[int, int]:
        """(external memory handle, device pointer) of ``buffer``'s memory imported into CUDA."""
        fd = buffer.export_fd()
        desc = _MemoryHandleDesc(type=_CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD, size=buffer.alloc_size,
                                 flags=_CUDA_EXTERNAL_MEMORY_DEDICATED if buffer.dedicated else 0)
        desc.handle.fd = fd
        ext = ctypes.c_void_p()
        with self.current(ordinal):
            rc = self.lib.cuImportExternalMemory(ctypes.byref(ext), ctypes.byref(desc))
            if rc != 0:
                os.close(fd)   # CUDA owns the descriptor only once the import succeeded
                self.check(rc, f"cuImportExternalMemory ({buffer.alloc_size} bytes)")
            ptr = ctypes.c_uint64()
            rc = self.lib.cuExternalMemoryGetMappedBuffer(ctypes.byref(ptr), ext, ctypes.byref(
                _BufferDesc(offset=0, size=buffer.size, flags=0)))
            if rc != 0:
                self.lib.cuDestroyExternalMemory(ext)
                self.check(rc, "cuExternalMemoryGetMappedBuffer")
        return ext.value, ptr.value

    def release(self, ordinal: int, ext: int, ptr: int) -> None:
        """Unmap and destroy an import (errors ignored: this runs at close, maybe at exit)."""
        with contextlib.suppress(RuntimeError), self.current(ordinal):
            self.lib.cuMemFree_v2(ptr)
            self.lib.cuDestroyExternalMemory(ext)


_driver_lock = threading.Lock()
_driver: Driver | None = None


def the_driver() -> Driver:
    global _driver
    with _driver_lock:
        if _driver is None:
            _driver = Driver()
        return _driver


def uuid_text(u: bytes) -> str:
    h = u.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
