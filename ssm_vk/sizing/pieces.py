"""Where an array larger than one allocation is cut into pieces (runtime.Pieces): at the windows'
own boundaries, so that every binding of a window lies in one piece.

``maxMemoryAllocationSize`` bounds one buffer, not a call: the planners already cut every binding
to ``maxStorageBufferRange`` in windows of whole sequences or token ranges of one sequence
(Window), and an array of tokens -- (S, T, ...) -- is bound window by window. Such an array beyond
one allocation is held as consecutive pieces, each a run of whole windows within the limit. Other
arrays (the states, the cache, the snapshots, the scratch) are bound whole by some kernel, so one
beyond an allocation is refused with the reason.

Pure Python: the support decision and the budget count by it before anything is allocated; the
workspace allocates by it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .limits import DEFAULT_K, F32, Window, alloc_cap, binding_cap

if TYPE_CHECKING:
    from ssm_ref import Dims

    from .limits import Limits

__all__ = ["token_arrays", "cuts", "even_cuts", "piece_sizes", "piece_cap", "window_ranges", "device_piece_bytes",
           "device_cuts", "device_piece_tokens", "token_windows", "window_cuts"]


def token_arrays(d: Dims, backward: bool) -> dict[str, int]:
    """The (S, T, ...) arrays a call binds window by window, by name: elements per token."""
    per = {"x": d.H * d.P, "dt": d.H, "B": d.G * d.N, "C": d.G * d.N}
    if backward:
        per.update(g_y=d.H * d.P, d_x=d.H * d.P, d_dt=d.H, d_B=d.G * d.N, d_C=d.G * d.N)
    else:
        per["y"] = d.H * d.P
    return per


def piece_cap(lim: Limits) -> int:
    """The most bytes one piece takes: one allocation, within the largest device-local heap, less
    the driver's rounding of a buffer's memory (limits.alloc_cap)."""
    return alloc_cap(lim.max_memory_allocation_size, lim.min_storage_buffer_offset_alignment, lim.device_local_bytes)


def _windowed(d: Dims, plan) -> tuple:
    """(the dims the windows of ``plan`` count in, its windows; () when it has none). A plan over
    time chunks (``tchunk``) has the windows of the chunks as sequences: S * T / tchunk sequences
    of tchunk tokens, the same memory (sequential_planner.chunk_dims)."""
    windows = getattr(plan, "windows", None) or ()
    tchunk = getattr(plan, "tchunk", 0)
    if tchunk:
        d = replace(d, S=d.S * (d.T // tchunk), T=tchunk)
    return d, windows


def cuts(d: Dims, plan, lim: Limits, backward: bool, names) -> tuple[dict[str, tuple], str]:
    """({name: byte offsets where its pieces start, the first 0}, "") for each array of ``names``
    (the token arrays over one allocation) under a family's ``plan``, or ({}, why not): the plan
    does not bind them in windows of its own."""
    d, windows = _windowed(d, plan)
    if not windows:
        return {}, "its plan does not bind the arrays of tokens in windows"
    cap = piece_cap(lim)
    per = token_arrays(d, backward)
    out = {}
    for name in names:
        row = per[name] * F32
        starts, why = window_cuts([((w.i0 * d.T + w.t0) * row, (w.i0 * d.T + w.t0 + w.S * w.T) * row)
                                   for w in windows], cap)
        if why:
            return {}, f"a window of {name} {why}"
        out[name] = starts
    return out, ""


def window_cuts(ranges, cap: int) -> tuple[tuple, str]:
    """(byte offsets where an array is cut into pieces of at most ``cap`` bytes, each piece a run of
    whole windows, ""), the windows binding it at byte ranges ``ranges`` [a, b) in order and
    covering it; or ((), why not): a window above ``cap`` (windows fit a binding, and so one
    allocation: never)."""
    starts = [0]
    for a, b in ranges:
        if b - a > cap:
            return (), f"takes {b - a} bytes, above one allocation"
        if b - starts[-1] > cap:
            starts.append(a)
    return tuple(starts), ""


def window_ranges(d: Dims, plan, backward: bool, name: str) -> list[tuple[int, int]]:
    """The byte ranges [a, b) of token array ``name`` that ``plan``'s windows bind ([] for a plan
    without windows of its own: then no array in pieces is bound in place)."""
    d, windows = _windowed(d, plan)
    row = token_arrays(d, backward)[name] * F32
    return [((w.i0 * d.T + w.t0) * row, (w.i0 * d.T + w.t0 + w.S * w.T) * row) for w in windows]


def even_cuts(shape: tuple, itemsize: int, cap: int, multiple: int = 1) -> tuple:
    """Byte offsets where an array of ``shape`` beyond one allocation of ``cap`` bytes is cut when
    no call's windows are known (``to_device``): as the planners cut -- runs of whole entries of
    the first axis (whole sequences), else of the second within one entry of the first (token
    ranges of one sequence, a multiple of ``multiple`` entries where more than that fit), and so
    on; a piece is at most ``cap`` bytes. With ``cap`` a binding's bytes and ``multiple`` the
    planners' checkpoint interval, the pieces are the token-sequential forward's windows where the
    array is the one that bounds them (x of Mamba-2: the call binds it in place)."""
    def cut(shape, base, depth):
        row = itemsize
        for n in shape[1:]:
            row *= n
        n0 = shape[0] if shape else 1
        if row <= cap or len(shape) <= 1:
            per = max(1, cap // row)
            if depth == 1 and per > multiple:
                per -= per % multiple
            return [base + i * row for i in range(0, n0, per)]
        out = []
        for i in range(n0):
            out += cut(shape[1:], base + i * row, depth + 1)
        return out

    return tuple(cut(tuple(shape), 0, 0)) if shape else (0,)


def device_piece_bytes(lim: Limits) -> int:
    """The most bytes of one piece of an array that ``to_device`` holds in pieces: one allocation
    (:func:`piece_cap`) and one binding."""
    return min(piece_cap(lim), binding_cap(lim) * F32)


def device_cuts(shape: tuple, itemsize: int, lim: Limits) -> tuple | None:
    """Where ``to_device`` cuts an array of ``shape`` (byte offsets of its pieces, as the planners
    cut: :func:`even_cuts` at :func:`device_piece_bytes`, token ranges a multiple of DEFAULT_K),
    or None when it fits one allocation."""
    n = itemsize
    for v in shape:
        n *= v
    if n <= piece_cap(lim):
        return None
    return even_cuts(shape, itemsize, device_piece_bytes(lim), DEFAULT_K)


def device_piece_tokens(d: Dims, lim: Limits) -> tuple:
    """The token lengths of the pieces ``to_device`` (:func:`device_cuts`) cuts one sequence of
    each token array of ``d`` (:func:`token_arrays`) into, where it cuts a sequence in token
    ranges; sorted, without repeats."""
    out = set()
    for per_token in set(token_arrays(d, True).values()):
        row = per_token * F32
        starts = device_cuts((d.S, d.T, per_token), F32, lim) if row else None
        if starts and len(starts) > 1 and starts[1] < d.T * row:   # (a sequence in token ranges)
            out.add(starts[1] // row)
    return tuple(sorted(out))


def token_windows(d: Dims, lim: Limits, Tw: int) -> tuple:
    """Each sequence's token windows, Window(i, i + 1, t0, t1) in sequence and token order: ``Tw``
    tokens each, cut again where a piece that ``to_device`` cuts a token array of ``d`` into ends
    (:func:`device_piece_tokens`: a window then lies in one piece of each array to_device made,
    which the call binds in place). Every sequence has the same token ranges."""
    ends = device_piece_tokens(d, lim)
    spans, t = [], 0
    while t < d.T:
        e = min(t + Tw, d.T, *((t // n + 1) * n for n in ends))
        spans.append((t, e))
        t = e
    return tuple(Window(i, i + 1, t0, t1) for i in range(d.S) for t0, t1 in spans)


def piece_sizes(nbytes: int, starts: tuple) -> list[int]:
    """The bytes of each piece of an array of ``nbytes`` cut at ``starts``."""
    ends = (*starts[1:], nbytes)
    return [e - s for s, e in zip(starts, ends, strict=True)]
