"""Recording the Mamba-3 token-sequential kernels (ws.plan: an M3Plan; glsl/mamba3_scan.comp,
mamba3_step.comp, mamba3_scan_back.comp, mamba3_reduce.comp).

The forward is one dispatch: every (sequence, head, channel block) walks its tokens, reading the
start state from the cache rows ids[i] in place and writing y and the four final state parts
(with update_cache, those the caller allows straight into the cache rows ids[i]); a forward of
one token (plan.step) runs mamba3_step.comp instead, one workgroup per block of a head's rows.

The backward: the walk forward and back per (sequence, head) (mamba3_scan_back.comp), then the
fixed-order sums (mamba3_reduce.comp) of the per-head d_B / d_C slabs over each group's heads
and of the per-sequence d_B_bias / d_C_bias / d_psi parts over the sequences.

``ws``: the call's workspace (ssm_vk.mamba3_workspace.M3Workspace): ``ctx``, ``plan``, ``limits`` and
``bind(name) -> (buffer, offset, nbytes)`` of a named array (a stand-in for an empty one).
``p``: the checked problem (ssm_ref.mamba3_checks.M3Problem).
"""

from __future__ import annotations

from ..kernel_specs import FLAT_WG, pack_push
from ..recording import kernel
from ..sizing import grid
from . import mamba3_specs as m3k

__all__ = ["record_forward", "record_backward", "reduce_sums"]


def _scan_push(p, plan, npb: int, in_place: int = 0) -> bytes:
    d = p.dims
    return pack_push(m3k.SCAN_PUSH, dict(S=d.S, T=d.T, H=d.H, P=d.P, G=d.G, F=d.F, R=d.R, gx=plan.gx, NPB=npb,
                                         halved=int(p.rotation == "halved"), K=plan.seg, IP=in_place))


def record_forward(seq, ws, p, bufs: dict, scatter: bool = False) -> None:
    """Record the forward (the workspace binds by name; ``bufs["_in_place"]``, where present,
    is (None, the kernel's IP bits): the final-state parts the kernel writes into the cache rows
    itself, their outputs then unbound; ``scatter``: never -- the caller writes the other parts
    into the cache rows)."""
    plan = ws.plan
    spec = m3k.forward_spec(p.dims, plan)
    in_place = bufs.get("_in_place", (None, 0))[1]
    seq.dispatch(kernel(ws.ctx, spec), [ws.bind(k) for k in m3k.FWD_BINDINGS],
                 _scan_push(p, plan, plan.npb, in_place), (plan.gx, plan.gy, 1))


def reduce_sums(seq, ws, src: str, dst, n_out: int, inner: int, K: int) -> None:
    """dst[a * inner + b] = Σ_{k < K} src[(a K + k) inner + b], k in order (mamba3_reduce.comp);
    ``dst`` a name the workspace binds, or a binding (a window's rows of an output)."""
    if n_out == 0:
        return
    gx, gy = grid(-(-n_out // FLAT_WG), ws.limits)
    push = pack_push(m3k.REDUCE_PUSH, dict(n_out=n_out, INNER=inner, K=K, gx=gx, o_in=0, o_out=0))
    out = dst if type(dst) is tuple else ws.bind(dst)
    seq.dispatch(kernel(ws.ctx, m3k.reduce_spec()), [ws.bind(src), out], push, (gx, gy, 1))


def record_backward(seq, ws, p, bufs: dict, kept=None) -> None:
    """Record the backward: the per-(sequence, head) walk, a barrier, the fixed-order sums into
    d_B, d_C and the parts' sum (H, 2MN + MP) that the caller splits into d_B_bias, d_C_bias,
    d_psi."""
    d = p.dims
    plan = ws.plan
    seq.dispatch(kernel(ws.ctx, m3k.back_spec(d, plan)), [ws.bind(k) for k in m3k.BWD_BINDINGS],
                 _scan_push(p, plan, 1), (plan.gx, plan.gy, 1))
    seq.barrier()
    hpg = d.H // d.G
    slab = d.S * d.T * d.M * d.G * d.N
    reduce_sums(seq, ws, "m3_dB_heads", "d_B", slab, d.N, hpg)
    reduce_sums(seq, ws, "m3_dC_heads", "d_C", slab, d.N, hpg)
    per = d.H * (2 * d.M * d.N + d.M * d.P)
    reduce_sums(seq, ws, "m3_parts", "d_parts", per, per, d.S)
