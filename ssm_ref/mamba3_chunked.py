"""The chunked (matrix) form of the Mamba-3 scan's forward (its backward: mamba3_chunked_back):
the spec of a chunked kernel, the same function as the token-by-token :mod:`ssm_ref.mamba3` with
other sums (tested equal to it in float64 to 1e-12, tests/ref/test_mamba3_chunked.py).

Glossary: S sequences · T tokens · H heads · P channels · N state size · G groups · M rank ·
F rotated pairs · L chunk length (the last chunk of a sequence may be shorter, Lc <= L).

Per sequence i, head h and chunk c (local tokens t, s = 0 .. Lc-1), with the state (θ_in, H_in,
k_in, v_in) the chunk receives (the start state's rows for the first chunk):

    θ_t = (θ_in + dθ_0 + ... + dθ_t) mod 2π             the chunk's prefix sums of the angle
    q_t^r, k_t^r rotated by θ_t, v_t^r = psi^r ⊙ x_t    as in the scan
    ℓ_t = dA_t   seg(t, s) = ℓ_{s+1} + ... + ℓ_t (s < t; 0 at s = t)   D[t, s] = exp(seg(t, s)), s <= t
    din_t = exp(ℓ_0 + ... + ℓ_t)   dch = din_{Lc-1}
    W[t, s] = D[t, s] (γ_s + [s < t] σ_s)   γ_s = λ_s Δ_s,  σ_s = Δ_{s+1} (1 - λ_{s+1})
    H'_in = H_in + Δ_0 (1 - λ_0) Σ_r v_in^r k_in^rᵀ                   (P, N)
    y_t^r = Σ_{s <= t} Σ_r' W[t, s] (q_t^r · k_s^r') v_s^r'  +  din_t H'_in q_t^r
    H_out = dch H'_in + Σ_s W[Lc-1, s] Σ_r v_s^r k_s^rᵀ;  θ_out = θ_{Lc-1}, k_out = k_{Lc-1}, v_out = v_{Lc-1}

The trapezoid's two terms: token s enters the state with weight γ_s at its own step and, through
the next token's β_{s+1} = α_{s+1} σ_s, with α_{s+1} absorbed into the decay from s to t -- so
the strictly causal entries carry γ_s + σ_s and the diagonal γ_s alone; the last token's σ term
belongs to the next chunk, which receives it as k_in, v_in (the term of H'_in). The decays are
exp of sums of log-decays over each token range (ssm_ref.chunked.chunk_tables), never
differences of running sums. Non-finite inputs are the token-by-token spec's business (a masked
entry here is a zero, where the scan never forms the product).

``precision`` (docs/SPEC.md section 15): at "high" or "medium" every product of a chunk goes
through :func:`ssm_ref.precision.matmul` -- the chunk's L M rows of queries and keys, token-major
with the rank inside: S = Q Kᵀ, (W ⊙ S) V, Q H'_inᵀ (its rows then times din) and the chunk's
state (w ⊙ V)ᵀ K with w = W[Lc-1, :] per row -- each operand one block; the trapezoid's rank-M
term of H'_in, the decays and the sums around the products stay float32. "highest" is the
einsum form above, unchanged.
"""

from __future__ import annotations

import numpy as np

from .chunked import chunk_tables
from .mamba3 import mod_2pi, rotate
from .mamba3_checks import M3Problem, pair_index
from .precision import check_precision, matmul

__all__ = ["check_chunk_length", "check_chunk_precision", "forward", "rows"]


def check_chunk_length(L) -> None:
    """ValueError unless L is an integer >= 1 (bool excluded)."""
    if isinstance(L, bool) or not isinstance(L, (int, np.integer)) or L < 1:
        raise ValueError(f"L: the chunk length must be an integer >= 1, got {L!r}")


def check_chunk_precision(p: M3Problem, precision: str) -> None:
    """ValueError for an unknown ``precision``, or matrix units ("high", "medium") on a problem
    that is not float32 (they emulate float32 products)."""
    check_precision(precision)
    if precision != "highest" and p.dtype != np.float32:
        raise ValueError(f"precision: {precision!r} emulates float32 matrix units; the problem is {p.dtype}")


def rows(a: np.ndarray) -> np.ndarray:
    """(Lc, M, X) -> the chunk's Lc M rows (Lc M, X), token-major with the rank inside."""
    return a.reshape(a.shape[0] * a.shape[1], a.shape[2])


def _products(q, k, v, W, din, H_in, precision: str):
    """y's two terms and the chunk's own state Σ_s W[Lc-1, s] Σ_r v_s^r k_s^rᵀ, on the matrix
    units at ``precision`` (module docstring): (y (Lc, M, P), Z (P, N))."""
    Lc, M, _ = q.shape
    Q, K, V = rows(q), rows(k), rows(v)                                          # (Lc M, N | P)
    Wr = np.kron(W, np.ones((M, M), W.dtype))                                    # W[t, s] at ((t,r), (s,q))
    S = matmul(Q, K.T, precision) * Wr                                           # (Lc M, Lc M)
    y = matmul(S, V, precision) + np.repeat(din, M)[:, None] * matmul(Q, H_in.T, precision)
    Z = matmul((V * np.repeat(W[-1], M)[:, None]).T, K, precision)               # (P, N)
    return y.reshape(Lc, M, -1), Z


def forward(p: M3Problem, L: int, keep: bool = False, precision: str = "highest"):
    """The forward in chunks of ``L`` tokens. Returns what :func:`ssm_ref.mamba3.forward` does:
    y (S, T, M, H, P) and the final state (theta (S, H, F), h (S, H, P, N), k (S, H, M, N),
    v (S, H, M, P)); with ``keep`` also the state each chunk receives, NC = ceil(T / L) chunks:
    theta_in (S, H, NC, F), H'_in (S, H, NC, P, N) (the incoming h with the trapezoid's term of
    k_in, v_in added), k_in (S, H, NC, M, N), v_in (S, H, NC, M, P) -- what the chunked backward
    (:mod:`ssm_ref.mamba3_chunked_back`) reads. ``precision``: the products' (module docstring).
    ValueError for L < 1 or a precision :func:`check_chunk_precision` refuses."""
    check_chunk_length(L)
    check_chunk_precision(p, precision)
    d = p.dims
    S, T, H, P, N, M, F = d.S, d.T, d.H, d.P, d.N, d.M, d.F
    one = p.dtype.type(1)
    ia, ib = pair_index(p.rotation, N, F)
    groups = d.group_of_head()
    y = np.empty((S, T, M, H, P), dtype=p.dtype)          # (S, T, M, H, P)
    theta = np.empty((S, H, F), dtype=p.dtype)
    h_out = np.empty((S, H, P, N), dtype=p.dtype)
    k_out = np.empty((S, H, M, N), dtype=p.dtype)
    v_out = np.empty((S, H, M, P), dtype=p.dtype)
    NC = -(-T // L)
    kept = (np.empty((S, H, NC, F), p.dtype), np.empty((S, H, NC, P, N), p.dtype),
            np.empty((S, H, NC, M, N), p.dtype), np.empty((S, H, NC, M, P), p.dtype))
    for i in range(S):
        row = p.ids[i]
        for h in range(H):
            g = groups[h]
            th = p.s_theta[row, h]                          # (F,)
            Hc = p.s_h[row, h]                              # (P, N)
            k_in, v_in = p.s_k[row, h], p.s_v[row, h]       # (M, N), (M, P)
            for t0 in range(0, T, L):
                t1 = min(t0 + L, T)
                ths = mod_2pi(th[None] + np.cumsum(p.dtheta[i, t0:t1, h], axis=0))  # (Lc, F)
                c, s = np.cos(ths)[:, None], np.sin(ths)[:, None]                   # (Lc, 1, F)
                k = rotate(p.B[i, t0:t1, :, g] + p.B_bias[h][None], c, s, ia, ib)     # (Lc, M, N)
                q = rotate(p.C[i, t0:t1, :, g] + p.C_bias[h][None], c, s, ia, ib)     # (Lc, M, N)
                v = p.psi[h][None] * p.x[i, t0:t1, h][:, None, :]                     # (Lc, M, P)
                dt, lam = p.dt[i, t0:t1, h], p.lam[i, t0:t1, h]                       # (Lc,)
                D, din, _dout, dch = chunk_tables(p.dA[i, t0:t1, h])                  # (Lc, Lc), (Lc,)
                gamma = lam * dt                                                      # (Lc,)
                sigma = np.zeros_like(dt)
                sigma[:-1] = dt[1:] * (one - lam[1:])                                 # (Lc,)
                strict = np.tri(t1 - t0, k=-1, dtype=bool)                            # s < t
                W = D * (gamma[None, :] + np.where(strict, sigma[None, :], p.dtype.type(0)))  # (Lc, Lc)
                H_in = Hc + dt[0] * (one - lam[0]) * np.einsum("mp,mn->pn", v_in, k_in)  # (P, N)
                for arr, val in zip(kept, (th, H_in, k_in, v_in), strict=True):
                    arr[i, h, t0 // L] = val
                if precision == "highest":
                    scores = np.einsum("trn,sqn->trsq", q, k) * W[:, None, :, None]   # (Lc, M, Lc, M)
                    y[i, t0:t1, :, h] = (np.einsum("trsq,sqp->trp", scores, v)
                                         + din[:, None, None] * np.einsum("pn,trn->trp", H_in, q))  # (Lc, M, P)
                    Hc = dch * H_in + np.einsum("s,sqp,sqn->pn", W[-1], v, k)         # (P, N)
                else:
                    y[i, t0:t1, :, h], Z = _products(q, k, v, W, din, H_in, precision)
                    Hc = dch * H_in + Z
                th, k_in, v_in = ths[-1], k[-1], v[-1]
            theta[i, h], h_out[i, h], k_out[i, h], v_out[i, h] = th, Hc, k_in, v_in
    if keep:
        return y, (theta, h_out, k_out, v_out), kept
    return y, (theta, h_out, k_out, v_out)
