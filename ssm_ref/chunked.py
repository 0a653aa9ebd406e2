"""The chunked (matrix) form of the Mamba-2 scan and its backward: the executable spec of the
chunked Vulkan kernels (ssm_vk/chunked/glsl/chunk_*.comp, docs/KERNELS.md "Chunked kernels").

Glossary: N d_state · P head_dim · H n_head · G n_group · T tokens · S sequences · L chunk length.
Mamba-2 only (A of shape (H,) or (H, 1)): the decay is one scalar per token and head, so a chunk's
state updates collapse into matrix products. Same results as :mod:`ssm_ref.scan` up to rounding
(tested in float64 to 1e-12); the order of the sums differs.

Per sequence i, head h and chunk c (tokens t0 .. t0 + Lc - 1, local index t = 0 .. Lc - 1):

    d_t = softplus(dt_t)      la_t = d_t * A[h]      u_t = x_t * d_t                  (P,)
    seg(t, s) = la_{s+1} + ... + la_t   (s < t; seg(t, t) = 0)   M[t, s] = exp(seg(t, s)), s <= t
    din_t = exp(la_0 + ... + la_t)   dout_s = exp(la_{s+1} + ... + la_{Lc-1})   dch = exp(sum la)
    CB[t, s] = C_t . B_s   (one per group: shared by the heads of a group)
    y_t   = sum_{s <= t} M[t, s] CB[t, s] u_s  +  din_t * (H_c C_t)                  H_c: (P, N)
    H_{c+1} = dch * H_c + sum_s dout_s u_s (x) B_s                                    (P, N)

The decays are sums of log-decays over the token range, never differences of cumulative sums:
no cancellation, and a -inf or nan log-decay stays inside the ranges that hold it (as in the
sequential product). Masked entries (s > t) are left out of the sums, not multiplied by zero, so
an inf or nan input reaches only the outputs the sequential scan lets it reach.

Backward, per chunk, with H_c the chunk's incoming state (recomputed by the forward above) and
G_c = dL/dH_{c+1} from later chunks (G of the last chunk = g_states):

    GU[t, s] = g_y_t . u_s
    Gam_s  = sum_{r >= s} M[r, s] CB[r, s] g_y_r  +  dout_s * (G_c B_s)               (P,)
    d_x_s  = Gam_s * d_s
    dB_s  += sum_{r >= s} M[r, s] GU[r, s] C_r  +  dout_s * (u_s G_c)                 (N,)
    dC_t  += sum_{s <= t} M[t, s] GU[t, s] B_s  +  din_t * (g_y_t H_c)                (N,)
    Q_t    = sum_{r >= t > s} M[r, s] GU[r, s] CB[r, s]  +  sum_{r >= t} alpha_r
             + sum_{s < t} beta_s  +  dch * <G_c, H_c>
             alpha_r = din_r * g_y_r . (H_c C_r)        beta_s = dout_s * u_s . (G_c B_s)
    d_dt_t = (Gam_t . x_t + A[h] Q_t) * softplus'(dt_t)      d_A[h] += sum_t d_t Q_t
    G_{c-1} = dch * G_c + sum_r din_r g_y_r (x) C_r;  d_s0 = G_{-1}

Q_t is the sequential backward's sum over (p, n) of lam_t * a_t * st_{t-1} (the decay's share),
written with the chunk's matrices: lam_t and a_t st_{t-1} expanded into their in-chunk and
boundary terms, multiplied out.

Every matrix product above (CB, GU, the masked products, those with H_c and G_c, the chunk states
and their mirror) goes through :func:`ssm_ref.precision.matmul` at the ``precision`` given:
"highest" (the default) is numpy's float32 or float64 arithmetic; "high" and "medium" emulate the
float16 matrix units on a float32 problem, one operand block per matrix as written here (e.g. one
chunk's B of a group, whose scale serves C B^T and the chunk states alike). The element-wise
products and the row sums (alpha, beta, Q) stay float32 arithmetic.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .checks import Problem
from .precision import check_precision, matmul
from .scan import softplus, softplus_grad

__all__ = ["forward", "backward", "chunk_tables"]


def chunk_tables(la: np.ndarray):
    """The decays of one chunk from its log-decays ``la`` (Lc,): M (Lc, Lc) with zeros above the
    diagonal, din (Lc,), dout (Lc,), dch (scalar). Every entry is exp of a sum over its own token
    range, added in token order from the far end (as the shaders do)."""
    Lc = la.shape[0]
    z = la.dtype.type(0)
    seg = np.zeros((Lc, Lc), dtype=la.dtype)       # seg[t, s] = la_{s+1} + ... + la_t
    for t in range(Lc):
        acc = z
        for s in range(t - 1, -1, -1):
            acc = acc + la[s + 1]
            seg[t, s] = acc
    M = np.where(np.tri(Lc, dtype=bool), np.exp(seg), z)                  # (Lc, Lc)
    head = np.array([la[: t + 1].sum() for t in range(Lc)], dtype=la.dtype)
    tail = np.array([la[s + 1:].sum() for s in range(Lc)], dtype=la.dtype)
    return M, np.exp(head), np.exp(tail), np.exp(la.sum(dtype=la.dtype))


def _chunks(T: int, L: int):
    return [(t0, min(t0 + L, T)) for t0 in range(0, T, L)]


def _check(p: Problem, L: int, precision: str) -> None:
    check_precision(precision)
    if precision != "highest" and p.dtype != np.float32:
        raise ValueError(f"precision: {precision!r} emulates float32 matrix units; the problem is {np.dtype(p.dtype)}")
    if p.dims.mamba1:
        raise ValueError("the chunked form needs Mamba-2 (A of shape (H,) or (H, 1))")
    if L < 1:
        raise ValueError(f"chunk length L must be >= 1, got {L}")
    if p.dims.K != 1 or p.g_snapshots is not None:
        raise ValueError("the chunked form computes y and the final states; the K state snapshots are "
                         "ssm_ref.scan's")


def _chunk_inputs(p: Problem, i: int, t0: int, t1: int, h: int):
    """d, la, u, B, C of head h over tokens t0..t1 of sequence i."""
    g = h // (p.dims.H // p.dims.G)
    d = softplus(p.dt[i, t0:t1, h])                      # (Lc,)
    la = d * p.A[h, 0]                                   # (Lc,)
    u = p.x[i, t0:t1, h, :] * d[:, None]                 # (Lc, P)
    return d, la, u, p.B[i, t0:t1, g, :], p.C[i, t0:t1, g, :]


def _masked_rows(Mw: np.ndarray, V: np.ndarray, precision: str = "highest") -> np.ndarray:
    """out[t] = sum_{s <= t} Mw[t, s] V[s]: only the causal entries are summed. On the matrix
    units, one product with the entries above the diagonal set to zero (the units skip those
    slices; a zero adds nothing to a finite sum)."""
    if precision != "highest":
        return matmul(np.tril(Mw), V, precision)
    out = np.zeros((Mw.shape[0], V.shape[1]), dtype=V.dtype)
    for t in range(Mw.shape[0]):
        out[t] = Mw[t, : t + 1] @ V[: t + 1]
    return out


def _masked_cols(Mw: np.ndarray, V: np.ndarray, precision: str = "highest") -> np.ndarray:
    """out[s] = sum_{r >= s} Mw[r, s] V[r] (on the matrix units as :func:`_masked_rows`)."""
    if precision != "highest":
        return matmul(np.ascontiguousarray(np.tril(Mw).T), V, precision)
    out = np.zeros((Mw.shape[0], V.shape[1]), dtype=V.dtype)
    for s in range(Mw.shape[0]):
        out[s] = Mw[s:, s] @ V[s:]
    return out


def forward(p: Problem, L: int = 64, keep_chunk_states: bool = False, precision: str = "highest"):
    """y (S, T, H, P) and states (S, H, P, N) by chunks of L tokens; with ``keep_chunk_states``
    also every chunk's incoming state, (S, n_chunks, H, P, N). ``precision``: the products'
    arithmetic (module docstring; "high" and "medium" need a float32 problem, else ValueError)."""
    _check(p, L, precision)
    mm = partial(matmul, precision=precision)
    d_ = p.dims
    chunks = _chunks(d_.T, L)
    y = np.zeros((d_.S, d_.T, d_.H, d_.P), dtype=p.dtype)
    states = p.s[p.ids].copy()                                     # (S, H, P, N)
    kept = np.zeros((d_.S, len(chunks), d_.H, d_.P, d_.N), dtype=p.dtype)
    for i in range(d_.S):
        for c, (t0, t1) in enumerate(chunks):
            for h in range(d_.H):
                _, la, u, B, C = _chunk_inputs(p, i, t0, t1, h)
                M, din, dout, dch = chunk_tables(la)
                Hc = states[i, h]                                  # (P, N)
                kept[i, c, h] = Hc
                CB = mm(C, B.T)                                    # (Lc, Lc)
                y[i, t0:t1, h] = _masked_rows(M * CB, u, precision) + din[:, None] * mm(C, Hc.T)
                states[i, h] = dch * Hc + mm((dout[:, None] * u).T, B)
    return (y, states, kept) if keep_chunk_states else (y, states)


def backward(p: Problem, L: int = 64, precision: str = "highest") -> dict[str, np.ndarray]:
    """The seven gradients (names as ssm_ref.scan.backward) by chunks of L tokens; ``precision``
    as :func:`forward`."""
    from .scan import scatter_rows

    _check(p, L, precision)
    mm = partial(matmul, precision=precision)
    d_ = p.dims
    chunks = _chunks(d_.T, L)
    _, _, kept = forward(p, L, True, precision)                   # (S, n_chunks, H, P, N)
    d_x = np.zeros_like(p.x)
    d_dt = np.zeros_like(p.dt)
    d_A = np.zeros((d_.H,), dtype=p.dtype)                         # (H,)
    d_B = np.zeros_like(p.B)
    d_C = np.zeros_like(p.C)
    d_s0 = np.zeros((d_.S, d_.H, d_.P, d_.N), dtype=p.dtype)
    for i in range(d_.S):
        Gs = p.g_states[i].copy()                                  # (H, P, N)
        for c in range(len(chunks) - 1, -1, -1):
            t0, t1 = chunks[c]
            for h in range(d_.H):
                g = h // (d_.H // d_.G)
                d, la, u, B, C = _chunk_inputs(p, i, t0, t1, h)
                M, din, dout, dch = chunk_tables(la)
                Hc, Gc = kept[i, c, h], Gs[h]                      # (P, N) each
                gy = p.g_y[i, t0:t1, h, :]                         # (Lc, P)
                CB = mm(C, B.T)                                    # (Lc, Lc)
                GU = mm(gy, u.T)                                   # (Lc, Lc)
                Gam = _masked_cols(M * CB, gy, precision) + dout[:, None] * mm(B, Gc.T)   # (Lc, P)
                d_x[i, t0:t1, h] = Gam * d[:, None]
                dBi = dout[:, None] * mm(u, Gc)                    # (Lc, N) boundary part
                dCi = din[:, None] * mm(gy, Hc)                    # (Lc, N)
                d_B[i, t0:t1, g] += _masked_cols(M * GU, C, precision) + dBi
                d_C[i, t0:t1, g] += _masked_rows(M * GU, B, precision) + dCi
                alpha = (C * dCi).sum(axis=1)                      # (Lc,) = din_r g_y_r . (H C_r)
                beta = (B * dBi).sum(axis=1)                       # (Lc,) = dout_s u_s . (G B_s)
                W = M * GU * CB                                    # (Lc, Lc), zero above the diagonal
                Lc = t1 - t0
                Q = np.array([W[t:, :t].sum() + alpha[t:].sum() + beta[:t].sum() for t in range(Lc)],
                             dtype=p.dtype) + dch * (Gc * Hc).sum()
                dd = (Gam * p.x[i, t0:t1, h]).sum(axis=1) + p.A[h, 0] * Q
                d_dt[i, t0:t1, h] = dd * softplus_grad(p.dt[i, t0:t1, h])
                d_A[h] += (d * Q).sum()
                Gs[h] = dch * Gc + mm((din[:, None] * gy).T, C)
        d_s0[i] = Gs
    d_A = d_A.reshape(d_.a_shape)
    return {"d_s": scatter_rows(d_s0, p.ids, d_.R), "d_s0": d_s0, "d_x": d_x, "d_dt": d_dt,
            "d_A": d_A, "d_B": d_B, "d_C": d_C}
