"""The cache rows the sequences read: ``ids`` checked and copied before any work (the kernels index
the state cache by them without a bounds check), and the arange(S) of a call that passes None.
Part of the validator (ssm_ref.checks)."""

from __future__ import annotations

import numpy as np

from .arraylike import as_array, finish, is_device_array
from .shapes import expect_shape

__all__ = ["arange_ids", "check_distinct_ids", "check_ids"]


def check_ids(ids, S: int, R: int) -> np.ndarray | None:
    """``ids`` checked for S sequences and R rows of s, raising as :func:`check_forward` does; returns
    the call's own copy of them: int64 (S,), C-contiguous, read-only. None stays None once arange(S)
    is known to fit in R rows: :func:`arange_ids` makes it, after the host memory rule (S itself
    may be huge).

    The S integers are copied before they are checked, and only the copy is used afterwards: the
    kernels index ``s[ids[i]]`` without a bounds check, so ids that another thread changes during
    the call must not reach them (a value written after the check would read or write outside
    ``s``). A device array of ids is read to the host (the range check needs their values)."""
    if ids is None:
        if S > R:
            raise ValueError(f"ids: None means arange(S) = [0, {S}), which needs R >= S rows of s, "
                             f"got R = {R}")
        return None
    if type(ids) is np.ndarray:
        arr = ids  # what as_array hands back for it
    else:
        arr = as_array("ids", ids, f"an integer array of shape (S,) = ({S},)")
        if is_device_array(arr):
            arr = arr.numpy()
    if arr.dtype.kind not in "iu":
        raise TypeError(f"ids: expected an integer array of shape (S,) = ({S},), got dtype {arr.dtype}")
    if arr.shape != (S,):
        expect_shape("ids", arr, "(S,)", (S,))
    # One read of the caller's memory: a copy in the caller's dtype (a uint64 above 2**63 must not
    # wrap before the range check), then the checks and the int64 conversion of that copy.
    own = arr.copy() if arr.dtype is _I64 else np.array(arr, copy=True, order="C")  # (copy(): C order)
    if S:
        if S <= 64:  # two numpy reductions cost more than the Python ints of a short array
            values = own.tolist()
            lo, hi = min(values), max(values)
        else:
            lo, hi = int(own.min()), int(own.max())
        if lo < 0 or hi >= R:
            bad = lo if lo < 0 else hi
            raise ValueError(f"ids: every id must be in [0, R) = [0, {R}) (R = rows of s), got {bad}")
    out = own if own.dtype is _I64 or own.dtype == _I64 else own.astype(np.int64)
    out.setflags(write=False)
    return out


_I64 = np.dtype(np.int64)


_ARANGE: dict[int, np.ndarray] = {}   # S -> arange(S), read-only: the ids of calls that pass None


def arange_ids(S: int) -> np.ndarray:
    """arange(S) as int64, read-only: the ids of a call that passes None (see :func:`check_ids`)."""
    if S > 4096:
        return finish(np.arange(S, dtype=np.int64), _I64)
    out = _ARANGE.get(S)
    if out is None:
        # Made once per S: no one holds a writable reference to it (it owns its memory and is
        # only handed out read-only), so every Problem may share it.
        out = np.arange(S, dtype=np.int64)
        out.setflags(write=False)
        if len(_ARANGE) >= 64:
            _ARANGE.clear()
        _ARANGE[S] = out
    return out


def check_distinct_ids(ids: np.ndarray, cache: str) -> None:
    """update_cache=True writes sequence i's final state into row ids[i] of ``cache`` (the name in
    the message), so two sequences must not name one row: ValueError naming ``ids`` otherwise."""
    if ids.size > 1:
        ordered = np.sort(ids)
        twice = ordered[1:][ordered[1:] == ordered[:-1]]
        if twice.size:
            raise ValueError(f"ids: update_cache=True writes each sequence's final state into its row of {cache}, "
                             f"so the ids must be distinct; row {int(twice[0])} is named more than once")
