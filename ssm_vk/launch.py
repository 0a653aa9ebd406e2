"""Recording the scan on the device: uploads, the window loop, the dispatches and barriers.

``forward(ctx, problem)`` and ``backward(ctx, problem)`` take a checked ``ssm_ref.Problem`` whose
arrays are numpy arrays (uploaded here, through the context's pool) or DeviceArrays (bound in
place), and return DeviceArrays. The caller decides whether to download them.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from ssm_ref import Problem

from . import runtime as rt
from . import specs
from .arrays import DeviceArray, empty, pool
from .plan import Limits, Plan, Window, grid, plan

__all__ = ["forward", "backward", "limits_of", "subgroup_ops", "last_gpu_ns"]

F32 = 4
_timing = threading.local()


def last_gpu_ns() -> float | None:
    """GPU time (timestamps) of this thread's last forward or backward, in ns; None when the
    device has no timestamps."""
    return getattr(_timing, "ns", None)


def _stamp(seq, label: str) -> None:
    if seq.ctx.info.timestamps:
        seq.timestamp(label)


def _submit(seq) -> None:
    _stamp(seq, "end")
    seq.finish()
    seq.submit()
    _timing.ns = seq.gpu_times().get("end") if seq.ctx.info.timestamps else None
# Set by tests (and SSM_VK_NO_SUBGROUP=1) to exercise the shared-memory reduction path.
FORCE_SHARED_MEMORY = False


def subgroup_ops(info) -> frozenset:
    """The subgroup operations the kernels may use; none when FORCE_SHARED_MEMORY is set or
    SSM_VK_NO_SUBGROUP=1 (the shared-memory path, tested on devices that have subgroups)."""
    if FORCE_SHARED_MEMORY or os.environ.get("SSM_VK_NO_SUBGROUP", "") == "1":
        return frozenset()
    return frozenset(info.subgroup_ops)


def limits_of(info) -> Limits:
    return Limits(
        subgroup_size=info.subgroup_size, subgroup_ops=subgroup_ops(info),
        max_workgroup_invocations=info.max_workgroup_invocations, max_shared_memory=info.max_shared_memory,
        max_workgroup_count=tuple(info.max_workgroup_count),
        max_storage_buffer_range=info.max_storage_buffer_range,
        max_memory_allocation_size=info.max_memory_allocation_size,
        min_storage_buffer_offset_alignment=info.min_storage_buffer_offset_alignment)


class _Call:
    """What one call owns: temporary buffers (returned to the pool at the end), its results until
    it succeeds (returned to the pool if it fails: a call that raises keeps nothing), bindings.

    Use as ``with _Call(ctx) as call:``."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.pool = pool(ctx)
        self.align = ctx.info.min_storage_buffer_offset_alignment
        self.temps: list = []
        self.results: list[DeviceArray] = []
        self._dummy = None

    def __enter__(self) -> _Call:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            for a in self.results:
                a.release()
        self.results.clear()
        self.close()

    def result(self, shape) -> DeviceArray:
        """A float32 DeviceArray for a result, released if the call fails."""
        a = empty(self.ctx, shape)
        self.results.append(a)
        return a

    def scratch(self, n_elems: int) -> rt.Buffer | None:
        if n_elems <= 0:
            return None
        buf = self.pool.acquire(n_elems * F32)
        self.temps.append(buf)
        return buf

    def device(self, arr) -> tuple[rt.Buffer | None, int]:
        """(buffer, element offset) holding ``arr``: DeviceArrays in place, numpy uploaded."""
        if isinstance(arr, DeviceArray):
            arr._check_live()
            if arr.ctx is not self.ctx:
                raise ValueError("a DeviceArray from another Vulkan context was passed")
            return arr.buffer, arr.offset
        a = np.ascontiguousarray(arr, dtype=np.float32)
        if a.size == 0:
            return None, 0
        buf = self.scratch(a.size)
        rt.upload(buf, a)
        return buf, 0

    def dummy(self) -> rt.Buffer:
        if self._dummy is None:
            self._dummy = self.scratch(4)
        return self._dummy

    def bind(self, buf, base: int, start: int, count: int) -> tuple[tuple, int]:
        """A binding of elements [base + start, base + start + count) of ``buf`` and the residual
        element offset the shader adds (binding offsets must be aligned)."""
        if buf is None or count <= 0:
            return (self.dummy(), 0, 16), 0
        byte0 = (base + start) * F32
        aligned = byte0 - byte0 % self.align
        resid = (byte0 - aligned) // F32
        return (buf, aligned, (resid + count) * F32), resid

    def close(self) -> None:
        for b in self.temps:
            self.pool.release(b)
        self.temps.clear()


def _zero(seq, buf, n_elems: int) -> None:
    if buf is not None and n_elems > 0:
        seq.fill(buf, 0, 0, n_elems * F32)


def _kernel(ctx, spec: specs.KernelSpec) -> rt.Kernel:
    return rt.Kernel.get(ctx, spec.name, bindings=spec.n_bindings, push_size=spec.push_size,
                         local_size=(spec.wg, 1, 1), defines=dict(spec.defines))


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


def forward(ctx, p: Problem) -> tuple[DeviceArray, DeviceArray]:
    """Run the forward scan; returns (y, states) as DeviceArrays."""
    d = p.dims
    lim = limits_of(ctx.info)
    pl: Plan = plan(d, lim, backward=False)
    lay = pl.layout
    row = d.H * d.P * d.N
    KA = d.N if d.mamba1 else 1
    with _Call(ctx) as call:
        y = call.result((d.S, d.T, d.H, d.P))
        states = call.result((d.S, d.H, d.P, d.N))
        s_buf, s_off = call.device(p.s)
        with rt.Sequence(ctx) as seq:
            _stamp(seq, "start")
            _gather_rows(seq, call, s_buf, s_off, states.buffer, 0, p.ids, row)
            seq.barrier()
            if pl.windows and d.H * d.P > 0:
                x, dt, A, B, C = (call.device(a) for a in (p.x, p.dt, p.A, p.B, p.C))
                k = _kernel(ctx, specs.fwd_spec(d, lay, checkpoint=False))
                for w in pl.windows:
                    gx, gy = grid(w.S * lay.NHB * lay.NPB, lim)
                    tok = {"x": (*x, d.H * d.P), "dt": (*dt, d.H), "B": (*B, d.G * d.N), "C": (*C, d.G * d.N),
                           "y": (y.buffer, 0, d.H * d.P)}
                    b, o = _seq_bindings(call, d, w, tok, {"x": "o_x", "dt": "o_dt", "B": "o_B", "C": "o_C",
                                                         "y": "o_y"})
                    b["A"], _ = call.bind(*A, 0, d.H * KA)
                    b["st"], o["o_st"] = call.bind(states.buffer, 0, w.i0 * row, w.S * row)
                    b["ck"], o["o_ck"] = call.bind(None, 0, 0, 0)
                    push = {**_window_push(d, lay, w, gx), "NC": 1, "c0": 0, **o}
                    seq.dispatch(k, [b["x"], b["dt"], b["A"], b["B"], b["C"], b["y"], b["st"], b["ck"]],
                                 specs.pack_push(specs.FWD_PUSH, push), (gx, gy, 1))
                    seq.barrier()
            _submit(seq)
    return y, states


def backward(ctx, p: Problem) -> dict[str, DeviceArray]:
    """Run the backward scan; returns the gradients d_s, d_s0, d_x, d_dt, d_A, d_B, d_C."""
    d = p.dims
    lim = limits_of(ctx.info)
    pl: Plan = plan(d, lim, backward=True)
    lay = pl.layout
    row = d.H * d.P * d.N
    KA = d.N if d.mamba1 else 1
    with _Call(ctx) as call:
        out = {
            "d_s": call.result((d.R, d.H, d.P, d.N)),
            "d_s0": call.result((d.S, d.H, d.P, d.N)),
            "d_x": call.result((d.S, d.T, d.H, d.P)),
            "d_dt": call.result((d.S, d.T, d.H)),
            "d_A": call.result(d.a_shape),
            "d_B": call.result((d.S, d.T, d.G, d.N)),
            "d_C": call.result((d.S, d.T, d.G, d.N)),
        }
        lam = out["d_s0"].buffer   # carries dL/dstate backwards; ends as d_s0
        s_buf, s_off = call.device(p.s)
        gs_buf, gs_off = call.device(p.g_states)
        run_kernels = bool(pl.windows) and d.H * d.P > 0
        with rt.Sequence(ctx) as seq:
            _stamp(seq, "start")
            if row:
                seq.copy(gs_buf, lam, d.S * row * F32, gs_off * F32, 0)
            if not run_kernels:
                for name in ("d_x", "d_dt", "d_A", "d_B", "d_C"):
                    _zero(seq, out[name].buffer, out[name].size)
            else:
                st = call.scratch(d.S * row)          # running state of the checkpoint pass
                _gather_rows(seq, call, s_buf, s_off, st, 0, p.ids, row)
                dAp = call.scratch(d.S * d.H * d.P * KA)
                _zero(seq, dAp, d.S * d.H * d.P * KA)
                seq.barrier()
                _backward_windows(ctx, seq, call, p, pl, lim, st, lam, dAp, out)
                _reduce_dA(ctx, seq, call, p, lim, lay, dAp, out["d_A"].buffer)
            seq.barrier()
            _scatter_rows(ctx, seq, call, lim, lam, out["d_s"], p.ids, row, d.R)
            _submit(seq)
    return out


def _backward_windows(ctx, seq, call, p: Problem, pl: Plan, lim: Limits, st, lam, dAp, out) -> None:
    """Checkpoint pass, backward pass and partial reduction for every window, in the order the
    carries need: whole-sequence windows one after another; token windows of one sequence
    forward in time for the checkpoints, then backward in time."""
    d, lay = p.dims, pl.layout
    row = d.H * d.P * d.N
    KA = d.N if d.mamba1 else 1
    fwd_k = _kernel(ctx, specs.fwd_spec(d, lay, checkpoint=True))
    bwd_k = _kernel(ctx, specs.bwd_spec(d, lay))
    red_k = _kernel(ctx, specs.reduce_spec(0))
    x, dt, A, B, C, gy = (call.device(a) for a in (p.x, p.dt, p.A, p.B, p.C, p.g_y))
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
                "gy": (*gy, d.H * d.P), "dx": (out["d_x"].buffer, 0, d.H * d.P)}

    def ckpt_pass(w: Window, ck) -> None:
        gx, gyy = grid(w.S * lay.NHB * lay.NPB, lim)
        b, o = _seq_bindings(call, d, w, tok_arrays(), names)
        bA, _ = call.bind(*A, 0, d.H * KA)
        bst, o_st = call.bind(st, 0, w.i0 * row, w.S * row)
        nc = -(-w.T // lay.K)
        bck, o_ck = call.bind(ck, 0, 0, w.S * row * nc)
        push = {**_window_push(d, lay, w, gx), "NC": nc, "c0": 0, "o_x": o["o_x"], "o_dt": o["o_dt"],
                "o_B": o["o_B"], "o_C": o["o_C"], "o_y": 0, "o_st": o_st, "o_ck": o_ck}
        dum = call.bind(None, 0, 0, 0)[0]
        seq.dispatch(fwd_k, [b["x"], b["dt"], bA, b["B"], b["C"], dum, bst, bck],
                     specs.pack_push(specs.FWD_PUSH, push), (gx, gyy, 1))
        seq.barrier()

    def back_pass(w: Window, ck) -> None:
        gx, gyy = grid(w.S * lay.NHB * lay.NPB, lim)
        b, o = _seq_bindings(call, d, w, tok_arrays(), names)
        bA, _ = call.bind(*A, 0, d.H * KA)
        blam, o_lam = call.bind(lam, 0, w.i0 * row, w.S * row)
        nc = -(-w.T // lay.K)
        bck, o_ck = call.bind(ck, 0, 0, w.S * row * nc)
        n_part = w.S * w.T * d.H * lay.NPB
        bdA, o_dA = call.bind(dAp, 0, w.i0 * d.H * d.P * KA, w.S * d.H * d.P * KA)
        push = {**_window_push(d, lay, w, gx), "NC": nc, "c0": 0, **o, "o_lam": o_lam, "o_ck": o_ck,
                "o_dA": o_dA}
        seq.dispatch(bwd_k, [b["x"], b["dt"], bA, b["B"], b["C"], b["gy"], blam, bck, b["dx"],
                             call.bind(part, 0, 0, n_part * d.N)[0], call.bind(partC, 0, 0, n_part * d.N)[0],
                             call.bind(partT, 0, 0, n_part)[0], bdA],
                     specs.pack_push(specs.BWD_PUSH, push), (gx, gyy, 1))
        seq.barrier()
        # Fixed-order sums of the partials into d_B, d_C, d_dt of this window.
        n_out = max(w.S * w.T * d.G * d.N, w.S * w.T * d.H)
        gx, gyy = grid(-(-n_out // specs.FLAT_WG), lim)
        out_tok = {"dB": (out["d_B"].buffer, 0, d.G * d.N), "dC": (out["d_C"].buffer, 0, d.G * d.N),
                   "ddt": (out["d_dt"].buffer, 0, d.H)}
        b2, o2 = _seq_bindings(call, d, w, out_tok, {"dB": "o_3", "dC": "o_4", "ddt": "o_5"})
        push = dict(S=w.S, T=w.T, H=d.H, P=d.P, N=d.N, G=d.G, NPB=lay.NPB, KA=KA, gx=gx, o_0=0, **o2, acc=0)
        seq.dispatch(red_k, [call.bind(part, 0, 0, n_part * d.N)[0], call.bind(partC, 0, 0, n_part * d.N)[0],
                             call.bind(partT, 0, 0, n_part)[0], b2["dB"], b2["dC"], b2["ddt"]],
                     specs.pack_push(specs.RED_PUSH, push), (gx, gyy, 1))
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


def _reduce_dA(ctx, seq, call, p: Problem, lim: Limits, lay, dAp, dA) -> None:
    """d_A = the per-row accumulators summed over sequences and channels, in windows of
    sequences that fit a binding (added in sequence order)."""
    d = p.dims
    KA = d.N if d.mamba1 else 1
    per_seq = d.H * d.P * KA
    if per_seq == 0:
        _zero(seq, dA, d.H * KA)
        return
    k = _kernel(ctx, specs.reduce_spec(1))
    step = max(1, _cap_elems(lim) // per_seq)
    gx, gy = grid(-(-(d.H * KA) // specs.FLAT_WG), lim)
    dum = call.bind(None, 0, 0, 0)[0]
    bA, o3 = call.bind(dA, 0, 0, d.H * KA)
    for i0 in range(0, d.S, step):
        n = min(step, d.S - i0)
        bsrc, o0 = call.bind(dAp, 0, i0 * per_seq, n * per_seq)
        push = dict(S=n, T=d.T, H=d.H, P=d.P, N=d.N, G=d.G, NPB=lay.NPB, KA=KA, gx=gx, o_0=o0, o_3=o3, o_4=0, o_5=0,
                    acc=int(i0 > 0))
        seq.dispatch(k, [bsrc, dum, dum, bA, dum, dum], specs.pack_push(specs.RED_PUSH, push), (gx, gy, 1))
        seq.barrier()


def _scatter_rows(ctx, seq, call, lim, d_s0, d_s: DeviceArray, ids, row: int, R: int) -> None:
    """d_s = rows of d_s0 scatter-added by ids, in sequence order (as ssm_ref.scatter_rows)."""
    if d_s.buffer is None:
        return
    _zero(seq, d_s.buffer, d_s.size)
    seq.barrier()
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
    for r, i in firsts:
        seq.copy(d_s0, d_s.buffer, row * F32, i * row * F32, r * row * F32)
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
                dst, o_dst = call.bind(d_s.buffer, 0, 0, R * row)
                arr = np.asarray(grp, dtype=np.uint32).reshape(-1)
            else:  # one pair, each row bound on its own
                (r, i), = grp
                src, o_src = call.bind(d_s0, 0, i * row, row)
                dst, o_dst = call.bind(d_s.buffer, 0, r * row, row)
                arr = np.zeros(2, dtype=np.uint32)
            pbuf = call.pool.acquire(arr.nbytes)
            call.temps.append(pbuf)
            rt.upload(pbuf, arr)
            n = len(grp) * row
            gx, gy = grid(-(-n // specs.FLAT_WG), lim)
            push = dict(L=row, n_pairs=len(grp), gx=gx, o_src=o_src, o_dst=o_dst)
            seq.dispatch(k, [src, dst, (pbuf, 0, arr.nbytes)], specs.pack_push(specs.ROWS_PUSH, push), (gx, gy, 1))
