"""Recording the token-sequential kernels: the window loop, dispatches, barriers, copies.

Each function records into a runtime Sequence for one problem shape, on buffers already resolved
by the caller (inputs uploaded or device-resident, outputs allocated). ``ws`` (a
workspace.Workspace) supplies the plan, the limits, persistent scratch buffers and aligned bindings.
Recording happens once per shape and set of buffers; the sequence is then replayed.
"""

from __future__ import annotations

import numpy as np

from ssm_ref import Problem

from .. import kernel_specs as specs
from .. import recording as rc
from ..recording import (
    F32,
    cache_rows,
    gather_rows,
    kernel,
    reduce_dA,
    reduce_partials,
    scatter_rows,
    seq_bindings,
    zero,
    zero_at,
)
from ..sizing import Window, grid
from . import sequential_specs as seqk
from . import time_chunks

NAN_WORD = 0x7FC00000   # a quiet NaN: the snapshot slots past the start state (docs/SPEC.md 3.1)

__all__ = ["record_forward", "record_backward", "scatters_in_place"]  # of the token-sequential kernels


def _window_push(d, lay, w: Window, gx: int) -> dict:
    return dict(S=w.S, T=w.T, H=d.H, P=d.P, N=d.N, G=d.G, HB=lay.HB, PB=lay.PB, NHB=lay.NHB,
                NPB=lay.NPB, gx=gx)


def record_forward(seq, ws, p: Problem, bufs: dict, scatter: bool = False) -> None:
    """Record the forward: states <- s[ids]; the scan over every window. ``bufs`` maps s, x, dt,
    A, B, C, y, states to (buffer or None, element offset). ``scatter``: the final states go into
    the cache rows s[ids] instead of states (ssm_scan's update_cache; only where
    :func:`scatters_in_place` says the scan reads those rows in place)."""
    d = p.dims
    lim, pl = ws.limits, ws.plan
    lay = pl.layout
    row = d.H * d.P * d.N
    KA = d.N if d.mamba1 else 1
    ctx = ws.ctx
    st_buf, st_off = bufs["states"]
    scan = pl.windows and d.H * d.P > 0
    rows = cache_rows(ws, p, bufs["s"]) if scan else None
    if scan and pl.tchunk:
        return time_chunks.record_forward(seq, ws, p, bufs, rows)
    if rows is None:   # states <- s[ids] by copies, then the scan starts from states
        gather_rows(seq, ws, *bufs["s"], st_buf, st_off, p.ids, row)
        seq.barrier()
    if ws.profile and ctx.info.timestamps:  # SSM_VK_PROFILE: the gather's time apart from the scan's
        seq.timestamp("gather")
    if not scan:
        if pl.snap:
            _snapshots_unscanned(seq, d, bufs)
        return
    x, dt, A, B, C = (bufs[k] for k in ("x", "dt", "A", "B", "C"))
    k = kernel(ctx, seqk.fwd_spec(d, lay, checkpoint=False, softplus=pl.softplus, snap=pl.snap))
    for w in pl.windows:
        gx, gy = grid(w.S * lay.NHB * lay.NPB, lim)
        tok = {"x": (*x, d.H * d.P), "dt": (*dt, d.H), "B": (*B, d.G * d.N), "C": (*C, d.G * d.N),
               "y": (*bufs["y"], d.H * d.P)}
        b, o = seq_bindings(ws, d, w, tok, {"x": "o_x", "dt": "o_dt", "B": "o_B", "C": "o_C", "y": "o_y"})
        b["A"], o["o_A"] = ws.bind(*A, 0, d.H * KA)
        b["st"], o["o_st"] = ws.bind(st_buf, st_off, w.i0 * row, w.S * row)
        b["ck"], o["o_ck"] = ws.bind(None, 0, 0, 0)
        b_s, b_ids, o_rows = _rows_binding(ws, rows, w)
        push = {**_window_push(d, lay, w, gx), "NC": 1, "c0": 0, **o, **o_rows, "scatter": int(scatter)}
        bindings = [b["x"], b["dt"], b["A"], b["B"], b["C"], b["y"], b["st"], b["ck"], b_s, b_ids]
        if pl.snap:
            b_sn, snap_push = _snap_binding(ws, d, w, bufs["snapshots"])
            bindings.append(b_sn)
            push.update(snap_push)
        seq.dispatch(k, bindings, specs.pack_push(_fwd_push(pl.snap), push), (gx, gy, 1))
        seq.barrier()


def _fwd_push(snap: bool) -> tuple:
    return seqk.FWD_PUSH + seqk.SNAP_PUSH if snap else seqk.FWD_PUSH


def _bwd_push(snap: bool) -> tuple:
    return seqk.BWD_PUSH + seqk.SNAP_PUSH if snap else seqk.BWD_PUSH


def _snap_binding(ws, d, w: Window, at: tuple) -> tuple:
    """The binding of the K snapshot slots (K = ``d.K``; ``at``: (buffer, element offset) of the
    (K, S, H, P, N) array, slot-major) that window ``w`` writes or reads, and its push constants
    KS, o_sn, sst. A token window (time_split) sees the slots from its own end: slot k of the
    window is slot k + (T - w.t1) of the call, and a window that does not start the sequences
    stops below its own T (its slot T, the state before it, is its predecessor's last)."""
    row = d.H * d.P * d.N
    shift = d.T - w.t1
    KS = d.K - shift
    if w.t0 > 0:
        KS = min(KS, w.T)
    if KS <= 0 or row == 0:
        return ws.bind(None, 0, 0, 0)[0], {"KS": 0, "o_sn": 0, "sst": 0}
    buf, base = at
    b, o = ws.bind(buf, base, (shift * d.S + w.i0) * row, ((KS - 1) * d.S + w.S) * row)
    return b, {"KS": KS, "o_sn": o, "sst": d.S * d.H * d.P}


def _snapshots_unscanned(seq, d, bufs: dict) -> None:
    """A forward with snapshots that runs no scan (T == 0, or no rows): slot 0 is the start
    state (the states, gathered), the other slots NaN."""
    row = d.S * d.H * d.P * d.N
    sn, sn_off = bufs["snapshots"]
    if sn is None or row == 0:
        return
    st, st_off = bufs["states"]
    seq.copy(st, sn, row * F32, st_off * F32, sn_off * F32)
    if d.T == 0:
        seq.fill(sn, NAN_WORD, (sn_off + row) * F32, (d.K - 1) * row * F32)
    seq.barrier()


def scatters_in_place(ws, p: Problem, s_at: tuple) -> bool:
    """Whether the forward of ``p`` can write its final states straight into the cache rows
    s[ids] (record_forward's ``scatter``; family.Family.scatters): the token-sequential scan over
    whole sequences, reading those rows in place. (Time chunks and token windows do not: their
    states are copied into the rows after the call; so are the other families'.)"""
    pl = ws.plan
    return (not pl.tchunk and not pl.time_split and bool(pl.windows)
            and p.dims.H * p.dims.P > 0 and cache_rows(ws, p, s_at, probe=True) is not None)


def _rows_binding(ws, rows, w: Window) -> tuple:
    """The s and ids bindings of window ``w`` and their push constants (dummies and gather = 0
    when the rows were copied, or for a token window that continues a sequence: t0 > 0)."""
    dummy = ws.bind(None, 0, 0, 0)[0]
    if rows is None or w.t0 != 0:
        return dummy, dummy, {"gather": 0, "o_s": 0, "o_ids": 0}
    (b_s, o_s), ids_buf = rows
    return b_s, (ids_buf, 0, ids_buf.size), {"gather": 1, "o_s": o_s, "o_ids": w.i0}


def record_backward(seq, ws, p: Problem, bufs: dict, kept=None) -> None:
    """Record the backward. ``bufs`` maps the inputs (s, x, dt, A, B, C, g_y, g_states) and the
    outputs (d_s, d_s0, d_x, d_dt, d_A, d_B, d_C) to (buffer or None, element offset). ``kept``:
    never a forward's tables (a token-sequential forward keeps none)."""
    d = p.dims
    lim, pl = ws.limits, ws.plan
    row = d.H * d.P * d.N
    KA = d.N if d.mamba1 else 1
    ctx = ws.ctx
    lam, lam_off = bufs["d_s0"]   # carries dL/dstate backwards; ends as d_s0
    assert lam_off == 0 or lam is None
    if row:
        gs_buf, gs_off = bufs["g_states"]
        seq.copy(gs_buf, lam, d.S * row * F32, gs_off * F32, 0)
    if pl.tchunk and pl.windows and d.H * d.P > 0:
        # over time chunks: their initial states and adjoints, then the walk back on the chunks
        cd, st, lam_c, flag = time_chunks.record_adjoints(seq, ws, p, bufs, cache_rows(ws, p, bufs["s"]), lam)
        dAp = ws.scratch(cd.S * d.H * d.P * KA)
        zero(seq, dAp, cd.S * d.H * d.P * KA)
        seq.barrier()
        backward_windows(seq, ws, cd, st, lam_c, dAp, bufs, None)
        reduce_dA(seq, ws, cd, dAp, bufs["d_A"], rows=d.P, KA=KA)
        rc.flag_end(seq, ws, flag)
    elif not (pl.windows and d.H * d.P > 0):
        for name in ("d_x", "d_dt", "d_A", "d_B", "d_C"):
            zero_at(seq, *bufs[name], ws.sizes[name])
        if pl.snap and d.T == 0 and row:   # slot 0 is the start state: d_s0 = g_states + g_snapshots[0]
            seq.barrier()
            _add_rows(seq, ws, bufs["g_snapshots"], lam, d.S, row)
    else:
        st = ws.scratch(d.S * row)          # running state of the checkpoint pass
        rows = cache_rows(ws, p, bufs["s"])
        if rows is None:
            gather_rows(seq, ws, *bufs["s"], st, 0, p.ids, row)
        dAp = ws.scratch(d.S * d.H * d.P * KA)
        zero(seq, dAp, d.S * d.H * d.P * KA)
        seq.barrier()
        backward_windows(seq, ws, d, st, lam, dAp, bufs, rows)
        reduce_dA(seq, ws, d, dAp, bufs["d_A"], rows=d.P, KA=KA, per_sequence=bool(pl.layout.EXACT))
    seq.barrier()
    scatter_rows(ctx, seq, ws, lim, lam, bufs["d_s"], p.ids, row, d.R)


def _add_rows(seq, ws, src_at: tuple, dst, n_rows: int, row: int) -> None:
    """dst[i] += src[i] for the first ``n_rows`` rows of ``row`` elements (the rows kernel, pairs
    (i, i); one pair a dispatch where the rows do not fit one binding)."""
    lim = ws.limits
    src, src_base = src_at
    k = kernel(ws.ctx, specs.rows_spec())
    whole = n_rows * row <= rc.binding_cap(lim)
    groups = [list(range(n_rows))] if whole else [[i] for i in range(n_rows)]
    for grp in groups:
        pairs = np.asarray([(j, j) for j in range(len(grp))], dtype=np.uint32).reshape(-1)
        table = ws.constant(pairs)
        b_src, o_src = ws.bind(src, src_base, grp[0] * row, len(grp) * row)
        b_dst, o_dst = ws.bind(dst, 0, grp[0] * row, len(grp) * row)
        gx, gy = grid(-(-len(grp) * row // specs.FLAT_WG), lim)
        push = dict(L=row, n_pairs=len(grp), gx=gx, o_src=o_src, o_dst=o_dst)
        seq.dispatch(k, [b_src, b_dst, (table, 0, pairs.nbytes)], specs.pack_push(specs.ROWS_PUSH, push), (gx, gy, 1))


def backward_windows(seq, call, d, st, lam, dAp, bufs, rows) -> None:
    """Checkpoint pass, backward pass and partial reduction for every window of ``call``'s plan,
    for a problem of dims ``d``, in the order the carries need: whole-sequence windows one after
    another; token windows of one sequence forward in time for the checkpoints, then backward in
    time. ``st``: the initial states (overwritten), ``lam``: dL/dstate after the last token (then
    a_0 lam_0), ``dAp``: the d_A accumulators (zeroed). ``rows``: common.cache_rows's (the checkpoint
    pass reads the initial states from s[ids]) or None (they are in ``st``)."""
    ctx, pl, lim = call.ctx, call.plan, call.limits
    lay = pl.layout
    hp = lay.partial_heads(d.H)
    row = d.H * d.P * d.N
    KA = d.N if d.mamba1 else 1
    fwd_k = kernel(ctx, seqk.fwd_spec(d, lay, checkpoint=True, softplus=pl.softplus))
    snap = pl.snap and bufs.get("g_snapshots") is not None   # (time chunks' walk back: never)
    bwd_k = kernel(ctx, seqk.bwd_spec(d, lay, pl.softplus, snap=snap))
    x, dt, A, B, C, gy = (bufs[k] for k in ("x", "dt", "A", "B", "C", "g_y"))
    wmax = max(pl.windows, key=lambda w: w.S * w.T)
    nc_max = max(-(-w.T // lay.K) for w in pl.windows)
    sw_max = max(w.S for w in pl.windows)
    part = call.scratch(wmax.S * wmax.T * hp * lay.NPB * d.N)
    partC = call.scratch(wmax.S * wmax.T * hp * lay.NPB * d.N)
    partT = call.scratch(wmax.S * wmax.T * d.H * lay.NPB)
    ck_elems = sw_max * row * nc_max
    names = {"x": "o_x", "dt": "o_dt", "B": "o_B", "C": "o_C", "gy": "o_gy", "dx": "o_dx"}
    profile = call.profile and ctx.info.timestamps

    def stamp(w: Window, name: str) -> None:     # SSM_VK_PROFILE: the first window's passes
        if profile and w is pl.windows[0]:
            seq.timestamp(name)

    def tok_arrays():
        return {"x": (*x, d.H * d.P), "dt": (*dt, d.H), "B": (*B, d.G * d.N), "C": (*C, d.G * d.N),
                "gy": (*gy, d.H * d.P), "dx": (*bufs["d_x"], d.H * d.P)}

    def window(w: Window, carry, ck):
        """What both passes bind for window ``w``: grid, token arrays, A, the carried rows
        (states or lam) and the checkpoints."""
        gx, gyy = grid(w.S * lay.NHB * lay.NPB, lim)
        b, o = seq_bindings(call, d, w, tok_arrays(), names)
        b["A"], o["o_A"] = call.bind(*A, 0, d.H * KA)
        b["carry"], o_carry = call.bind(carry, 0, w.i0 * row, w.S * row)
        nc = -(-w.T // lay.K)
        b["ck"], o["o_ck"] = call.bind(ck, 0, 0, w.S * row * nc)
        return gx, gyy, b, o, o_carry, nc

    def ckpt_pass(w: Window, ck) -> None:
        gx, gyy, b, o, o_st, nc = window(w, st, ck)
        bA, bst, bck, o_ck = b["A"], b["carry"], b["ck"], o["o_ck"]
        b_s, b_ids, o_rows = _rows_binding(call, rows, w)
        push = {**_window_push(d, lay, w, gx), "NC": nc, "c0": 0, "o_x": o["o_x"], "o_dt": o["o_dt"],
                "o_B": o["o_B"], "o_C": o["o_C"], "o_y": 0, "o_st": o_st, "o_ck": o_ck, **o_rows, "scatter": 0,
                "o_A": o["o_A"]}
        dum = call.bind(None, 0, 0, 0)[0]
        seq.dispatch(fwd_k, [b["x"], b["dt"], bA, b["B"], b["C"], dum, bst, bck, b_s, b_ids],
                     specs.pack_push(seqk.FWD_PUSH, push), (gx, gyy, 1))
        seq.barrier()
        stamp(w, "checkpoints")

    def back_pass(w: Window, ck) -> None:
        gx, gyy, b, o, o_lam, nc = window(w, lam, ck)
        bA, blam, bck = b["A"], b["carry"], b["ck"]
        n_part = w.S * w.T * d.H * lay.NPB
        n_bc = w.S * w.T * hp * lay.NPB * d.N
        bdA, o_dA = call.bind(dAp, 0, w.i0 * d.H * d.P * KA, w.S * d.H * d.P * KA)
        push = {**_window_push(d, lay, w, gx), "NC": nc, "c0": 0, **o, "o_lam": o_lam, "o_dA": o_dA}
        bindings = [b["x"], b["dt"], bA, b["B"], b["C"], b["gy"], blam, bck, b["dx"],
                    call.bind(part, 0, 0, n_bc)[0], call.bind(partC, 0, 0, n_bc)[0],
                    call.bind(partT, 0, 0, n_part)[0], bdA]
        if snap:
            b_gsn, snap_push = _snap_binding(call, d, w, bufs["g_snapshots"])
            bindings.append(b_gsn)
            push.update(snap_push)
        seq.dispatch(bwd_k, bindings, specs.pack_push(_bwd_push(snap), push), (gx, gyy, 1))
        seq.barrier()
        stamp(w, "back")
        reduce_partials(seq, call, d, w, lay.NPB, (call.bind(part, 0, 0, n_bc)[0], call.bind(partC, 0, 0, n_bc)[0],
                                                   call.bind(partT, 0, 0, n_part)[0]), bufs, d.H // hp)
        seq.barrier()
        stamp(w, "partials")

    if not pl.time_split:
        ck = call.scratch(ck_elems)
        for w in pl.windows:
            ckpt_pass(w, ck)
            back_pass(w, ck)
        return
    # Token windows, each sequence's in turn: the checkpoint pass forward in time, then the walk
    # back. The last windows keep their own checkpoints until their walk back (as many as the plan
    # keeps); each of the first ``R`` keeps its starting state (st's row of sequence i as it
    # begins; pl.starts_per of them to a buffer) and has its checkpoints computed again from it,
    # into the first kept window's buffer (free by then), just before its walk back.
    R, per = pl.recompute, pl.starts_per
    per_seq = [w for w in pl.windows if w.i0 == 0]
    cks = [call.scratch(ck_elems) for _ in range(max(1, len(per_seq) - R))]
    starts = [call.scratch(min(per, R - k) * row) for k in range(0, R, per)]
    nb = row * F32
    for i in range(d.S):
        wins = [w for w in pl.windows if w.i0 == i]
        for k, w in enumerate(wins):
            if k < R and nb:
                seq.copy(st, starts[k // per], nb, i * nb, (k % per) * nb)
                seq.barrier()
            ckpt_pass(w, cks[max(0, k - R)])
        for k in reversed(range(len(wins))):
            if k < R:
                if nb:
                    seq.copy(starts[k // per], st, nb, (k % per) * nb, i * nb)
                    seq.barrier()
                ckpt_pass(wins[k], cks[0])
            back_pass(wins[k], cks[max(0, k - R)])


