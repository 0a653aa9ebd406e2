"""The scan kernels' host-side table: which GLSL file, which defines, how many bindings and the
push-constant layout of each -- the same order and names as the PC blocks in ssm_vk/glsl/*.comp."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ssm_ref import Dims

from .plan import Layout

__all__ = ["KernelSpec", "fwd_spec", "bwd_spec", "reduce_spec", "rows_spec", "chunk_spec", "pack_push",
           "FWD_PUSH", "BWD_PUSH", "RED_PUSH", "ROWS_PUSH", "CHUNK_PUSH", "CHUNK_BINDINGS"]

# Push-constant fields, in the order of the PC block of each shader (all uint32).
FWD_PUSH = ("S", "T", "H", "P", "N", "G", "HB", "PB", "NHB", "NPB", "gx", "NC", "c0",
            "o_x", "o_dt", "o_B", "o_C", "o_y", "o_st", "o_ck")
BWD_PUSH = ("S", "T", "H", "P", "N", "G", "HB", "PB", "NHB", "NPB", "gx", "NC", "c0",
            "o_x", "o_dt", "o_B", "o_C", "o_gy", "o_lam", "o_ck", "o_dx", "o_dA")
RED_PUSH = ("S", "T", "H", "P", "N", "G", "NPB", "KA", "gx", "o_0", "o_3", "o_4", "o_5", "acc")
ROWS_PUSH = ("L", "n_pairs", "gx", "o_src", "o_dst")
# The chunked kernels (ssm_vk/glsl/chunk_common.glsl): one push block and one binding table for all.
CHUNK_PUSH = ("S", "T", "H", "G", "NCH", "gx", "o_x", "o_dt", "o_B", "o_C", "o_gy", "o_out", "o_st")
CHUNK_BINDINGS = ("x", "dt", "A", "B", "C", "gy", "hs", "gs", "cb", "mcb", "gu", "mgu", "dec", "out",
                  "sm", "st", "ddtp", "dAp", "flag")

# Threads per workgroup of the element-wise kernels (reduce, rows).
FLAT_WG = 64


@dataclass(frozen=True)
class KernelSpec:
    name: str            # ssm_vk/glsl/<name>.comp
    defines: tuple       # ((key, value), ...) sorted, hashable
    n_bindings: int
    push: tuple          # field names
    wg: int              # threads per workgroup

    @property
    def push_size(self) -> int:
        return 4 * len(self.push)


def _defs(**kw) -> tuple:
    return tuple(sorted((k, int(v)) for k, v in kw.items()))


def _common(d: Dims, lay: Layout) -> dict:
    return dict(WG=lay.WG, LN=lay.LN, NPL=lay.NPL, ROW_SUM=lay.ROW_SUM, MAMBA1=int(d.mamba1))


def fwd_spec(d: Dims, lay: Layout, checkpoint: bool) -> KernelSpec:
    defs = _common(d, lay)
    defs.update(CKPT=int(checkpoint), K=lay.K, TB=lay.TB)
    return KernelSpec("ssm_scan", _defs(**defs), 8, FWD_PUSH, lay.WG)


def bwd_spec(d: Dims, lay: Layout) -> KernelSpec:
    defs = _common(d, lay)
    defs.update(K=lay.K, TBR=lay.TBR)
    return KernelSpec("ssm_scan_back", _defs(**defs), 13, BWD_PUSH, lay.WG)


def reduce_spec(mode: int) -> KernelSpec:
    return KernelSpec("ssm_scan_reduce", _defs(WG=FLAT_WG, MODE=mode), 6, RED_PUSH, FLAT_WG)


def rows_spec() -> KernelSpec:
    return KernelSpec("rows", _defs(WG=FLAT_WG), 3, ROWS_PUSH, FLAT_WG)


def chunk_spec(name: str, d: Dims, CL: int, wg: int, **defines) -> KernelSpec:
    """A chunked kernel (ssm_vk/glsl/<name>.comp): sizes P, N and the chunk length are compile-time."""
    defs = _defs(WG=wg, CL=CL, PD=d.P, ND=d.N, **defines)
    return KernelSpec(name, defs, len(CHUNK_BINDINGS), CHUNK_PUSH, wg)


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
