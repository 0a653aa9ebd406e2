"""``out=`` of ssm_scan / ssm_scan_back (and mamba3_scan's): the caller's DeviceArrays that a call writes its outputs
into (docs/API.md). :func:`check` validates them before any work; :func:`fill` uploads a CPU
fallback's results into them.

Given outputs are bound in place of the pooled ones the call would take (ssm_vk.run.run_bound):
the recorded sequence writes them, so the call needs no copy of its own -- what ssm_torch's
CUDA-tensor path (its arena's output slots) uses to make one submission per call.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ssm_ref.ops import SCAN

from . import runtime as rt
from .arrays import DeviceArray
from .sizing import output_shapes

__all__ = ["check", "fill"]

_F32 = np.dtype(np.float32)
_INPUTS = (*SCAN.float_inputs, *SCAN.cotangent_names, "g_snapshots")


def _span(a: DeviceArray) -> tuple | None:
    """(buffer, first byte, end byte) of ``a``'s elements; None when it has none."""
    if a.buffer is None or a.size == 0:
        return None
    start = a.offset * a.dtype.itemsize
    return a.buffer, start, start + a.nbytes


def _overlap(u: tuple | None, v: tuple | None) -> bool:
    return u is not None and v is not None and u[0] is v[0] and u[1] < v[2] and v[1] < u[2]


def check(out, p, backward: bool, update_cache=False, shapes: dict | None = None, op: str | None = None,
          inputs: tuple = _INPUTS, arrays: dict | None = None) -> dict:
    """``out`` checked for problem ``p`` (ssm_ref's checked Problem): {name: DeviceArray} in the
    order of the outputs. Another op's call (Mamba-3's) gives its outputs' ``shapes`` by name, its
    name ``op``, its inputs' names ``inputs`` (the scan's by default) and, where ``p`` holds
    stand-ins of them, the arrays themselves by name (``arrays``). Raises, naming
    ``out[name]``: ValueError for update_cache (its states go into the cache rows), a missing or
    unknown name, another shape, a view that does not start its buffer (offset 0: what the
    recordings take), a released array, one of another context than the open one, one that
    overlaps an input or another output; TypeError for ``out`` not a mapping, a value not a
    DeviceArray or not float32."""
    if op is None:
        op = "ssm_scan_back" if backward else "ssm_scan"
    if update_cache is not False:
        raise ValueError(f"out: not with update_cache (the final states go into the cache rows; {op}'s "
                         "outputs are then y and the snapshots alone): pass one or the other")
    if not isinstance(out, Mapping):
        raise TypeError(f"out: a dict {{name: DeviceArray}} of every output of {op}, got {type(out).__name__}")
    if shapes is None:
        shapes = output_shapes(p.dims, backward)
    every = ", ".join(shapes)
    for k in out:
        if k not in shapes:
            raise ValueError(f"out[{k!r}]: not an output of this {op} (its outputs: {every})")
    for k in shapes:
        if k not in out:
            raise ValueError(f"out[{k!r}]: missing: out gives every output of this {op} ({every})")
    ctx = rt.current_context()
    given: dict = {}
    spans: list = []
    for k, shape in shapes.items():
        a, what = out[k], f"out[{k!r}]"
        if not isinstance(a, DeviceArray):
            raise TypeError(f"{what}: a DeviceArray (ssm_vk.to_device of an array of its shape, or a view of "
                            f"one), got {type(a).__name__}")
        if a.dtype != _F32:
            raise TypeError(f"{what}: float32, got {a.dtype}")
        if a.shape != tuple(int(n) for n in shape):
            raise ValueError(f"{what}: shape {a.shape}, the output's is {tuple(shape)}")
        if a.offset:   # (the recordings bind some outputs from their buffer's start: d_s0 carries the adjoint)
            raise ValueError(f"{what}: a view at element {a.offset} of its buffer; an output starts its buffer "
                             "(a whole array, or a view at 0)")
        if not a.live():
            raise ValueError(f"{what}: this DeviceArray was released (or its Vulkan context closed)")
        if a.ctx is not ctx:
            raise ValueError(f"{what}: a DeviceArray of another Vulkan context than the open one")
        span = _span(a)
        for j, other in spans:
            if _overlap(span, other):
                raise ValueError(f"{what}: overlaps out[{j!r}] (outputs take memory of their own)")
        for j in inputs:
            v = getattr(p, j, None) if arrays is None else arrays.get(j)
            if isinstance(v, DeviceArray) and _overlap(span, _span(v)):
                raise ValueError(f"{what}: overlaps the input {j} (outputs take memory of their own)")
        spans.append((k, span))
        given[k] = a
    return given


def fill(given: dict, result) -> None:
    """Upload the results of a CPU fallback (``result``'s fields by the names of ``given``: host
    arrays, or DeviceArrays ssm_ref's K = 1 snapshots would not be) into the given arrays."""
    for k, a in given.items():
        v = getattr(result, k)
        a.write(v.numpy() if isinstance(v, DeviceArray) else v)
