"""The kernels' host-side table, what every family shares, in pure Python: a kernel's spec (GLSL
file, defines, bindings, push-constant layout -- the same order and names as the PC blocks of its
shader), packing push constants, and the specs of the shared kernels (ssm_vk/glsl/: the carry
over time chunks, the fixed-order reductions, the d_s row additions). Each family's own specs are
in its folder (``ssm_vk/<family>/<family>_specs.py``); the list of what a plan dispatches and the
packaged matrix are composed in ssm_vk.registry; a context's kernel of a spec is made by
recording.kernel.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ssm_ref import Dims

__all__ = ["KernelSpec", "carry_spec", "reduce_spec", "rows_spec", "pack_push", "defines_of",
           "softplus_constants", "CARRY_PUSH", "RED_PUSH", "ROWS_PUSH", "FLAT_WG", "SOFTPLUS"]

# Push-constant fields, in the order of the PC block of each shader (all uint32).
CARRY_PUSH = ("S", "H", "P", "N", "NCH", "gx", "gather", "o_s", "o_ids", "o_st")
RED_PUSH = ("S", "T", "H", "P", "N", "G", "NPB", "KA", "gx", "o_0", "o_3", "o_4", "o_5", "acc", "HS", "HSC")
ROWS_PUSH = ("L", "n_pairs", "gx", "o_src", "o_dst")

# Threads per workgroup of the element-wise kernels (reduce, rows).
FLAT_WG = 64


# The dt_softplus forms -> the kernels' specialisation constant SOFTPLUS (ssm_vk/glsl/math.glsl).
# One SPIR-V module serves every form: the form is set when the pipeline is made.
SOFTPLUS = {"ggml": 0, "log1p": 1, None: 2}


@dataclass(frozen=True)
class KernelSpec:
    name: str            # <name>.comp in ssm_vk/glsl/ or a family's glsl/
    defines: tuple       # ((key, value), ...) sorted, hashable
    n_bindings: int
    push: tuple          # field names
    wg: int              # threads per workgroup
    constants: tuple = ()  # specialisation constants 3, 4, ...: (SOFTPLUS,) for a form other than ggml's

    @property
    def push_size(self) -> int:
        return 4 * len(self.push)


def defines_of(**kw) -> tuple:
    return tuple(sorted((k, int(v)) for k, v in kw.items()))


def softplus_constants(code: int) -> tuple:
    """The specialisation constants of a kernel that computes the step, for form ``code``
    (none for ggml's, the shaders' default: the same pipelines as a call without the keyword)."""
    return (code,) if code else ()


def carry_spec(d: Dims, reverse: bool = False) -> KernelSpec:
    """ssm_scan_carry.comp: the middle pass of the forward (or, ``reverse``, the backward) parallel
    over time."""
    defs = dict(WG=FLAT_WG, MAMBA1=int(d.mamba1))
    if reverse:
        defs.update(REVERSE=1)
    return KernelSpec("ssm_scan_carry", defines_of(**defs), 6, CARRY_PUSH, FLAT_WG)


def reduce_spec(mode: int, no_dt: bool = False, per_sequence: bool = False) -> KernelSpec:
    """ssm_scan_reduce.comp: MODE 0 sums the d_B / d_C (and, unless ``no_dt``, d_dt) partials,
    MODE 1 d_A's, MODE 2 the chunked backward's M o GU over each group's heads (in place).
    ``per_sequence`` (MODE 1, the invariant mode): d_A the sum of per-sequence sums, in sequence
    order."""
    defs = dict(WG=FLAT_WG, MODE=mode)
    if no_dt:
        defs.update(NODT=1)
    if per_sequence:
        defs.update(SEQSUM=1)
    return KernelSpec("ssm_scan_reduce", defines_of(**defs), 6, RED_PUSH, FLAT_WG)


def rows_spec() -> KernelSpec:
    return KernelSpec("rows", defines_of(WG=FLAT_WG), 3, ROWS_PUSH, FLAT_WG)


def pack_push(fields: tuple, values: dict) -> bytes:
    """Pack push constants in field order; every field must be given and fit in uint32."""
    missing = [f for f in fields if f not in values]
    if missing:
        raise KeyError(f"push constants missing: {missing}")
    vals = [int(values[f]) for f in fields]
    for f, v in zip(fields, vals, strict=True):
        if not 0 <= v < 2**32:
            raise OverflowError(f"push constant {f} = {v} does not fit in uint32")
    return struct.pack(f"<{len(vals)}I", *vals)
