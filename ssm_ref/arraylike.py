"""The validator's one reading of the caller's array-likes: device arrays told apart (checked by
shape and dtype, never copied by the checker), float arrays turned into read-only C-contiguous
arrays of the working dtype without writing or keeping the caller's, and the zero-stride zeros
that stand for absent inputs. Part of the validator (ssm_ref.checks)."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["as_array", "finish", "float_array", "is_device_array", "zero_stand_in", "zeros"]


def is_device_array(value) -> bool:
    """True for device-resident arrays (ssm_vk.DeviceArray): checked by shape and dtype only,
    never copied to the host by the checker."""
    return getattr(value, "_ssm_device_array", False) is True


def as_array(name: str, value, what: str = "a float array") -> np.ndarray:
    if value is None:
        raise TypeError(f"{name}: expected {what}, got None")
    if isinstance(value, np.ndarray) or is_device_array(value):
        return value
    try:
        arr = np.asarray(value)
    except Exception as e:  # ragged lists and the like
        raise TypeError(f"{name}: expected {what}, could not convert {type(value).__name__}: {e}") from e
    return arr


def float_array(name: str, value, dtype: np.dtype, keep_device: bool = False) -> np.ndarray:
    """A read-only C-contiguous array of ``dtype``; the caller's array is never written or kept."""
    arr = as_array(name, value)
    if not keep_device and is_device_array(arr):
        arr = arr.numpy()  # host backends compute on a host copy
    kind = arr.dtype.kind
    if kind != "f":
        what = {"i": "an integer", "u": "an unsigned integer", "b": "a bool", "c": "a complex",
                "O": "an object", "U": "a string", "S": "a bytes", "V": "a structured"}.get(kind, "a non-float")
        raise TypeError(f"{name}: expected a float array (float16/32/64 are converted to {dtype}), "
                        f"got {what} array of dtype {arr.dtype}")
    if arr.dtype.itemsize > 8:
        raise TypeError(f"{name}: expected float16, float32 or float64, got {arr.dtype}")
    return arr


def finish(arr: np.ndarray, dtype: np.dtype, keep_zeros: bool = False) -> np.ndarray:
    # When no conversion is needed ascontiguousarray hands back the caller's array itself; the
    # extra view lets us clear the writeable flag without touching the caller's flags.
    # Values beyond float32's range become inf, as docs/SPEC.md section 8 expects; like the scan
    # itself, the cast does so without a RuntimeWarning.
    if type(arr) is np.ndarray and arr.dtype == dtype and arr.flags.c_contiguous and arr.ndim:
        out = arr.view()  # what the conversion below hands back, without np.errstate's cost
    elif is_device_array(arr):
        if arr.dtype != dtype:
            raise TypeError(f"device arrays hold float32; this call works in {dtype}")
        return arr
    elif keep_zeros and zero_stand_in(arr):   # (read-only: np.broadcast_to's arrays are)
        return arr if arr.dtype == dtype else zeros(arr.shape, dtype)
    else:
        with np.errstate(over="ignore"):
            out = np.ascontiguousarray(arr, dtype=dtype).view()
    out.flags.writeable = False
    return out


def zeros(shape: tuple, dtype: np.dtype) -> np.ndarray:
    """Zeros of ``shape`` as a zero-stride stand-in: nothing allocated until the Problem is made
    (_finish's contiguous copy, which the host memory rule counts as a copy; with ``keep_device``
    the Problem keeps the stand-in)."""
    return np.broadcast_to(np.zeros((), dtype), shape)


def zero_stand_in(a) -> bool:
    """Whether ``a`` is zeros as a zero-stride stand-in (:func:`zeros`'s form: every stride 0, the
    one element +0.0, so its bytes are all zero; -0.0 is not). A numpy array of other strides --
    np.zeros included -- is not, whatever it holds: the test reads one element, never the data."""
    if type(a) is not np.ndarray or not a.ndim or not a.size or any(a.strides) or a.dtype.kind != "f":
        return False
    v = a.item(0)
    return v == 0.0 and math.copysign(1.0, v) > 0.0
