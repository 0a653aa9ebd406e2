"""Recording the scan's commands: the window loop, dispatches, barriers, copies.

Each function records into a runtime Sequence for one problem shape, on buffers already resolved
by ssm_vk.launch (inputs uploaded or device-resident, outputs allocated). ``ws`` (a
workspace.Workspace) supplies the plan, the limits, persistent scratch buffers and aligned bindings.
Recording happens once per shape and set of buffers; the sequence is then replayed.
"""

from __future__ import annotations

import numpy as np

from ssm_ref import Problem

from . import runtime as rt
from . import specs
from .plan import Limits, Plan, Window, grid
from .runtime import shaders

__all__ = ["record_forward", "record_backward", "kernels_needed", "missing_spirv", "choose_plan", "choose_plan_why",
           "F32"]

F32 = 4


def kernels_needed(d, pl: Plan, backward: bool) -> list[specs.KernelSpec]:
    """The kernels the recording of a problem of dims ``d`` may dispatch (what ``_kernel`` below
    is asked for; the d_s scatter's counted whenever ids could repeat), so that
    ssm_vk.supports() can tell, before any work, whether their SPIR-V can be had."""
    if pl.chunked is not None:
        # the chunked kernels, and the sequential ones that recompute a call with inf or nan
        from dataclasses import replace

        from .record_chunked import chunk_kernels

        return chunk_kernels(d, pl.chunked, backward) + kernels_needed(d, replace(pl, chunked=None), backward)
    if not (pl.windows and d.H * d.P > 0):
        kernels = []
    elif not backward:
        return [specs.fwd_spec(d, pl.layout, checkpoint=False)]
    else:
        kernels = [specs.fwd_spec(d, pl.layout, checkpoint=True), specs.bwd_spec(d, pl.layout), specs.reduce_spec(0)]
        if d.H * d.P * (d.N if d.mamba1 else 1):
            kernels.append(specs.reduce_spec(1))
    if backward and d.R * d.H * d.P * d.N and d.S > 1:
        kernels.append(specs.rows_spec())  # ids may repeat: rows added by the scatter kernel
    return kernels


def choose_plan(ctx, d, lim: Limits, backward: bool, chunked: bool = True) -> Plan:
    """The plan a call runs: plan.plan's, without the chunked kernels when ``chunked`` is False
    or their SPIR-V cannot be had here (no glslc and none packaged or cached: the token-
    sequential kernels, which a wheel packages, run the shape instead)."""
    return choose_plan_why(ctx, d, lim, backward, chunked)[0]


def choose_plan_why(ctx, d, lim: Limits, backward: bool, chunked: bool = True) -> tuple[Plan, str]:
    """(:func:`choose_plan`'s plan, why it left out the chunked kernels that plan.plan picked for
    the shape: the reason their SPIR-V cannot be had; "" when it did not)."""
    from dataclasses import replace

    from .plan import plan
    from .record_chunked import chunk_kernels

    pl = plan(d, lim, backward=backward)
    if pl.chunked is None:
        return pl, ""
    why = "" if not chunked else missing_spirv(ctx, chunk_kernels(d, pl.chunked, backward))
    if not chunked or why:
        pl = replace(pl, chunked=None)
    return pl, why


def _zero(seq, buf, n_elems: int) -> None:
    if buf is not None and n_elems > 0:
        seq.fill(buf, 0, 0, n_elems * F32)


def _zero_at(seq, buf, off: int, n_elems: int) -> None:
    if buf is not None and n_elems > 0:
        seq.fill(buf, 0, off * F32, n_elems * F32)


def _kernel_args(spec: specs.KernelSpec) -> dict:
    return dict(bindings=spec.n_bindings, push_size=spec.push_size, local_size=(spec.wg, 1, 1),
                defines=dict(spec.defines))


def _kernel(ctx, spec: specs.KernelSpec) -> rt.Kernel:
    return rt.Kernel.get(ctx, spec.name, **_kernel_args(spec))


def missing_spirv(ctx, kernels: list[specs.KernelSpec]) -> str:
    """Why one of ``kernels`` could not be built on ``ctx`` (no glslc, no packaged or cached
    SPIR-V), or "": kernels the context already holds need nothing."""
    for spec in kernels:
        if rt.Kernel.cached(ctx, spec.name, **_kernel_args(spec)) is None:
            why = shaders.unavailable(spec.name, dict(spec.defines))
            if why:
                return why
    return ""


def _gather_rows(seq, call, src, src_base, dst, dst_base, ids, row_elems) -> None:
    """dst[i] = src[ids[i]] for every sequence i, by copy commands."""
    if row_elems == 0:
        return
    nb = row_elems * F32
    for i, r in enumerate(ids):
        seq.copy(src, dst, nb, (src_base + int(r) * row_elems) * F32, (dst_base + i * row_elems) * F32)


def _window_push(d, lay, w: Window, gx: int) -> dict:
    return dict(S=w.S, T=w.T, H=d.H, P=d.P, N=d.N, G=d.G, HB=lay.HB, PB=lay.PB, NHB=lay.NHB,
                NPB=lay.NPB, gx=gx)


def _seq_bindings(call, d, w: Window, arrays: dict, names_tok: dict) -> tuple[dict, dict]:
    """Bindings and residual offsets of the (S, T, ...) arrays of a window."""
    binds, offs = {}, {}
    for key, (buf, base, per_tok) in arrays.items():
        start = (w.i0 * d.T + w.t0) * per_tok
        binds[key], offs[names_tok[key]] = call.bind(buf, base, start, w.S * w.T * per_tok)
    return binds, offs


def record_forward(seq, ws, p: Problem, bufs: dict) -> None:
    """Record the forward: states <- s[ids]; the scan over every window. ``bufs`` maps s, x, dt,
    A, B, C, y, states to (buffer or None, element offset)."""
    if ws.plan.chunked is not None:
        from .record_chunked import record_forward_chunked

        return record_forward_chunked(seq, ws, p, bufs)
    d = p.dims
    lim, pl = ws.limits, ws.plan
    lay = pl.layout
    row = d.H * d.P * d.N
    KA = d.N if d.mamba1 else 1
    ctx = ws.ctx
    st_buf, st_off = bufs["states"]
    _gather_rows(seq, ws, *bufs["s"], st_buf, st_off, p.ids, row)
    seq.barrier()
    if not (pl.windows and d.H * d.P > 0):
        return
    x, dt, A, B, C = (bufs[k] for k in ("x", "dt", "A", "B", "C"))
    k = _kernel(ctx, specs.fwd_spec(d, lay, checkpoint=False))
    for w in pl.windows:
        gx, gy = grid(w.S * lay.NHB * lay.NPB, lim)
        tok = {"x": (*x, d.H * d.P), "dt": (*dt, d.H), "B": (*B, d.G * d.N), "C": (*C, d.G * d.N),
               "y": (*bufs["y"], d.H * d.P)}
        b, o = _seq_bindings(ws, d, w, tok, {"x": "o_x", "dt": "o_dt", "B": "o_B", "C": "o_C", "y": "o_y"})
        b["A"], _ = ws.bind(*A, 0, d.H * KA)
        b["st"], o["o_st"] = ws.bind(st_buf, st_off, w.i0 * row, w.S * row)
        b["ck"], o["o_ck"] = ws.bind(None, 0, 0, 0)
        push = {**_window_push(d, lay, w, gx), "NC": 1, "c0": 0, **o}
        seq.dispatch(k, [b["x"], b["dt"], b["A"], b["B"], b["C"], b["y"], b["st"], b["ck"]],
                     specs.pack_push(specs.FWD_PUSH, push), (gx, gy, 1))
        seq.barrier()


def record_backward(seq, ws, p: Problem, bufs: dict) -> None:
    """Record the backward. ``bufs`` maps the inputs (s, x, dt, A, B, C, g_y, g_states) and the
    outputs (d_s, d_s0, d_x, d_dt, d_A, d_B, d_C) to (buffer or None, element offset)."""
    if ws.plan.chunked is not None:
        from .record_chunked import record_backward_chunked

        return record_backward_chunked(seq, ws, p, bufs)
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
    if not (pl.windows and d.H * d.P > 0):
        for name in ("d_x", "d_dt", "d_A", "d_B", "d_C"):
            _zero_at(seq, *bufs[name], ws.sizes[name])
    else:
        st = ws.scratch(d.S * row)          # running state of the checkpoint pass
        _gather_rows(seq, ws, *bufs["s"], st, 0, p.ids, row)
        dAp = ws.scratch(d.S * d.H * d.P * KA)
        _zero(seq, dAp, d.S * d.H * d.P * KA)
        seq.barrier()
        _backward_windows(ctx, seq, ws, p, pl, lim, st, lam, dAp, bufs)
        reduce_dA(seq, ws, p, dAp, bufs["d_A"], rows=d.P, KA=KA)
    seq.barrier()
    _scatter_rows(ctx, seq, ws, lim, lam, bufs["d_s"], p.ids, row, d.R)


def _backward_windows(ctx, seq, call, p: Problem, pl: Plan, lim: Limits, st, lam, dAp, bufs) -> None:
    """Checkpoint pass, backward pass and partial reduction for every window, in the order the
    carries need: whole-sequence windows one after another; token windows of one sequence
    forward in time for the checkpoints, then backward in time."""
    d, lay = p.dims, pl.layout
    row = d.H * d.P * d.N
    KA = d.N if d.mamba1 else 1
    fwd_k = _kernel(ctx, specs.fwd_spec(d, lay, checkpoint=True))
    bwd_k = _kernel(ctx, specs.bwd_spec(d, lay))
    x, dt, A, B, C, gy = (bufs[k] for k in ("x", "dt", "A", "B", "C", "g_y"))
    wmax = max(pl.windows, key=lambda w: w.S * w.T)
    nc_max = max(-(-w.T // lay.K) for w in pl.windows)
    sw_max = max(w.S for w in pl.windows)
    part = call.scratch(wmax.S * wmax.T * d.H * lay.NPB * d.N)
    partC = call.scratch(wmax.S * wmax.T * d.H * lay.NPB * d.N)
    partT = call.scratch(wmax.S * wmax.T * d.H * lay.NPB)
    ck_elems = sw_max * row * nc_max
    names = {"x": "o_x", "dt": "o_dt", "B": "o_B", "C": "o_C", "gy": "o_gy", "dx": "o_dx"}

    def tok_arrays():
        return {"x": (*x, d.H * d.P), "dt": (*dt, d.H), "B": (*B, d.G * d.N), "C": (*C, d.G * d.N),
                "gy": (*gy, d.H * d.P), "dx": (*bufs["d_x"], d.H * d.P)}

    def window(w: Window, carry, ck):
        """What both passes bind for window ``w``: grid, token arrays, A, the carried rows
        (states or lam) and the checkpoints."""
        gx, gyy = grid(w.S * lay.NHB * lay.NPB, lim)
        b, o = _seq_bindings(call, d, w, tok_arrays(), names)
        b["A"], _ = call.bind(*A, 0, d.H * KA)
        b["carry"], o_carry = call.bind(carry, 0, w.i0 * row, w.S * row)
        nc = -(-w.T // lay.K)
        b["ck"], o["o_ck"] = call.bind(ck, 0, 0, w.S * row * nc)
        return gx, gyy, b, o, o_carry, nc

    def ckpt_pass(w: Window, ck) -> None:
        gx, gyy, b, o, o_st, nc = window(w, st, ck)
        bA, bst, bck, o_ck = b["A"], b["carry"], b["ck"], o["o_ck"]
        push = {**_window_push(d, lay, w, gx), "NC": nc, "c0": 0, "o_x": o["o_x"], "o_dt": o["o_dt"],
                "o_B": o["o_B"], "o_C": o["o_C"], "o_y": 0, "o_st": o_st, "o_ck": o_ck}
        dum = call.bind(None, 0, 0, 0)[0]
        seq.dispatch(fwd_k, [b["x"], b["dt"], bA, b["B"], b["C"], dum, bst, bck],
                     specs.pack_push(specs.FWD_PUSH, push), (gx, gyy, 1))
        seq.barrier()

    def back_pass(w: Window, ck) -> None:
        gx, gyy, b, o, o_lam, nc = window(w, lam, ck)
        bA, blam, bck = b["A"], b["carry"], b["ck"]
        n_part = w.S * w.T * d.H * lay.NPB
        bdA, o_dA = call.bind(dAp, 0, w.i0 * d.H * d.P * KA, w.S * d.H * d.P * KA)
        push = {**_window_push(d, lay, w, gx), "NC": nc, "c0": 0, **o, "o_lam": o_lam, "o_dA": o_dA}
        seq.dispatch(bwd_k, [b["x"], b["dt"], bA, b["B"], b["C"], b["gy"], blam, bck, b["dx"],
                             call.bind(part, 0, 0, n_part * d.N)[0], call.bind(partC, 0, 0, n_part * d.N)[0],
                             call.bind(partT, 0, 0, n_part)[0], bdA],
                     specs.pack_push(specs.BWD_PUSH, push), (gx, gyy, 1))
        seq.barrier()
        reduce_partials(seq, call, d, w, lay.NPB, (call.bind(part, 0, 0, n_part * d.N)[0],
                                                   call.bind(partC, 0, 0, n_part * d.N)[0],
                                                   call.bind(partT, 0, 0, n_part)[0]), bufs)
        seq.barrier()

    if not pl.time_split:
        ck = call.scratch(ck_elems)
        for w in pl.windows:
            ckpt_pass(w, ck)
            back_pass(w, ck)
        return
    # Token windows: each sequence's windows keep their own checkpoints until the walk back.
    per_seq = [w for w in pl.windows if w.i0 == 0]
    cks = [call.scratch(ck_elems) for _ in per_seq]
    for i in range(d.S):
        wins = [w for w in pl.windows if w.i0 == i]
        for w, ck in zip(wins, cks, strict=True):
            ckpt_pass(w, ck)
        for w, ck in reversed(list(zip(wins, cks, strict=True))):
            back_pass(w, ck)


def _cap_elems(lim: Limits) -> int:
    """Most float32 elements one binding may cover (offset slack included)."""
    return (lim.max_storage_buffer_range - lim.min_storage_buffer_offset_alignment) // F32


def reduce_partials(seq, call, d, w: Window, npb: int, parts: tuple, bufs: dict) -> None:
    """Fixed-order sums of a window's partials (bindings of d_B and d_C parts (S, T, H, npb, N) and
    d_dt parts (S, T, H, npb)) into d_B, d_C (over each group's heads, then the blocks) and d_dt."""
    n_out = max(w.S * w.T * d.G * d.N, w.S * w.T * d.H)
    gx, gy = grid(-(-n_out // specs.FLAT_WG), call.limits)
    out_tok = {"dB": (*bufs["d_B"], d.G * d.N), "dC": (*bufs["d_C"], d.G * d.N), "ddt": (*bufs["d_dt"], d.H)}
    b2, o2 = _seq_bindings(call, d, w, out_tok, {"dB": "o_3", "dC": "o_4", "ddt": "o_5"})
    push = dict(S=w.S, T=w.T, H=d.H, P=d.P, N=d.N, G=d.G, NPB=npb, KA=1, gx=gx, o_0=0, **o2, acc=0)
    seq.dispatch(_kernel(call.ctx, specs.reduce_spec(0)), [*parts, b2["dB"], b2["dC"], b2["ddt"]],
                 specs.pack_push(specs.RED_PUSH, push), (gx, gy, 1))


def reduce_dA(seq, call, p: Problem, dAp, dA_at, rows: int, KA: int) -> None:
    """d_A (H, KA) = the accumulators dAp (S, H, rows, KA) summed over sequences (outer) and rows
    (channels for the sequential kernels, chunks for the chunked ones), in windows of sequences
    that fit a binding (added in sequence order)."""
    d = p.dims
    per_seq = d.H * rows * KA
    dA, dA_off = dA_at
    if per_seq == 0:
        _zero_at(seq, dA, dA_off, d.H * KA)
        return
    k = _kernel(call.ctx, specs.reduce_spec(1))
    step = max(1, _cap_elems(call.limits) // per_seq)
    gx, gy = grid(-(-(d.H * KA) // specs.FLAT_WG), call.limits)
    dum = call.bind(None, 0, 0, 0)[0]
    bA, o3 = call.bind(dA, dA_off, 0, d.H * KA)
    for i0 in range(0, d.S, step):
        n = min(step, d.S - i0)
        bsrc, o0 = call.bind(dAp, 0, i0 * per_seq, n * per_seq)
        push = dict(S=n, T=d.T, H=d.H, P=rows, N=d.N, G=d.G, NPB=1, KA=KA, gx=gx, o_0=o0, o_3=o3, o_4=0, o_5=0,
                    acc=int(i0 > 0))
        seq.dispatch(k, [bsrc, dum, dum, bA, dum, dum], specs.pack_push(specs.RED_PUSH, push), (gx, gy, 1))
        seq.barrier()


MAX_FILLS = 8   # separate fills of unread cache rows before one fill of all d_s is recorded instead


def _runs(rows: list) -> list[tuple[int, int]]:
    """(first, count) of each run of consecutive values in sorted ``rows``."""
    out: list = []
    for r in rows:
        if out and out[-1][0] + out[-1][1] == r:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((r, 1))
    return out


def _scatter_rows(ctx, seq, call, lim, d_s0, d_s_at, ids, row: int, R: int) -> None:
    """d_s = rows of d_s0 scatter-added by ids, in sequence order (as ssm_ref.scatter_rows)."""
    d_s, ds_off = d_s_at
    if d_s is None:
        return
    assert ds_off == 0, "outputs own their buffers"
    if row == 0:
        return
    seen: dict[int, int] = {}
    layers: list[list[tuple[int, int]]] = []
    firsts = []
    for i, r in enumerate(int(v) for v in ids):
        k = seen.get(r, 0)
        seen[r] = k + 1
        if k == 0:
            firsts.append((r, i))
        else:
            while len(layers) < k:
                layers.append([])
            layers[k - 1].append((r, i))
    # The rows no sequence reads are zeroed, the first sequence of each row copied in (runs of
    # consecutive rows and sequences as one copy); these regions are disjoint, so no barrier
    # between them. Many scattered unread rows: one fill of everything first.
    gaps = _runs(sorted(set(range(R)) - seen.keys()) if len(seen) < R else [])
    if len(gaps) > MAX_FILLS:
        _zero(seq, d_s, R * row)
        seq.barrier()
    else:
        for r0, n in gaps:
            _zero_at(seq, d_s, r0 * row, n * row)
    i0 = r0 = n = 0
    for r, i in [*sorted(firsts, key=lambda ri: ri[1]), (-2, -2)]:
        if n and r == r0 + n and i == i0 + n:
            n += 1
            continue
        if n:
            seq.copy(d_s0, d_s, n * row * F32, i0 * row * F32, r0 * row * F32)
        r0, i0, n = r, i, 1
    if not layers:
        return
    k = _kernel(ctx, specs.rows_spec())
    cap = _cap_elems(lim)
    whole = max(len(ids), R) * row <= cap
    if not whole and row > cap:
        raise ValueError(f"a state row of {row} floats exceeds the device's storage-buffer range")
    for pairs in layers:
        seq.barrier()
        groups = [pairs] if whole else [[pr] for pr in pairs]
        for grp in groups:
            if whole:
                src, o_src = call.bind(d_s0, 0, 0, len(ids) * row)
                dst, o_dst = call.bind(d_s, 0, 0, R * row)
                arr = np.asarray(grp, dtype=np.uint32).reshape(-1)
            else:  # one pair, each row bound on its own
                (r, i), = grp
                src, o_src = call.bind(d_s0, 0, i * row, row)
                dst, o_dst = call.bind(d_s, 0, r * row, row)
                arr = np.zeros(2, dtype=np.uint32)
            pbuf = call.constant(arr)
            n = len(grp) * row
            gx, gy = grid(-(-n // specs.FLAT_WG), lim)
            push = dict(L=row, n_pairs=len(grp), gx=gx, o_src=o_src, o_dst=o_dst)
            seq.dispatch(k, [src, dst, (pbuf, 0, arr.nbytes)], specs.pack_push(specs.ROWS_PUSH, push), (gx, gy, 1))
