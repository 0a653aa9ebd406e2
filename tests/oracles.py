"""Expected values built without the code under test's backward: a scalar-loop forward written
straight from docs/SPEC.md, the loss the backward differentiates, and finite differences of it.

Glossary: N d_state · P head_dim · H n_head · G n_group · T tokens · S sequences · R cache rows.
"""

from __future__ import annotations

import math

import numpy as np

import ssm_ref

__all__ = ["fd_grad", "loss", "naive_forward", "scatter_add", "snapshot_cotangent", "snapshot_oracle"]


def _softplus(z: float) -> float:
    return z if z > 20 else math.log(1.0 + math.exp(z))


def naive_forward(s, x, dt, A, B, C, ids=None):
    """docs/SPEC.md's forward, one scalar at a time in Python floats (float64). Slow: tiny shapes only.

    Returns y (S, T, H, P) and states (S, H, P, N) as float64 arrays.
    """
    s, x, dt, A, B, C = (np.asarray(v, dtype=np.float64) for v in (s, x, dt, A, B, C))
    S, T, H, P = x.shape
    N = s.shape[3]
    G = B.shape[2]
    ids = np.arange(S) if ids is None else np.asarray(ids)
    A2 = A.reshape(H, -1)                                  # (H, 1) Mamba-2 or (H, N) Mamba-1
    y = np.zeros((S, T, H, P))
    states = np.zeros((S, H, P, N))
    for i in range(S):
        for h in range(H):
            g = h // (H // G)
            for p in range(P):
                st = [float(v) for v in s[ids[i], h, p]]
                for t in range(T):
                    d = _softplus(float(dt[i, t, h]))
                    u = float(x[i, t, h, p]) * d
                    acc = 0.0
                    for n in range(N):
                        a = math.exp(d * float(A2[h, n if A2.shape[1] > 1 else 0]))
                        st[n] = st[n] * a + float(B[i, t, g, n]) * u
                        acc += st[n] * float(C[i, t, g, n])
                    y[i, t, h, p] = acc
                states[i, h, p] = st
    return y, states


def scatter_add(rows: np.ndarray, ids, R: int) -> np.ndarray:
    """(S, ...) rows added into an (R, ...) zero array at ids, by an explicit Python loop."""
    out = np.zeros((R, *rows.shape[1:]), dtype=np.float64)
    for i, r in enumerate(np.asarray(ids).tolist()):
        out[r] += rows[i]
    return out


def loss(inputs: dict, g_y, g_states, dt_softplus="ggml") -> float:
    """sum(y * g_y) + sum(states * g_states) of the float64 forward (``dt_softplus``: its form)."""
    r = ssm_ref.ssm_scan(**inputs, dtype=np.float64, dt_softplus=dt_softplus)
    return float(np.sum(r.y * g_y) + np.sum(r.states * g_states))


def fd_grad(inputs: dict, name: str, g_y, g_states, *, idx=None, h: float = 1e-3,
            dt_softplus="ggml") -> np.ndarray:
    """Finite-difference gradient of :func:`loss` w.r.t. ``inputs[name]`` (float64).

    Fourth-order central stencil (f(-2h) - 8 f(-h) + 8 f(h) - f(2h)) / 12h: with h = 1e-3 its
    truncation error (~h^4) and rounding error (~1e-16 * |loss| / h) are both near 1e-12, so a
    1e-7 comparison has a wide margin. ``idx``: flat indices to evaluate (default: all); the
    result then holds only those entries, in that order. ``dt_softplus``: the forward's form.
    """
    base = np.asarray(inputs[name], dtype=np.float64)
    flat = range(base.size) if idx is None else idx
    g_y = np.asarray(g_y, dtype=np.float64)
    g_states = np.asarray(g_states, dtype=np.float64)
    out = []
    for k in flat:
        i = np.unravel_index(int(k), base.shape)
        vals = []
        for step in (-2, -1, 1, 2):
            moved = base.copy()
            moved[i] += step * h
            vals.append(loss({**inputs, name: moved}, g_y, g_states, dt_softplus))
        out.append((vals[0] - 8 * vals[1] + 8 * vals[2] - vals[3]) / (12 * h))
    res = np.array(out, dtype=np.float64)
    return res.reshape(base.shape) if idx is None else res


def snapshot_cotangent(case, K: int, seed: int = 0) -> np.ndarray:
    """A random gradient of ``case``'s K snapshot slots, every slot nonzero (those k > T too: a
    bridge must drop them)."""
    d = case.dims
    return np.random.default_rng(seed).uniform(-1.0, 1.0, (K, d["S"], d["H"], d["P"], d["N"]))


def snapshot_oracle(case, K: int, g_snap: np.ndarray, forms="ggml"):
    """ssm_ref in float64: the forward with K slots, and the backward of sum(y * g_y) + sum(states *
    g_states) + sum(snapshots * g_snap) over the slots that hold a state (k <= T)."""
    args = case.args(np.float64)
    r = ssm_ref.ssm_scan(**args, dtype=np.float64, dt_softplus=forms, snapshots=K)
    held = g_snap.copy()
    held[case.dims["T"] + 1:] = 0.0   # slots k > T hold NaN, which depends on nothing
    g = ssm_ref.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states, g_snapshots=held, dtype=np.float64,
                              dt_softplus=forms)
    return r, g
