"""The backward is linear in (g_y, g_states); every run of a backend is bit-identical to the
last; non-finite values land where the float32 reference puts them."""

from __future__ import annotations

import warnings

import numpy as np

from ssm_ref.results import GRAD_NAMES
from ssm_ref.tolerance import OUTPUTS, nonfinite_mismatch

from ..cases import Case
from ._common import PropertyFailed, case_rng, combo, expect, run, snapshot_args, tol_for

__all__ = ["deterministic", "linear_backward", "nonfinite_pattern"]


def linear_backward(module, case: Case, tol: dict) -> bool:
    """backward(alpha * w1 + beta * w2) == alpha * backward(w1) + beta * backward(w2) for
    w = (g_y, g_states), within the tolerance of each term (ssm_ref.testing.properties._common.combo),
    and a zero w gives gradients that are exactly zero."""
    rng = case_rng(case, "linear")
    alpha, beta = (float(v) for v in rng.uniform(-2.0, 2.0, 2))
    gy2 = rng.uniform(-1.0, 1.0, case.g_y.shape).astype(np.float32)
    gs2 = rng.uniform(-1.0, 1.0, case.g_states.shape).astype(np.float32)
    a = case.args()
    mix_y = (np.float32(alpha) * case.g_y + np.float32(beta) * gy2).astype(np.float32)
    mix_s = (np.float32(alpha) * case.g_states + np.float32(beta) * gs2).astype(np.float32)
    one = run(module, a, case.g_y, case.g_states)
    if one.no_backward:
        return False
    two = run(module, a, gy2, gs2)
    mixed = run(module, a, mix_y, mix_s)
    zero = run(module, a, np.zeros_like(case.g_y), np.zeros_like(case.g_states))
    tt = tol_for(tol, case)
    checks = [combo(k, mixed[k], [(alpha, one[k]), (beta, two[k])], tt[k]) for k in GRAD_NAMES]
    expect("linear_backward", checks, case, f"alpha = {alpha:.4f}, beta = {beta:.4f}")
    nonzero = [k for k in GRAD_NAMES if np.any(zero[k] != 0)]
    if nonzero:
        raise PropertyFailed(f"linear_backward: g_y = 0 and g_states = 0 give non-zero {nonzero} for {case.label}")
    return True


def deterministic(module, case: Case, tol: dict) -> bool:
    """Two runs of forward and backward on the same input give the same bytes in every output
    (the forward's only, for a port without a backward), the compared snapshot slots included."""
    snap = snapshot_args(module, case)
    first = run(module, case.args(), case.g_y, case.g_states, **snap)
    second = run(module, case.args(), case.g_y, case.g_states, **snap)
    differ = [k for k in first.having((*OUTPUTS, "snapshots")) if first[k].tobytes() != second[k].tobytes()]
    if differ:
        raise PropertyFailed(f"deterministic: a second run changed the bytes of {differ} for {case.label}")
    return True


def nonfinite_pattern(module, case: Case, tol: dict) -> bool:
    """Every output has the non-finite pattern of ssm_ref's float32 result: np.isnan,
    np.isposinf and np.isneginf masks equal (so finite masks equal and infinities of the same
    sign). Nothing raises and no RuntimeWarning is emitted (docs/SPEC.md section 8). A port
    without a backward: its forward's outputs. K > 1: the compared snapshot slots too, and the
    gradients of the loss with g_snapshots."""
    import ssm_ref

    a = case.args()
    snap = snapshot_args(module, case)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        try:
            got = run(module, a, case.g_y, case.g_states, **snap)
        except (RuntimeWarning, FloatingPointError, ArithmeticError) as e:
            raise PropertyFailed(f"nonfinite_pattern: {type(e).__name__}: {e} for {case.label}") from e
    want = run(ssm_ref, case.args(), case.g_y, case.g_states, **snap)
    bad = [f"{k}: {why}" for k in got.having((*OUTPUTS, "snapshots"))
           if (why := nonfinite_mismatch(got[k], want[k]))]
    if bad:
        raise PropertyFailed(f"nonfinite_pattern fails against the float32 reference for {case.label}:\n  "
                             + "\n  ".join(bad))
    return True
