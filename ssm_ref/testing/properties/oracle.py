"""Properties against the float64 truth: agreement with the oracle, forward and backward, and
the dot-product (adjoint) test of the backward against the reference's forward mode."""

from __future__ import annotations

import math

import numpy as np

from ssm_ref.jvp import ssm_scan_jvp
from ssm_ref.ops import SCAN

from ..cases import INPUT_NAMES, Case
from ._common import PropertyFailed, case_rng, close, expect, oracle, run, snapshot_args, tol_for

__all__ = ["adjoint", "oracle_backward", "oracle_forward"]

FORWARD = SCAN.output_names          # y, states
BACKWARD = SCAN.grad_names           # d_s, d_s0, d_x, d_dt, d_A, d_B, d_C
GRAD_OF = SCAN.grad_of               # s -> d_s, x -> d_x, ...


def _dtypes(prop: str, got: dict, case: Case) -> None:
    wrong = {k: str(v.dtype) for k, v in got.items() if v.dtype != np.float32}
    if wrong:
        raise PropertyFailed(f"{prop}: outputs must be float32, got {wrong} for {case.label}")


def _missing(prop: str, got: dict, names, case: Case) -> None:
    lacking = [k for k in names if k not in got]
    if lacking:
        raise PropertyFailed(f"{prop}: the port returned no {lacking} for {case.label}")


def forward_names(case: Case, got: dict, snap: dict) -> tuple:
    """The forward outputs compared: y, states and, for a port that declares SNAPSHOTS, the
    snapshots (required when K > 1; at K = 1 when the port returns them)."""
    wants = snap["slots"] and (case.K > 1 or "snapshots" in got)
    return (*FORWARD, "snapshots") if wants else FORWARD


def oracle_forward(module, case: Case, tol: dict) -> bool:
    """y, states and the K snapshot slots (a port that declares SNAPSHOTS; a "ggml" one: the
    slots k < T) within the tolerance of the float64 oracle (non-finite entries at the same
    places with the same values: the NaN of the slots k > T included)."""
    snap = snapshot_args(module, case)
    got = run(module, case.args(), case.g_y, case.g_states, backward=False, **snap)
    want = oracle(case.args(), case.g_y, case.g_states, backward=False, **snap)
    names = forward_names(case, got, snap)
    _missing("oracle_forward", got, names, case)
    _dtypes("oracle_forward", got, case)
    t = tol_for(tol, case)
    expect("oracle_forward", [close(k, got[k], want[k], t) for k in names], case)
    return True


def oracle_backward(module, case: Case, tol: dict) -> bool:
    """Every gradient (d_s, d_s0, d_x, d_dt, d_A, d_B, d_C) within the tolerance of the oracle;
    with K > 1 (a port that declares SNAPSHOTS) the loss has the snapshots' term, g_snapshots."""
    snap = snapshot_args(module, case)
    got = run(module, case.args(), case.g_y, case.g_states, **snap)
    if got.no_backward:
        return False
    want = oracle(case.args(), case.g_y, case.g_states, **snap)
    _dtypes("oracle_backward", got, case)
    t = tol_for(tol, case)
    expect("oracle_backward", [close(k, got[k], want[k], t) for k in BACKWARD], case)
    return True


def _jvp_dot(case: Case, tangents: dict) -> float:
    """<J v, w> in float64: the reference's forward mode along v, dotted with w = (g_y, g_states)."""
    j = ssm_scan_jvp(**case.args(np.float64), **{f"{k}_dot": v for k, v in tangents.items()})
    return float(np.sum(j.y_dot * case.g_y.astype(np.float64))
                 + np.sum(j.states_dot * case.g_states.astype(np.float64)))


def adjoint(module, case: Case, tol: dict) -> bool:
    """<J v, w> == <v, J^T w> for random directions v: J v from ssm_ref's float64 forward mode,
    J^T w from ``module``'s backward with w = (g_y, g_states). Checked along each input alone
    and along all at once. The bound is what the tolerance table allows the gradients:
    |<v, err>| <= sum over inputs k of ||v_k|| * (rtol_k * ||J^T w|_k|| + atol_k * sqrt(size_k))
    (Cauchy-Schwarz), plus float64 rounding of the two dot products."""
    grads = run(module, case.args(), case.g_y, case.g_states)
    if grads.no_backward:
        return False
    t = tol_for(tol, case)
    rng = case_rng(case, "adjoint")
    shapes = {k: np.shape(case.inputs[k]) for k in INPUT_NAMES}
    full = {k: rng.uniform(-1.0, 1.0, shapes[k]) for k in INPUT_NAMES}
    failures = []
    for wrt in (*INPUT_NAMES, "all"):
        v = full if wrt == "all" else {wrt: full[wrt]}
        lhs = _jvp_dot(case, v)
        terms = {k: np.asarray(grads[GRAD_OF[k]], dtype=np.float64) * vk for k, vk in v.items()}
        rhs = float(sum(np.sum(x) for x in terms.values()))
        bound = 0.0
        for k, vk in v.items():
            g = np.asarray(grads[GRAD_OF[k]], dtype=np.float64)
            tk = t[GRAD_OF[k]]
            bound += float(np.linalg.norm(vk)) * (tk.rtol * float(np.linalg.norm(g)) + tk.atol * math.sqrt(g.size))
        bound += 1e-12 * (abs(lhs) + float(sum(np.sum(np.abs(x)) for x in terms.values())))
        if not (abs(lhs - rhs) <= bound):
            failures.append(f"along {wrt}: <J v, w> = {lhs:.9e}, <v, J^T w> = {rhs:.9e}, "
                            f"|difference| = {abs(lhs - rhs):.3e} > bound {bound:.3e}")
    if failures:
        raise PropertyFailed(f"adjoint fails for {case.label}:\n  " + "\n  ".join(failures))
    return True
