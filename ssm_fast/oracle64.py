"""A parallel float64 copy of the reference, for checking other backends at sizes where
``ssm_ref`` (numpy, one core, all T states in memory) is too slow or too large.

Same equations and results as ``ssm_ref.ssm_scan(..., dtype=np.float64)`` and
``ssm_ref.ssm_scan_back(..., dtype=np.float64)`` (tested against them), parallel over
(sequence, head) with numba; the K state snapshots (``snapshots=K``, ``g_snapshots``) included.
Memory: one row's T+1 states per thread, plus per-head partial sums
of d_B and d_C (S, H, T, N) that are added over the heads of each group in order afterwards.
"""

from __future__ import annotations

import numba as nb
import numpy as np

import ssm_ref

__all__ = ["scan64", "scan_back64"]


@nb.njit(cache=True, inline="always")
def _softplus(z):
    return z if z > 20.0 else np.log(1.0 + np.exp(z))


@nb.njit(cache=True, inline="always")
def _softplus_grad(z):
    return 1.0 if z > 20.0 else 1.0 / (1.0 + np.exp(-z))


@nb.njit(parallel=True, cache=True)
def _forward(s0, x, dt, A, B, C, y, states, snaps):
    S, T, H, P = x.shape
    N = s0.shape[3]
    G = B.shape[2]
    K = snaps.shape[0]
    hpg = H // G
    for ih in nb.prange(S * H):
        i, h = ih // H, ih % H
        g = h // hpg
        for p in range(P):
            st = s0[i, h, p].copy()
            if T < K:
                snaps[T, i, h, p] = st                      # slot T: the start state
            for t in range(T):
                d = _softplus(dt[i, t, h])
                u = x[i, t, h, p] * d
                acc = 0.0
                for n in range(N):
                    a = np.exp(d * A[h, n if A.shape[1] > 1 else 0])
                    st[n] = st[n] * a + B[i, t, g, n] * u
                    acc += st[n] * C[i, t, g, n]
                y[i, t, h, p] = acc
                if T - 1 - t < K:
                    snaps[T - 1 - t, i, h, p] = st          # the state after t + 1 tokens
            states[i, h, p] = st


@nb.njit(parallel=True, cache=True)
def _backward(s0, x, dt, A, B, C, gy, gs, gsn, d_s0, d_x, d_dt, dA_h, dB_h, dC_h):
    S, T, H, P = x.shape
    N = s0.shape[3]
    G = B.shape[2]
    KA = A.shape[1]
    K = gsn.shape[0]
    hpg = H // G
    for ih in nb.prange(S * H):
        i, h = ih // H, ih % H
        g = h // hpg
        sts = np.empty((T + 1, N))
        for p in range(P):
            sts[0] = s0[i, h, p]
            for t in range(T):
                d = _softplus(dt[i, t, h])
                u = x[i, t, h, p] * d
                for n in range(N):
                    a = np.exp(d * A[h, n if KA > 1 else 0])
                    sts[t + 1, n] = sts[t, n] * a + B[i, t, g, n] * u
            carry = gs[i, h, p].copy()
            if K > 0:
                carry += gsn[0, i, h, p]                    # slot 0 is the final state too
            for t in range(T - 1, -1, -1):
                if 0 < T - 1 - t < K:
                    carry += gsn[T - 1 - t, i, h, p]        # the state after t + 1 tokens
                d = _softplus(dt[i, t, h])
                u = x[i, t, h, p] * d
                gyv = gy[i, t, h, p]
                gam = 0.0
                qa = 0.0
                for n in range(N):
                    a = np.exp(d * A[h, n if KA > 1 else 0])
                    lam = carry[n] + gyv * C[i, t, g, n]
                    dC_h[i, h, t, n] += gyv * sts[t + 1, n]
                    dB_h[i, h, t, n] += lam * u
                    gam += lam * B[i, t, g, n]
                    q = lam * sts[t, n] * a
                    qa += q * A[h, n if KA > 1 else 0]
                    dA_h[i, h, n if KA > 1 else 0] += q * d
                    carry[n] = a * lam
                d_x[i, t, h, p] = gam * d
                d_dt[i, t, h] += (gam * x[i, t, h, p] + qa) * _softplus_grad(dt[i, t, h])
            if 0 < T < K:
                carry += gsn[T, i, h, p]                    # slot T: the start state
            d_s0[i, h, p] = carry


def _arrays(p):
    d = p.dims
    s0 = np.ascontiguousarray(p.s[p.ids], dtype=np.float64)
    return d, s0, *(np.ascontiguousarray(a, dtype=np.float64) for a in (p.x, p.dt, p.A, p.B, p.C))


def scan64(s, x, dt, A, B, C, ids=None, *, snapshots=1) -> ssm_ref.ScanResult:
    """float64 forward; same result as ssm_ref.ssm_scan(..., dtype=np.float64, snapshots=K),
    the K slots included."""
    p = ssm_ref.check_forward(s, x, dt, A, B, C, ids, dtype=np.float64, snapshots=snapshots)
    d, s0, x_, dt_, A_, B_, C_ = _arrays(p)
    y = np.zeros((d.S, d.T, d.H, d.P))
    states = s0.copy()
    snaps = np.full((d.K, d.S, d.H, d.P, d.N), np.nan)     # slots k > T stay NaN
    if d.T < d.K:
        snaps[d.T] = s0
    if d.T and d.H * d.P:
        _forward(s0, x_, dt_, A_, B_, C_, y, states, snaps)
    return ssm_ref.ScanResult(y=y, states=states, where="CPU", backend="ssm_fast.oracle64", snapshots=snaps)


def scan_back64(s, x, dt, A, B, C, ids, g_y, g_states, *, g_snapshots=None) -> ssm_ref.ScanGrads:
    """float64 backward; same result as ssm_ref.ssm_scan_back(..., dtype=np.float64), g_snapshots
    (K,S,H,P,N) or the packed g_y with K slots included."""
    p = ssm_ref.check_backward(s, x, dt, A, B, C, ids, g_y, g_states, dtype=np.float64, g_snapshots=g_snapshots)
    d, s0, x_, dt_, A_, B_, C_ = _arrays(p)
    gy = np.ascontiguousarray(p.g_y, dtype=np.float64)
    gs = np.ascontiguousarray(p.g_states, dtype=np.float64)
    gsn = (np.zeros((0, d.S, d.H, d.P, d.N)) if p.g_snapshots is None
           else np.ascontiguousarray(p.g_snapshots, dtype=np.float64))
    KA = A_.shape[1]
    d_s0 = gs + gsn[0] if gsn.shape[0] else gs.copy()       # T = 0: slot 0 is the start state
    d_x = np.zeros((d.S, d.T, d.H, d.P))
    d_dt = np.zeros((d.S, d.T, d.H))
    dA_h = np.zeros((d.S, d.H, KA))
    dB_h = np.zeros((d.S, d.H, d.T, d.N))
    dC_h = np.zeros((d.S, d.H, d.T, d.N))
    if d.T and d.H * d.P:
        _backward(s0, x_, dt_, A_, B_, C_, gy, gs, gsn, d_s0, d_x, d_dt, dA_h, dB_h, dC_h)
    hpg = max(d.heads_per_group, 1)
    d_B = dB_h.reshape(d.S, d.G, hpg, d.T, d.N).sum(axis=2).transpose(0, 2, 1, 3).copy()
    d_C = dC_h.reshape(d.S, d.G, hpg, d.T, d.N).sum(axis=2).transpose(0, 2, 1, 3).copy()
    return ssm_ref.ScanGrads(d_s=ssm_ref.scatter_rows(d_s0, p.ids, d.R), d_s0=d_s0, d_x=d_x, d_dt=d_dt,
                             d_A=dA_h.sum(axis=0).reshape(d.a_shape), d_B=d_B, d_C=d_C,
                             where="CPU", backend="ssm_fast.oracle64")
