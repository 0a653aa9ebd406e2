"""Drop-ins for mamba_ssm's Mamba-3 functions, with its signatures and semantics, on ssm-scan's CPU
backends (docs/TORCH.md has the argument mapping):

- :func:`mamba3_siso_combined` -- the SISO scan (``mamba_ssm.ops.triton.mamba3.mamba3_siso_combined``);
- :func:`mamba3_mimo` -- the MIMO scan (``mamba_ssm.ops.tilelang.mamba3.mamba3_mimo``);
- :func:`mamba3_siso_step` -- one SISO decoding step (``mamba_ssm.ops.triton.mamba3.mamba3_siso_step``);
(the layer, ``Mamba3``, is in ssm_torch/mamba3_layer.py; ssm_torch.mamba3 presents both).

The recurrence is ``ssm_torch.mamba3_scan``; everything mamba_ssm's kernels compute around it is
torch code here, which autograd differentiates as written: the angle increment
``pi * tanh(Angles) * DT``, ``sigmoid(Trap)``, the layouts ((b, h, l) to (b, l, h)), the D skip
(``D * v`` per rank), the ``silu(Z)`` gate (MIMO: ``silu(Z * MIMO_Z)`` per rank), MIMO's fused
head-wise RMSNorm and its ``MIMO_Out`` sum over ranks. ``cu_seqlens`` packs sequences along the
tokens of batch row 0; each becomes a sequence of the scan (S = num_sequences), the shorter ones
padded at their end with tokens that leave all four states as they are (step 0, decay 1, no
rotation, the last token's key and value repeated), so the final states are each sequence's own.

Each function takes an extra keyword, ``backend`` (None: ssm_fast where it computes the op, else
ssm_ref). ``chunk_size`` (and MIMO's ``dtype``) are accepted and change nothing: the backends scan
token by token in float32 (float64 on ssm_ref when every float input is float64).

Glossary (mamba_ssm's names): batch b, seqlen l, nheads_qk (groups G), nheads H, headdim_qk
(state size N), headdim_v (P), headdim_angles (rotated pairs F), mimo_rank (R, the op's M).
"""

from __future__ import annotations

import itertools
import math

import torch

from . import _mamba3_op
from . import mamba3_scan as _scan
from ._bridge import work_dtype
from ._common import tensor_arg as _tensor
from ._gate import gate as _gate

__all__ = ["mamba3_mimo", "mamba3_siso_combined", "mamba3_siso_step"]


def _backend(backend):
    from ssm_ref.backend_names import resolve_backend

    return _mamba3_op.default_backend() if backend is None else resolve_backend(backend)


def _expect(name: str, t, shape: tuple, text: str) -> None:
    if t is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {text} = {tuple(shape)}, got {tuple(t.shape)}")


def _cu(cu_seqlens, batch: int, L: int) -> list | None:
    """cu_seqlens as a list of offsets (num_sequences + 1), checked; None when not given."""
    if cu_seqlens is None:
        return None
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype.is_floating_point or cu_seqlens.dim() != 1:
        raise TypeError("cu_seqlens: expected a 1-D integer tensor (num_sequences + 1,)")
    if batch != 1:
        raise ValueError(f"cu_seqlens: expected batch 1 (the sequences packed along seqlen), got batch {batch}")
    cu = cu_seqlens.detach().cpu().to(torch.int64)
    if cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != L or bool((cu.diff() <= 0).any()):
        raise ValueError(f"cu_seqlens: expected increasing offsets from 0 to seqlen = {L} (no empty sequence), "
                         f"got {cu.tolist()}")
    return cu.tolist()


def _angle_steps(Angles, dt):
    """mamba_ssm's angle increment: pi * tanh(Angles) * DT, (b, l, H, F) from dt (b, l, H)."""
    return math.pi * torch.tanh(Angles) * dt.unsqueeze(-1)


class _Packing:
    """The sequences of ``cu`` (offsets along the tokens of batch row 0) as the rows of the scan:
    ``edge(t)`` gathers a per-token tensor (1, L, ...) into (n, Lmax, ...) repeating each
    sequence's last token into its padding (keys and values: the k and v states stay), ``zero(t)``
    pads with zeros (steps, decays, angles: the h and theta states stay), ``unpack(y)`` puts the
    rows' tokens back in place (1, L, ...), ``last(t)`` is each sequence's last token (n, ...)."""

    def __init__(self, cu: list):
        self.n = len(cu) - 1
        self.L = cu[-1]
        lengths = [b - a for a, b in itertools.pairwise(cu)]
        self.Lmax = max(lengths)
        pos = torch.arange(self.Lmax)
        starts, lens = torch.tensor(cu[:-1]), torch.tensor(lengths)
        inside = pos[None, :] < lens[:, None]                                   # (n, Lmax)
        self.edge_idx = starts[:, None] + torch.minimum(pos[None, :], lens[:, None] - 1)
        self.zero_idx = torch.where(inside, starts[:, None] + pos[None, :], torch.full_like(inside, self.L,
                                                                                          dtype=torch.int64))
        self.scatter = (torch.arange(self.n)[:, None] * self.Lmax + pos[None, :])[inside]   # (L,) in token order
        self.last_idx = torch.tensor(cu[1:]) - 1

    def edge(self, t):
        return t[0][self.edge_idx]

    def zero(self, t):
        flat = torch.cat([t[0], t.new_zeros((1, *t.shape[2:]))])
        return flat[self.zero_idx]

    def unpack(self, y):
        return y.reshape(self.n * self.Lmax, *y.shape[2:])[self.scatter][None]

    def last(self, t):
        return t[0][self.last_idx]


def _run(values: tuple, steps: tuple, params: tuple, states, cu, rotation: str, backend: str):
    """The scan on (x, B, C) ``values`` and (dt, dA, lam, dtheta) ``steps``, all (b, l, ...), with
    ``params`` (B_bias, C_bias, psi) and ``states`` (4 parts, one row per sequence) or None; packed
    along row 0 by ``cu`` when given. Returns (y (b, l, ...), theta, h, k, v)."""
    if cu is None:   # (contiguous once here: B, C, x split from one projection are strided)
        x, B, C = (t.contiguous() for t in values)
        dt, dA, lam, dth = (t.contiguous() for t in steps)
        return _scan(x, dt, dA, lam, B, C, *params[:2], dth, params[2], *(states or (None,) * 4),
                     rotation=rotation, backend=backend)
    pk = _Packing(cu)
    x, B, C = (pk.edge(t) for t in values)
    dt, dA, lam, dth = (pk.zero(t) for t in steps)
    y, *finals = _scan(x, dt, dA, lam, B, C, *params[:2], dth, params[2], *(states or (None,) * 4),
                       rotation=rotation, backend=backend)
    return (pk.unpack(y), *finals)


def _states(name: str, states, shapes: list, work):
    """Input_States: None, or a tuple of the four parts (angle, ssm, k, v) of ``shapes``, in ``work``."""
    if states is None:
        return None
    if not isinstance(states, (tuple, list)) or len(states) != 4:
        raise TypeError(f"{name}: expected a tuple (Angle_State, SSM_State, K_State, V_State) or None")
    parts = [_tensor(f"{name}[{i}]", t, optional=True) for i, t in enumerate(states)]
    if any(t is None for t in parts):
        raise ValueError(f"{name}: the four states must be given together (or Input_States=None)")
    for i, (t, (shape, text)) in enumerate(zip(parts, shapes, strict=True)):
        _expect(f"{name}[{i}]", t, shape, text)
    return tuple(t.to(work) for t in parts)


# ---------------------------------------------------------------------------------------------
# SISO


def mamba3_siso_combined(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None, Input_States=None,
                         chunk_size=64, return_final_states=False, cu_seqlens=None, *, backend=None):
    """mamba_ssm's Mamba-3 SISO scan.

    Q, K (batch, seqlen, nheads_qk, headdim_qk); V (batch, seqlen, nheads, headdim_v); ADT, DT,
    Trap (batch, nheads, seqlen) (Trap before its sigmoid); Q_bias, K_bias (nheads, headdim_qk);
    Angles (batch, seqlen, nheads, headdim_angles), headdim_angles <= headdim_qk / 2, rotating the
    pairs (2j, 2j+1); D (nheads,); Z like V; Input_States (Angle (n, nheads, headdim_angles), SSM
    (n, nheads, headdim_v, headdim_qk), K (n, nheads, headdim_qk), V (n, nheads, headdim_v)) or
    None, n = num_sequences (batch, or len(cu_seqlens) - 1); cu_seqlens (num_sequences + 1,)
    offsets along seqlen (batch 1). Returns out (batch, seqlen, nheads, headdim_v) in V's dtype;
    with ``return_final_states`` the tuple (out, angle, ssm, k, v) of the final states (n, ...)
    in the working dtype, the angle reduced mod 2 pi. Differentiable in every tensor, through every
    output (mamba_ssm's too). Raises TypeError / ValueError naming the argument.
    """
    Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles = (
        _tensor(n, t) for n, t in zip(("Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias", "Angles"),
                                      (Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles), strict=True))
    D, Z = _tensor("D", D, True), _tensor("Z", Z, True)
    if V.dim() != 4:
        raise ValueError(f"V: expected shape (batch, seqlen, nheads, headdim_v), got {tuple(V.shape)}")
    b, L, H, P = V.shape
    if Q.dim() != 4 or tuple(Q.shape[:2]) != (b, L) or Q.shape[2] < 1 or H % Q.shape[2]:
        raise ValueError(f"Q: expected shape (batch, seqlen, nheads_qk, headdim_qk) with nheads % nheads_qk == 0 "
                         f"(batch, seqlen, nheads = {b}, {L}, {H}), got {tuple(Q.shape)}")
    N = Q.shape[3]
    _expect("K", K, Q.shape, "Q's")
    for name, t in (("ADT", ADT), ("DT", DT), ("Trap", Trap)):
        _expect(name, t, (b, H, L), "(batch, nheads, seqlen)")
    _expect("Q_bias", Q_bias, (H, N), "(nheads, headdim_qk)")
    _expect("K_bias", K_bias, (H, N), "(nheads, headdim_qk)")
    if Angles.dim() != 4 or tuple(Angles.shape[:3]) != (b, L, H):
        raise ValueError(f"Angles: expected shape (batch, seqlen, nheads, headdim_angles) = ({b}, {L}, {H}, F), "
                         f"got {tuple(Angles.shape)}")
    F = Angles.shape[3]
    _expect("D", D, (H,), "(nheads,)")
    _expect("Z", Z, V.shape, "V's")
    cu = _cu(cu_seqlens, b, L)
    n = b if cu is None else len(cu) - 1
    be = _backend(backend)
    work = work_dtype(be, (Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z))
    states = _states("Input_States", Input_States,
                     [((n, H, F), "(num_sequences, nheads, headdim_angles)"),
                      ((n, H, P, N), "(num_sequences, nheads, headdim_v, headdim_qk)"),
                      ((n, H, N), "(num_sequences, nheads, headdim_qk)"),
                      ((n, H, P), "(num_sequences, nheads, headdim_v)")], work)

    x = V.to(work)
    dt = DT.to(work).transpose(1, 2)                                          # (b, l, H)
    steps = (dt, ADT.to(work).transpose(1, 2), torch.sigmoid(Trap.to(work)).transpose(1, 2),
             _angle_steps(Angles.to(work), dt))
    y, theta, h, k, v = _run((x, K.to(work), Q.to(work)), steps, (K_bias.to(work), Q_bias.to(work), None), states,
                             cu, "interleaved", be)
    out = _gate(y, x, None if D is None else D.to(work)[:, None], None if Z is None else Z.to(work)).to(V.dtype)
    return (out, theta, h, k, v) if return_final_states else out


def mamba3_siso_step(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None, Input_States=None, *,
                     backend=None):
    """mamba_ssm's Mamba-3 SISO decoding step: one token, nothing written in place.

    Q, K (batch, nheads_qk, headdim_qk); V (batch, nheads, headdim_v); ADT, DT, Trap (batch,
    nheads); Q_bias, K_bias (nheads, headdim_qk); Angles (batch, nheads, headdim_angles); D
    (nheads,); Z like V; Input_States (Angle (batch, nheads, headdim_angles), SSM (batch, nheads,
    headdim_v, headdim_qk), K (batch, nheads, headdim_qk), V (batch, nheads, headdim_v)), or None
    for zeros. Returns (Out (batch, nheads, headdim_v), [Angle, SSM, K, V]): the new states, V
    the token's V itself, as mamba_ssm's.
    """
    V, ADT, DT, Trap, Q, K, Angles = (_tensor(n, t) for n, t in zip(("V", "ADT", "DT", "Trap", "Q", "K", "Angles"),
                                                                       (V, ADT, DT, Trap, Q, K, Angles), strict=True))
    if V.dim() != 3:
        raise ValueError(f"V: expected shape (batch, nheads, headdim_v), got {tuple(V.shape)}")
    for name, t in (("ADT", ADT), ("DT", DT), ("Trap", Trap)):
        _expect(name, t, V.shape[:2], "(batch, nheads)")
    for name, t in (("Q", Q), ("K", K), ("Angles", Angles)):
        if t.dim() != 3:
            raise ValueError(f"{name}: expected 3 axes (batch, heads, dim), got shape {tuple(t.shape)}")
    Z = _tensor("Z", Z, True)
    out, angle, ssm, k, _ = mamba3_siso_combined(
        Q[:, None], K[:, None], V[:, None], ADT[..., None], DT[..., None], Trap[..., None], Q_bias, K_bias,
        Angles[:, None], D, None if Z is None else Z[:, None], Input_States, return_final_states=True,
        backend=backend)
    return out[:, 0], [angle, ssm, k, V]


# ---------------------------------------------------------------------------------------------
# MIMO


def mamba3_mimo(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z, chunk_size,
                rotary_dim_divisor, dtype, return_state=False, cu_seqlens=None, fuse_pregate_headwise_rms_norm=False,
                outproj_norm_weight=None, outproj_norm_eps=1e-5, *, Input_States=None, backend=None):
    """mamba_ssm's Mamba-3 MIMO scan.

    Q, K (batch, seqlen, mimo_rank, nheads_qk, headdim_qk); V (batch, seqlen, nheads, headdim_v);
    ADT, DT, Trap (batch, nheads, seqlen) (Trap before its sigmoid); Q_bias, K_bias (nheads,
    mimo_rank, headdim_qk); MIMO_V (nheads, mimo_rank, headdim_v), V's up-projection per rank;
    MIMO_Z like it (read when Z is given); MIMO_Out like it, or None; Angles (batch, seqlen,
    nheads, headdim_qk // rotary_dim_divisor) rotating the pairs (j, j + headdim_qk / 2);
    rotary_dim_divisor 2 or 4; D (nheads,) or None; Z like V or None. Per rank r:
    o_r = y_r + D * v_r (v_r = MIMO_V[:, r] * V), then ``fuse_pregate_headwise_rms_norm``:
    o_r = rmsnorm(o_r) * outproj_norm_weight * silu(Z * MIMO_Z[:, r]) (over headdim_v, per head;
    weight (nheads, headdim_v), flattened, or None), else o_r * silu(Z * MIMO_Z[:, r]) when Z is
    given; out = sum_r MIMO_Out[:, r] * o_r (batch, seqlen, nheads, headdim_v), or with
    MIMO_Out None the ranks (batch, seqlen, mimo_rank, nheads, headdim_v). In V's dtype
    (``dtype`` and ``chunk_size`` change nothing). ``return_state``: (out, angle (n, nheads,
    headdim_angles), ssm (n, nheads, headdim_v, headdim_qk), k (n, mimo_rank, nheads,
    headdim_qk), v (n, nheads, headdim_v): each sequence's last V), n = num_sequences; unlike
    mamba_ssm's, differentiable, and per sequence with cu_seqlens.

    ``Input_States`` (keyword only; mamba_ssm's function has no start state, its layer's decoding
    step has): None, or the four start states in the layouts ``return_state`` gives them (angle,
    ssm, k (n, mimo_rank, nheads, headdim_qk), v (n, nheads, headdim_v) the last V, before MIMO_V).
    """
    names = ("Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias", "MIMO_V", "Angles")
    Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, Angles = (
        _tensor(n, t) for n, t in zip(names, (Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, Angles), strict=True))
    MIMO_Z, MIMO_Out, D, Z, w = (_tensor(n, t, True) for n, t in (
        ("MIMO_Z", MIMO_Z), ("MIMO_Out", MIMO_Out), ("D", D), ("Z", Z), ("outproj_norm_weight", outproj_norm_weight)))
    if V.dim() != 4:
        raise ValueError(f"V: expected shape (batch, seqlen, nheads, headdim_v), got {tuple(V.shape)}")
    b, L, H, P = V.shape
    if Q.dim() != 5 or tuple(Q.shape[:2]) != (b, L) or Q.shape[3] < 1 or H % Q.shape[3]:
        raise ValueError(f"Q: expected shape (batch, seqlen, mimo_rank, nheads_qk, headdim_qk) with nheads % "
                         f"nheads_qk == 0 (batch, seqlen, nheads = {b}, {L}, {H}), got {tuple(Q.shape)}")
    R, N = Q.shape[2], Q.shape[4]
    _expect("K", K, Q.shape, "Q's")
    for name, t in (("ADT", ADT), ("DT", DT), ("Trap", Trap)):
        _expect(name, t, (b, H, L), "(batch, nheads, seqlen)")
    for name, t in (("Q_bias", Q_bias), ("K_bias", K_bias)):
        _expect(name, t, (H, R, N), "(nheads, mimo_rank, headdim_qk)")
    for name, t in (("MIMO_V", MIMO_V), ("MIMO_Out", MIMO_Out), ("MIMO_Z", MIMO_Z if Z is not None else None)):
        _expect(name, t, (H, R, P), "(nheads, mimo_rank, headdim_v)")
    if isinstance(rotary_dim_divisor, bool) or rotary_dim_divisor not in (2, 4):
        raise ValueError(f"rotary_dim_divisor: expected 2 or 4, got {rotary_dim_divisor!r}")
    _expect("Angles", Angles, (b, L, H, N // rotary_dim_divisor),
            "(batch, seqlen, nheads, headdim_qk // rotary_dim_divisor)")
    _expect("D", D, (H,), "(nheads,)")
    _expect("Z", Z, V.shape, "V's")
    if Z is not None and MIMO_Z is None:
        raise ValueError("MIMO_Z: Z is given, so MIMO_Z (nheads, mimo_rank, headdim_v) must be too")
    if fuse_pregate_headwise_rms_norm:
        if Z is None or MIMO_Out is None:
            raise ValueError("fuse_pregate_headwise_rms_norm: needs Z, MIMO_Z and MIMO_Out")
        if w is not None and tuple(w.shape) not in ((H, P), (H * P,)):
            raise ValueError(f"outproj_norm_weight: expected shape (nheads, headdim_v) = ({H}, {P}) or "
                             f"({H * P},), got {tuple(w.shape)}")
    cu = _cu(cu_seqlens, b, L)
    be = _backend(backend)
    work = work_dtype(be, (Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z, w))

    n, F = (b if cu is None else len(cu) - 1), Angles.shape[3]
    x, psi = V.to(work), MIMO_V.to(work)
    states = _states("Input_States", Input_States,
                     [((n, H, F), "(num_sequences, nheads, headdim_angles)"),
                      ((n, H, P, N), "(num_sequences, nheads, headdim_v, headdim_qk)"),
                      ((n, R, H, N), "(num_sequences, mimo_rank, nheads, headdim_qk)"),
                      ((n, H, P), "(num_sequences, nheads, headdim_v)")], work)
    if states is not None:   # the op's layouts: k (n, H, R, N), v after MIMO_V (n, H, R, P)
        states = (*states[:2], states[2].transpose(1, 2), states[3][:, :, None] * psi)
    dt = DT.to(work).transpose(1, 2)
    steps = (dt, ADT.to(work).transpose(1, 2), torch.sigmoid(Trap.to(work)).transpose(1, 2),
             _angle_steps(Angles.to(work), dt))
    y, theta, h, k, _ = _run((x, K.to(work), Q.to(work)), steps, (K_bias.to(work), Q_bias.to(work), psi), states,
                             cu, "halved", be)
    o = mimo_out(y, x, psi, None if D is None else D.to(work), None if Z is None else Z.to(work),
                 None if MIMO_Z is None else MIMO_Z.to(work), None if MIMO_Out is None else MIMO_Out.to(work),
                 (None if w is None else w.to(work).reshape(H, P), outproj_norm_eps)
                 if fuse_pregate_headwise_rms_norm else None).to(V.dtype)
    if not return_state:
        return o
    v_last = V[:, -1] if cu is None else _Packing(cu).last(V)
    return o, theta, h, k.transpose(1, 2), v_last


def mimo_out(y, x, psi, D, Z, MIMO_Z, MIMO_Out, norm=None):
    """MIMO's output around the scan's per-rank y (b, l, R, H, P): the D skip on each rank's value
    (psi (H, R, P) times x (b, l, H, P)), the gate silu(Z * MIMO_Z[:, r]) -- after a head-wise
    RMSNorm when ``norm`` = (weight (H, P) or None, eps) --, and the sum over ranks with MIMO_Out
    (None: the ranks are returned)."""
    psi_r = psi.transpose(0, 1)                                                 # (R, H, P)
    o = y if D is None else y + (D[:, None] * psi_r) * x[:, :, None]
    if norm is not None:
        weight, eps = norm
        o = o * torch.rsqrt(o.square().mean(dim=-1, keepdim=True) + eps)
        if weight is not None:
            o = o * weight
    if Z is not None:
        o = o * torch.nn.functional.silu(Z[:, :, None] * MIMO_Z.transpose(0, 1))
    if MIMO_Out is None:
        return o
    return torch.einsum("blrhp,hrp->blhp", o, MIMO_Out)

