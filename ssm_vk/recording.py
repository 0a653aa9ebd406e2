"""What the kernel families' recordings share: a context's kernel by spec, bindings of the
per-token arrays of a window, zeroing, the gather of the cache rows, the fixed-order reductions
of partial sums, the d_s scatter, the carry over time chunks and the non-finite flag."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import kernel_specs as specs
from . import runtime as rt
from .sizing import FLAG_ELEMS, Window, binding_cap, grid, rows_in_place

if TYPE_CHECKING:
    from .kernel_specs import KernelSpec

__all__ = ["F32", "kernel", "kernel_cached", "zero", "zero_at", "gather_rows", "seq_bindings", "reduce_partials",
           "reduce_dA", "scatter_rows", "flag_start", "flag_end", "put_rows", "carry", "cache_rows"]

F32 = 4


# -- kernels of a context, by spec (a pipeline of the context, made on first use) -------------

def _kernel_args(spec: KernelSpec) -> dict:
    return dict(bindings=spec.n_bindings, push_size=spec.push_size, local_size=(spec.wg, 1, 1),
                spec=spec.constants, defines=dict(spec.defines))


def kernel_cached(ctx, spec: KernelSpec) -> bool:
    """Whether ``ctx`` holds the kernel of ``spec`` already."""
    return rt.Kernel.cached(ctx, spec.name, **_kernel_args(spec)) is not None


def kernel(ctx, spec: KernelSpec) -> rt.Kernel:
    return rt.Kernel.get(ctx, spec.name, **_kernel_args(spec))



def zero(seq, buf, n_elems: int) -> None:
    if buf is not None and n_elems > 0:
        seq.fill(buf, 0, 0, n_elems * F32)


def zero_at(seq, buf, off: int, n_elems: int) -> None:
    if buf is not None and n_elems > 0:
        seq.fill(buf, 0, off * F32, n_elems * F32)


def flag_start(seq, ws):
    """The non-finite flag: zeroed before the kernels (the barrier that follows covers it)."""
    flag = ws.scratch(FLAG_ELEMS)
    seq.fill(flag, 0, 0, FLAG_ELEMS * F32)
    return flag


def flag_end(seq, ws, flag) -> None:
    """Copy the flag where the host reads it after the wait (workspace.Workspace.nonfinite)."""
    seq.barrier()
    seq.copy(flag, ws.flag_host(), FLAG_ELEMS * F32)


def gather_rows(seq, call, src, src_base, dst, dst_base, ids, row_elems) -> None:
    """dst[i] = src[ids[i]] for every sequence i, by copy commands."""
    if row_elems == 0:
        return
    nb = row_elems * F32
    for i, r in enumerate(ids):
        seq.copy(src, dst, nb, (src_base + int(r) * row_elems) * F32, (dst_base + i * row_elems) * F32)


def put_rows(seq, src, src_base, dst, dst_base, ids, row_elems) -> None:
    """dst[ids[i]] = src[i] for every sequence i, by copy commands (gather_rows the other way; the
    ids distinct, so no row is written twice)."""
    if row_elems == 0:
        return
    nb = row_elems * F32
    for i, r in enumerate(ids):
        seq.copy(src, dst, nb, (src_base + i * row_elems) * F32, (dst_base + int(r) * row_elems) * F32)


def cache_rows(ws, p, s_at: tuple, probe: bool = False):
    """(binding of the whole cache s, the ids as a uint32 constant buffer) when a kernel can read
    each sequence's initial state from s[ids[i]] in place -- s fits one binding -- or None: the
    rows are copied into the carried states first (gather_rows). ``probe``: the answer only
    (True or None; nothing bound, no constant made)."""
    d = p.dims
    s_buf, s_off = s_at
    if s_buf is None or not rows_in_place(d, ws.limits):
        return None
    if probe:
        return True
    return ws.bind(s_buf, s_off, 0, d.R * d.H * d.P * d.N), ws.constant(p.ids.astype(np.uint32))


def seq_bindings(call, d, w: Window, arrays: dict, names_tok: dict) -> tuple[dict, dict]:
    """Bindings and residual offsets of the (S, T, ...) arrays of a window."""
    binds, offs = {}, {}
    for key, (buf, base, per_tok) in arrays.items():
        start = (w.i0 * d.T + w.t0) * per_tok
        binds[key], offs[names_tok[key]] = call.bind(buf, base, start, w.S * w.T * per_tok)
    return binds, offs


def reduce_partials(seq, call, d, w: Window, npb: int, parts: tuple, bufs: dict, hs: int = 1,
                    no_dt: bool = False, hs_c: int | None = None) -> None:
    """Fixed-order sums of a window's partials (bindings of d_B parts (S, T, H / hs, npb, N) -- each
    the sum of ``hs`` heads of a group --, d_C parts (S, T, H / hs_c, npb, N), ``hs_c`` = ``hs``
    unless given, and d_dt parts (S, T, H, npb)) into d_B, d_C (over each group's heads, then the
    blocks) and d_dt; with ``no_dt`` d_dt is not touched (its kernel wrote it whole; the third part
    is a stand-in)."""
    n_out = w.S * w.T * d.G * d.N if no_dt else max(w.S * w.T * d.G * d.N, w.S * w.T * d.H)
    gx, gy = grid(-(-n_out // specs.FLAT_WG), call.limits)
    out_tok = {"dB": (*bufs["d_B"], d.G * d.N), "dC": (*bufs["d_C"], d.G * d.N), "ddt": (*bufs["d_dt"], d.H)}
    b2, o2 = seq_bindings(call, d, w, out_tok, {"dB": "o_3", "dC": "o_4", "ddt": "o_5"})
    push = dict(S=w.S, T=w.T, H=d.H, P=d.P, N=d.N, G=d.G, NPB=npb, KA=1, gx=gx, o_0=0, **o2, acc=0, HS=hs,
                HSC=hs if hs_c is None else hs_c)
    seq.dispatch(kernel(call.ctx, specs.reduce_spec(0, no_dt)), [*parts, b2["dB"], b2["dC"], b2["ddt"]],
                 specs.pack_push(specs.RED_PUSH, push), (gx, gy, 1))


def reduce_dA(seq, call, d, dAp, dA_at, rows: int, KA: int, per_sequence: bool = False) -> None:
    """d_A (H, KA) = the accumulators dAp (S, H, rows, KA) summed over sequences (outer) and rows
    (channels for the sequential kernels, chunks for the chunked ones), in windows of sequences
    that fit a binding (added in sequence order); ``d``: the problem's dims. ``per_sequence`` (the
    invariant mode): each sequence's rows summed first (0 + row 0 + row 1 + ...), then those sums
    in sequence order, sequence 0's taken as it is: d_A is the float32 sum of the sequences' own
    d_A, from first to last, whatever the windows. No barrier after the last dispatch: what reads
    d_A next records one."""
    per_seq = d.H * rows * KA
    dA, dA_off = dA_at
    if per_seq == 0:
        zero_at(seq, dA, dA_off, d.H * KA)
        return
    k = kernel(call.ctx, specs.reduce_spec(1, per_sequence=per_sequence))
    step = max(1, binding_cap(call.limits) // per_seq)
    gx, gy = grid(-(-(d.H * KA) // specs.FLAT_WG), call.limits)
    dum = call.bind(None, 0, 0, 0)[0]
    bA, o3 = call.bind(dA, dA_off, 0, d.H * KA)
    for i0 in range(0, d.S, step):
        if i0:
            seq.barrier()              # the window before added in
        n = min(step, d.S - i0)
        bsrc, o0 = call.bind(dAp, 0, i0 * per_seq, n * per_seq)
        push = dict(S=n, T=d.T, H=d.H, P=rows, N=d.N, G=d.G, NPB=1, KA=KA, gx=gx, o_0=o0, o_3=o3, o_4=0, o_5=0,
                    acc=int(i0 > 0), HS=1, HSC=1)
        seq.dispatch(k, [bsrc, dum, dum, bA, dum, dum], specs.pack_push(specs.RED_PUSH, push), (gx, gy, 1))


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


def scatter_rows(ctx, seq, call, lim, d_s0, d_s_at, ids, row: int, R: int) -> None:
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
        zero(seq, d_s, R * row)
        seq.barrier()
    else:
        for r0, n in gaps:
            zero_at(seq, d_s, r0 * row, n * row)
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
    k = kernel(ctx, specs.rows_spec())
    cap = binding_cap(lim)
    whole = max(len(ids), R) * row <= cap
    if not whole and row > cap:
        raise ValueError(f"a state row of {row} floats exceeds the device's storage-buffer range")
    # Every group's pairs in one constant buffer (one allocation, whatever the ids), each group
    # at an aligned offset: binding offsets must be multiples of minStorageBufferOffsetAlignment.
    plans = [[pairs] if whole else [[pr] for pr in pairs] for pairs in layers]
    align_words = max(2, call.align // 4)
    words = []
    for groups in plans:
        for grp in groups:
            words.append(np.asarray(grp if whole else [(0, 0)], dtype=np.uint32).reshape(-1))
            pad = -len(words[-1]) % align_words
            if pad:
                words.append(np.zeros(pad, np.uint32))
    table = call.constant(np.concatenate(words))
    at = 0
    for groups in plans:
        seq.barrier()
        for grp in groups:
            if whole:
                src, o_src = call.bind(d_s0, 0, 0, len(ids) * row)
                dst, o_dst = call.bind(d_s, 0, 0, R * row)
            else:  # one pair, each row bound on its own (the pair read is (0, 0))
                (r, i), = grp
                src, o_src = call.bind(d_s0, 0, i * row, row)
                dst, o_dst = call.bind(d_s, 0, r * row, row)
            nbytes = 8 * len(grp)
            n = len(grp) * row
            gx, gy = grid(-(-n // specs.FLAT_WG), lim)
            push = dict(L=row, n_pairs=len(grp), gx=gx, o_src=o_src, o_dst=o_dst)
            seq.dispatch(k, [src, dst, (table, at, nbytes)], specs.pack_push(specs.ROWS_PUSH, push), (gx, gy, 1))
            at += nbytes + (-nbytes % (4 * align_words))


def carry(seq, ws, d, nch: int, dec, b, st_at: tuple, rows, flag, reverse: bool) -> None:
    """ssm_scan_carry.comp over ``nch`` chunks per sequence: the chunks' contributions ``b``
    (S * nch, H, P, N) and decays ``dec`` (S * nch, H, 1 or N) into the values each chunk starts
    from (written over b), in time order (or ``reverse``); ``st_at``: (buffer, offset) of the
    sequences' initial values, overwritten with the last ones, unless ``rows`` (the cache binding
    and its ids) gives the initial values."""
    lim = ws.limits
    n = d.S * d.H * d.P * d.N
    KA = d.N if d.mamba1 else 1
    dummy = ws.bind(None, 0, 0, 0)[0]
    gx, gy = grid(-(-n // specs.FLAT_WG), lim)
    b_st, o_st = ws.bind(*st_at, 0, n)
    if rows is None:
        b_s, b_ids, gather, o_s = dummy, dummy, 0, 0
    else:
        (b_s, o_s), ids_buf = rows
        b_ids, gather = (ids_buf, 0, ids_buf.size), 1
    push = dict(S=d.S, H=d.H, P=d.P, N=d.N, NCH=nch, gx=gx, gather=gather, o_s=o_s, o_ids=0, o_st=o_st)
    seq.dispatch(kernel(ws.ctx, specs.carry_spec(d, reverse)),
                 [ws.bind(dec, 0, 0, d.S * nch * d.H * KA)[0], ws.bind(b, 0, 0, n * nch)[0], b_st, b_s, b_ids,
                  ws.bind(flag, 0, 0, FLAG_ELEMS)[0]],
                 specs.pack_push(specs.CARRY_PUSH, push), (gx, gy, 1))
