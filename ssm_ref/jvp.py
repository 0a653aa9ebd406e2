"""Forward-mode differentiation of the scan: tangents of y and states for tangents of the inputs.

Glossary: N d_state · P head_dim · H n_head · G n_group · T tokens · S sequences · R cache rows.

For a direction v = (s_dot, x_dot, dt_dot, A_dot, B_dot, C_dot) this computes J v, the
directional derivative of (y, states), by carrying a tangent beside every quantity of the
forward in scan.py (a dot marks a tangent, the product rule gives each line):

    d_dot  = softplus'(dt) * dt_dot              softplus' as in the backward (1 when dt > 20)
    a_dot  = a * (d_dot * A + d * A_dot)         a = exp(d * A)
    u_dot  = x_dot * d + x * d_dot               u = x * d
    st_dot = st_dot * a + st * a_dot + B_dot * u + B * u_dot
    y_dot  = sum_n st_dot * C + st * C_dot
    st_dot starts at s_dot[ids[i]]

It does not use the backward. The tests use it for the dot-product test of every backend's
backward: <J v, w> == <v, J^T w>, with J v from here in float64 and J^T w from the backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .checks import Problem, check_forward
from .scan import _decay, _per_head, softplus, softplus_grad

__all__ = ["ScanTangents", "ssm_scan_jvp"]

TANGENTS = ("s_dot", "x_dot", "dt_dot", "A_dot", "B_dot", "C_dot")


@dataclass(frozen=True, eq=False)
class ScanTangents:
    """The forward's outputs and their tangents, in the working dtype.

    y, y_dot: (S, T, H, P)   states, states_dot: (S, H, P, N)
    """

    y: np.ndarray
    states: np.ndarray
    y_dot: np.ndarray
    states_dot: np.ndarray


def _tangent(name: str, value, like: np.ndarray, shape_text: str, dtype) -> np.ndarray:
    """``value`` as an array of ``like``'s shape in ``dtype``; None means zeros."""
    if value is None:
        return np.zeros(like.shape, dtype=dtype)
    arr = np.asarray(value)
    if arr.dtype.kind != "f":
        raise TypeError(f"{name}: expected a float array, got dtype {arr.dtype}")
    if arr.shape != like.shape:
        raise ValueError(f"{name}: expected shape {shape_text} = {like.shape} (the shape of its input), "
                         f"got {arr.shape}")
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(arr, dtype=dtype)


def _tangents(p: Problem, given: dict) -> dict:
    dm = p.dims
    A_given = p.A.reshape(dm.a_shape)
    specs = {
        "s_dot": (p.s, "(R, H, P, N)"), "x_dot": (p.x, "(S, T, H, P)"), "dt_dot": (p.dt, "(S, T, H)"),
        "A_dot": (A_given, "the shape of A"), "B_dot": (p.B, "(S, T, G, N)"), "C_dot": (p.C, "(S, T, G, N)"),
    }
    out = {k: _tangent(k, given[k], like, text, p.dtype) for k, (like, text) in specs.items()}
    out["A_dot"] = out["A_dot"].reshape(p.A.shape)             # (H, 1|N) like p.A
    return out


def ssm_scan_jvp(s, x, dt, A, B, C, ids=None, s_dot=None, x_dot=None, dt_dot=None, A_dot=None,
                 B_dot=None, C_dot=None, *, dtype=np.float64) -> ScanTangents:
    """Forward scan plus its directional derivative along the given input tangents.

    Primal arguments as :func:`ssm_ref.ssm_scan`. Each tangent has the shape of its input
    (``A_dot`` the shape A was given in); None means zero. ``dtype``: np.float64 (default: the
    oracle, for gradient checks) or np.float32. Returns :class:`ScanTangents`; ``y`` and
    ``states`` are bit-identical to ``ssm_ref.ssm_scan(..., dtype=dtype)``.
    Raises TypeError / ValueError for bad primal input (as ssm_scan), ValueError for a tangent
    of the wrong shape, TypeError for a non-float tangent.
    """
    p = check_forward(s, x, dt, A, B, C, ids, dtype=dtype)
    tan = _tangents(p, dict(s_dot=s_dot, x_dot=x_dot, dt_dot=dt_dot, A_dot=A_dot, B_dot=B_dot,
                            C_dot=C_dot))
    dm = p.dims
    S, T, H, P = dm.S, dm.T, dm.H, dm.P
    A, A_dot = p.A, tan["A_dot"]                                     # (H, 1|N) each
    with np.errstate(over="ignore", invalid="ignore"):
        st = p.s[p.ids].copy()                                       # (S, H, P, N)
        st_dot = tan["s_dot"][p.ids].copy()                          # (S, H, P, N)
        y = np.empty((S, T, H, P), dtype=p.dtype)                    # (S, T, H, P)
        y_dot = np.empty((S, T, H, P), dtype=p.dtype)                # (S, T, H, P)
        for t in range(T):
            z = p.dt[:, t]                                           # (S, H)
            d = softplus(z)                                          # (S, H)
            d_dot = softplus_grad(z) * tan["dt_dot"][:, t]           # (S, H)
            a = _decay(p, d)                                         # (S, H, 1, 1|N)
            a_dot = a * (d_dot[:, :, None, None] * A[None, :, None, :]
                         + d[:, :, None, None] * A_dot[None, :, None, :])  # (S, H, 1, 1|N)
            x_t = p.x[:, t]                                          # (S, H, P)
            u = x_t * d[:, :, None]                                  # (S, H, P)
            u_dot = tan["x_dot"][:, t] * d[:, :, None] + x_t * d_dot[:, :, None]  # (S, H, P)
            Bt, Bt_dot = _per_head(p, p.B[:, t]), _per_head(p, tan["B_dot"][:, t])  # (S, H, N) each
            Ct, Ct_dot = _per_head(p, p.C[:, t]), _per_head(p, tan["C_dot"][:, t])  # (S, H, N) each
            st_dot = (st_dot * a + st * a_dot + Bt_dot[:, :, None, :] * u[..., None]
                      + Bt[:, :, None, :] * u_dot[..., None])       # (S, H, P, N)
            st = st * a + Bt[:, :, None, :] * u[..., None]           # (S, H, P, N), as scan.forward
            y[:, t] = np.sum(st * Ct[:, :, None, :], axis=-1)        # (S, H, P)
            y_dot[:, t] = np.sum(st_dot * Ct[:, :, None, :] + st * Ct_dot[:, :, None, :], axis=-1)
    return ScanTangents(y=y, states=st, y_dot=y_dot, states_dot=st_dot)
