"""Recording the forward parallel over time (plan.tchunk > 0): three passes instead of one scan
along each sequence.

Every sequence's T tokens are cut into NCH = T / tchunk chunks, and the token-sequential kernel
treats chunk c of sequence i as a sequence of its own, i * NCH + c (the same memory: the per-token
arrays are (S, T, ...), so the chunks of the sequences in order are (S * NCH, tchunk, ...)):

1. ssm_scan.comp with SUMMARY: each chunk from a zero state; what it adds to the state (b) and the
   decay it applies to the state it receives, over all chunks at once;
2. ssm_scan_carry.comp: per state element, chunk after chunk, the state each chunk starts from
   (written over b) and the final state; it flags any value that is not finite;
3. ssm_scan.comp: each chunk again from its initial state, writing y.

The token-sequential scan runs S * H * P rows one after another along T; this runs NCH times as
many rows at once, for about 1.7 times the arithmetic. A flagged call is recomputed token by token
(run.py), so inf and nan follow the sequential rules.
"""

from __future__ import annotations

from ssm_ref import Problem

from .. import kernels as specs
from ..plan import chunk_dims, grid
from ..plan.sizes import FLAG_ELEMS, time_chunk_scratch
from .common import flag_end, flag_start, gather_rows, kernel, seq_bindings

__all__ = ["record_forward"]  # of the forward parallel over time


def record_forward(seq, ws, p: Problem, bufs: dict, rows) -> None:
    """Record the three passes. ``bufs`` maps s, x, dt, A, B, C, y, states to (buffer or None,
    element offset); ``rows``: the binding of the cache and the ids when the carry pass reads the
    initial states from s[ids] in place (record.sequential._rows_in_place), else None."""
    d = p.dims
    lim, pl = ws.limits, ws.plan
    lay = pl.layout
    cd = chunk_dims(d, pl.tchunk)
    nch = d.T // pl.tchunk
    row = d.H * d.P * d.N
    KA = d.N if d.mamba1 else 1
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
    x, dt, A, B, C = (bufs[k] for k in ("x", "dt", "A", "B", "C"))
    dummy = ws.bind(None, 0, 0, 0)[0]

    def chunk_pass(k, summary: bool) -> None:
        for w in pl.windows:    # windows of chunks (cd's sequences)
            gx, gy = grid(w.S * lay.NHB * lay.NPB, lim)
            tok = {"x": (*x, d.H * d.P), "dt": (*dt, d.H), "B": (*B, d.G * d.N), "C": (*C, d.G * d.N),
                   "y": (*bufs["y"], d.H * d.P)}
            bnd, o = seq_bindings(ws, cd, w, tok, {"x": "o_x", "dt": "o_dt", "B": "o_B", "C": "o_C", "y": "o_y"})
            bnd["A"], _ = ws.bind(*A, 0, d.H * KA)
            bnd["st"], o["o_st"] = ws.bind(b, 0, w.i0 * row, w.S * row)
            bnd["ck"], o["o_ck"] = (ws.bind(dec, 0, w.i0 * d.H * KA, w.S * d.H * KA) if summary
                                    else ws.bind(None, 0, 0, 0))
            push = dict(S=w.S, T=w.T, H=d.H, P=d.P, N=d.N, G=d.G, HB=lay.HB, PB=lay.PB, NHB=lay.NHB,
                        NPB=lay.NPB, gx=gx, NC=1, c0=0, gather=0, o_s=0, o_ids=0, scatter=0, **o)
            seq.dispatch(k, [bnd["x"], bnd["dt"], bnd["A"], bnd["B"], bnd["C"], bnd["y"], bnd["st"], bnd["ck"],
                             dummy, dummy], specs.pack_push(specs.FWD_PUSH, push), (gx, gy, 1))
        seq.barrier()

    chunk_pass(kernel(ctx, specs.fwd_spec(cd, lay, checkpoint=False, softplus=pl.softplus, summary=True)), True)
    if profile:
        seq.timestamp("summary")
    n = d.S * row
    gx, gy = grid(-(-n // specs.FLAT_WG), lim)
    b_st, o_st = ws.bind(st_buf, st_off, 0, n)
    if rows is None:
        b_s, b_ids, gather, o_s = dummy, dummy, 0, 0
    else:
        (b_s, o_s), ids_buf = rows
        b_ids, gather = (ids_buf, 0, ids_buf.size), 1
    push = dict(S=d.S, H=d.H, P=d.P, N=d.N, NCH=nch, gx=gx, gather=gather, o_s=o_s, o_ids=0, o_st=o_st)
    seq.dispatch(kernel(ctx, specs.carry_spec(d)),
                 [ws.bind(dec, 0, 0, sizes["dec"])[0], ws.bind(b, 0, 0, sizes["b"])[0], b_st, b_s, b_ids,
                  ws.bind(flag, 0, 0, FLAG_ELEMS)[0]],
                 specs.pack_push(specs.CARRY_PUSH, push), (gx, gy, 1))
    seq.barrier()
    if profile:
        seq.timestamp("carry")
    chunk_pass(kernel(ctx, specs.fwd_spec(cd, lay, checkpoint=False, softplus=pl.softplus)), False)
    flag_end(seq, ws, flag)
