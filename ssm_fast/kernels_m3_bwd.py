"""Mamba-3 backward kernel (private: it trusts its inputs and only does arithmetic).

The forward's pre-decay state (kernels_m3_fwd): h̃_t = α_t h̃_{t-1} + s_t Σ_r v_t k_tᵀ with
s_t = γ_t + δ_{t+1}, and y_t^r = α_t h̃_{t-1} q^r + γ_t Σ_r' (k^r'·q^r) v^r'. Walking the tokens
backwards with the carry c = dL/dh̃_t (g_h at the last token) and L = c + Σ_r g_y^r q^rᵀ:

    dL/dh̃_{t-1} = α_t L           dα_t = <L, h̃_{t-1}>          ds_t = Σ_r v^r·(c k^r)
    dk^r = s_t cᵀv^r + γ Σ_r' (g_y^r'·v^r) q^r'     dv^r = s_t c k^r + γ Σ_r' (k^r·q^r') g_y^r'
    dq^r = α_t h̃_{t-1}ᵀ g_y^r + γ Σ_r' (g_y^r·v^r') k^r'
    dγ_t = ds_t + Σ_{r,r'} (k^r·q^r')(g_y^r'·v^r),   dδ_{t+1} = ds_t

so per state element and rank a token costs six multiply-adds (L, dα, cᵀv, c k, h̃ᵀg_y, the new
carry), as a Mamba-2 token does; the rest is O(M (N + P)) per token. dα, dγ and dδ give d_dA,
d_dt, d_lam; the rotation's adjoint gives d_B, d_C (before the sum over a group's heads) and the
angles' cotangent, carried back through θ_t = θ_{t-1} + dθ_t (the mod passes gradients as 1).

Recompute, not store: the states h̃_{t-1} are P x N per token (16 KiB at P = N = 64), too many to
keep for every token of a long sequence, and the forward is cheap. A task first runs the state
recurrence keeping h̃ and θ at the start of every segment of ``seg`` tokens (checkpoints; skipped
when one segment covers the sequence), then, from the last segment to the first, recomputes the
segment's states, rotated keys and queries into buffers (``seg`` tokens: config.M3_SEGMENT_BYTES)
and walks its tokens backwards.

Partition and determinism: a task is (sequence i, head h) and writes only its own slices: d_x,
d_dt, d_dA, d_lam, d_dtheta at [i, :, h], the start-state gradients d0_* [i, h], and per-head
partials -- slab_B / slab_C (S,T,M,H,N), the gradients of the biased keys and queries before
rotation, and psi_part (S,H,M,P) float64 -- that the wrapper sums afterwards in a fixed order
(heads of a group for d_B / d_C, sequences and tokens for the biases, sequences for d_psi).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .config import DRIVER, TASK
from .kernels_m3_fwd import advance_angles, start_state, token_vectors, update_state
from .mathf import exp_f32
from .pool import fetch_add
from .simd import prefer_vector_width, restrict_arrays

ZERO = np.float32(0.0)
ONE = np.float32(1.0)


@njit(**TASK)
def _rows(cc, hp, a, kr, qr, vv, gy, X, Y, Z, lrow):
    """The per-element work of one token over the P x N state: X[r] = cᵀv^r, Y[r] = c k^r,
    Z[r] = h̃_{t-1}ᵀ g_y^r, and cc <- α L; returns <L, h̃_{t-1}> (float64 sum of row sums).
    SISO walks four rows at a time, so X, Z, k and q are loaded once per four rows. The arrays
    are distinct buffers: marked so (restrict_arrays), LLVM vectorises the loops over n without
    run-time overlap checks, which it gives up on for this many arrays."""
    prefer_vector_width()
    restrict_arrays()
    P, N = cc.shape
    M = kr.shape[0]
    for r in range(M):
        for n in range(N):
            X[r, n] = ZERO
            Z[r, n] = ZERO
    da = 0.0
    if M == 1:
        p = 0
        while p + 4 <= P:
            g0 = gy[0, p]
            g1 = gy[0, p + 1]
            g2 = gy[0, p + 2]
            g3 = gy[0, p + 3]
            v0 = vv[0, p]
            v1 = vv[0, p + 1]
            v2 = vv[0, p + 2]
            v3 = vv[0, p + 3]
            y0 = ZERO
            y1 = ZERO
            y2 = ZERO
            y3 = ZERO
            d0 = ZERO
            d1 = ZERO
            d2 = ZERO
            d3 = ZERO
            for n in range(N):
                q = qr[0, n]
                k = kr[0, n]
                c0 = cc[p, n]
                c1 = cc[p + 1, n]
                c2 = cc[p + 2, n]
                c3 = cc[p + 3, n]
                h0 = hp[p, n]
                h1 = hp[p + 1, n]
                h2 = hp[p + 2, n]
                h3 = hp[p + 3, n]
                L0 = c0 + g0 * q
                L1 = c1 + g1 * q
                L2 = c2 + g2 * q
                L3 = c3 + g3 * q
                d0 += L0 * h0
                d1 += L1 * h1
                d2 += L2 * h2
                d3 += L3 * h3
                X[0, n] += (c0 * v0 + c1 * v1) + (c2 * v2 + c3 * v3)
                Z[0, n] += (h0 * g0 + h1 * g1) + (h2 * g2 + h3 * g3)
                y0 += c0 * k
                y1 += c1 * k
                y2 += c2 * k
                y3 += c3 * k
                cc[p, n] = a * L0
                cc[p + 1, n] = a * L1
                cc[p + 2, n] = a * L2
                cc[p + 3, n] = a * L3
            Y[0, p] = y0
            Y[0, p + 1] = y1
            Y[0, p + 2] = y2
            Y[0, p + 3] = y3
            da += np.float64(d0) + np.float64(d1) + np.float64(d2) + np.float64(d3)
            p += 4
        while p < P:
            gp = gy[0, p]
            vp = vv[0, p]
            yp = ZERO
            dap = ZERO
            for n in range(N):
                c = cc[p, n]
                hv = hp[p, n]
                L = c + gp * qr[0, n]
                dap += L * hv
                X[0, n] += c * vp
                yp += c * kr[0, n]
                Z[0, n] += hv * gp
                cc[p, n] = a * L
            Y[0, p] = yp
            da += np.float64(dap)
            p += 1
        return da
    for p in range(P):
        for r in range(M):
            gp = gy[r, p]
            vp = vv[r, p]
            yp = ZERO
            for n in range(N):
                c = cc[p, n]
                X[r, n] += c * vp
                yp += c * kr[r, n]
                Z[r, n] += hp[p, n] * gp
            Y[r, p] = yp
        for n in range(N):
            lrow[n] = cc[p, n]
        for r in range(M):
            gp = gy[r, p]
            for n in range(N):
                lrow[n] += gp * qr[r, n]
        dap = ZERO
        for n in range(N):
            dap += lrow[n] * hp[p, n]
            cc[p, n] = a * lrow[n]
        da += np.float64(dap)
    return da


@njit(**TASK)
def _token_grads(a, sc, gam, kr, qr, vv, gy, X, Y, Z, kq, gv, dk, dq, dv):
    """One token's O(M (N + P)) algebra after :func:`_rows`: kq[r, r2] = k^r·q^r2, gv[r, r2] =
    g_y^r·v^r2, the rotated keys' and queries' gradients dk, dq (M, N) and the values' dv (M, P)
    (without the final state's cotangents); returns (ds, the y term of dγ). Loops over n or p
    innermost (vectorised); the arrays distinct (restrict_arrays)."""
    prefer_vector_width()
    restrict_arrays()
    M, N = kr.shape
    P = vv.shape[1]
    ds = ZERO
    for r in range(M):
        for r2 in range(M):
            acc = ZERO
            for n in range(N):
                acc += kr[r, n] * qr[r2, n]
            kq[r, r2] = acc
            acc = ZERO
            for p in range(P):
                acc += gy[r, p] * vv[r2, p]
            gv[r, r2] = acc
        acc = ZERO
        for p in range(P):
            acc += vv[r, p] * Y[r, p]
        ds += acc
    dgy = ZERO
    for r in range(M):
        for r2 in range(M):
            dgy += kq[r, r2] * gv[r2, r]
    for r in range(M):
        for n in range(N):
            dk[r, n] = sc * X[r, n]
            dq[r, n] = a * Z[r, n]
        for r2 in range(M):
            ck = gam * gv[r2, r]
            cq = gam * gv[r, r2]
            for n in range(N):
                dk[r, n] += ck * qr[r2, n]
                dq[r, n] += cq * kr[r2, n]
        for p in range(P):
            dv[r, p] = sc * Y[r, p]
        for r2 in range(M):
            cv = gam * kq[r, r2]
            for p in range(P):
                dv[r, p] += cv * gy[r2, p]
    return ds, dgy


@njit(**TASK)
def _rotate_back(g, u, cs, sn, halved, gth):
    """g (N,) <- Rot(θ)ᵀ g in place; gth (F,) += the angles' cotangent, g_b u_a - g_a u_b
    (u the rotated vector)."""
    N = g.shape[0]
    for f in range(cs.shape[0]):
        ia = f if halved else 2 * f
        ib = f + N // 2 if halved else 2 * f + 1
        ga = g[ia]
        gb = g[ib]
        gth[f] += gb * u[ia] - ga * u[ib]
        g[ia] = ga * cs[f] + gb * sn[f]
        g[ib] = gb * cs[f] - ga * sn[f]


@njit(**DRIVER)
def backward(counter, x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v, ids,
             g_y, g_theta, g_h, g_k, g_v, halved, seg, n_tasks,
             d_x, d_dt, d_dA, d_lam, d_dtheta, slab_B, slab_C, psi_part, d0_theta, d0_h, d0_k, d0_v):
    """The backward for T >= 1 (see the module's notes). Inputs as kernels_m3_fwd.forward plus the
    cotangents g_y (S,T,M,H,P), g_theta (S,H,F), g_h (S,H,P,N), g_k (S,H,M,N), g_v (S,H,M,P).
    Fills d_x (S,T,H,P), d_dt d_dA d_lam (S,T,H), d_dtheta (S,T,H,F), slab_B slab_C
    (S,T,M,H,N), psi_part (S,H,M,P) float64, d0_theta (S,H,F), d0_h (S,H,P,N), d0_k (S,H,M,N),
    d0_v (S,H,M,P). ``seg``: tokens per recompute segment."""
    prefer_vector_width()
    restrict_arrays()
    T, H, P = x.shape[1], x.shape[2], x.shape[3]
    M, N = B.shape[2], B.shape[4]
    F = dtheta.shape[3]
    nseg = (T + seg - 1) // seg
    cps = np.empty((nseg, P, N), dtype=np.float32)          # h̃ before token sg*seg
    cth = np.empty((nseg, F), dtype=np.float32)             # θ before token sg*seg
    sts = np.empty((seg, P, N), dtype=np.float32)           # h̃_{t-1} of the segment's tokens
    ks = np.empty((seg, M, N), dtype=np.float32)            # rotated keys
    qs = np.empty((seg, M, N), dtype=np.float32)            # rotated queries
    css = np.empty((seg, F), dtype=np.float32)
    sns = np.empty((seg, F), dtype=np.float32)
    th = np.empty(F, dtype=np.float32)
    vv = np.empty((M, P), dtype=np.float32)
    gy = np.empty((M, P), dtype=np.float32)
    cc = np.empty((P, N), dtype=np.float32)                 # dL/dh̃_t
    X = np.empty((M, N), dtype=np.float32)
    Z = np.empty((M, N), dtype=np.float32)
    Y = np.empty((M, P), dtype=np.float32)
    lrow = np.empty(N, dtype=np.float32)
    dk = np.empty((M, N), dtype=np.float32)
    dq = np.empty((M, N), dtype=np.float32)
    dv = np.empty((M, P), dtype=np.float32)
    kq = np.empty((M, M), dtype=np.float32)
    gv = np.empty((M, M), dtype=np.float32)
    gth = np.empty(F, dtype=np.float32)
    dpsi = np.empty((M, P), dtype=np.float64)
    while True:
        task = fetch_add(counter, 1)
        if task >= n_tasks:
            break
        i = task // H
        h = task % H
        j = ids[i]
        d0 = dt[i, 0, h] * (ONE - lam[i, 0, h])
        start_state(s_h, s_k, s_v, j, h, d0, cps[0])
        for f in range(F):
            cth[0, f] = s_theta[j, h, f]
        if nseg > 1:                                        # checkpoints
            th[:] = cth[0]
            for t in range((nseg - 1) * seg):
                k = t % seg                                 # the state before token t, from cps or sts
                src = cps[t // seg] if k == 0 else sts[k]
                dst = cps[t // seg + 1] if k + 1 == seg else sts[k + 1]
                advance_angles(th, dtheta, i, t, h)
                token_vectors(i, t, h, x, B, C, B_bias, C_bias, psi, th, halved, css[0], sns[0], ks[0], qs[0], vv)
                sc = lam[i, t, h] * dt[i, t, h] + dt[i, t + 1, h] * (ONE - lam[i, t + 1, h])
                update_state(src, dst, exp_f32(dA[i, t, h]), sc, vv, ks[0])
                if k + 1 == seg:
                    cth[t // seg + 1, :] = th
        for p in range(P):
            for n in range(N):
                cc[p, n] = g_h[i, h, p, n]
        for f in range(F):
            gth[f] = g_theta[i, h, f]
        dpsi[:, :] = 0.0
        for back in range(nseg):                            # segments, last first
            sg = nseg - 1 - back
            t0 = sg * seg
            t1 = min(T, t0 + seg)
            sts[0, :, :] = cps[sg]
            th[:] = cth[sg]
            for t in range(t0, t1):
                k = t - t0
                advance_angles(th, dtheta, i, t, h)
                token_vectors(i, t, h, x, B, C, B_bias, C_bias, psi, th, halved, css[k], sns[k], ks[k], qs[k], vv)
                if k + 1 < t1 - t0:
                    sc = lam[i, t, h] * dt[i, t, h] + dt[i, t + 1, h] * (ONE - lam[i, t + 1, h])
                    update_state(sts[k], sts[k + 1], exp_f32(dA[i, t, h]), sc, vv, ks[k])
            for k_back in range(t1 - t0):                   # tokens, last first
                k = t1 - t0 - 1 - k_back
                t = t0 + k
                kr = ks[k]
                qr = qs[k]
                a = exp_f32(dA[i, t, h])
                d = dt[i, t, h]
                lm = lam[i, t, h]
                gam = lm * d
                last = t + 1 == T
                sc = gam if last else gam + dt[i, t + 1, h] * (ONE - lam[i, t + 1, h])
                for r in range(M):
                    for p in range(P):
                        vv[r, p] = psi[h, r, p] * x[i, t, h, p]
                        gy[r, p] = g_y[i, t, r, h, p]
                da = _rows(cc, sts[k], a, kr, qr, vv, gy, X, Y, Z, lrow)
                ds, dgy = _token_grads(a, sc, gam, kr, qr, vv, gy, X, Y, Z, kq, gv, dk, dq, dv)
                if last:                                    # the final k and v are outputs too
                    for r in range(M):
                        for n in range(N):
                            dk[r, n] += g_k[i, h, r, n]
                        for p in range(P):
                            dv[r, p] += g_v[i, h, r, p]
                dgam = ds + dgy
                d_dA[i, t, h] = np.float32(da) * a
                d_dt[i, t, h] = dgam * lm
                d_lam[i, t, h] = dgam * d
                if not last:                                # ds_t is also dδ_{t+1}
                    d_dt[i, t + 1, h] += ds * (ONE - lam[i, t + 1, h])
                    d_lam[i, t + 1, h] -= ds * dt[i, t + 1, h]
                for p in range(P):
                    d_x[i, t, h, p] = psi[h, 0, p] * dv[0, p]
                for r in range(M):
                    if r > 0:
                        for p in range(P):
                            d_x[i, t, h, p] += psi[h, r, p] * dv[r, p]
                    for p in range(P):
                        dpsi[r, p] += np.float64(dv[r, p] * x[i, t, h, p])
                for r in range(M):
                    _rotate_back(dk[r], kr[r], css[k], sns[k], halved, gth)
                    _rotate_back(dq[r], qr[r], css[k], sns[k], halved, gth)
                    for n in range(N):
                        slab_B[i, t, r, h, n] = dk[r, n]
                        slab_C[i, t, r, h, n] = dq[r, n]
                for f in range(F):
                    d_dtheta[i, t, h, f] = gth[f]
        # the start state: h̃_{-1} = s_h + δ_0 Σ_r s_v s_kᵀ, its cotangent cc
        dd0 = ZERO
        for r in range(M):
            for n in range(N):
                X[r, n] = ZERO
            for p in range(P):
                w = s_v[j, h, r, p]
                yp = ZERO
                for n in range(N):
                    X[r, n] += cc[p, n] * w
                    yp += cc[p, n] * s_k[j, h, r, n]
                d0_v[i, h, r, p] = d0 * yp
                dd0 += w * yp
            for n in range(N):
                d0_k[i, h, r, n] = d0 * X[r, n]
        d_dt[i, 0, h] += dd0 * (ONE - lam[i, 0, h])
        d_lam[i, 0, h] -= dd0 * dt[i, 0, h]
        for p in range(P):
            for n in range(N):
                d0_h[i, h, p, n] = cc[p, n]
        for f in range(F):
            d0_theta[i, h, f] = gth[f]
        for r in range(M):
            for p in range(P):
                psi_part[i, h, r, p] = dpsi[r, p]
