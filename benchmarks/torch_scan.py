"""PyTorch CPU implementation of the selective scan, for benchmarks only (autograd gives the
backward). Written from docs/SPEC.md (sections 3, 4), float32 throughout.

* Mamba-2: the chunked "state-space duality" algorithm with blocks of Q = 64 tokens. Inside a
  block, y is an attention-like product: y_intra[q] = sum_{r<=q} (C_q . B_r) exp(L_q - L_r) u_r,
  with L the running sum of d*A inside the block; across blocks the state is carried:
  h_next = exp(L_last) h + sum_r exp(L_last - L_r) B_r u_r^T, and y_off[q] = exp(L_q) C_q . h.
* Mamba-1: every decay exp(d * A) and every B*u at once, then a loop over tokens for the
  recurrence and one product with C.

Glossary: N d_state, P head_dim, H n_head, G n_group, T tokens, S sequences.
"""

from __future__ import annotations

import torch

BLOCK = 64


def softplus(z: torch.Tensor) -> torch.Tensor:
    """The softplus of docs/SPEC.md (section 3): z above 20, else log(1 + exp(z)) (not log1p)."""
    return torch.where(z > 20, z, torch.log(1 + torch.exp(torch.clamp(z, max=20.0))))


def _per_head(v: torch.Tensor, H: int) -> torch.Tensor:
    """(..., G, N) -> (..., H, N): head h reads group h // (H // G)."""
    G = v.shape[-2]
    return v.repeat_interleave(H // G, dim=-2)


def scan_mamba2(s0, x, dt, A, B, C):
    """s0 (S,H,P,N) initial states (already gathered by ids), x (S,T,H,P), dt (S,T,H), A (H,),
    B/C (S,T,G,N); T must be a multiple of BLOCK or smaller than it. Returns y, final states."""
    S, T, H, P = x.shape
    N = s0.shape[-1]
    Q = min(BLOCK, T)
    nc = T // Q
    assert nc * Q == T, "T must be a multiple of the block"
    d = softplus(dt)                                          # (S,T,H)
    u = x * d[..., None]                                      # (S,T,H,P)
    la = (d * A).reshape(S, nc, Q, H)                         # log decay per token
    L = torch.cumsum(la, dim=2)                               # (S,nc,Q,H)
    Bh = _per_head(B, H).reshape(S, nc, Q, H, N)
    Ch = _per_head(C, H).reshape(S, nc, Q, H, N)
    uc = u.reshape(S, nc, Q, H, P)
    # intra-block: masked decay matrix exp(L_q - L_r) for r <= q
    Lh = L.permute(0, 1, 3, 2)                                # (S,nc,H,Q)
    diff = Lh[..., :, None] - Lh[..., None, :]                # (S,nc,H,Q,Q)
    causal = torch.ones(Q, Q, dtype=torch.bool).tril()
    decay = torch.exp(diff.masked_fill(~causal, float("-inf")))
    CB = torch.einsum("scqhn,scrhn->schqr", Ch, Bh)           # (S,nc,H,Q,Q)
    y = torch.einsum("schqr,scrhp->scqhp", CB * decay, uc)    # (S,nc,Q,H,P)
    # block-local end states and the carried state
    to_end = torch.exp(L[:, :, -1:, :] - L)                   # (S,nc,Q,H)
    local = torch.einsum("scrhn,scrh,scrhp->schpn", Bh, to_end, uc)   # (S,nc,H,P,N)
    block_decay = torch.exp(L[:, :, -1, :])                   # (S,nc,H)
    h = s0
    starts = []
    for c in range(nc):
        starts.append(h)
        h = block_decay[:, c, :, None, None] * h + local[:, c]
    h_start = torch.stack(starts, dim=1)                      # (S,nc,H,P,N)
    y_off = torch.einsum("scqhn,schpn->scqhp", Ch, h_start) * torch.exp(L)[..., None]
    return (y + y_off).reshape(S, T, H, P), h


def scan_mamba1(s0, x, dt, A, B, C):
    """As :func:`scan_mamba2` with A (H,N); a loop over tokens for the recurrence."""
    T, H = x.shape[1], x.shape[2]
    d = softplus(dt)                                          # (S,T,H)
    a = torch.exp(d[..., None] * A)                           # (S,T,H,N)
    Bu = _per_head(B, H)[:, :, :, None, :] * (x * d[..., None])[..., None]   # (S,T,H,P,N)
    # unbind once: indexing a[:, t] inside the loop would make autograd scatter every token's
    # gradient into a zero tensor of the full (S,T,H,P,N) shape
    a_t = a[:, :, :, None, :].unbind(1)
    Bu_t = Bu.unbind(1)
    h = s0
    hs = []
    for t in range(T):
        h = a_t[t] * h + Bu_t[t]
        hs.append(h)
    st = torch.stack(hs, dim=1)                               # (S,T,H,P,N)
    y = torch.einsum("sthpn,sthn->sthp", st, _per_head(C, H))
    return y, h


def scan(s, x, dt, A, B, C, ids):
    """Forward on torch tensors; A (H,) is Mamba-2, (H, N) Mamba-1."""
    s0 = s[ids]
    if A.dim() == 1:
        return scan_mamba2(s0, x, dt, A, B, C)
    return scan_mamba1(s0, x, dt, A, B, C)
