"""Recording the Mamba-1 kernels with time in a workgroup's threads (ws.plan: an M1Plan; the kernels:
ssm_vk/m1/glsl/m1_scan.comp and m1_scan_back.comp).

The forward: the summary pass (each slice's part of the state, composed in the workgroup into
what the final pass starts each slice from); over time chunks (NCH > 1) the carry
(ssm_scan_carry.comp) of the chunks' contributions into every chunk's initial state and the final
states; the final pass (y). With one chunk, summary and final pass are one dispatch (MODE 2), which
writes the final states too.

The backward: over time chunks, the summary with the adjoint and both carries (every chunk's
initial state, every chunk's adjoint at its end, d_s0); the backward pass (d_x, d_dt, d_B and
d_C per channel block, d_A per chunk, and with NCH = 1 d_s0); the fixed-order sums of the
partials (ssm_scan_reduce.comp); d_s from d_s0.

Every pass raises the non-finite flag on inf or nan (the host then recomputes the call token by
token: run.py), and on subgroups other than the plan's.
"""

from __future__ import annotations

from ssm_ref import Problem

from .. import kernel_specs as specs
from ..recording import (
    F32,
    cache_rows,
    carry,
    flag_end,
    flag_start,
    gather_rows,
    kernel,
    reduce_dA,
    reduce_partials,
    scatter_rows,
)
from ..sizing import FLAG_ELEMS, Window, grid
from . import m1_specs as m1k
from .m1_planner import m1_scratch

__all__ = ["record_forward", "record_backward"]


# m1_scan.comp's bindings, in order (its header); a pass binds what it uses, stand-ins the rest.
SCAN_BINDINGS = ("x", "dt", "A", "B", "C", "gy", "y", "init", "agg", "cb", "cdec", "cbl", "s", "ids", "flag")


def _inputs(ws, d, bufs: dict, names: tuple) -> tuple[dict, dict]:
    """Bindings of whole input / output arrays and their element offsets (the push constants o_*)."""
    per = {"x": d.H, "dt": d.H, "y": d.H, "g_y": d.H, "d_x": d.H, "d_dt": d.H, "B": d.G * d.N, "C": d.G * d.N}
    b, o = {}, {}
    for k in names:
        n = d.H * d.N if k == "A" else d.S * d.T * per[k]
        b[k], o[k] = ws.bind(*bufs[k], 0, n)
    return b, o


def _scan(seq, ws, spec, d, mp, ti: int, o: dict, bindings: dict, **push) -> None:
    """One m1_scan.comp pass over every (sequence, chunk, channel block): ``bindings`` by name
    (SCAN_BINDINGS), ``o`` the inputs' offsets, ``push`` the rest of its push constants (0 unless
    given)."""
    gx, gy = grid(mp.groups(d), ws.limits)
    values = dict.fromkeys(m1k.M1_PUSH, 0)
    values.update(S=d.S, T=d.T, H=d.H, G=d.G, NCH=mp.NCH, NRB=mp.NRB, gx=gx, TI=ti,
                  **{f"o_{k}": o[k] for k in ("x", "dt", "A", "B", "C")}, **push)
    dummy = ws.bind(None, 0, 0, 0)[0]
    seq.dispatch(kernel(ws.ctx, spec), [bindings.get(k, dummy) for k in SCAN_BINDINGS],
                 specs.pack_push(m1k.M1_PUSH, values), (gx, gy, 1))


def record_forward(seq, ws, p: Problem, bufs: dict, scatter: bool = False) -> None:
    """Record the forward; ``bufs`` maps s, x, dt, A, B, C, y, states to (buffer or None, element
    offset). ``scatter``: never (the final states are copied into the cache rows after it)."""
    d = p.dims
    mp = ws.plan
    sp = mp.softplus
    sizes = m1_scratch(d, mp, False, sp)
    flag = flag_start(seq, ws)
    agg, cb, cdec = (ws.scratch(sizes[k]) if k in sizes else None for k in ("agg", "cb", "cdec"))
    step = ws.scratch(sizes["step"]) if "step" in sizes else None
    row = d.H * d.N
    st_buf, st_off = bufs["states"]
    rows = cache_rows(ws, p, bufs["s"])
    if rows is None:
        gather_rows(seq, ws, *bufs["s"], st_buf, st_off, p.ids, row)
    seq.barrier()
    b, o = _inputs(ws, d, bufs, ("x", "dt", "A", "B", "C", "y"))
    chunks = d.S * mp.NCH * row
    b["flag"] = ws.bind(flag, 0, 0, FLAG_ELEMS)[0]
    keep = {"keep_step": 1} if step is not None else {}
    if step is not None:
        b["gy"] = ws.bind(step, 0, 0, d.S * d.T * d.H)[0]     # binding 5: the kept steps
    final = dict(keep, o_y=o["y"])
    if mp.NCH == 1:                                           # one pass
        b["init"], final["o_init"] = ws.bind(st_buf, st_off, 0, d.S * row)
        final["final_state"] = 1
        if rows is not None:
            (b["s"], final["o_s"]), ids_buf = rows
            b["ids"], final["gather"] = (ids_buf, 0, ids_buf.size), 1
        _scan(seq, ws, m1k.m1_spec(d, mp, 2, softplus=sp), d, mp, mp.TI, o, b, **final)
        flag_end(seq, ws, flag)
        return
    b["agg"] = ws.bind(agg, 0, 0, sizes["agg"])[0]
    summary = {k: b[k] for k in ("x", "dt", "A", "B", "C", "gy", "agg", "flag") if k in b}
    summary.update(cb=ws.bind(cb, 0, 0, chunks)[0], cdec=ws.bind(cdec, 0, 0, chunks)[0])
    _scan(seq, ws, m1k.m1_spec(d, mp, 0, softplus=sp), d, mp, mp.TI, o, summary, **keep)
    seq.barrier()
    if ws.profile and ws.ctx.info.timestamps:
        seq.timestamp("summary")
    carry(seq, ws, d, mp.NCH, cdec, cb, (st_buf, st_off), rows, flag, reverse=False)
    seq.barrier()
    if ws.profile and ws.ctx.info.timestamps:
        seq.timestamp("carry")
    b["init"], final["o_init"] = ws.bind(cb, 0, 0, chunks)
    _scan(seq, ws, m1k.m1_spec(d, mp, 1, softplus=sp), d, mp, mp.TI, o, b, **final)
    flag_end(seq, ws, flag)


def record_backward(seq, ws, p: Problem, bufs: dict, kept=None) -> None:
    """Record the backward; ``bufs`` maps the inputs (s .. g_states) and the outputs (d_s .. d_C)."""
    d = p.dims
    mp, lim = ws.plan, ws.limits
    sp = mp.softplus
    sizes = m1_scratch(d, mp, True)
    row = d.H * d.N
    chunks = d.S * mp.NCH * row
    flag = flag_start(seq, ws)
    b_flag = ws.bind(flag, 0, 0, FLAG_ELEMS)[0]
    st = ws.scratch(sizes["st"])
    cb, cdec, cbl = ((ws.scratch(sizes["cb"]), ws.scratch(sizes["cdec"]), ws.scratch(sizes["cbl"])) if mp.NCH > 1
                     else (None, None, None))
    part_B, part_C, dAp = ws.scratch(sizes["part_B"]), ws.scratch(sizes["part_C"]), ws.scratch(sizes["dAp"])
    lam, lam_off = bufs["d_s0"]            # g_states, then d_s0
    assert lam_off == 0 or lam is None
    gs_buf, gs_off = bufs["g_states"]
    seq.copy(gs_buf, lam, d.S * row * F32, gs_off * F32, 0)
    rows = cache_rows(ws, p, bufs["s"])
    if rows is None:
        gather_rows(seq, ws, *bufs["s"], st, 0, p.ids, row)
    seq.barrier()
    dummy = ws.bind(None, 0, 0, 0)[0]
    b, o = _inputs(ws, d, bufs, ("x", "dt", "A", "B", "C", "g_y", "d_x", "d_dt"))
    profile = ws.profile and ws.ctx.info.timestamps
    b_s = b_ids = dummy
    gather = o_s = 0
    if mp.NCH > 1:
        sp_plan = mp.summary()
        summary = {k: b[k] for k in ("x", "dt", "A", "B", "C")}
        summary.update(gy=b["g_y"], cb=ws.bind(cb, 0, 0, chunks)[0], cdec=ws.bind(cdec, 0, 0, chunks)[0],
                       cbl=ws.bind(cbl, 0, 0, chunks)[0], flag=b_flag)
        _scan(seq, ws, m1k.m1_spec(d, sp_plan, 0, adjoint=True, softplus=sp), d, mp, sp_plan.TI, o, summary,
              o_gy=o["g_y"])
        seq.barrier()
        if profile:
            seq.timestamp("summary")
        carry(seq, ws, d, mp.NCH, cdec, cb, (st, 0), rows, flag, reverse=False)
        carry(seq, ws, d, mp.NCH, cdec, cbl, (lam, 0), None, flag, reverse=True)
        seq.barrier()
        if profile:
            seq.timestamp("carries")
        (b_init, o_init), (b_adj, o_adj) = ws.bind(cb, 0, 0, chunks), ws.bind(cbl, 0, 0, chunks)
    else:
        (b_init, o_init), (b_adj, o_adj) = ws.bind(st, 0, 0, d.S * row), ws.bind(lam, 0, 0, d.S * row)
        if rows is not None:
            (b_s, o_s), ids_buf = rows
            b_ids, gather = (ids_buf, 0, ids_buf.size), 1
    n_part = sizes["part_B"]
    parts = (ws.bind(part_B, 0, 0, n_part)[0], ws.bind(part_C, 0, 0, n_part)[0])
    gx, gy = grid(mp.groups(d), lim)
    push = dict(S=d.S, T=d.T, H=d.H, G=d.G, NCH=mp.NCH, NRB=mp.NRB, gx=gx, o_x=o["x"], o_dt=o["dt"], o_A=o["A"],
                o_B=o["B"], o_C=o["C"], o_gy=o["g_y"], o_init=o_init, o_adj=o_adj, o_dx=o["d_x"], o_ddt=o["d_dt"],
                gather=gather, o_s=o_s, o_ids=0)
    seq.dispatch(kernel(ws.ctx, m1k.m1_back_spec(d, mp, sp)),
                 [b["x"], b["dt"], b["A"], b["B"], b["C"], b["g_y"], b_init, b_adj, b_s, b_ids, b["d_x"], b["d_dt"],
                  *parts, ws.bind(dAp, 0, 0, sizes["dAp"])[0], b_flag],
                 specs.pack_push(m1k.M1_BACK_PUSH, push), (gx, gy, 1))
    seq.barrier()
    if profile:
        seq.timestamp("back")
    # the sums of the partials, d_A and d_s read what is done and write apart: no barriers between
    reduce_partials(seq, ws, d, Window(0, d.S, 0, d.T), 1, (*parts, dummy), bufs, mp.RW, no_dt=True)
    reduce_dA(seq, ws, d, dAp, bufs["d_A"], rows=mp.NCH, KA=d.N)
    scatter_rows(ws.ctx, seq, ws, lim, lam, bufs["d_s"], p.ids, row, d.R)
    flag_end(seq, ws, flag)
