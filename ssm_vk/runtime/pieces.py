"""Pieces: one array held as several buffers, for arrays larger than one allocation.

A device's ``maxMemoryAllocationSize`` bounds one buffer (4 GiB on NVIDIA's drivers), not the
memory a call may use. An array beyond it is held as consecutive pieces -- Buffers, each within
the limit -- cut where the kernels' windows cut it (``ssm_vk.sizing.pieces``), so every binding a
recording makes lies in one piece. A Pieces stands where a Buffer would: a binding names a piece
and an offset inside it (:meth:`Pieces.at`); copies and fills recorded over a range are split at
the cuts (runtime.commands), host transfers too (runtime.transfer). Its offsets are byte offsets
of the whole array (Python ints: no 32-bit arithmetic anywhere on the host).

The Pieces owns nothing: its buffers are acquired and given back by whoever made it (a
workspace, or the DeviceArray that owns it), one by one, as any buffer.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import pairwise

__all__ = ["Pieces", "split_copy"]


class Pieces:
    """Buffers ``buffers`` holding bytes [starts[k], starts[k] + size_k) of one array of ``size``
    bytes (starts[0] == 0, ascending, each piece at least as large as its range). ``serial``: a
    key that differs from every Buffer's and every other Pieces' (the tuple of its buffers'
    serials), as recorded sequences are keyed by the buffers they bind."""

    __slots__ = ("buffers", "ctx", "serial", "size", "starts")

    def __init__(self, buffers: list, starts: tuple, size: int):
        if not buffers or len(buffers) != len(starts) or starts[0] != 0:
            raise ValueError("Pieces: one start per buffer, the first at 0")
        ends = (*starts[1:], size)
        for b, s, e in zip(buffers, starts, ends, strict=True):
            if e <= s or b.size < e - s:
                raise ValueError(f"Pieces: piece [{s}, {e}) does not fit its buffer of {b.size} bytes")
        self.buffers = list(buffers)
        self.starts = tuple(int(s) for s in starts)
        self.size = int(size)
        self.ctx = buffers[0].ctx
        self.serial = ("pieces", *(b.serial for b in buffers))

    @property
    def closed(self) -> bool:
        return any(b.closed for b in self.buffers)

    @property
    def mappable(self) -> bool:
        return all(b.mappable for b in self.buffers)

    def end(self, k: int) -> int:
        """The byte where piece ``k`` ends in the array."""
        return self.starts[k + 1] if k + 1 < len(self.starts) else self.size

    def at(self, offset: int, nbytes: int) -> tuple:
        """(the piece's Buffer, byte offset in it) of bytes [offset, offset + nbytes) of the array.
        Raises ValueError when the range crosses a cut or leaves the array: a binding must lie in
        one piece (the cuts are the windows' own, so a recording that raises this is a bug)."""
        k = bisect_right(self.starts, offset) - 1
        if k < 0 or offset + nbytes > self.end(k):
            raise ValueError(f"bytes [{offset}, {offset + nbytes}) cross a cut of an array held in pieces at "
                             f"{self.starts[1:]} (of {self.size} bytes)")
        return self.buffers[k], offset - self.starts[k]

    def parts(self, offset: int, nbytes: int):
        """(Buffer, byte offset in it, byte offset in the range, bytes) of each piece the range
        [offset, offset + nbytes) covers, in order. ValueError when it leaves the array."""
        if offset < 0 or offset + nbytes > self.size:
            raise ValueError(f"bytes [{offset}, {offset + nbytes}) outside an array of {self.size} bytes in pieces")
        k = bisect_right(self.starts, offset) - 1
        done = 0
        while done < nbytes:
            pos = offset + done
            n = min(self.end(k), offset + nbytes) - pos
            yield self.buffers[k], pos - self.starts[k], done, n
            done += n
            k += 1

    def __repr__(self) -> str:
        return f"Pieces({len(self.buffers)} buffers, {self.size} bytes, cuts at {self.starts[1:]})"


def split_copy(src, dst, nbytes: int, src_offset: int, dst_offset: int):
    """The copies of one copy of ``nbytes`` from ``src`` to ``dst`` (each a Buffer or Pieces) when
    either is in pieces: (src Buffer, dst Buffer, bytes, src offset, dst offset) each, cut at the
    cuts of both."""
    def parts(b, off, n):
        if isinstance(b, Pieces):
            return list(b.parts(off, n))
        return [(b, off, 0, n)]

    sp, dp = parts(src, src_offset, nbytes), parts(dst, dst_offset, nbytes)
    bounds = sorted({0, nbytes, *(p[2] for p in sp), *(p[2] for p in dp)})
    out = []
    for a, b in pairwise(bounds):
        s = next(p for p in sp if p[2] <= a < p[2] + p[3])
        d = next(p for p in dp if p[2] <= a < p[2] + p[3])
        out.append((s[0], d[0], b - a, s[1] + a - s[2], d[1] + a - d[2]))
    return out
