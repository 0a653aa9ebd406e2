"""The device memory one call takes, and the rule ``supports()`` applies before any allocation.

A call acquires these buffers through the context's pool (each rounded up by
``BufferPool.size_class``, at most a third):

- one upload buffer per host input (device-resident inputs are bound where they are),
- one buffer per output,
- the backward's scratch (record.py): the running state (S, H, P, N), the d_A partials
  (S, H, P, 1|N), the d_B / d_C / d_dt partials of the largest window, and the checkpoints -- one
  set per token window of a sequence when sequences are cut into token windows,
- small constants (the row pairs of the d_s scatter: at most S - 1 of them, counted as if every
  sequence after the first shared a row, so that the answer does not depend on the ids) and a
  16-byte stand-in binding.

The rule: every buffer within ``maxMemoryAllocationSize``, and all of them together within the
largest device-local heap (``DeviceInfo.device_local_bytes``). A problem beyond either falls back
to the CPU, with the numbers in the reason. (Memory that other work holds at the time is not
foreseen: a driver that then runs out raises OutOfDeviceMemory, after the pool has given back what
it could -- see runtime.memory.BufferPool.acquire.)
"""

from __future__ import annotations

from ssm_ref import Dims

from . import runtime as rt
from .plan import Limits, Plan

__all__ = ["buffers", "check"]

F32 = 4
DUMMY_BYTES = 16


def _outputs(d, backward: bool) -> dict[str, int]:
    row = d.H * d.P * d.N
    if not backward:
        return {"y": d.S * d.T * d.H * d.P, "states": d.S * row}
    return {"d_s": d.R * row, "d_s0": d.S * row, "d_x": d.S * d.T * d.H * d.P, "d_dt": d.S * d.T * d.H,
            "d_A": d.H * (d.N if d.mamba1 else 1), "d_B": d.S * d.T * d.G * d.N, "d_C": d.S * d.T * d.G * d.N}


def _inputs(d, backward: bool) -> dict[str, int]:
    row = d.H * d.P * d.N
    sizes = {"s": d.R * row, "x": d.S * d.T * d.H * d.P, "dt": d.S * d.T * d.H,
             "A": d.H * (d.N if d.mamba1 else 1), "B": d.S * d.T * d.G * d.N, "C": d.S * d.T * d.G * d.N}
    if backward:
        sizes.update(g_y=d.S * d.T * d.H * d.P, g_states=d.S * row)
    return sizes


def _chunk_scratch(d, pl: Plan, backward: bool) -> dict[str, int]:
    """The chunked kernels' scratch, as record_chunked requests it."""
    from .chunk_plan import NOT_SCRATCH, scratch_elems

    cp = pl.chunked
    e = scratch_elems(d, cp.CL, cp.Sw, backward, cp.headloop)
    out = {k: v for k, v in e.items() if k not in NOT_SCRATCH}
    if backward:
        out.update(st=d.S * d.H * d.P * d.N, dAp=d.S * d.H * cp.NCH)
    return out


def _scratch(d, pl: Plan) -> dict[str, int]:
    """The backward's scratch, as record.record_backward requests it."""
    if not (pl.windows and d.H * d.P > 0):
        return {}
    lay = pl.layout
    row = d.H * d.P * d.N
    wmax = max(pl.windows, key=lambda w: w.S * w.T)
    nc_max = max(-(-w.T // lay.K) for w in pl.windows)
    sw_max = max(w.S for w in pl.windows)
    out = {"st": d.S * row, "dAp": d.S * d.H * d.P * (d.N if d.mamba1 else 1),
           "part_B": wmax.S * wmax.T * d.H * lay.NPB * d.N, "part_C": wmax.S * wmax.T * d.H * lay.NPB * d.N,
           "part_dt": wmax.S * wmax.T * d.H * lay.NPB}
    n_ck = sum(1 for w in pl.windows if w.i0 == 0) if pl.time_split else 1
    for k in range(n_ck):
        out[f"ck{k}"] = sw_max * row * nc_max
    return out


def buffers(d: Dims, pl: Plan, lim: Limits, backward: bool, resident=frozenset()) -> dict[str, int]:
    """Bytes of every buffer a call of a problem of dims ``d`` acquires (before the pool's
    rounding), by name; an upper bound where ids matter. ``resident``: names of inputs already on
    the device (DeviceArrays), which take nothing."""
    sizes = {f"in:{k}": n * F32 for k, n in _inputs(d, backward).items() if k not in resident}
    sizes.update({f"out:{k}": n * F32 for k, n in _outputs(d, backward).items()})
    row = d.H * d.P * d.N
    if pl.chunked is not None:
        # the chunked kernels' scratch, and a second set of outputs and scratch for the
        # token-sequential recompute of a call that turns out inf or nan
        from .record_chunked import FLAG_ELEMS

        sizes.update({f"scratch:{k}": n * F32 for k, n in _chunk_scratch(d, pl, backward).items()})
        sizes.update({"scratch:flag": FLAG_ELEMS * F32, "flag_host": 16})
        sizes.update({f"rerun:out:{k}": n * F32 for k, n in _outputs(d, backward).items()})
    if backward:
        sizes.update({f"scratch:seq:{k}": n * F32 for k, n in _scratch(d, pl).items()})
        if d.R * row:
            for k in range(d.S - 1):  # the most pair buffers any ids can ask for, each the smallest
                sizes[f"const:pairs{k}"] = 8
    sizes["dummy"] = DUMMY_BYTES
    return {k: v for k, v in sizes.items() if v > 0}


def _pooled(nbytes: int, limit: int) -> int:
    """What the pool allocates for a request (BufferPool.acquire's rounding)."""
    size = rt.BufferPool.size_class(nbytes)
    return nbytes if size > limit >= nbytes else size


def check(info, sizes: dict[str, int]) -> str:
    """Why ``sizes`` (from :func:`buffers`) do not fit device ``info``, or "" when they do."""
    limit = info.max_memory_allocation_size
    name, biggest = max(sizes.items(), key=lambda kv: kv[1], default=("", 0))
    if biggest > limit:
        return (f"{name.split(':')[-1]} needs a buffer of {biggest} bytes, above maxMemoryAllocationSize "
                f"({limit} bytes) of {info.name}")
    need = sum(_pooled(n, limit) for n in sizes.values())
    if need > info.device_local_bytes:
        return (f"the call needs {need} bytes of device memory, more than the {info.device_local_bytes} bytes "
                f"of {info.name}'s largest device-local heap")
    return ""
