"""Recording the chunked Mamba-3 forward and backward (ws.plan: an M3ChunkPlan; glsl/m3c_*.comp,
glsl/m3b_*.comp).

The forward:
In order, a barrier between each: the non-finite flag zeroed; where F > 0 the chunks' angle sums
(m3c_prep MODE 0) and the pass over them (m3c_angle: each chunk's θ_in, the final θ); the
rotated keys and queries and the chunks' decays (m3c_prep MODE 1); each chunk's own state
contribution (m3c_states); the pass over the chunks (m3c_pass: the state each chunk receives,
the final h, k, v); y (m3c_y); the flag copied where the host reads it after the wait
(ssm_vk.mamba3_run recomputes a flagged call on the token-sequential kernels).

The backward (ssm_ref/mamba3_chunked_back.py), a barrier between each step: the flag zeroed; the
forward's first steps again (the angle sums and pass, the rotation, the chunk states, the pass:
the chunks' θ_in, q, k, H'_in, decays); each chunk's part of the state cotangent (m3b_gstates)
and the pass back over the chunks (m3b_gpass: G_out of each chunk, d0_h); each chunk's gradients
(m3b_chunk: d_x, d_dt, d_dA, d_lam, d_psi's parts, the cotangents of the rotated q and k, d0_k,
d0_v); the rotation's adjoint (m3b_rot MODE 0: d_B, d_C per head, the biases' parts, the angle
cotangents); where F > 0 the pass back over the chunks' angle cotangents (m3b_angle, d0_theta)
and d_dtheta's suffix sums (m3b_rot MODE 1); the fixed-order sums over a group's heads (d_B,
d_C) and over the sequences' chunks (the biases' and d_psi's parts; mamba3_reduce.comp, as the
token-sequential backward); the flag copied where the host reads it.

Both run window after window (plan.windows, each with its own sizes, grids and bindings from
ws.bind_window): windows of whole sequences where the call's scratch exceeds one binding, and
windows of one sequence's tokens where that sequence's does -- the forward each window from the
state the one before it left, the backward after a walk forward that leaves each window's start
state, from the sequence's last window back (_backward_order). The flag is zeroed once and read
once, for the whole call.

``ws``: the call's workspace (ssm_vk.mamba3_workspace.M3Workspace): ``ctx``, ``plan``,
``bind(name)`` and ``flag_host()``.
``p``: the checked problem (ssm_ref.mamba3_checks.M3Problem).
"""

from __future__ import annotations

from ..kernel_specs import pack_push
from ..recording import flag_end, kernel
from . import mamba3_chunked_specs as m3c
from .mamba3_recording import reduce_sums

__all__ = ["record_forward", "record_backward", "FLAG"]

FLAG = "m3c_flag"   # the scratch the kernels raise on a non-finite value (4 uint32, the first read)


def _push(p, plan, w, gx: int, mode: int = 0) -> bytes:
    d = p.dims
    return pack_push(m3c.PUSH, dict(S=w.n, T=w.nt, H=d.H, P=d.P, G=d.G, F=d.F, R=d.R, N=d.N, M=d.M, L=plan.L,
                                    NC=w.NC, halved=int(p.rotation == "halved"), gx=gx, mode=mode))


def _runner(seq, ws, p, w, walk: bool = False):
    """run(spec, grid, names, mode): a barrier, then ``spec`` dispatched over window ``w``'s bindings
    of ``names`` (its ids its own; ``walk``: the backward's walk forward to each window of tokens'
    start state, ws.bind_window)."""
    ids = ws.window_ids(p, w)

    def run(spec, grid, names, mode: int = 0) -> None:
        seq.barrier()
        binds = [ids if k == "ids" else ws.bind_window(k, w, walk) for k in names]
        seq.dispatch(kernel(ws.ctx, spec), binds, _push(p, ws.plan, w, grid[0], mode), (grid[0], grid[1], 1))

    return run


def _recompute(run, w, F: int) -> None:
    """The forward's first steps over window ``w``: the chunks' angles, the rotated keys and
    queries and decays, the chunk states and the pass (the state each chunk receives, the final
    state)."""
    fwd = m3c.RECOMPUTE_BINDINGS
    if F:
        run(m3c.prep_spec(), w.prep, fwd, 0)
        run(m3c.angle_spec(), w.angle, fwd)
    run(m3c.prep_spec(), w.prep, fwd, 1)
    run(m3c.states_spec(), w.states, fwd)
    run(m3c.pass_spec(), w.pass_, fwd)


def _backward_order(plan, S: int, T: int, walk):
    """The windows in the order the backward takes them (a generator: what it records runs in
    turn): windows of sequences as they come; windows of tokens sequence by sequence, each
    sequence's from its last, after ``walk(w)`` has recorded the forward over every window of it
    but the last, in order, to leave each window's start state (in slots the next sequence's walk
    reuses)."""
    if plan.Tw >= T:
        yield from plan.windows
        return
    for s0 in range(S):
        mine = [w for w in plan.windows if w.s0 == s0]
        for w in mine[:-1]:
            walk(w)
        yield from reversed(mine)


def record_forward(seq, ws, p, bufs: dict, scatter: bool = False) -> None:
    """Record the chunked forward, window after window (``bufs``: unused, the workspace binds by
    name; ``scatter``: never -- the final states go to their own arrays, the caller writes the
    cache rows)."""
    flag = ws.bind(FLAG)
    seq.fill(flag[0], 0, 0, flag[2])
    for w in ws.plan.windows:
        run = _runner(seq, ws, p, w)
        if p.dims.F:
            run(m3c.prep_spec(), w.prep, m3c.BINDINGS, 0)
            run(m3c.angle_spec(), w.angle, m3c.BINDINGS)
        run(m3c.prep_spec(), w.prep, m3c.BINDINGS, 1)
        run(m3c.states_spec(), w.states, m3c.BINDINGS)
        run(m3c.pass_spec(), w.pass_, m3c.BINDINGS)
        run(m3c.y_spec(), w.y, m3c.BINDINGS)
    flag_end(seq, ws, flag[0])   # (the workspace reads it after the wait: a flagged call is computed again)


def record_backward(seq, ws, p, bufs: dict, kept=None) -> None:
    """Record the chunked backward, window after window (``bufs``: unused, the workspace binds by
    name; ``kept``: never -- it recomputes the forward's tables). Its outputs are the
    token-sequential backward's: d_x, d_dtheta, d_B, d_C, and d_step, d_parts, d_start, which the
    workspace splits (split_grads; a window's d_step and d_start as each window ends, where there
    are several: window_out). d_B and d_C are summed over a group's heads per window, the parts
    over every sequence's chunks once, after the last window: windows of sequences give the bits
    of one window."""
    d = p.dims
    plan = ws.plan
    flag = ws.bind(FLAG)
    seq.fill(flag[0], 0, 0, flag[2])
    slab = d.M * d.G * d.N   # (a token's d_B)
    windows = _backward_order(plan, d.S, d.T, lambda w: _recompute(_runner(seq, ws, p, w, walk=True), w, d.F))
    for w in windows:
        if plan.windowed:
            ws.window_in(seq, w)
        run = _runner(seq, ws, p, w)
        bwd = m3c.BWD_BINDINGS
        _recompute(run, w, d.F)
        run(m3c.gstates_spec(), w.states, bwd)
        run(m3c.gpass_spec(), w.pass_, bwd)
        run(m3c.chunk_spec(1), w.prep, bwd)   # the chunk's products in two halves (m3b_chunk.comp)
        run(m3c.chunk_spec(2), w.prep, bwd)
        run(m3c.rot_spec(), w.prep, bwd, 0)
        if d.F:
            run(m3c.bangle_spec(), w.angle, bwd)
            run(m3c.rot_spec(), w.prep, bwd, 1)
        seq.barrier()
        n = w.n * w.nt * slab   # (into the window's rows of d_B and d_C)
        reduce_sums(seq, ws, "m3b_dBh", ws.bind_window("d_B", w), n, d.N, d.H // d.G)
        reduce_sums(seq, ws, "m3b_dCh", ws.bind_window("d_C", w), n, d.N, d.H // d.G)
        if plan.windowed:
            ws.window_out(seq, w)
    seq.barrier()
    per = d.H * (2 * d.M * d.N + d.M * d.P)
    reduce_sums(seq, ws, "m3b_parts", "d_parts", per, per, d.S * plan.NC)
    flag_end(seq, ws, flag[0])
