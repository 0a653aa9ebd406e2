"""The device memory one call takes, and the rule ``supports()`` applies before any allocation.

A call acquires these buffers through the context's pool (each rounded up by
``BufferPool.size_class``, at most a third):

- one upload buffer per host input (device-resident inputs are bound where they are),
- one buffer per output,
- the scratch of the recording (family.Family.scratch: each family's, by the names its recording
  requests it under); a plan whose results are flagged when non-finite adds a host-visible flag
  and, for the recompute of a call with inf or nan, a second set of outputs (and that recompute's
  scratch, where its plan stands in for the family's: family.Family.rerun_stands_in),
- small constant buffers (the row pairs of the d_s scatter, sized for the worst ids, so that
  the answer does not depend on them; the ids, when the scan reads the cache rows in place) and a
  16-byte stand-in binding.

An input or output of tokens ((S, T, ...): x, dt, B, C, y, g_y and their cotangents) larger
than one allocation is held in pieces cut at its plan's windows (sizing.pieces, runtime.Pieces):
:func:`pieces` says where, or why the call cannot be cut so, and each piece counts as a buffer.

The rule: every buffer (each piece) within ``maxMemoryAllocationSize``, all of them together within the
largest device-local heap (``DeviceInfo.device_local_bytes``), and their count with the
allocations already made within ``maxMemoryAllocationCount`` (every buffer is an allocation of
its own). A problem beyond any falls back to the CPU, with the numbers in the reason. (Memory
that other work holds at the time is not foreseen: a driver that then runs out raises
OutOfDeviceMemory, after the pool has given back what it could -- see
runtime.pool.BufferPool.acquire.)
"""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING

from .runtime.pool import BufferPool
from .sizing import (
    DUMMY_BYTES,
    F32,
    alloc_cap,
    cuts,
    input_shapes,
    output_shapes,
    piece_cap,
    piece_sizes,
    rows_in_place,
    token_arrays,
)

if TYPE_CHECKING:
    from ssm_ref import Dims

    from .family import FamilyPlan
    from .sizing import Limits

__all__ = ["buffers", "check", "allocations", "pieces", "whole"]


def buffers(d: Dims, fp: FamilyPlan, lim: Limits, backward: bool, resident=frozenset()) -> dict[str, int]:
    """Bytes of every buffer a call of a problem of dims ``d`` under plan ``fp`` acquires (before
    the pool's rounding), by name; an upper bound where ids matter. ``resident``: names of inputs
    already on the device (DeviceArrays), which take nothing."""
    sizes = {f"in:{k}": prod(v) * F32 for k, v in input_shapes(d, backward).items() if k not in resident}
    outs = {k: prod(v) * F32 for k, v in output_shapes(d, backward).items()}
    sizes.update({f"out:{k}": n for k, n in outs.items()})
    row = d.H * d.P * d.N
    family, plan, rerun = fp.family, fp.plan, fp.device_rerun
    sizes.update({f"scratch:{k}": n * F32 for k, n in family.scratch(d, plan, backward).items()})
    if rerun is not None:
        # a plan that flags inf and nan: the flag's host-visible copy, and a second set of outputs
        # (the recompute's workspace); and the recompute's scratch where its plan stands in
        sizes.update({"flag_host": 16})
        sizes.update({f"rerun:out:{k}": n for k, n in outs.items()})
        if family.rerun_stands_in:
            sizes.update({f"scratch:{k}": n * F32 for k, n in rerun.family.scratch(d, rerun.plan, backward).items()})
    if backward:
        if d.R * row and d.S > 1:  # the pairs of the d_s scatter: one buffer, its groups aligned
            sizes["const:pairs"] = pairs_bytes(d.S, lim.min_storage_buffer_offset_alignment)
    if rows_in_place(d, lim):  # the ids as a constant buffer, for the scan's read of s[ids]
        sizes["const:ids"] = 4 * d.S
    sizes["dummy"] = DUMMY_BYTES
    return {k: v for k, v in sizes.items() if v > 0}


def whole(d: Dims, lim: Limits, backward: bool, resident: frozenset) -> frozenset:
    """The device-resident inputs of ``resident`` within one allocation. Those beyond it are
    DeviceArrays in pieces, cut where no call's windows were known (arrays.empty): the budget
    counts each as an input the call copies into buffers of its own (HostData.rebind_pieces), and
    :func:`pieces` refuses one that is not an array of tokens."""
    cap = piece_cap(lim)
    shapes = input_shapes(d, backward)
    return frozenset(k for k in resident if k not in shapes or prod(shapes[k]) * F32 <= cap)


def pieces(d: Dims, fp: FamilyPlan, lim: Limits, backward: bool, sizes: dict[str, int]) -> tuple[dict, str]:
    """Where the buffers of ``sizes`` (:func:`buffers`) beyond one allocation are cut: ({False:
    {name: byte offsets of its pieces} of the first plan's workspace, True: those of the plan that
    recomputes flagged results}, ""), both empty when nothing is beyond; or ({}, why the call
    cannot be cut so -- an array other than the inputs and results of tokens, a plan without
    windows -- in the words of :func:`check`)."""
    cap = piece_cap(lim)
    big = [k for k, n in sizes.items() if n > cap]
    if not big:
        return {}, ""
    tokens = token_arrays(d, backward)
    out: dict = {False: {}, True: {}}
    for key in big:
        *where, name = key.split(":")
        what = (f"{name} needs a buffer of {sizes[key]} bytes, above one allocation (maxMemoryAllocationSize "
                f"{lim.max_memory_allocation_size} bytes, the heap {lim.device_local_bytes})")
        if name not in tokens or where[-1:] not in (["in"], ["out"]):
            return {}, f"{what}, and only arrays of tokens are held in pieces"
        rerun = where[0] == "rerun"
        keys = [False, True] if where == ["in"] else [rerun]   # (each workspace uploads its own inputs)
        for r in keys:
            plan = fp.device_rerun if r and fp.device_rerun is not None else fp
            got, why = cuts(d, plan.plan, lim, backward, [name])
            if why:
                return {}, f"{what}, and {plan.family.title} cannot cut it: {why}"
            out[r].update(got)
    return out, ""


def pooled(nbytes: int, limit: int) -> int:
    """What the pool allocates for a request (BufferPool.acquire's rounding)."""
    size = BufferPool.size_class(nbytes)
    return nbytes if size > limit >= nbytes else size


def pairs_bytes(S: int, align: int) -> int:
    """The most bytes the d_s scatter's row pairs take, whatever the ids: at most S - 1 pairs
    (every sequence after the first on a row already read), each group of them starting at an
    aligned offset -- one pair per group when rows are bound one at a time."""
    per = max(8, align)
    return (S - 1) * per


def allocations(sizes: dict[str, int]) -> int:
    """How many device allocations the buffers of :func:`buffers` take (one each: the pool does
    not suballocate)."""
    return len(sizes)


def check(info, sizes: dict[str, int], live_allocations: int = 0, cut: dict | None = None) -> str:
    """Why ``sizes`` (from :func:`buffers`) do not fit device ``info`` -- an allocation above
    maxMemoryAllocationSize, more memory than its largest device-local heap, more allocations
    than maxMemoryAllocationCount besides the ``live_allocations`` already made -- or "".
    ``cut``: the pieces of :func:`pieces`, each counted as a buffer of its own."""
    if cut:
        sizes = dict(sizes)
        for key in [k for k in sizes if k.split(":")[-2:-1] in (["in"], ["out"])
                    and k.split(":")[-1] in cut.get(k.startswith("rerun:"), {})]:
            starts = cut[key.startswith("rerun:")][key.split(":")[-1]]
            for i, n in enumerate(piece_sizes(sizes.pop(key), starts)):
                sizes[f"{key}#{i}"] = n
    limit = info.max_memory_allocation_size
    name, biggest = max(sizes.items(), key=lambda kv: kv[1], default=("", 0))
    if biggest > alloc_cap(limit, info.min_storage_buffer_offset_alignment):   # (the driver rounds it up)
        return (f"{name.split(':')[-1]} needs a buffer of {biggest} bytes, above maxMemoryAllocationSize "
                f"({limit} bytes) of {info.name}")
    need = sum(pooled(n, limit) for n in sizes.values())
    if need > info.device_local_bytes:
        return (f"the call needs {need} bytes of device memory, more than the {info.device_local_bytes} bytes "
                f"of {info.name}'s largest device-local heap")
    count = allocations(sizes)
    if live_allocations + count > info.max_memory_allocation_count:
        return (f"the call needs {count} device allocations besides the {live_allocations} made, more than "
                f"maxMemoryAllocationCount ({info.max_memory_allocation_count}) of {info.name}")
    return ""
