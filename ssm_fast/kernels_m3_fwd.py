"""Mamba-3 forward kernels (private: they trust their inputs and only do arithmetic), and the
per-token helpers the backward (kernels_m3_bwd) shares.

Arrays are those of ssm_ref's checked problem (ssm_ref.mamba3_checks.M3Problem), float32, rank
axis always present (SISO: M = 1): x (S,T,H,P), dt dA lam (S,T,H), B C (S,T,M,G,N), B_bias C_bias
(H,M,N), dtheta (S,T,H,F), psi (H,M,P), s_theta (R,H,F), s_h (R,H,P,N), s_k (R,H,M,N),
s_v (R,H,M,P), ids (S,) int64; y (S,T,M,H,P).

The state the kernels carry
---------------------------
The recurrence h_t = α_t h_{t-1} + β_t Σ_r v_{t-1} k_{t-1}ᵀ + γ_t Σ_r v_t k_tᵀ with β_t = α_t δ_t,
δ_t = Δ_t (1 - λ_t), is run on the *pre-decay* state

    h̃_{t-1} = h_{t-1} + δ_t Σ_r v_{t-1} k_{t-1}ᵀ,   so   h_t = α_t h̃_{t-1} + γ_t Σ_r v_t k_tᵀ,
    h̃_t = α_t h̃_{t-1} + (γ_t + δ_{t+1}) Σ_r v_t k_tᵀ         (δ_T = 0: h̃_{T-1} = h_{T-1})
    y_t^r = h_t q^r = α_t (h̃_{t-1} q^r) + γ_t Σ_r' (k^r'·q^r) v^r'

one rank-1 update per rank and token instead of two (the β term of token t+1 is folded into
token t's, as mamba_ssm's chunked kernels fold it into a per-token scale), and no subtraction:
every product of the reference's sum is still added, only grouped differently. Per state element
a SISO token costs one multiply and two fused multiply-adds, as a Mamba-2 token does.

Partition: a task is (sequence i, head h): the P x N state, private to the task, walks the
tokens. Tasks share only read-only inputs and write disjoint slices of the outputs, so results do
not depend on the thread count. Loops over n are contiguous and vectorised (``reassoc``: the sums
over n grouped by LLVM at compile time, config.TASK).

``decode`` is the update_cache step of T = 1 in place on the four cache arrays (float32,
C-contiguous), each read and written once.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .config import DRIVER, TASK
from .mathf import exp_f32, sincos_f32
from .pool import fetch_add
from .simd import prefer_vector_width, restrict_arrays

ZERO = np.float32(0.0)
ONE = np.float32(1.0)
TWO_PI = np.float32(2 * np.pi)


def n_tasks(S: int, H: int) -> int:
    """Tasks of every Mamba-3 kernel: one per (sequence, head)."""
    return S * H


@njit(**TASK)
def advance_angles(th, dtheta, i, t, h):
    """θ <- (θ + dθ[i, t, h]) mod 2π, the reference's a - 2π floor(a / 2π)."""
    for f in range(th.shape[0]):
        a = th[f] + dtheta[i, t, h, f]
        th[f] = a - TWO_PI * np.floor(a / TWO_PI)


@njit(**TASK)
def token_vectors(i, t, h, x, B, C, B_bias, C_bias, psi, th, halved, cs, sn, kr, qr, vv):
    """One token's rotated keys and queries kr, qr (M, N), values vv (M, P) and the rotation's
    cos, sin (F,) at the angles th. ``halved``: pairs (f, f + N/2), else (2f, 2f + 1)."""
    M, G, N = B.shape[2], B.shape[3], B.shape[4]
    P = x.shape[3]
    F = th.shape[0]
    g = h // (x.shape[2] // G)
    for f in range(F):
        sn[f], cs[f] = sincos_f32(th[f])
    for r in range(M):
        for n in range(N):
            kr[r, n] = B[i, t, r, g, n] + B_bias[h, r, n]
            qr[r, n] = C[i, t, r, g, n] + C_bias[h, r, n]
        for f in range(F):
            ia = f if halved else 2 * f
            ib = f + N // 2 if halved else 2 * f + 1
            c = cs[f]
            s = sn[f]
            ua = kr[r, ia]
            ub = kr[r, ib]
            kr[r, ia] = ua * c - ub * s
            kr[r, ib] = ua * s + ub * c
            ua = qr[r, ia]
            ub = qr[r, ib]
            qr[r, ia] = ua * c - ub * s
            qr[r, ib] = ua * s + ub * c
        for p in range(P):
            vv[r, p] = psi[h, r, p] * x[i, t, h, p]


@njit(**TASK)
def start_state(s_h, s_k, s_v, j, h, d0, st):
    """st (P, N) = h̃_{-1} = s_h[j, h] + δ_0 Σ_r s_v[j, h, r] s_k[j, h, r]ᵀ."""
    prefer_vector_width()
    restrict_arrays()
    P, N = st.shape
    M = s_k.shape[2]
    for p in range(P):
        for n in range(N):
            st[p, n] = s_h[j, h, p, n]
        for r in range(M):
            w = d0 * s_v[j, h, r, p]
            for n in range(N):
                st[p, n] += w * s_k[j, h, r, n]


@njit(**TASK)
def update_state(src, dst, a, sc, vv, kr):
    """dst (P, N) = a src + sc Σ_r vv[r] kr[r]ᵀ; the arrays distinct (restrict_arrays)."""
    prefer_vector_width()
    restrict_arrays()
    P, N = dst.shape
    M = kr.shape[0]
    for p in range(P):
        w = sc * vv[0, p]
        for n in range(N):
            dst[p, n] = a * src[p, n] + w * kr[0, n]
        for r in range(1, M):
            w = sc * vv[r, p]
            for n in range(N):
                dst[p, n] += w * kr[r, n]


@njit(**TASK)
def dots(kr, qr, kq):
    """kq[r, r2] = k^r · q^r2."""
    M, N = kr.shape
    for r in range(M):
        for r2 in range(M):
            acc = ZERO
            for n in range(N):
                acc += kr[r, n] * qr[r2, n]
            kq[r, r2] = acc


@njit(**TASK)
def _token_rows(i, t, h, st, a, gam, sc, kr, qr, vv, kq, ya, y):
    """One token's rows: y[i, t, :, h, :] from h̃_{t-1} (st on entry), and st <- h̃_t.
    ya: (M,) scratch. The arrays distinct (restrict_arrays)."""
    prefer_vector_width()
    restrict_arrays()
    P, N = st.shape
    M = kr.shape[0]
    if M == 1:   # four rows at a time: k and q loaded once per four rows
        g1 = gam * kq[0, 0]
        p = 0
        while p + 4 <= P:
            w0 = sc * vv[0, p]
            w1 = sc * vv[0, p + 1]
            w2 = sc * vv[0, p + 2]
            w3 = sc * vv[0, p + 3]
            a0 = ZERO
            a1 = ZERO
            a2 = ZERO
            a3 = ZERO
            for n in range(N):
                q = qr[0, n]
                k = kr[0, n]
                h0 = st[p, n]
                h1 = st[p + 1, n]
                h2 = st[p + 2, n]
                h3 = st[p + 3, n]
                a0 += h0 * q
                a1 += h1 * q
                a2 += h2 * q
                a3 += h3 * q
                st[p, n] = a * h0 + w0 * k
                st[p + 1, n] = a * h1 + w1 * k
                st[p + 2, n] = a * h2 + w2 * k
                st[p + 3, n] = a * h3 + w3 * k
            y[i, t, 0, h, p] = a * a0 + g1 * vv[0, p]
            y[i, t, 0, h, p + 1] = a * a1 + g1 * vv[0, p + 1]
            y[i, t, 0, h, p + 2] = a * a2 + g1 * vv[0, p + 2]
            y[i, t, 0, h, p + 3] = a * a3 + g1 * vv[0, p + 3]
            p += 4
        while p < P:
            acc = ZERO
            w = sc * vv[0, p]
            for n in range(N):
                hv = st[p, n]
                acc += hv * qr[0, n]
                st[p, n] = a * hv + w * kr[0, n]
            y[i, t, 0, h, p] = a * acc + g1 * vv[0, p]
            p += 1
        return
    for p in range(P):
        for r in range(M):
            acc = ZERO
            for n in range(N):
                acc += st[p, n] * qr[r, n]
            ya[r] = acc
        w = sc * vv[0, p]
        for n in range(N):
            st[p, n] = a * st[p, n] + w * kr[0, n]
        for r in range(1, M):
            w = sc * vv[r, p]
            for n in range(N):
                st[p, n] += w * kr[r, n]
        for r in range(M):
            acc = a * ya[r]
            for r2 in range(M):
                acc += gam * kq[r2, r] * vv[r2, p]
            y[i, t, r, h, p] = acc


@njit(**DRIVER)
def forward(counter, x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v, ids, halved,
            n_tasks, y, theta_out, h_out, k_out, v_out):
    """The forward for T >= 1: fills y (S,T,M,H,P) and the final states theta_out (S,H,F),
    h_out (S,H,P,N), k_out (S,H,M,N), v_out (S,H,M,P). ``counter``: (1,) int64, 0 on entry;
    ``n_tasks``: :func:`n_tasks`."""
    prefer_vector_width()
    restrict_arrays()
    T, H, P = x.shape[1], x.shape[2], x.shape[3]
    M, N = B.shape[2], B.shape[4]
    F = dtheta.shape[3]
    st = np.empty((P, N), dtype=np.float32)
    th = np.empty(F, dtype=np.float32)
    cs = np.empty(F, dtype=np.float32)
    sn = np.empty(F, dtype=np.float32)
    kr = np.empty((M, N), dtype=np.float32)
    qr = np.empty((M, N), dtype=np.float32)
    vv = np.empty((M, P), dtype=np.float32)
    kq = np.empty((M, M), dtype=np.float32)
    ya = np.empty(M, dtype=np.float32)
    while True:
        task = fetch_add(counter, 1)
        if task >= n_tasks:
            break
        i = task // H
        h = task % H
        j = ids[i]
        for f in range(F):
            th[f] = s_theta[j, h, f]
        start_state(s_h, s_k, s_v, j, h, dt[i, 0, h] * (ONE - lam[i, 0, h]), st)
        for t in range(T):
            advance_angles(th, dtheta, i, t, h)
            token_vectors(i, t, h, x, B, C, B_bias, C_bias, psi, th, halved, cs, sn, kr, qr, vv)
            dots(kr, qr, kq)
            a = exp_f32(dA[i, t, h])
            gam = lam[i, t, h] * dt[i, t, h]
            sc = gam + (dt[i, t + 1, h] * (ONE - lam[i, t + 1, h]) if t + 1 < T else ZERO)
            _token_rows(i, t, h, st, a, gam, sc, kr, qr, vv, kq, ya, y)
        for f in range(F):
            theta_out[i, h, f] = th[f]
        for p in range(P):
            for n in range(N):
                h_out[i, h, p, n] = st[p, n]
        for r in range(M):
            for n in range(N):
                k_out[i, h, r, n] = kr[r, n]
            for p in range(P):
                v_out[i, h, r, p] = vv[r, p]


@njit(**DRIVER)
def decode(counter, x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, c_theta, c_h, c_k, c_v, ids, halved,
           n_tasks, y):
    """One token (T = 1) in place: reads the start state from rows ids[i] of the caches c_theta
    (R,H,F), c_h (R,H,P,N), c_k (R,H,M,N), c_v (R,H,M,P) and writes the new state there (each
    element read once, then written); fills y (S,1,M,H,P). The ids are distinct (checked)."""
    prefer_vector_width()
    restrict_arrays()
    H, P = x.shape[2], x.shape[3]
    M, N = B.shape[2], B.shape[4]
    F = dtheta.shape[3]
    th = np.empty(F, dtype=np.float32)
    cs = np.empty(F, dtype=np.float32)
    sn = np.empty(F, dtype=np.float32)
    kr = np.empty((M, N), dtype=np.float32)
    qr = np.empty((M, N), dtype=np.float32)
    vv = np.empty((M, P), dtype=np.float32)
    kq = np.empty((M, M), dtype=np.float32)
    ya = np.empty(M, dtype=np.float32)
    row = np.empty(N, dtype=np.float32)
    while True:
        task = fetch_add(counter, 1)
        if task >= n_tasks:
            break
        i = task // H
        h = task % H
        j = ids[i]
        for f in range(F):
            th[f] = c_theta[j, h, f]
        advance_angles(th, dtheta, i, 0, h)
        token_vectors(i, 0, h, x, B, C, B_bias, C_bias, psi, th, halved, cs, sn, kr, qr, vv)
        dots(kr, qr, kq)
        a = exp_f32(dA[i, 0, h])
        gam = lam[i, 0, h] * dt[i, 0, h]
        d0 = dt[i, 0, h] * (ONE - lam[i, 0, h])
        for p in range(P):
            # h̃_{-1} row p (as start_state), then the token's row (as _token_rows with sc = γ)
            for n in range(N):
                row[n] = c_h[j, h, p, n]
            for r in range(M):
                w = d0 * c_v[j, h, r, p]
                for n in range(N):
                    row[n] += w * c_k[j, h, r, n]
            for r in range(M):
                acc = ZERO
                for n in range(N):
                    acc += row[n] * qr[r, n]
                ya[r] = acc
            w = gam * vv[0, p]
            for n in range(N):
                row[n] = a * row[n] + w * kr[0, n]
            for r in range(1, M):
                w = gam * vv[r, p]
                for n in range(N):
                    row[n] += w * kr[r, n]
            for n in range(N):
                c_h[j, h, p, n] = row[n]
            for r in range(M):
                acc = a * ya[r]
                for r2 in range(M):
                    acc += gam * kq[r2, r] * vv[r2, p]
                y[i, 0, r, h, p] = acc
        for f in range(F):
            c_theta[j, h, f] = th[f]
        for r in range(M):
            for n in range(N):
                c_k[j, h, r, n] = kr[r, n]
            for p in range(P):
                c_v[j, h, r, p] = vv[r, p]
