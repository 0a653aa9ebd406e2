"""The backward of the Mamba-3 scan in chunk (matrix) form: the spec of a chunked backward kernel,
the same function as :func:`ssm_ref.mamba3.backward` (the token-by-token adjoint) with other sums
(tested equal to it in float64 to 1e-12, tests/ref/test_mamba3_chunked_back.py).

Glossary: S sequences · T tokens · H heads · P channels · N state size · G groups · M rank ·
F rotated pairs · L chunk length (Lc <= L tokens in a chunk) · NC = ceil(T / L) chunks.
Notation of :mod:`ssm_ref.mamba3_chunked` (its forward): per sequence i, head h and chunk c the
chunk receives (θ_in, H_in, k_in, v_in), and with σ_in = Δ_0 (1 - λ_0)

    H'_in = H_in + σ_in Σ_r v_in^r k_in^rᵀ
    y_t^r = Σ_{s <= t} W[t, s] Σ_r' (q_t^r · k_s^r') v_s^r'  +  din_t H'_in q_t^r
    H_out = dch H'_in + Σ_s W[Lc-1, s] Σ_r v_s^r k_s^rᵀ

The backward, given the cotangents of the outputs (g_y, and of the final state g_theta, g_h, g_k,
g_v), runs in three steps, each a kernel's worth of work:

1. The state pass (back over chunks, per (i, h)): G_out of the last chunk is g_h, and

       G'_in = dch G_out + Σ_t din_t Σ_r g_y_t^r q_t^rᵀ     (P x N: the cotangent of H'_in, and of H_in)
       G_out of chunk c-1 = G'_in of chunk c;   d0_h = G'_in of chunk 0.

   The forward's chunk-entry states (H'_in, θ_in, k_in, v_in) are recomputed by its own pass
   (``mamba3_chunked.forward(keep=True)``).

2. Per chunk, independent of the others given G_out, G'_in and H'_in. With the extended σ
   (σ_s = Δ_{s+1} (1 - λ_{s+1}) for s < Lc-1, and for s = Lc-1 the next chunk's σ_in, 0 in the
   last chunk) and wout_s = dout_s (γ_s + σ_s), the weight of token s in H_out *and* in the next
   chunk's H'_in (so the last token's k, v take their cotangent through the next chunk's σ_in term
   here, from G_out = the next chunk's G'_in):

       S[(t,r),(s,r')] = q_t^r · k_s^r'        GV[(t,r),(s,r')] = g_y_t^r · v_s^r'     (L M x L M)
       g_v_s^r' = Σ_{t >= s} Σ_r W[t,s] S g_y_t^r + wout_s G_out k_s^r'       (+ g_v at the last token)
       g_k_s^r' = Σ_{t >= s} Σ_r W[t,s] GV q_t^r + wout_s G_outᵀ v_s^r'       (+ g_k at the last token)
       g_q_t^r  = Σ_{s <= t} Σ_r' W[t,s] GV k_s^r' + din_t H'_inᵀ g_y_t^r
       gW[t, s] = Σ_{r,r'} S ⊙ GV  (s <= t)      b_s = Σ_r v_s^rᵀ G_out k_s^r      gdin_t = Σ_r g_y_t^rᵀ H'_in q_t^r
       d_dA_u = Σ_{t >= u > s} gW W[t,s]  +  Σ_{s < u} b_s wout_s  +  Σ_{t >= u} gdin_t din_t  +  dch <G_out, H'_in>
       gγ_s = Σ_{t >= s} gW[t,s] D[t,s] + b_s dout_s      gσ_s = Σ_{t > s} gW[t,s] D[t,s] + b_s dout_s   (s < Lc-1)
       gσ_in = Σ_r v_in^rᵀ G'_in k_in^r    (the first token's σ: its cotangent is read here, not in chunk c-1)
       d_dt_s = gγ_s λ_s + gσ_{s-1} (1 - λ_s)      d_lam_s = gγ_s Δ_s - gσ_{s-1} Δ_s      (gσ_{-1} = gσ_in)
       d_x_t = Σ_r psi^r ⊙ g_v_t^r      d_psi^r += Σ_t g_v_t^r ⊙ x_t
       the rotation's adjoint of g_k, g_q at θ_t: d_B, d_C (summed over a group's heads), the
       biases (summed over tokens and sequences), and the angle cotangent a_t (F per token).
   Chunk 0 also gives the start state's d0_k = σ_in G'_inᵀ v_in, d0_v = σ_in G'_in k_in.

3. The angle pass (back over chunks): gθ_out of the last chunk is g_theta;
   d_dθ_t = gθ_out + Σ_{t' >= t} a_t' (within the chunk), gθ_out of chunk c-1 = gθ_out + Σ_t a_t,
   d0_theta = that of chunk 0 (the mod 2π passes the cotangent as 1).

Decays as in the forward (ssm_ref.chunked.chunk_tables: exp of sums over each token range).
Non-finite inputs are the token-by-token spec's business.

``precision`` (docs/SPEC.md section 15): at "high" or "medium" the forward is recomputed at that
precision and every product of a chunk goes through :func:`ssm_ref.precision.matmul`, on the
chunk's L M rows (token-major, the rank inside): S = Q Kᵀ, GV = g_Y Vᵀ, (W ⊙ S)ᵀ g_Y, K G_outᵀ,
(W ⊙ GV)ᵀ Q, V G_out, (W ⊙ GV) K, g_Y H'_in, and the state pass's (din ⊙ g_Y)ᵀ Q; b and gdin
are the row dots of V G_out with K and of g_Y H'_in with Q, as a kernel forms them from those
products. The rank-M terms of the first chunk token's σ, the decays and the sums stay float32.
"""

from __future__ import annotations

import numpy as np

from .chunked import chunk_tables
from .mamba3 import mod_2pi, rotate, rotate_back
from .mamba3_checks import M3Problem, pair_index
from .mamba3_chunked import check_chunk_length, check_chunk_precision, forward, rows
from .precision import matmul

__all__ = ["backward"]


def _chunks(T: int, L: int) -> list[tuple[int, int]]:
    return [(t0, min(t0 + L, T)) for t0 in range(0, T, L)]


class _Chunk:
    """One chunk's forward quantities of head h in sequence i, recomputed from its entry angle."""

    def __init__(self, p: M3Problem, i: int, h: int, t0: int, t1: int, th_in: np.ndarray):
        one, zero = p.dtype.type(1), p.dtype.type(0)
        g = p.dims.group_of_head()[h]
        self.ia, self.ib = pair_index(p.rotation, p.dims.N, p.dims.F)
        ths = mod_2pi(th_in[None] + np.cumsum(p.dtheta[i, t0:t1, h], axis=0))        # (Lc, F)
        self.c, self.s = np.cos(ths)[:, None], np.sin(ths)[:, None]                   # (Lc, 1, F)
        self.k = rotate(p.B[i, t0:t1, :, g] + p.B_bias[h][None], self.c, self.s, self.ia, self.ib)  # (Lc, M, N)
        self.q = rotate(p.C[i, t0:t1, :, g] + p.C_bias[h][None], self.c, self.s, self.ia, self.ib)  # (Lc, M, N)
        self.v = p.psi[h][None] * p.x[i, t0:t1, h][:, None, :]                        # (Lc, M, P)
        self.gy = p.g_y[i, t0:t1, :, h]                                               # (Lc, M, P)
        self.dt, self.lam = p.dt[i, t0:t1, h], p.lam[i, t0:t1, h]                      # (Lc,)
        self.D, self.din, self.dout, self.dch = chunk_tables(p.dA[i, t0:t1, h])
        self.gamma = self.lam * self.dt                                               # (Lc,)
        sigma = np.zeros_like(self.dt)                                                # extended σ (Lc,)
        sigma[:-1] = self.dt[1:] * (one - self.lam[1:])
        if t1 < p.dims.T:
            sigma[-1] = p.dt[i, t1, h] * (one - p.lam[i, t1, h])
        self.sigma = sigma
        self.sigma_in = self.dt[0] * (one - self.lam[0])
        strict = np.tri(t1 - t0, k=-1, dtype=bool)                                    # s < t
        self.W = self.D * (self.gamma[None, :] + np.where(strict, sigma[None, :], zero))  # (Lc, Lc)
        self.wout = self.dout * (self.gamma + sigma)                                  # (Lc,)


def _einsums(q: _Chunk, Go, Hi):
    """The chunk's products in float32 (``precision="highest"``): S, GV (Lc, M, Lc, M), g_v, g_k,
    g_q (Lc, M, P | N), b, gdin (Lc,)."""
    Sc = np.einsum("trn,sqn->trsq", q.q, q.k)                                     # (Lc, M, Lc, M)
    GV = np.einsum("trp,sqp->trsq", q.gy, q.v)
    Wm = q.W[:, None, :, None]
    g_v = (np.einsum("trsq,trp->sqp", Sc * Wm, q.gy)
           + q.wout[:, None, None] * np.einsum("pn,sqn->sqp", Go, q.k))              # (Lc, M, P)
    g_k = (np.einsum("trsq,trn->sqn", GV * Wm, q.q)
           + q.wout[:, None, None] * np.einsum("pn,sqp->sqn", Go, q.v))              # (Lc, M, N)
    g_q = (np.einsum("trsq,sqn->trn", GV * Wm, q.k)
           + q.din[:, None, None] * np.einsum("pn,trp->trn", Hi, q.gy))              # (Lc, M, N)
    b = np.einsum("sqp,pn,sqn->s", q.v, Go, q.k)                                   # (Lc,)
    gdin = np.einsum("trp,pn,trn->t", q.gy, Hi, q.q)                               # (Lc,)
    return Sc, GV, g_v, g_k, g_q, b, gdin


def _matrix_units(q: _Chunk, Go, Hi, precision: str):
    """:func:`_einsums`'s products on the matrix units at ``precision`` (module docstring)."""
    Lc, M, _ = q.q.shape
    Q, K, V, GY = rows(q.q), rows(q.k), rows(q.v), rows(q.gy)
    Wr = np.kron(q.W, np.ones((M, M), q.W.dtype))
    wout, din = np.repeat(q.wout, M)[:, None], np.repeat(q.din, M)[:, None]
    S, GV = matmul(Q, K.T, precision), matmul(GY, V.T, precision)                  # (Lc M, Lc M)
    VG, GH = matmul(V, Go, precision), matmul(GY, Hi, precision)                   # (Lc M, N)
    g_v = matmul((S * Wr).T, GY, precision) + wout * matmul(K, Go.T, precision)
    g_k = matmul((GV * Wr).T, Q, precision) + wout * VG
    g_q = matmul(GV * Wr, K, precision) + din * GH
    b = (VG * K).sum(axis=1).reshape(Lc, M).sum(axis=1)
    gdin = (GH * Q).sum(axis=1).reshape(Lc, M).sum(axis=1)
    four = (Lc, M, Lc, M)
    return (S.reshape(four), GV.reshape(four), g_v.reshape(Lc, M, -1), g_k.reshape(Lc, M, -1),
            g_q.reshape(Lc, M, -1), b, gdin)


def backward(p: M3Problem, L: int, precision: str = "highest") -> dict[str, np.ndarray]:
    """The adjoint of the forward in chunks of ``L`` tokens. Returns what
    :func:`ssm_ref.mamba3.backward` does (rank axis kept): d_x, d_dt, d_dA, d_lam, d_B, d_C,
    d_B_bias, d_C_bias, d_dtheta, d_psi, and the start-state gradients per sequence d0_theta
    (S,H,F), d0_h (S,H,P,N), d0_k (S,H,M,N), d0_v (S,H,M,P). ``precision``: the products' (module
    docstring). ValueError for L < 1 or a precision the forward refuses."""
    check_chunk_length(L)
    check_chunk_precision(p, precision)
    d = p.dims
    S, T, H, P, N, G, M, F = d.S, d.T, d.H, d.P, d.N, d.G, d.M, d.F
    dt_ = p.dtype
    one = dt_.type(1)
    groups = d.group_of_head()
    out = {"d_x": np.zeros((S, T, H, P), dt_), "d_dt": np.zeros((S, T, H), dt_), "d_dA": np.zeros((S, T, H), dt_),
           "d_lam": np.zeros((S, T, H), dt_), "d_B": np.zeros((S, T, M, G, N), dt_),
           "d_C": np.zeros((S, T, M, G, N), dt_), "d_B_bias": np.zeros((H, M, N), dt_),
           "d_C_bias": np.zeros((H, M, N), dt_), "d_dtheta": np.zeros((S, T, H, F), dt_),
           "d_psi": np.zeros((H, M, P), dt_), "d0_theta": p.g_theta.copy(), "d0_h": p.g_h.copy(),
           "d0_k": p.g_k.copy(), "d0_v": p.g_v.copy()}
    if T == 0:
        return out                      # the outputs are the start state: the cotangents pass as they are
    chunks = _chunks(T, L)
    _y, _final, (th_in, h_in, k_in, v_in) = forward(p, L, keep=True, precision=precision)
    for i in range(S):
        for h in range(H):
            cs = [_Chunk(p, i, h, t0, t1, th_in[i, h, c]) for c, (t0, t1) in enumerate(chunks)]
            # 1. the state pass: G_out and G'_in of every chunk
            G_out, G_in = [None] * len(chunks), [None] * len(chunks)
            G = p.g_h[i, h]
            for c in reversed(range(len(chunks))):
                q = cs[c]
                G_out[c] = G
                if precision == "highest":
                    G = q.dch * G + np.einsum("t,trp,trn->pn", q.din, q.gy, q.q)    # (P, N)
                else:
                    G = q.dch * G + matmul((rows(q.gy) * np.repeat(q.din, d.M)[:, None]).T, rows(q.q), precision)
                G_in[c] = G
            out["d0_h"][i, h] = G
            # 2. each chunk's own gradients, and 3. the angle pass (its suffix sums)
            g_th = p.g_theta[i, h]                                                # (F,)
            for c in reversed(range(len(chunks))):
                t0, t1 = chunks[c]
                q, Go, Gi, Hi = cs[c], G_out[c], G_in[c], h_in[i, h, c]
                ki, vi = k_in[i, h, c], v_in[i, h, c]                             # (M, N), (M, P)
                causal = np.tri(t1 - t0, dtype=bool)
                Sc, GV, g_v, g_k, g_q, b, gdin = (_einsums(q, Go, Hi) if precision == "highest"
                                                   else _matrix_units(q, Go, Hi, precision))
                if t1 == T:
                    g_k[-1] += p.g_k[i, h]
                    g_v[-1] += p.g_v[i, h]
                # the weights' and the decays' cotangents
                gW = np.where(causal, (Sc * GV).sum(axis=(1, 3)), dt_.type(0))     # (Lc, Lc)
                E, Eout, Edin = gW * q.W, b * q.wout, gdin * q.din
                gdch = np.sum(Go * Hi)
                Lc = t1 - t0
                out["d_dA"][i, t0:t1, h] = np.array(
                    [E[u:, :u].sum() + Eout[:u].sum() + Edin[u:].sum() for u in range(Lc)], dt_) + gdch * q.dch
                gWD = gW * q.D
                g_gamma = gWD.sum(axis=0) + b * q.dout                               # (Lc,)
                g_sig_prev = np.empty(Lc, dt_)                                       # gσ_{s-1}
                g_sig_prev[0] = np.einsum("mp,pn,mn->", vi, Gi, ki)
                g_sig_prev[1:] = (np.tril(gWD, k=-1).sum(axis=0) + b * q.dout)[:-1]
                out["d_dt"][i, t0:t1, h] = g_gamma * q.lam + g_sig_prev * (one - q.lam)
                out["d_lam"][i, t0:t1, h] = g_gamma * q.dt - g_sig_prev * q.dt
                if c == 0:
                    out["d0_k"][i, h] = q.sigma_in * np.einsum("pn,mp->mn", Gi, vi)
                    out["d0_v"][i, h] = q.sigma_in * np.einsum("pn,mn->mp", Gi, ki)
                # v = psi ⊙ x
                out["d_x"][i, t0:t1, h] = np.sum(g_v * p.psi[h][None], axis=1)
                out["d_psi"][h] += np.sum(g_v * p.x[i, t0:t1, h][:, None, :], axis=0)
                # the rotation's adjoint
                g_kb, a_k = rotate_back(g_k, q.k, q.c, q.s, q.ia, q.ib)
                g_qb, a_q = rotate_back(g_q, q.q, q.c, q.s, q.ia, q.ib)
                g = groups[h]
                out["d_B"][i, t0:t1, :, g] += g_kb
                out["d_C"][i, t0:t1, :, g] += g_qb
                out["d_B_bias"][h] += g_kb.sum(axis=0)
                out["d_C_bias"][h] += g_qb.sum(axis=0)
                a = (a_k + a_q).sum(axis=1)                                          # (Lc, F)
                out["d_dtheta"][i, t0:t1, h] = g_th[None] + np.cumsum(a[::-1], axis=0)[::-1]
                g_th = g_th + a.sum(axis=0)
            out["d0_theta"][i, h] = g_th
    return out
