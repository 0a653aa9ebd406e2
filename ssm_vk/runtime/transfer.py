"""Moving data between the host and device buffers: :func:`upload`, :func:`download` and
:func:`fill`, straight through the mapping of a host-visible buffer or through a staging buffer
and the context's one-shot command sequence (device-local memory of a discrete GPU).

Transfers are synchronous. They do not wait for sequences submitted with ``wait=False``: do not
transfer into or out of a buffer that pending work uses.
"""

from __future__ import annotations

import numpy as np

from .checks import check_int
from .commands import oneshot
from .context import Context
from .memory import Buffer, check_range, fill_range
from .owned import Slot

__all__ = ["upload", "download", "fill", "release_staging"]


def upload(buffer: Buffer, array, offset: int = 0) -> None:
    """Copy the bytes of ``array`` (C order) into ``buffer`` at byte ``offset``.

    Raises TypeError (not a buffer; an object array), ValueError (does not fit), RuntimeError
    (buffer or context closed), DeviceLost, VulkanTimeout.
    """
    data = np.ascontiguousarray(array)
    if data.dtype.hasobject:
        raise TypeError("upload: object arrays have no byte representation")
    offset = check_range(buffer, offset, data.nbytes, "upload")
    if data.nbytes == 0:
        return
    raw = data.reshape(-1).view(np.uint8)
    if buffer.mappable and not buffer.ctx.seams.force_staging:
        memoryview(buffer.mapping)[offset:offset + raw.size] = raw
        return
    _through_staging(buffer, offset, raw.size, raw, None)


def download(buffer: Buffer, what, offset: int = 0) -> np.ndarray:
    """A new array with bytes of ``buffer`` from byte ``offset``.

    ``what`` is a byte count (the result is uint8 of that length) or ``(shape, dtype)``.
    Raises TypeError/ValueError for a bad ``what`` or a range outside the buffer, RuntimeError
    (buffer or context closed), DeviceLost, VulkanTimeout.
    """
    if isinstance(what, tuple) and len(what) == 2:
        shape, dtype = what
        shape = (shape,) if isinstance(shape, int | np.integer) else tuple(shape)
        for n in shape:
            check_int("shape", n)
        dtype = np.dtype(dtype)
        if dtype.hasobject:
            raise TypeError("download: object dtypes have no byte representation")
    else:
        shape, dtype = (check_int("nbytes", what),), np.dtype(np.uint8)
    out = np.empty(shape, dtype)
    offset = check_range(buffer, offset, out.nbytes, "download")
    if out.nbytes == 0:
        return out
    raw = out.reshape(-1).view(np.uint8)
    if buffer.mappable and not buffer.ctx.seams.force_staging:
        raw[:] = np.frombuffer(buffer.mapping, np.uint8, raw.size, offset)
        return out
    _through_staging(buffer, offset, raw.size, None, raw)
    return out


def _through_staging(buffer: Buffer, offset: int, nbytes: int, source, target) -> None:
    """Move ``nbytes`` between host bytes and ``buffer`` in chunks of the context's staging buffer."""

    ctx = buffer.ctx
    with ctx.lock:  # one staging buffer per context
        staging = _staging_buffer(ctx, min(nbytes, ctx.staging_chunk_bytes))
        window = memoryview(staging.mapping)
        for start in range(0, nbytes, staging.size):
            n = min(staging.size, nbytes - start)
            if source is not None:
                window[:n] = source[start:start + n]
            with oneshot(ctx) as seq:
                if source is not None:
                    seq.copy(staging, buffer, n, dst_offset=offset + start)
                else:
                    seq.copy(buffer, staging, n, src_offset=offset + start)
            if target is not None:
                target[start:start + n] = np.frombuffer(window, np.uint8, n)


def _staging_buffer(ctx: Context, nbytes: int) -> Buffer:
    slot = ctx.owned.extension("staging", Slot)
    staging = slot.obj
    if staging is None or staging.closed or staging.size < nbytes:
        slot.clear()
        staging = slot.obj = Buffer(ctx, nbytes, staging=True)
    return staging


def fill(buffer: Buffer, value: int, offset: int = 0, nbytes: int | None = None) -> None:
    """Set ``nbytes`` bytes from ``offset`` to repeats of the 32-bit word ``value`` (vkCmdFillBuffer),
    e.g. 0 to zero a buffer or 0x7FC00000 to poison it with float32 NaN.

    ``nbytes`` defaults to the rest of the buffer rounded down to a multiple of 4. Raises
    ValueError when offset or nbytes is not a multiple of 4 or the range does not fit, TypeError,
    RuntimeError, DeviceLost, VulkanTimeout.
    """

    offset, nbytes = fill_range(buffer, value, offset, nbytes)
    with oneshot(buffer.ctx) as seq:
        seq.fill(buffer, value, offset, nbytes)


def release_staging(ctx: Context) -> None:
    """Free the context's staging buffer (it is made again on the next staged transfer)."""
    slot = ctx.owned.extension("staging")
    if slot is not None:
        with ctx.lock:
            slot.clear()
