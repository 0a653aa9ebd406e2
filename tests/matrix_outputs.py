"""The chunked forms at a matrix-unit precision beside the float64 scans, output by output: what
tests/ref/test_matrix_precision.py holds to ssm_ref.tolerance.MATRIX_TOL (the scan) and
MAMBA3_MATRIX_TOL (Mamba-3), and tests/measure_matrix_precision.py measures those bounds from."""

from __future__ import annotations

import numpy as np

import ssm_ref
from ssm_ref import chunked, mamba3, mamba3_chunked, mamba3_chunked_back, scan
from ssm_ref.mamba3_checks import check_mamba3_backward
from ssm_ref.ops import MAMBA3

OUTS = ("y", "states", "d_s", "d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C")
# Mamba-3's outputs and gradients; the start states' gradients per sequence (d0_*, before the
# scatter into cache rows) under the names of the op's (d_s_*), whose bounds they take
M3_OUTS = (*MAMBA3.output_names, *(g for g in MAMBA3.grad_names if g != "d_psi"), "d_psi")


def chunked_and_float64(case, L: int, precision: str) -> tuple[dict, dict]:
    """({output: ssm_ref.chunked's forward and backward in float32 at ``precision``, chunks of L},
    {output: ssm_ref.scan's in float64}) for ``case`` (a problems.Case) and its cotangents."""
    kw = dict(g_y=case.g_y, g_states=case.g_states)
    p64 = ssm_ref.check_backward(**case.args(), **kw, dtype=np.float64)
    p32 = ssm_ref.check_backward(**case.args(), **kw, dtype=np.float32)
    y, states, _ = scan.forward(p64)
    want = {"y": y, "states": states, **scan.backward(p64)}
    cy, cstates = chunked.forward(p32, L, precision=precision)
    got = {"y": cy, "states": cstates, **chunked.backward(p32, L, precision=precision)}
    return got, want


def mamba3_chunked_and_float64(case, L: int, precision: str) -> tuple[dict, dict]:
    """({output: ssm_ref.mamba3_chunked's forward and backward in float32 at ``precision``, chunks
    of L}, {output: ssm_ref.mamba3's token-by-token scan in float64}) for ``case`` (an OpCase of
    ssm_ref.testing.mamba3_cases) and its cotangents (d_psi only where psi is given)."""
    a, cot = case.args(), case.cotangents
    args = [a[n] for n in MAMBA3.float_inputs] + [a["ids"]] + [cot[n] for n in MAMBA3.cotangent_names]

    def problem(dtype):
        return check_mamba3_backward(*args, rotation=case.keywords["rotation"], dtype=dtype)

    def named(y, finals, grads):
        out = dict(zip(MAMBA3.output_names, (y, *finals), strict=True))
        for k, v in grads.items():
            out["d_s_" + k[3:] if k.startswith("d0_") else k] = v
        if a["psi"] is None:
            out.pop("d_psi")
        return out

    p64, p32 = problem(np.float64), problem(np.float32)
    want = named(*mamba3.forward(p64), mamba3.backward(p64))
    y, finals = mamba3_chunked.forward(p32, L, precision=precision)
    got = named(y, finals, mamba3_chunked_back.backward(p32, L, precision=precision))
    return got, want
