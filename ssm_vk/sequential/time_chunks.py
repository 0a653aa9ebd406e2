"""Recording the scans parallel over time (plan.tchunk > 0): passes over time chunks instead of
one scan along each sequence.

Every sequence's T tokens are cut into NCH = T / tchunk chunks, and the token-sequential kernels
treat chunk c of sequence i as a sequence of its own, i * NCH + c (the same memory: the per-token
arrays are (S, T, ...), so the chunks of the sequences in order are (S * NCH, tchunk, ...)).

The forward, three passes:

1. ssm_scan.comp with SUMMARY: each chunk from a zero state; what it adds to the state (b) and the
   decay it applies to the state it receives, over all chunks at once;
2. ssm_scan_carry.comp: per state element, chunk after chunk, the state each chunk starts from
   (written over b) and the final state; it flags any value that is not finite;
3. ssm_scan.comp: each chunk again from its initial state, writing y.

The backward (:func:`record_adjoints`, then sequential.sequential_recording's windows on the chunks): the
forward's first two passes give every chunk's initial state; ssm_scan_back.comp with BSUM walks
every chunk back from a zero adjoint (what the chunk adds to the adjoint it hands on -- its decay
is the forward's), and the carry in reverse gives the adjoint every chunk starts its walk back
from, and d_s0; then the token-sequential backward runs on the chunks as sequences. The
adjoint is linear in what it receives just as the state is, so the same carry serves both.

The token-sequential scan runs S * H * P rows one after another along T; this runs NCH times as
many rows at once, for about 1.7 times the arithmetic forward (two summaries and a carry more in
the backward). A flagged call is recomputed token by token (run.py), so inf and nan follow the
sequential rules.
"""

from __future__ import annotations

from ssm_ref import Problem

from .. import kernel_specs as specs
from ..recording import carry, flag_end, flag_start, gather_rows, kernel, seq_bindings
from ..sizing import grid
from . import sequential_specs as seqk
from .sequential_planner import chunk_dims, time_chunk_scratch

__all__ = ["record_forward", "record_adjoints"]  # of the scans parallel over time


def _chunk_pass(seq, ws, d, cd, bufs: dict, k, st, dec) -> None:
    """ssm_scan.comp over the chunks of ``d`` as the sequences of ``cd``: with SUMMARY each chunk's
    contribution into ``st`` and its decay into ``dec``; else each chunk from its initial state in
    ``st``, writing y."""
    lim, lay = ws.limits, ws.plan.layout
    row = d.H * d.P * d.N
    KA = d.N if d.mamba1 else 1
    x, dt, A, B, C = (bufs[k] for k in ("x", "dt", "A", "B", "C"))
    dummy = ws.bind(None, 0, 0, 0)[0]
    for w in ws.plan.windows:    # windows of chunks (cd's sequences)
        gx, gy = grid(w.S * lay.NHB * lay.NPB, lim)
        tok = {"x": (*x, d.H * d.P), "dt": (*dt, d.H), "B": (*B, d.G * d.N), "C": (*C, d.G * d.N)}
        names = {"x": "o_x", "dt": "o_dt", "B": "o_B", "C": "o_C"}
        if dec is None:
            tok["y"], names["y"] = (*bufs["y"], d.H * d.P), "o_y"
        bnd, o = seq_bindings(ws, cd, w, tok, names)
        if dec is not None:
            bnd["y"], o["o_y"] = dummy, 0
        bnd["A"], o["o_A"] = ws.bind(*A, 0, d.H * KA)
        bnd["st"], o["o_st"] = ws.bind(st, 0, w.i0 * row, w.S * row)
        bnd["ck"], o["o_ck"] = (ws.bind(dec, 0, w.i0 * d.H * KA, w.S * d.H * KA) if dec is not None
                                else ws.bind(None, 0, 0, 0))
        push = dict(S=w.S, T=w.T, H=d.H, P=d.P, N=d.N, G=d.G, HB=lay.HB, PB=lay.PB, NHB=lay.NHB,
                    NPB=lay.NPB, gx=gx, NC=1, c0=0, gather=0, o_s=0, o_ids=0, scatter=0, **o)
        seq.dispatch(k, [bnd["x"], bnd["dt"], bnd["A"], bnd["B"], bnd["C"], bnd["y"], bnd["st"], bnd["ck"],
                         dummy, dummy], specs.pack_push(seqk.FWD_PUSH, push), (gx, gy, 1))
        if w is not ws.plan.windows[-1]:
            seq.barrier()   # (the windows share the stand-in binding, which the kernel may write)


def _adjoint_summary(seq, ws, d, cd, bufs: dict, lam) -> None:
    """ssm_scan_back.comp with BSUM over the chunks: each chunk's adjoint contribution into ``lam``."""
    lim, pl = ws.limits, ws.plan
    lay = pl.layout
    row = d.H * d.P * d.N
    KA = d.N if d.mamba1 else 1
    k = kernel(ws.ctx, seqk.bwd_spec(cd, lay, pl.softplus, summary=True))
    x, dt, A, B, C, gy = (bufs[k] for k in ("x", "dt", "A", "B", "C", "g_y"))
    dummy = ws.bind(None, 0, 0, 0)[0]
    for w in pl.windows:
        gx, gyy = grid(w.S * lay.NHB * lay.NPB, lim)
        tok = {"x": (*x, d.H * d.P), "dt": (*dt, d.H), "B": (*B, d.G * d.N), "C": (*C, d.G * d.N),
               "gy": (*gy, d.H * d.P)}
        bnd, o = seq_bindings(ws, cd, w, tok, {"x": "o_x", "dt": "o_dt", "B": "o_B", "C": "o_C", "gy": "o_gy"})
        bA, o["o_A"] = ws.bind(*A, 0, d.H * KA)
        blam, o_lam = ws.bind(lam, 0, w.i0 * row, w.S * row)
        push = dict(S=w.S, T=w.T, H=d.H, P=d.P, N=d.N, G=d.G, HB=lay.HB, PB=lay.PB, NHB=lay.NHB, NPB=lay.NPB,
                    gx=gx, NC=1, c0=0, **o, o_lam=o_lam, o_ck=0, o_dx=0, o_dA=0)
        seq.dispatch(k, [bnd["x"], bnd["dt"], bA, bnd["B"], bnd["C"], bnd["gy"], blam, dummy, dummy, dummy, dummy,
                         dummy, dummy], specs.pack_push(seqk.BWD_PUSH, push), (gx, gyy, 1))
        if w is not pl.windows[-1]:
            seq.barrier()   # (as _chunk_pass)


def _carry(seq, ws, d, dec, b, st_at: tuple, rows, flag, reverse: bool) -> None:
    """recording.carry over this plan's time chunks."""
    carry(seq, ws, d, d.T // ws.plan.tchunk, dec, b, st_at, rows, flag, reverse)


def record_forward(seq, ws, p: Problem, bufs: dict, rows) -> None:
    """Record the three passes. ``bufs`` maps s, x, dt, A, B, C, y, states to (buffer or None,
    element offset); ``rows``: the binding of the cache and the ids when the carry pass reads the
    initial states from s[ids] in place (recording.cache_rows), else None."""
    d = p.dims
    pl = ws.plan
    cd = chunk_dims(d, pl.tchunk)
    row = d.H * d.P * d.N
    ctx = ws.ctx
    sizes = time_chunk_scratch(d, pl)
    b = ws.scratch(sizes["b"])
    dec = ws.scratch(sizes["dec"])
    flag = flag_start(seq, ws)
    st_buf, st_off = bufs["states"]
    if rows is None:   # states <- s[ids] by copies: the carry pass starts from states
        gather_rows(seq, ws, *bufs["s"], st_buf, st_off, p.ids, row)
    seq.barrier()
    profile = ws.profile and ctx.info.timestamps
    if profile:
        seq.timestamp("gather")
    lay = pl.layout
    _chunk_pass(seq, ws, d, cd, bufs, kernel(ctx, seqk.fwd_spec(cd, lay, checkpoint=False, softplus=pl.softplus,
                                                                summary=True)), b, dec)
    seq.barrier()
    if profile:
        seq.timestamp("summary")
    _carry(seq, ws, d, dec, b, (st_buf, st_off), rows, flag, reverse=False)
    seq.barrier()
    if profile:
        seq.timestamp("carry")
    _chunk_pass(seq, ws, d, cd, bufs, kernel(ctx, seqk.fwd_spec(cd, lay, checkpoint=False, softplus=pl.softplus)),
             b, None)
    seq.barrier()
    flag_end(seq, ws, flag)


def record_adjoints(seq, ws, p: Problem, bufs: dict, rows, lam):
    """Record what the backward over time chunks needs before its walk back: every chunk's initial
    state and initial adjoint. ``lam`` holds g_states and ends as d_s0. Returns (the chunks as a
    problem's dims, their initial states, their initial adjoints, the non-finite flag): the
    token-sequential backward then runs on those (sequential.sequential_recording) and the flag is read after."""
    d = p.dims
    pl = ws.plan
    cd = chunk_dims(d, pl.tchunk)
    row = d.H * d.P * d.N
    ctx = ws.ctx
    lay = pl.layout
    sizes = time_chunk_scratch(d, pl, backward=True)
    b = ws.scratch(sizes["b"])
    dec = ws.scratch(sizes["dec"])
    bl = ws.scratch(sizes["lam"])
    st = ws.scratch(sizes["st"])
    flag = flag_start(seq, ws)
    if rows is None:
        gather_rows(seq, ws, *bufs["s"], st, 0, p.ids, row)
    seq.barrier()
    # the two summaries read only the inputs: one after the other without a barrier
    _chunk_pass(seq, ws, d, cd, bufs, kernel(ctx, seqk.fwd_spec(cd, lay, checkpoint=False, softplus=pl.softplus,
                                                                summary=True)), b, dec)
    _adjoint_summary(seq, ws, d, cd, bufs, bl)
    seq.barrier()
    _carry(seq, ws, d, dec, b, (st, 0), rows, flag, reverse=False)
    _carry(seq, ws, d, dec, bl, (lam, 0), None, flag, reverse=True)
    seq.barrier()
    if ws.profile and ctx.info.timestamps:
        seq.timestamp("summaries+carries")
    return cd, b, bl, flag
