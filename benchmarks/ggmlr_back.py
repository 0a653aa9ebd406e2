"""ggmlR's CPU backward of SSM_SCAN (its SSM_SCAN_BACK op), called through ctypes.

The library is ggmlR's own ``src/ggml-cpu/ops-ssm.cpp`` (https://github.com/Zabis13/ggmlR),
compiled unchanged with our harness by ``tools/build_ggmlr_back.sh``; its path comes from the
environment variable ``SSM_GGMLR_BACK_LIB`` (the file, or the folder holding it). Used by
``benchmarks/cpu_targets.py``, which compares every gradient block with ssm_fast's before timing
(its pytest check against the float64 oracle, ``benchmarks/check_ggmlr_back.py``: commit d8008ea).

Glossary: N d_state, P head_dim, H n_head, G n_group, T tokens, S sequences, R cache rows.
Inputs are ssm_ref's (docs/SPEC.md section 2): s (R,H,P,N), x (S,T,H,P), dt (S,T,H),
A (H,) | (H,1) | (H,N), B and C (S,T,G,N), ids (S,); the gradient is the packed forward layout
(g_y then g_states) and the result the packed backward layout d_s0 | d_x | d_dt | d_A | d_B | d_C
(section 7; ``ssm_ref.unpack_backward`` splits it).
"""

from __future__ import annotations

import ctypes
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ENV = "SSM_GGMLR_BACK_LIB"
LIB_NAME = "libssm_ggmlr_back.so"

_f32p = ctypes.POINTER(ctypes.c_float)


def lib_path() -> Path:
    """The library named by SSM_GGMLR_BACK_LIB. Raises FileNotFoundError saying why there is none."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        raise FileNotFoundError(f"{ENV} is not set: build the library with tools/build_ggmlr_back.sh "
                                "(docs/BENCHMARKS.md says where ggmlR's source comes from)")
    path = Path(raw)
    if path.is_dir():
        path = path / LIB_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{ENV}={raw}: no {path}")
    return path


@dataclass(frozen=True)
class GgmlrBack:
    """A loaded library: ``info`` is its build stamp (ggmlr-build.json beside it), or {}."""

    path: Path
    info: dict
    _fn: object

    def scan_back(self, s, x, dt, A, B, C, ids, g_packed, *, threads: int = 2) -> tuple[np.ndarray, float]:
        """Run ggmlR's backward on ``threads`` OpenMP threads. Returns (packed gradients, float32,
        and the seconds of the threaded region alone). Raises ValueError for shapes the op cannot take."""
        s, x, dt, A, B, C = (np.ascontiguousarray(v, dtype=np.float32) for v in (s, x, dt, A, B, C))
        ids = np.ascontiguousarray(np.arange(x.shape[0]) if ids is None else ids, dtype=np.int32)
        g = np.ascontiguousarray(g_packed, dtype=np.float32).ravel()
        R, H, P, N = s.shape
        S, T = x.shape[:2]
        G = B.shape[2]
        a_n = A.shape[1] if A.ndim == 2 else 1                     # 1: Mamba-2, N: Mamba-1
        if g.size != S * T * H * P + S * H * P * N:
            raise ValueError(f"g_packed: expected {S * T * H * P + S * H * P * N} elements, got {g.size}")
        out = np.empty(S * H * P * N + S * T * H * P + S * T * H + A.size + 2 * S * T * G * N, np.float32)
        dims = (ctypes.c_int64 * 7)(N, P, H, G, T, S, R)
        secs = ctypes.c_double()
        rc = self._fn(dims, a_n, *(v.ctypes.data_as(_f32p) for v in (s, x, dt, A, B, C)),
                      ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), g.ctypes.data_as(_f32p),
                      out.ctypes.data_as(_f32p), int(threads), ctypes.byref(secs))
        if rc != 0:
            raise ValueError(f"ggmlR's SSM_SCAN_BACK cannot take N={N} P={P} H={H} G={G} T={T} S={S} R={R}, "
                             f"A {A.shape}, ids {ids.tolist()[:8]}, threads {threads}")
        return out, secs.value


def load(path: str | os.PathLike | None = None) -> GgmlrBack:
    """Load the library (``path``, else SSM_GGMLR_BACK_LIB). Raises FileNotFoundError or OSError."""
    p = Path(path) if path is not None else lib_path()
    lib = ctypes.CDLL(str(p))
    fn = lib.ssm_ggmlr_scan_back
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int64, *([_f32p] * 6),
                   ctypes.POINTER(ctypes.c_int32), _f32p, _f32p, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
    stamp = p.parent / "ggmlr-build.json"
    info = json.loads(stamp.read_text()) if stamp.is_file() else {}
    return GgmlrBack(path=p, info=info, _fn=fn)
