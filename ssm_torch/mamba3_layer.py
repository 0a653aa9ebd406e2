"""The Mamba-3 layer as mamba_ssm has it (``mamba_ssm.modules.mamba3.Mamba3``), on ssm-scan's CPU
backends: the same constructor arguments, parameter names and shapes (a mamba_ssm state dict
loads with ``load_state_dict``), ``forward(u, seq_idx=None, cu_seqlens=None,
inference_params=None)``, the decoding ``step`` and the inference cache. The scan is
ssm_torch.mamba3's drop-ins (:func:`mamba3_siso_combined`, :func:`mamba3_mimo`); everything around
it -- in_proj and its split, softplus(dd_dt + dt_bias), A's heavy-tail activation and floor, the
B and C RMSNorms, the output norm, out_proj -- is torch code written from mamba_ssm's layer.

Also :class:`RMSNormGated`, mamba_ssm's gated RMSNorm (``mamba_ssm.ops.triton.layernorm_gated.RMSNorm``)
with its parameter names: ``weight``, no bias.

Glossary: b batch, l seqlen, H nheads, P headdim, N d_state, G ngroups, R mimo_rank, F rotated
pairs (num_rope_angles).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's and mamba_ssm's name)
from torch import nn

from ._mamba3_dropins import mamba3_mimo, mamba3_siso_combined, mamba3_siso_step

__all__ = ["Mamba3", "RMSNormGated", "heavy_tail_activation"]


def heavy_tail_activation(x):
    """1 + x for x >= 0, 1 / (1 - x) below: positive, continuous, with a continuous derivative
    (mamba_ssm's activation of the data-dependent A)."""
    return x.clamp_min(0) + torch.reciprocal(1 - x.clamp_max(0))


def _wide(t):
    """``t`` in float32 at least (float64 stays float64): mamba_ssm's ``.float()`` casts, which
    must not narrow a float64 layer."""
    return t if t.dtype == torch.float64 else t.float()


class RMSNormGated(nn.Module):
    """RMSNorm with an optional silu gate, mamba_ssm's ``layernorm_gated.RMSNorm``:
    ``forward(x, z=None)`` is ``rmsnorm(x) * weight * silu(z)`` (norm_before_gate) or
    ``rmsnorm(x * silu(z)) * weight``, the mean over groups of ``group_size`` channels of the last
    axis (None: all of it), computed in float32 at least, returned in x's dtype."""

    def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=True, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate

    def reset_parameters(self):
        nn.init.ones_(self.weight)

    def forward(self, x, z=None):
        dtype = x.dtype
        x = _wide(x)
        if z is not None:
            z = _wide(z)
            if not self.norm_before_gate:
                x = x * F.silu(z)
        g = x.shape[-1] if self.group_size is None else self.group_size
        xg = x.unflatten(-1, (x.shape[-1] // g, g))
        out = (xg * torch.rsqrt(xg.square().mean(dim=-1, keepdim=True) + self.eps)).flatten(-2) * _wide(self.weight)
        if z is not None and self.norm_before_gate:
            out = out * F.silu(z)
        return out.to(dtype)


class Mamba3(nn.Module):
    """mamba_ssm's Mamba-3 layer. The constructor's arguments are mamba_ssm's (``chunk_size``,
    ``dropout``, ``n_layer`` and unknown keywords accepted and unused), plus ``backend`` (None:
    ssm_fast where it computes Mamba-3's scan, else ssm_ref). Parameters: in_proj.weight, dt_bias
    (H,), B_bias and C_bias (H, R, N), B_norm.weight and C_norm.weight (N,), mimo_x, mimo_z,
    mimo_o (H, R, P) with is_mimo, D (H,), norm.weight (H*P,) with is_outproj_norm, out_proj.weight.
    """

    def __init__(self, d_model, d_state=128, expand=2, headdim=64, ngroups=1, rope_fraction=0.5, dt_min=0.001,
                 dt_max=0.1, dt_init_floor=1e-4, A_floor=1e-4, is_outproj_norm=False, is_mimo=False, mimo_rank=4,
                 fuse_pregate_headwise_norm=True, chunk_size=64, dropout=0.0, layer_idx=None, n_layer=None,
                 device=None, dtype=None, *, backend=None, **kwargs):
        fk = {"device": device, "dtype": dtype}
        super().__init__()
        self.d_model, self.d_state, self.expand, self.headdim = d_model, d_state, expand, headdim
        self.chunk_size, self.layer_idx, self.A_floor = chunk_size, layer_idx, A_floor
        self.is_outproj_norm, self.is_mimo = is_outproj_norm, is_mimo
        self.mimo_rank = mimo_rank if is_mimo else 1
        self.fuse_pregate_headwise_norm = bool(fuse_pregate_headwise_norm and is_mimo and is_outproj_norm)
        self.backend = backend
        self.d_inner = int(expand * d_model)
        if self.d_inner % headdim:
            raise ValueError(f"headdim: must divide d_inner = expand * d_model = {self.d_inner}, got {headdim}")
        self.nheads = self.d_inner // headdim
        self.num_bc_heads = ngroups
        if rope_fraction not in (0.5, 1.0):
            raise ValueError(f"rope_fraction: expected 0.5 or 1.0, got {rope_fraction!r}")
        self.rotary_dim_divisor = int(2 / rope_fraction)
        # the rotated part of the state: an even number of dims, two per angle
        self.split_tensor_size = int(d_state * rope_fraction) // 2 * 2
        self.num_rope_angles = self.split_tensor_size // 2
        if self.num_rope_angles < 1:
            raise ValueError(f"d_state: too small to rotate a pair with rope_fraction={rope_fraction}, got {d_state}")

        H, R, N, P = self.nheads, self.mimo_rank, d_state, headdim
        # in_proj's output, in order: z, x, B, C, dd_dt, dd_A, trap, angles
        self.split_sizes = [self.d_inner, self.d_inner, N * ngroups * R, N * ngroups * R, H, H, H,
                            self.num_rope_angles]
        self.in_proj = nn.Linear(d_model, sum(self.split_sizes), bias=False, **fk)
        # dt_bias: softplus's inverse of steps log-uniform in [dt_min, dt_max], floored
        dt = torch.exp(torch.rand(H, device=device) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_init_floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.dt_bias._no_weight_decay = True
        self.B_bias = nn.Parameter(torch.ones(H, R, N, device=device))
        self.C_bias = nn.Parameter(torch.ones(H, R, N, device=device))
        self.B_norm = RMSNormGated(N, eps=1e-5, **fk)
        self.C_norm = RMSNormGated(N, eps=1e-5, **fk)
        if is_mimo:
            self.mimo_x = nn.Parameter(torch.full((H, R, P), 1.0 / R, device=device))
            self.mimo_z = nn.Parameter(torch.ones(H, R, P, device=device))
            self.mimo_o = nn.Parameter(torch.full((H, R, P), 1.0 / R, device=device))
        self.D = nn.Parameter(torch.ones(H, device=device))
        self.D._no_weight_decay = True
        if is_outproj_norm:
            self.norm = RMSNormGated(self.d_inner, eps=1e-5, norm_before_gate=True, group_size=P, **fk)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False, **fk)

    # -----------------------------------------------------------------------------------------

    def _project(self, u):
        """in_proj and mamba_ssm's preprocessing of its parts, for (b, l, d_model) or (b, d_model)
        inputs (the token axes kept): z, x (.., H, P); B, C (.., R, G, N) normed; ADT, DT (.., H);
        trap (.., H) before its sigmoid; angles (.., H, F)."""
        z, x, B, C, dd_dt, dd_A, trap, angles = torch.split(self.in_proj(u), self.split_sizes, dim=-1)
        lead = u.shape[:-1]
        z, x = z.unflatten(-1, (self.nheads, self.headdim)), x.unflatten(-1, (self.nheads, self.headdim))
        B = self.B_norm(B.unflatten(-1, (self.mimo_rank, self.num_bc_heads, self.d_state)))
        C = self.C_norm(C.unflatten(-1, (self.mimo_rank, self.num_bc_heads, self.d_state)))
        A = torch.clamp(-heavy_tail_activation(_wide(dd_A)), max=-self.A_floor)
        DT = F.softplus(dd_dt + self.dt_bias)
        angles = _wide(angles).unsqueeze(-2).expand(*lead, self.nheads, self.num_rope_angles)
        return z, x, B, C, A * DT, DT, trap, angles

    def _mimo_kw(self, z):
        """mamba3_mimo's arguments after Z that the layer's configuration sets."""
        fused = self.fuse_pregate_headwise_norm
        gated = fused or not self.is_outproj_norm   # (else the norm below gates)
        return dict(MIMO_Out=self.mimo_o if gated else None, Z=z if gated else None, D=self.D,
                    fuse_pregate_headwise_rms_norm=fused, outproj_norm_weight=self.norm.weight if fused else None,
                    outproj_norm_eps=self.norm.eps if fused else 1e-5)

    def _finish(self, y, z):
        """The output norm where it is not fused, MIMO's sum over ranks after it, out_proj. y:
        (.., H, P) or, MIMO with the norm unfused, (.., R, H, P)."""
        if self.is_mimo and self.is_outproj_norm and not self.fuse_pregate_headwise_norm:
            zr = torch.einsum("...hp,hrp->...rhp", _wide(z), self.mimo_z).flatten(-2)
            y = self.norm(_wide(y).flatten(-2), zr).unflatten(-1, (self.nheads, self.headdim))
            y = torch.einsum("...rhp,hrp->...hp", y, self.mimo_o)
        y = y.flatten(-2)
        if self.is_outproj_norm and not self.is_mimo:
            y = self.norm(y, z.flatten(-2))
        return self.out_proj(y.to(self.out_proj.weight.dtype))

    def forward(self, u, seq_idx=None, cu_seqlens=None, inference_params=None):
        """u (batch, seqlen, d_model) -> (batch, seqlen, d_model). cu_seqlens (num_sequences + 1,):
        sequences packed along seqlen (batch 1). inference_params: mamba_ssm's InferenceParams
        (``key_value_memory_dict``, ``seqlen_offset``): at offset 0 the final states are written
        into the layer's cache; after it, each call is one :meth:`step` (seqlen 1). ``seq_idx``
        is not supported (mamba_ssm's layer ignores it): NotImplementedError, use cu_seqlens."""
        if seq_idx is not None:
            raise NotImplementedError("seq_idx: not supported by the Mamba-3 layer (mamba_ssm's ignores it); pass "
                                      "cu_seqlens to pack sequences")
        if not isinstance(u, torch.Tensor) or u.dim() != 3:
            raise ValueError(f"u: expected a tensor (batch, seqlen, d_model), got {getattr(u, 'shape', type(u))}")
        cache = None
        if inference_params is not None:
            n = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else u.shape[0]
            cache = self._get_states_from_cache(inference_params, n)
            if inference_params.seqlen_offset > 0:
                return self.step(u, *cache)[0]
        z, x, B, C, ADT, DT, trap, angles = self._project(u)
        ADT, DT, trap = (t.transpose(1, 2) for t in (ADT, DT, trap))           # (b, H, l): mamba_ssm's layout
        if self.is_mimo:
            r = mamba3_mimo(C, B, x, ADT, DT, trap, self.C_bias, self.B_bias, self.mimo_x, self.mimo_z,
                            Angles=angles, chunk_size=self.chunk_size, rotary_dim_divisor=self.rotary_dim_divisor,
                            dtype=x.dtype, return_state=cache is not None, cu_seqlens=cu_seqlens,
                            backend=self.backend, **self._mimo_kw(z))
        else:
            r = mamba3_siso_combined(C[:, :, 0], B[:, :, 0], x, ADT, DT, trap, self.C_bias[:, 0], self.B_bias[:, 0],
                                     angles, D=self.D, Z=None if self.is_outproj_norm else z,
                                     return_final_states=cache is not None, cu_seqlens=cu_seqlens,
                                     backend=self.backend)
        if cache is not None:
            y, *finals = r
            self._store(cache, finals)
        else:
            y = r
        return self._finish(y, z)

    def _store(self, cache, finals) -> None:
        """Write final states (angle, ssm, k, v) into the cache's four tensors (not recorded by
        autograd). k: (n, R, H, N) (MIMO) or (n, H, N) (SISO)."""
        angle, ssm, k, v = finals
        with torch.no_grad():
            cache[0].copy_(angle)
            cache[1].copy_(ssm)
            cache[2].copy_(k if k.dim() == 4 else k.unsqueeze(1))
            cache[3].copy_(v)

    def step(self, u, angle_state, ssm_state, k_state, v_state, **kwargs):
        """One decoding step from the cache, which is advanced in place. u (batch, d_model) or
        (batch, 1, d_model); angle_state (batch, H, F); ssm_state (batch, H, P, N); k_state
        (batch, R, H, N) (R = 1 without MIMO); v_state (batch, H, P), the last token's x. Returns
        (out like u, angle_state, ssm_state, k_state, v_state), the new states (the angle reduced
        mod 2 pi, where mamba_ssm's step lets it grow: the same rotations)."""
        one = u.dim() == 3
        if one and u.shape[1] != 1:
            raise ValueError(f"u: a decoding step takes one token, got seqlen {u.shape[1]}")
        u1 = u[:, 0] if one else u
        z, x, B, C, ADT, DT, trap, angles = self._project(u1)
        # the op keeps its inputs for the backward: read copies where the cache is written after
        grad = torch.is_grad_enabled()
        states = tuple(t.clone() if grad else t for t in (angle_state, ssm_state, k_state, v_state))
        if self.is_mimo:
            y, angle, ssm, k, _ = mamba3_mimo(
                C[:, None], B[:, None], x[:, None], ADT[..., None], DT[..., None], trap[..., None], self.C_bias,
                self.B_bias, self.mimo_x, self.mimo_z, Angles=angles[:, None], chunk_size=self.chunk_size,
                rotary_dim_divisor=self.rotary_dim_divisor, dtype=x.dtype, return_state=True,
                Input_States=states, backend=self.backend, **self._mimo_kw(z[:, None]))
            y = y[:, 0]
        else:
            y, (angle, ssm, k, _) = mamba3_siso_step(
                C[:, 0], B[:, 0], x, ADT, DT, trap, self.C_bias[:, 0], self.B_bias[:, 0], angles, D=self.D,
                Z=None if self.is_outproj_norm else z, Input_States=(*states[:2], states[2][:, 0], states[3]),
                backend=self.backend)
            k = k.unsqueeze(1)
        out = self._finish(y, z)
        self._store((angle_state, ssm_state, k_state, v_state), (angle, ssm, k, x))
        return (out[:, None] if one else out), angle_state, ssm_state, k_state, v_state

    def _state_dtypes(self, dtype):
        # the angle and the SSM state in float32 as mamba_ssm's, float64 for a float64 layer
        wide = torch.float64 if dtype == torch.float64 else torch.float32
        return wide, dtype

    def allocate_inference_cache(self, batch_size, max_seqlen, device=None, dtype=None, **kwargs):
        """(angle (batch, H, F), ssm (batch, H, P, N), k (batch, R, H, N), v (batch, H, P)), zeros:
        the angle and SSM states in float32 (float64 for a float64 layer), k and v in ``dtype``
        (default: in_proj's)."""
        device = self.in_proj.weight.device if device is None else device
        dtype = self.in_proj.weight.dtype if dtype is None else dtype
        wide, _ = self._state_dtypes(dtype)
        H, P, N, R = self.nheads, self.headdim, self.d_state, self.mimo_rank
        return (torch.zeros(batch_size, H, self.num_rope_angles, device=device, dtype=wide),
                torch.zeros(batch_size, H, P, N, device=device, dtype=wide),
                torch.zeros(batch_size, R, H, N, device=device, dtype=dtype),
                torch.zeros(batch_size, H, P, device=device, dtype=dtype))

    def _get_states_from_cache(self, inference_params, batch_size, initialize_states=False):
        """This layer's four cache tensors in ``inference_params.key_value_memory_dict[layer_idx]``,
        made (zeros) on first use."""
        if self.layer_idx is None:
            raise ValueError("layer_idx: the layer needs a layer_idx to keep its cache in inference_params")
        store = inference_params.key_value_memory_dict
        if self.layer_idx not in store:
            store[self.layer_idx] = self.allocate_inference_cache(batch_size, None)
        elif initialize_states:
            for t in store[self.layer_idx]:
                t.zero_()
        return store[self.layer_idx]
