"""The Mamba-3 scan and its backward, token by token: the executable spec (docs/SPEC.md, "Mamba-3").

Glossary: S sequences · T tokens · H heads · P channels per head · N state size · G groups (head
h reads group h // (H/G)) · M MIMO rank (SISO: M = 1, no rank axis in its arrays) · F rotated
pairs · R cache rows. Names follow the recurrence (mamba_ssm's in brackets):

    θ_t = (θ_{t-1} + dθ_t) mod 2π                                   (Angle_State)
    q_t^r = Rot(θ_t)(C_t^r[g] + C_bias^r[h]),  k_t^r = Rot(θ_t)(B_t^r[g] + B_bias^r[h])   (Q, K)
    v_t^r = psi^r ⊙ x_t                                             (V, MIMO_V)
    α_t = exp(dA_t),  β_t = α_t Δ_t (1 - λ_t),  γ_t = λ_t Δ_t       (ADT, DT, sigmoid(Trap))
    h_t = α_t h_{t-1} + β_t Σ_r v_{t-1}^r k_{t-1}^rᵀ + γ_t Σ_r v_t^r k_t^rᵀ      (SSM_State, P x N)
    y_t^r = h_t q_t^r

The state carried from one call to the next has four parts: θ (S,H,F), h (S,H,P,N), and the last
token's k (S,H,M,N) and v (S,H,M,P) (K_State, V_State), which the trapezoid's β term of the next
token reads.

Each function loops over tokens and is vectorised over (S, H, M, P, N) with numpy; arrays carry
a rank axis throughout (ssm_ref.mamba3_checks adds it for SISO; the public functions drop it).
Precision: every array and operation in ``p.dtype`` (float32 = the contract, float64 = the
oracle); products unfused, in the order written above. The mod 2π is a - 2π·floor(a / 2π) in the
working dtype; its derivative is taken as 1 (the floor is piecewise constant).

Same functions: ssm_fast.mamba3_scan (numba), ssm_torch / ssm_jax (bridges).
"""

from __future__ import annotations

import numpy as np

from .mamba3_checks import (
    M3Problem,
    check_mamba3_backward,
    check_mamba3_forward,
    check_mamba3_update_cache,
    drop_rank,
    pair_index,
)
from .results import Mamba3Grads, Mamba3Result
from .scan import scatter_rows

__all__ = ["backward", "forward", "mamba3_scan", "mamba3_scan_back", "mod_2pi", "rotate", "rotate_back"]


def rotate(u: np.ndarray, c: np.ndarray, s: np.ndarray, ia: np.ndarray, ib: np.ndarray) -> np.ndarray:
    """Rot(θ) of the pairs (ia[j], ib[j]) of u's last axis by the angles whose cos and sin are
    c, s (..., F) (broadcast against u's leading axes); the other entries pass through.
    (u_a, u_b) -> (u_a cos - u_b sin, u_a sin + u_b cos)."""
    out = u.copy()
    ua, ub = u[..., ia], u[..., ib]                      # (..., F)
    out[..., ia] = ua * c - ub * s
    out[..., ib] = ua * s + ub * c
    return out


def rotate_back(g: np.ndarray, rotated: np.ndarray, c, s, ia, ib) -> tuple[np.ndarray, np.ndarray]:
    """The adjoint of :func:`rotate` at the output cotangent g: (the cotangent of u -- Rot(θ)ᵀ g --,
    the cotangent of the angles, (..., F) before any sum over broadcast axes). ``rotated`` is the
    output, which d/dθ of the rotation maps to (-out_b, out_a)."""
    gu = g.copy()
    ga, gb = g[..., ia], g[..., ib]                      # (..., F)
    gu[..., ia] = ga * c + gb * s
    gu[..., ib] = gb * c - ga * s
    g_angle = gb * rotated[..., ia] - ga * rotated[..., ib]   # (..., F)
    return gu, g_angle


def _per_head(p: M3Problem, v: np.ndarray) -> np.ndarray:
    """One token's (S, M, G, N) -> (S, H, M, N): head h reads group h // (H/G)."""
    return v[:, :, p.dims.group_of_head()].transpose(0, 2, 1, 3)


def _group_sum(p: M3Problem, v: np.ndarray) -> np.ndarray:
    """(S, H, M, N) -> (S, M, G, N): the sum over each group's H/G heads (the adjoint of _per_head)."""
    d = p.dims
    return v.reshape(d.S, d.G, d.heads_per_group, d.M, d.N).sum(axis=2).transpose(0, 2, 1, 3)


def mod_2pi(a: np.ndarray) -> np.ndarray:
    """a - 2π·floor(a / 2π) in a's dtype: the angle in [0, 2π) (up to rounding)."""
    two_pi = a.dtype.type(2 * np.pi)
    return a - two_pi * np.floor(a / two_pi)


class _Token:
    """One token's quantities that the forward and the walk back both need."""

    def __init__(self, p: M3Problem, t: int, theta: np.ndarray):
        one = p.dtype.type(1)
        self.c, self.s = np.cos(theta)[:, :, None], np.sin(theta)[:, :, None]   # (S, H, 1, F)
        self.ia, self.ib = pair_index(p.rotation, p.dims.N, p.dims.F)
        self.kb = _per_head(p, p.B[:, t]) + p.B_bias[None]   # (S, H, M, N) biased key
        self.qb = _per_head(p, p.C[:, t]) + p.C_bias[None]   # (S, H, M, N) biased query
        self.k = rotate(self.kb, self.c, self.s, self.ia, self.ib)   # (S, H, M, N)
        self.q = rotate(self.qb, self.c, self.s, self.ia, self.ib)   # (S, H, M, N)
        self.v = p.psi[None] * p.x[:, t][:, :, None, :]      # (S, H, M, P)
        self.dt, self.lam = p.dt[:, t], p.lam[:, t]          # (S, H)
        self.a = np.exp(p.dA[:, t])                          # (S, H) α
        self.beta = self.a * self.dt * (one - self.lam)      # (S, H)
        self.gamma = self.lam * self.dt                      # (S, H)


def _outer(v: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Σ_r v^r k^rᵀ: (S, H, M, P), (S, H, M, N) -> (S, H, P, N)."""
    return np.einsum("shmp,shmn->shpn", v, k)


def forward(p: M3Problem, keep: bool = False):
    """The forward scan. Returns y (S, T, M, H, P) and the final state (theta (S, H, F), h (S, H, P, N),
    k (S, H, M, N), v (S, H, M, P)); with ``keep`` also the states after every token, each with the
    start first: thetas (T+1, S, H, F), hs (T+1, S, H, P, N), ks (T+1, S, H, M, N), vs (T+1, S, H, M, P)."""
    d = p.dims
    S, T, H, P, M = d.S, d.T, d.H, d.P, d.M
    with np.errstate(over="ignore", invalid="ignore"):   # inf/nan flow as IEEE says (docs/SPEC.md section 8)
        theta = p.s_theta[p.ids].copy()                  # (S, H, F)
        h = p.s_h[p.ids].copy()                          # (S, H, P, N)
        k = p.s_k[p.ids].copy()                          # (S, H, M, N)
        v = p.s_v[p.ids].copy()                          # (S, H, M, P)
        y = np.empty((S, T, M, H, P), dtype=p.dtype)     # (S, T, M, H, P)
        kept = [[theta], [h], [k], [v]] if keep else None
        for t in range(T):
            theta = mod_2pi(theta + p.dtheta[:, t])     # (S, H, F)
            tok = _Token(p, t, theta)
            h = (tok.a[:, :, None, None] * h
                 + tok.beta[:, :, None, None] * _outer(v, k)
                 + tok.gamma[:, :, None, None] * _outer(tok.v, tok.k))       # (S, H, P, N)
            y[:, t] = np.einsum("shpn,shmn->smhp", h, tok.q)                 # (S, M, H, P)
            k, v = tok.k, tok.v
            if keep:
                for lst, val in zip(kept, (theta, h, k, v), strict=True):
                    lst.append(val)
    if keep:
        return y, (theta, h, k, v), tuple(np.stack(lst) for lst in kept)
    return y, (theta, h, k, v)


def backward(p: M3Problem) -> dict[str, np.ndarray]:
    """The adjoint of :func:`forward` for the loss Σ y·g_y + Σ theta·g_theta + Σ h·g_h + Σ k·g_k +
    Σ v·g_v (the Problem's cotangents). Returns the gradients by name, rank axis kept: d_x, d_dt,
    d_dA, d_lam, d_B, d_C, d_B_bias, d_C_bias, d_dtheta, d_psi, and each sequence's start-state
    gradients d0_theta (S,H,F), d0_h (S,H,P,N), d0_k (S,H,M,N), d0_v (S,H,M,P)."""
    d = p.dims
    S, T, H, P, N, G, M, F = d.S, d.T, d.H, d.P, d.N, d.G, d.M, d.F
    dt_ = p.dtype
    one = dt_.type(1)
    d_x = np.zeros((S, T, H, P), dt_)
    d_dt = np.zeros((S, T, H), dt_)
    d_dA = np.zeros((S, T, H), dt_)
    d_lam = np.zeros((S, T, H), dt_)
    d_B = np.zeros((S, T, M, G, N), dt_)
    d_C = np.zeros((S, T, M, G, N), dt_)
    d_B_bias = np.zeros((H, M, N), dt_)
    d_C_bias = np.zeros((H, M, N), dt_)
    d_dtheta = np.zeros((S, T, H, F), dt_)
    d_psi = np.zeros((H, M, P), dt_)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        _y, _final, (thetas, hs, ks, vs) = forward(p, keep=True)
        # The cotangents carried back: of h_t, θ_t, and of k_t, v_t from everything after token t.
        g_h = p.g_h.copy()                               # (S, H, P, N)
        g_th = p.g_theta.copy()                          # (S, H, F)
        g_k = p.g_k.copy()                               # (S, H, M, N)
        g_v = p.g_v.copy()                               # (S, H, M, P)
        for t in reversed(range(T)):
            tok = _Token(p, t, thetas[t + 1])
            h_prev, k_prev, v_prev = hs[t], ks[t], vs[t]  # the state before token t
            gy = p.g_y[:, t]                             # (S, M, H, P)
            # y_t^r = h_t q_t^r
            g_h = g_h + np.einsum("smhp,shmn->shpn", gy, tok.q)   # (S, H, P, N)
            g_q = np.einsum("shpn,smhp->shmn", hs[t + 1], gy)     # (S, H, M, N)
            # h_t = α h_{t-1} + β Σ v_{t-1} k_{t-1}ᵀ + γ Σ v_t k_tᵀ
            g_alpha = np.sum(g_h * h_prev, axis=(2, 3))            # (S, H)
            g_beta = np.sum(g_h * _outer(v_prev, k_prev), axis=(2, 3))   # (S, H)
            g_gamma = np.sum(g_h * _outer(tok.v, tok.k), axis=(2, 3))    # (S, H)
            gam, bet = tok.gamma[:, :, None, None], tok.beta[:, :, None, None]
            g_k = g_k + gam * np.einsum("shpn,shmp->shmn", g_h, tok.v)   # (S, H, M, N)
            g_v = g_v + gam * np.einsum("shpn,shmn->shmp", g_h, tok.k)   # (S, H, M, P)
            g_k_prev = bet * np.einsum("shpn,shmp->shmn", g_h, v_prev)   # (S, H, M, N)
            g_v_prev = bet * np.einsum("shpn,shmn->shmp", g_h, k_prev)   # (S, H, M, P)
            # α = exp(dA), β = α Δ (1 - λ), γ = λ Δ
            g_alpha = g_alpha + g_beta * tok.dt * (one - tok.lam)        # (S, H)
            d_dA[:, t] = g_alpha * tok.a
            d_dt[:, t] = g_beta * tok.a * (one - tok.lam) + g_gamma * tok.lam
            d_lam[:, t] = g_gamma * tok.dt - g_beta * tok.a * tok.dt
            # v_t^r = psi^r ⊙ x_t
            d_x[:, t] = np.sum(g_v * p.psi[None], axis=2)                # (S, H, P)
            d_psi += np.sum(g_v * p.x[:, t][:, :, None, :], axis=0)      # (H, M, P)
            # k_t = Rot(θ_t) kb, q_t = Rot(θ_t) qb
            g_kb, g_ang_k = rotate_back(g_k, tok.k, tok.c, tok.s, tok.ia, tok.ib)
            g_qb, g_ang_q = rotate_back(g_q, tok.q, tok.c, tok.s, tok.ia, tok.ib)
            d_B[:, t] = _group_sum(p, g_kb)                              # (S, M, G, N)
            d_C[:, t] = _group_sum(p, g_qb)
            d_B_bias += np.sum(g_kb, axis=0)                             # (H, M, N)
            d_C_bias += np.sum(g_qb, axis=0)
            # θ_t = θ_{t-1} + dθ_t (mod 2π: derivative 1)
            g_th = g_th + np.sum(g_ang_k + g_ang_q, axis=2)              # (S, H, F)
            d_dtheta[:, t] = g_th
            # on to token t-1: the cotangents of h_{t-1}, k_{t-1}, v_{t-1} (θ's passes as it is)
            g_h = tok.a[:, :, None, None] * g_h
            g_k, g_v = g_k_prev, g_v_prev
    return {"d_x": d_x, "d_dt": d_dt, "d_dA": d_dA, "d_lam": d_lam, "d_B": d_B, "d_C": d_C,
            "d_B_bias": d_B_bias, "d_C_bias": d_C_bias, "d_dtheta": d_dtheta, "d_psi": d_psi,
            "d0_theta": g_th, "d0_h": g_h, "d0_k": g_k, "d0_v": g_v}


# ---- the public functions (exported as ssm_ref.mamba3_scan, ssm_ref.mamba3_scan_back) ----

def mamba3_scan(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi=None, s_theta=None, s_h=None, s_k=None,
                s_v=None, ids=None, *, rotation="interleaved", dtype=np.float32, update_cache=False):
    """The Mamba-3 scan (docs/SPEC.md, "Mamba-3"), token by token.

    Args (S sequences, T tokens, H heads, P channels, N state size, G groups, M rank, F pairs, R rows):
    x (S,T,H,P) the value; dt (S,T,H) the step Δ (already positive); dA (S,T,H) the log decay A·Δ;
    lam (S,T,H) λ in [0, 1]; B, C (S,T,G,N) SISO or (S,T,M,G,N) MIMO: key and query before bias and
    rotation; B_bias, C_bias (H,N) or (H,M,N); dtheta (S,T,H,F) the angle increments; psi (H,M,P)
    (MIMO's value projection; None: ones; SISO: must be None); the start state s_theta (R,H,F),
    s_h (R,H,P,N), s_k (R,H,N)|(R,H,M,N), s_v (R,H,P)|(R,H,M,P), all four None (zeros) or all given;
    ids (S,) integers in [0, R) (None: arange(S); must be None with no states). Any float dtype.
    rotation: "interleaved" (pairs (2j, 2j+1)) or "halved" (pairs (j, j + N/2)), j < F.
    dtype: np.float32 (the contract) or np.float64 (the oracle).
    update_cache: True writes sequence i's four final state parts into row ids[i] of the four
    caches in place (writeable numpy float arrays; ids distinct) and returns states None.

    Returns Mamba3Result(y (S,T,H,P) | (S,T,M,H,P), theta (S,H,F), h (S,H,P,N), k (S,H,N) | (S,H,M,N),
    v (S,H,P) | (S,H,M,P), where="CPU"), in ``dtype``; unpacks as ``y, theta, h, k, v``. T = 0: y
    empty, the states those of the start. Raises TypeError / ValueError naming the argument before
    any work. Same function: ssm_fast.mamba3_scan; ssm_torch / ssm_jax bridges.
    """
    p = check_mamba3_forward(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v, ids,
                             rotation=rotation, dtype=dtype)
    update = check_mamba3_update_cache(update_cache, (s_theta, s_h, s_k, s_v), p)
    y, (theta, h, k, v) = forward(p)
    y, k, v = drop_rank(p.dims, y, 2), drop_rank(p.dims, k, 2), drop_rank(p.dims, v, 2)
    if update:
        if p.dims.S:
            for cache, final in zip((s_theta, s_h, s_k, s_v), (theta, h, k, v), strict=True):
                cache[p.ids] = final
        return Mamba3Result(y=y, theta=None, h=None, k=None, v=None)
    return Mamba3Result(y=y, theta=theta, h=h, k=k, v=v)


def mamba3_scan_back(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi=None, s_theta=None, s_h=None, s_k=None,
                     s_v=None, ids=None, g_y=None, g_theta=None, g_h=None, g_k=None, g_v=None, *,
                     rotation="interleaved", dtype=np.float32):
    """Backward of :func:`mamba3_scan` for the loss Σ y·g_y + Σ theta·g_theta + Σ h·g_h + Σ k·g_k +
    Σ v·g_v (each cotangent in its output's shape, or None for zeros).

    Returns Mamba3Grads (a read-only mapping by name, like ScanGrads): d_x, d_dt, d_dA, d_lam, d_B,
    d_C, d_B_bias, d_C_bias, d_dtheta in their inputs' shapes; d_psi (H,M,P) (None when psi is
    None); d_s_theta, d_s_h, d_s_k, d_s_v in the caches' shapes (R, ...): each sequence's start-state
    gradient scatter-added into row ids[i] (repeated ids add); with no start states given, the
    gradients of the zero start states, (S, ...). The mod 2π passes gradients as 1. Raises as
    :func:`mamba3_scan`. Same function: ssm_fast.mamba3_scan_back.
    """
    p = check_mamba3_backward(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v, ids,
                              g_y, g_theta, g_h, g_k, g_v, rotation=rotation, dtype=dtype)
    g = backward(p)
    R = p.dims.R
    out = {k: g[k] for k in ("d_x", "d_dt", "d_dA", "d_lam", "d_dtheta")}
    for k in ("d_B", "d_C"):
        out[k] = drop_rank(p.dims, g[k], 2)
    for k in ("d_B_bias", "d_C_bias"):
        out[k] = drop_rank(p.dims, g[k], 1)
    out["d_psi"] = g["d_psi"] if p.psi_given else None
    out["d_s_theta"] = scatter_rows(g["d0_theta"], p.ids, R)
    out["d_s_h"] = scatter_rows(g["d0_h"], p.ids, R)
    out["d_s_k"] = scatter_rows(drop_rank(p.dims, g["d0_k"], 2), p.ids, R)
    out["d_s_v"] = scatter_rows(drop_rank(p.dims, g["d0_v"], 2), p.ids, R)
    return Mamba3Grads(**out)
