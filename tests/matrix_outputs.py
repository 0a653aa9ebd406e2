"""The chunked form at a matrix-unit precision beside the float64 scan, output by output: what
tests/ref/test_matrix_precision.py holds to ssm_ref.tolerance.MATRIX_TOL and
tests/measure_matrix_precision.py measures those bounds from."""

from __future__ import annotations

import numpy as np

import ssm_ref
from ssm_ref import chunked, scan

OUTS = ("y", "states", "d_s", "d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C")


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
