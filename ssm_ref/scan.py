"""The selective scan and its backward, written to read like docs/SPEC.md (sections 3, 4).

Glossary: N d_state · P head_dim · H n_head · G n_group · T tokens · S sequences · R cache rows.
Each function loops over tokens and is vectorised over (S, H, P, N) with numpy. Arrays keep the
docs/SPEC.md's names; a shape comment follows every line that makes an array.

Precision: every array and every operation is in ``p.dtype`` (float32 = the contract, float64 =
the oracle). Products are unfused and in the spec's order. numpy's sums over n (and over heads
and channels in the backward) are the reference order; other backends may reorder them.
"""

from __future__ import annotations

import numpy as np

from .checks import Problem

__all__ = ["backward", "backward_workspace", "forward", "forward_workspace", "scatter_rows", "softplus",
           "softplus_grad"]


def forward_workspace(d, dtype) -> int:
    """Bytes :func:`forward` needs besides its inputs and outputs: the running state and the
    per-token temporaries, about four (S, H, P, N) arrays."""
    return 4 * d.S * d.H * d.P * d.N * np.dtype(dtype).itemsize


def backward_workspace(d, dtype) -> int:
    """Bytes :func:`backward` needs besides its inputs and outputs: the T+1 recomputed states
    (T+1, S, H, P, N) and about six (S, H, P, N) temporaries of the walk back."""
    return (d.T + 1 + 6) * d.S * d.H * d.P * d.N * np.dtype(dtype).itemsize


def softplus(z: np.ndarray, form: str | None = "ggml") -> np.ndarray:
    """The step d from the raw dt, in z's dtype (docs/SPEC.md section 3, ``dt_softplus``):

    - ``"ggml"`` (the default): z if z > 20 else log(1 + exp(z)) -- deliberately not log1p: ggml's
      CPU and Vulkan kernels compute log(1+exp), which is exactly 0 below about z = -16.6 in float32;
    - ``"log1p"``: z if z > 20 else log1p(exp(z)), accurate down to where exp(z) underflows (PyTorch's
      ``F.softplus`` and mamba_ssm's kernels);
    - ``None``: z itself (dt is the step).
    """
    if form is None:
        return z
    one = z.dtype.type(1)
    small = np.minimum(z, z.dtype.type(20))  # keeps exp() finite on the branch we discard
    inner = np.log1p(np.exp(small)) if form == "log1p" else np.log(one + np.exp(small))
    return np.where(z > 20, z, inner)


def softplus_grad(z: np.ndarray, form: str | None = "ggml") -> np.ndarray:
    """d softplus / dz: sigmoid(z) = 1 / (1 + exp(-z)) on the log branch, 1 when z > 20 (the same
    for ``"ggml"`` and ``"log1p"``: the derivative of the formula, not of its rounding); 1
    everywhere for ``form=None``."""
    one = z.dtype.type(1)
    if form is None:
        return np.ones_like(z)
    return np.where(z > 20, one, one / (one + np.exp(-z)))


def _per_head(p: Problem, v: np.ndarray) -> np.ndarray:
    """(S, G, N) -> (S, H, N): head h reads group h // (H // G)."""
    return v[:, p.dims.group_of_head(), :]


def _decay(p: Problem, d: np.ndarray) -> np.ndarray:
    """a = exp(d * A): (S, H, 1, 1) for Mamba-2, (S, H, 1, N) for Mamba-1."""
    A = p.A  # (H, 1) or (H, N)
    return np.exp(d[:, :, None, None] * A[None, :, None, :])


def forward(p: Problem, dt_softplus: str | None = "ggml") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The forward scan. Returns y (S, T, H, P), states (S, H, P, N) and the K = ``p.dims.K``
    snapshots (K, S, H, P, N): slot k is the state after T - k tokens (slot 0 equals states, slot
    T the start state), slots k > T are NaN (there is no such state). ``dt_softplus``: the form of
    :func:`softplus` (checked by the caller: ssm_ref.checks.check_dt_softplus)."""
    dm = p.dims
    S, T, H, P, N, K = dm.S, dm.T, dm.H, dm.P, dm.N, dm.K
    with np.errstate(over="ignore", invalid="ignore"):  # inf/nan follow docs/SPEC.md section 8
        st = p.s[p.ids].copy()                                # (S, H, P, N)
        y = np.empty((S, T, H, P), dtype=p.dtype)             # (S, T, H, P)
        snaps = np.full((K, S, H, P, N), np.nan, dtype=p.dtype)  # (K, S, H, P, N)
        if T < K:
            snaps[T] = st                                     # slot T: the start state
        for t in range(T):
            d = softplus(p.dt[:, t], dt_softplus)             # (S, H)
            a = _decay(p, d)                                  # (S, H, 1, 1|N)
            u = p.x[:, t] * d[:, :, None]                     # (S, H, P)
            Bt = _per_head(p, p.B[:, t])                      # (S, H, N)
            Ct = _per_head(p, p.C[:, t])                      # (S, H, N)
            st = st * a + Bt[:, :, None, :] * u[..., None]    # (S, H, P, N)
            y[:, t] = np.sum(st * Ct[:, :, None, :], axis=-1)  # (S, H, P)
            if T - 1 - t < K:
                snaps[T - 1 - t] = st                         # the state after t + 1 tokens
    return y, st, snaps


def _group_sum(p: Problem, v: np.ndarray) -> np.ndarray:
    """(S, H, P, N) -> (S, G, N): sum over the H/G heads of each group and over channels p."""
    dm = p.dims
    v = v.reshape(dm.S, dm.G, dm.heads_per_group, dm.P, dm.N)  # (S, G, H/G, P, N)
    return v.sum(axis=(2, 3))                                   # (S, G, N)


def scatter_rows(d_s0: np.ndarray, ids: np.ndarray, R: int) -> np.ndarray:
    """d_s (R, H, P, N): row ids[i] receives d_s0[i], in order i = 0..S-1 (duplicate ids add,
    rows no sequence reads stay 0). Deterministic; every backend uses this."""
    d_s = np.zeros((R, *d_s0.shape[1:]), dtype=d_s0.dtype)  # (R, H, P, N)
    with np.errstate(invalid="ignore", over="ignore"):      # inf + -inf is nan, silently
        np.add.at(d_s, ids, d_s0)
    return d_s


def backward(p: Problem, dt_softplus: str | None = "ggml") -> dict[str, np.ndarray]:
    """The backward scan. Returns the gradients d_s, d_s0, d_x, d_dt, d_A (shape of A as
    given), d_B, d_C for the loss sum(y * g_y) + sum(states * g_states) + sum(snapshots *
    g_snapshots) (the last when ``p.g_snapshots`` is given: slot k adds to the gradient of the
    state after T - k tokens; slots k > T are constants and add nothing). ``dt_softplus`` as in
    :func:`forward`."""
    dm = p.dims
    S, T, H, P, N, G, K = dm.S, dm.T, dm.H, dm.P, dm.N, dm.G, dm.K
    g_snap = p.g_snapshots                                    # (K, S, H, P, N) or None
    d_x = np.zeros((S, T, H, P), dtype=p.dtype)
    d_dt = np.zeros((S, T, H), dtype=p.dtype)
    d_A = np.zeros(p.A.shape, dtype=p.dtype)                  # (H, 1|N)
    d_B = np.zeros((S, T, G, N), dtype=p.dtype)
    d_C = np.zeros((S, T, G, N), dtype=p.dtype)

    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        # Recompute the forward states: sts[t + 1] is the state after token t, sts[0] the start.
        sts = np.empty((T + 1, S, H, P, N), dtype=p.dtype)    # (T+1, S, H, P, N)
        sts[0] = p.s[p.ids]
        for t in range(T):
            d = softplus(p.dt[:, t], dt_softplus)             # (S, H)
            u = p.x[:, t] * d[:, :, None]                     # (S, H, P)
            Bt = _per_head(p, p.B[:, t])                      # (S, H, N)
            sts[t + 1] = sts[t] * _decay(p, d) + Bt[:, :, None, :] * u[..., None]

        # Walk back. carry = a_{t+1} * lam_{t+1} (g_states before the last token).
        carry = p.g_states.copy()                             # (S, H, P, N)
        if g_snap is not None:
            carry = carry + g_snap[0]                         # slot 0 is the final state too
        for t in reversed(range(T)):
            if g_snap is not None and 0 < T - 1 - t < K:
                carry = carry + g_snap[T - 1 - t]             # the snapshot of the state after t + 1 tokens
            d = softplus(p.dt[:, t], dt_softplus)             # (S, H)
            a = _decay(p, d)                                  # (S, H, 1, 1|N)
            u = p.x[:, t] * d[:, :, None]                     # (S, H, P)
            Bt = _per_head(p, p.B[:, t])                      # (S, H, N)
            Ct = _per_head(p, p.C[:, t])                      # (S, H, N)
            gy = p.g_y[:, t]                                  # (S, H, P)
            st, st_prev = sts[t + 1], sts[t]                  # (S, H, P, N) each

            lam = carry + gy[..., None] * Ct[:, :, None, :]   # (S, H, P, N)
            d_C[:, t] = _group_sum(p, gy[..., None] * st)     # (S, G, N)
            d_B[:, t] = _group_sum(p, lam * u[..., None])     # (S, G, N)
            gamma = np.sum(lam * Bt[:, :, None, :], axis=-1)  # (S, H, P)
            d_x[:, t] = gamma * d[:, :, None]                 # (S, H, P)
            q = lam * st_prev * a                             # (S, H, P, N)
            dd = gamma * p.x[:, t] + np.sum(q * p.A[None, :, None, :], axis=-1)  # (S, H, P)
            d_dt[:, t] = np.sum(dd * softplus_grad(p.dt[:, t], dt_softplus)[:, :, None], axis=-1)  # (S, H)
            # dA: summed over sequences, channels and tokens; Mamba-2 also over n.
            dA_t = np.sum(q * d[:, :, None, None], axis=(0, 2))                  # (H, N)
            d_A += dA_t if dm.mamba1 else np.sum(dA_t, axis=-1, keepdims=True)
            carry = a * lam                                   # (S, H, P, N)

        d_s0 = carry                                          # (S, H, P, N): a_0 * lam_0
        if g_snap is not None and 0 < T < K:
            d_s0 = d_s0 + g_snap[T]                           # slot T is the start state
    return {
        "d_s": scatter_rows(d_s0, p.ids, dm.R),
        "d_s0": d_s0,
        "d_x": d_x,
        "d_dt": d_dt,
        "d_A": d_A.reshape(dm.a_shape),
        "d_B": d_B,
        "d_C": d_C,
    }
