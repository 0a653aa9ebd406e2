"""Recording the chunked (matrix-form) Mamba-2 kernels: the forward and backward of
ssm_ref/chunked.py as a short list of dispatches per window of whole sequences, or of a token
range of one sequence (the planner's token windows: the state buffer carries a sequence's state
from one window to the next, and the backward first walks each sequence forward, keeping every
window's starting state, then walks its windows back, the last first, d_s0's buffer carrying the
state's cotangent; d_A's parts of a window land at its first chunk of the sequence's, so that
their sum runs in the order of one window's).

Forward, per window:  CB (C.B per group) -> decay (din, dout, dch, M*CB) -> ZF (each chunk's own
state) -> pass (incoming states, in chunk order; final states) -> Y.
Backward, per window: CB, GU -> decay (also M*GU and the in-chunk decay gradient) -> ZF, ZB ->
the two passes (H_c forward, G_c backward, which ends as d_s0) -> GAM (d_x), DB, DC (per-head
d_B, d_C: the heads of a group added in order; their products over the chunk's own tokens
once per group, from M o GU summed over its heads after the decay step) -> finish (d_dt; d_A
parts) -> the fixed-order d_A reduce of the sequential path. After a forward of the same inputs
whose tables are still there (engine.KeptForward), CB, ZF, the H_c pass and the M o C.B writes
are left out: its hs, cb and mcb are bound instead.
"""

from __future__ import annotations

from ssm_ref import Problem

from .. import kernel_specs as specs
from .. import recording
from ..recording import F32, gather_rows, kernel, reduce_dA, reduce_partials, scatter_rows, seq_bindings
from ..sizing import FLAG_ELEMS, grid
from . import chunked_specs as chk
from .chunked_planner import PER_GROUP, ChunkPlan, scratch_elems
from .chunked_specs import PASS_WG, decay_spec, finish_spec, gemm_spec, pass_spec

__all__ = ["record_forward", "record_backward"]  # of the chunked kernels


class _Chunked:
    """Dispatch helper for one window: the binding table of ssm_vk/chunked/glsl/chunk_common.glsl."""

    def __init__(self, seq, ws, d, cp: ChunkPlan, w, binds: dict, offs: dict):
        self.seq, self.ws, self.d, self.cp, self.w = seq, ws, d, cp, w
        self.binds, self.offs = binds, offs
        self.nch = -(-w.T // cp.CL)   # the window's chunks
        self.profile = ws.profile and ws.ctx.info.timestamps and w == cp.windows[0]

    def mark(self, label: str) -> None:
        """A barrier (every step reads what the one before wrote), and a timestamp when profiling
        (SSM_VK_PROFILE=1: after each step of the first window; benchmarks/vk_speed.py prints them)."""
        self.seq.barrier()
        if self.profile:
            self.seq.timestamp(label)

    def split(self, label: str) -> None:
        """Between independent dispatches: a barrier and a timestamp only when profiling."""
        if self.profile:
            self.mark(label)

    def run(self, spec: specs.KernelSpec, n_groups: int, **extra) -> None:
        """Dispatch ``spec`` over ``n_groups`` workgroups; ``extra``: bindings by name, and push
        constants (offsets o_*, NCHA) over the window's."""
        gx, gy = grid(n_groups, self.ws.limits)
        dummy = self.ws.bind(None, 0, 0, 0)[0]
        b = {**self.binds, **{k: v for k, v in extra.items() if k not in chk.CHUNK_PUSH}}
        push = dict(S=self.w.S, T=self.w.T, H=self.d.H, G=self.d.G, NCH=self.nch, gx=gx,
                    o_x=0, o_dt=0, o_B=0, o_C=0, o_gy=0, o_out=0, o_st=0, o_A=0, NCHA=self.nch)
        push.update(self.offs)
        push.update({k: v for k, v in extra.items() if k in chk.CHUNK_PUSH})
        self.seq.dispatch(kernel(self.ws.ctx, spec), [b.get(k, dummy) for k in chk.CHUNK_BINDINGS],
                          specs.pack_push(chk.CHUNK_PUSH, push), (gx, gy, 1))

    def gemm(self, mode: str, **extra) -> None:
        d, cp = self.d, self.cp
        _, _, nrb, ncb = cp.tile(mode)
        if mode == "CB" or (mode in PER_GROUP and cp.headloop):
            heads = d.G
        else:
            heads = d.H // cp.hpart(mode)
        self.run(gemm_spec(d, cp, mode), self.w.S * self.nch * heads * nrb * ncb, **extra)

    def per_head(self, spec, **extra) -> None:
        self.run(spec, self.w.S * self.nch * self.d.H, **extra)

    def fold_heads(self) -> None:
        """M o GU summed over each group's heads into its first head's slot (ssm_scan_reduce.comp
        MODE 2), for d_B and d_C with FOLD."""
        d, cp, ws = self.d, self.cp, self.ws
        n = self.w.S * self.nch * d.G * cp.CL * cp.CL
        gx, gy = grid(-(-n // specs.FLAT_WG), ws.limits)
        push = dict.fromkeys(specs.RED_PUSH, 0)
        push.update(S=self.w.S, T=self.nch, H=d.H, P=1, N=cp.CL * cp.CL, G=d.G, NPB=1, KA=1, gx=gx, HS=1, HSC=1)
        dummy = ws.bind(None, 0, 0, 0)[0]
        self.seq.dispatch(kernel(ws.ctx, specs.reduce_spec(2)), [self.binds["mgu"], *[dummy] * 5],
                          specs.pack_push(specs.RED_PUSH, push), (gx, gy, 1))

    def pass_(self, mode: int, **extra) -> None:
        d = self.d
        spec = pass_spec(d, self.cp, mode)
        self.run(spec, -(-(self.w.S * d.H * d.P * d.N) // PASS_WG), **extra)


def _scratch(ws, d, cp: ChunkPlan, backward: bool) -> dict:
    sizes = scratch_elems(d, cp.CL, cp.Sw, backward, cp.headloop, T=cp.Tw)
    names = ["hs", "cb", "mcb", "dec"] + (["gs", "gu", "mgu", "sm"] if backward else [])
    if backward and not cp.headloop:
        names += ["dBp", "dCp", "ddtp"]
    return {k: ws.scratch(sizes[k]) for k in names}


def _window(seq, ws, p: Problem, cp: ChunkPlan, w, bufs: dict, scratch: dict, grads: bool) -> _Chunked:
    d = p.dims
    tok = {"x": (*bufs["x"], d.H * d.P), "dt": (*bufs["dt"], d.H), "B": (*bufs["B"], d.G * d.N),
           "C": (*bufs["C"], d.G * d.N)}
    names = {"x": "o_x", "dt": "o_dt", "B": "o_B", "C": "o_C"}
    if grads:
        tok["gy"] = (*bufs["g_y"], d.H * d.P)
        names["gy"] = "o_gy"
    b, o = seq_bindings(ws, d, w, tok, names)
    b["flag"] = ws.bind(scratch["flag"], 0, 0, FLAG_ELEMS)[0]
    b["A"], o["o_A"] = ws.bind(*bufs["A"], 0, d.H)
    sizes = scratch_elems(d, cp.CL, w.S, grads, cp.headloop, T=w.T)
    for k, buf in scratch.items():
        if k != "flag":
            b[k] = ws.bind(buf, 0, 0, sizes[k])[0]
    return _Chunked(seq, ws, d, cp, w, b, o)


def record_forward(seq, ws, p: Problem, bufs: dict, scatter: bool = False) -> None:
    """The forward by chunks (ssm_ref.chunked.forward); ``bufs`` as the token-sequential
    recording's. ``scatter``: never (the final states are copied into the cache rows after it)."""
    d, cp = p.dims, ws.plan
    row = d.H * d.P * d.N
    st_buf, st_off = bufs["states"]
    gather_rows(seq, ws, *bufs["s"], st_buf, st_off, p.ids, row)
    scratch = _scratch(ws, d, cp, False)
    # left holding the chunk states, C.B and M o C.B (one window: all of them); over token windows
    # each window's starting state (chunked_planner.tables)
    ck = ws.scratch(len(cp.windows) * row) if cp.tokens and cp.keep else None
    ws.kept = {"ck": ck} if cp.tokens else {"hs": scratch["hs"], "cb": scratch["cb"], "mcb": scratch["mcb"]}
    scratch["flag"] = recording.flag_start(seq, ws)
    seq.barrier()
    y_buf, y_off = bufs["y"]
    for j, w in enumerate(cp.windows):
        if ck is not None:   # (the barriers before this window's pass order it before the pass's write)
            seq.copy(st_buf, ck, row * F32, (st_off + w.i0 * row) * F32, j * row * F32)
        k = _window(seq, ws, p, cp, w, bufs, scratch, grads=False)
        k.gemm("CB")
        k.mark("cb")
        k.per_head(decay_spec(d, cp, False))
        k.mark("decay")
        k.gemm("ZF")
        k.mark("states")
        st_b, o_st = ws.bind(st_buf, st_off, w.i0 * row, w.S * row)
        k.pass_(0, st=st_b, o_st=o_st)   # (a token window's final state: the next one's start)
        k.mark("pass")
        out_b, o_out = _tokens(ws, d, w, (y_buf, y_off), d.H * d.P)
        k.gemm("Y", out=out_b, o_out=o_out)
        k.mark("y")
    recording.flag_end(seq, ws, scratch["flag"])


def _tokens(ws, d, w, at: tuple, per: int) -> tuple:
    """The binding and residual offset of window ``w``'s rows of an (S, T, per) output at ``at``."""
    return ws.bind(*at, (w.i0 * d.T + w.t0) * per, w.S * w.T * per)


def _starts(seq, ws, p: Problem, cp: ChunkPlan, bufs: dict, scratch: dict, st, row: int):
    """Token windows: a buffer of every window's starting state, the states at the windows'
    starts of each sequence, computed by walking the sequence forward (the decays alone, ZF, the
    pass) from its state gathered in ``st``, which it leaves at the last window's start."""
    d = p.dims
    ck = ws.scratch(len(cp.windows) * row)
    fwd = {k: scratch[k] for k in ("hs", "dec", "flag")}
    last = {w.i0: j for j, w in enumerate(cp.windows)}   # each sequence's last window
    for j, w in enumerate(cp.windows):
        seq.copy(st, ck, row * F32, w.i0 * row * F32, j * row * F32)
        if last[w.i0] == j:
            continue
        seq.barrier()   # (the copy read the state the pass is about to write)
        k = _window(seq, ws, p, cp, w, bufs, fwd, grads=False)
        k.per_head(decay_spec(d, cp, False, kept=True))   # (din, dout, dch; no M o C.B)
        k.mark("starts: decay")
        k.gemm("ZF")
        k.mark("starts: states")
        st_b, o_st = ws.bind(st, 0, w.i0 * row, row)
        k.pass_(0, st=st_b, o_st=o_st)
        k.mark("starts: pass")
    seq.barrier()
    return ck


def record_backward(seq, ws, p: Problem, bufs: dict, kept=None) -> None:
    """The backward by chunks (ssm_ref.chunked.backward); ``bufs`` as the token-sequential
    recording's. ``kept``: the tables its forward left (engine.KeptForward), bound instead of a
    recompute; None to recompute them."""
    d, cp = p.dims, ws.plan
    row = d.H * d.P * d.N
    lam, lam_off = bufs["d_s0"]            # g_states in, d_s0 out (the backward pass)
    gs_buf, gs_off = bufs["g_states"]
    seq.copy(gs_buf, lam, d.S * row * F32, gs_off * F32, lam_off * F32)
    st = ws.scratch(d.S * row)             # initial states of the forward recompute
    tables = None if kept is None else kept.tables   # what the forward left (engine.KeptForward):
    saved = None if cp.tokens else tables            # its hs, cb, mcb; or over token windows
    starts = tables["ck"] if cp.tokens and tables is not None else None   # the windows' starting states
    if saved is None and starts is None:
        gather_rows(seq, ws, *bufs["s"], st, 0, p.ids, row)
    dAp = ws.scratch(d.S * d.H * cp.nch_seq)
    scratch = _scratch(ws, d, cp, True)
    scratch["flag"] = recording.flag_start(seq, ws)
    seq.barrier()
    ck = (starts if starts is not None else _starts(seq, ws, p, cp, bufs, scratch, st, row)) if cp.tokens else None
    per = {"d_x": d.H * d.P, "d_B": d.G * d.N, "d_C": d.G * d.N, "d_dt": d.H}
    for j in reversed(range(len(cp.windows))):   # (a token window needs the cotangent of the next one's start)
        w = cp.windows[j]
        if ck is not None:   # this window's start into the state the pass walks (ck stays as it is: kept)
            seq.copy(ck, st, row * F32, j * row * F32, w.i0 * row * F32)
        k = _window(seq, ws, p, cp, w, bufs, scratch, grads=True)
        if saved is not None:
            fsz = scratch_elems(d, cp.CL, w.S, False)
            for name, buf in saved.items():
                k.binds[name] = ws.bind(buf, 0, 0, fsz[name])[0]
        dAp_b, o_dAp = ws.bind(dAp, 0, w.i0 * d.H * cp.nch_seq, w.S * d.H * cp.nch_seq)
        if cp.tokens:
            o_dAp += cp.chunk_at[j]
        if saved is None:
            k.gemm("CB")
        k.gemm("GU")
        k.mark("cb,gu")
        k.per_head(decay_spec(d, cp, True, kept=saved is not None))
        k.mark("decay")
        if cp.fold:
            k.fold_heads()
            k.split("fold")
        if saved is None:
            k.gemm("ZF")
        k.gemm("ZB")
        k.mark("states")
        if saved is None:
            st_b, o_st = ws.bind(st, 0, w.i0 * row, w.S * row)
            k.pass_(0, st=st_b, o_st=o_st)
        lam_b, o_lam = ws.bind(lam, lam_off, w.i0 * row, w.S * row)
        k.pass_(1, st=lam_b, o_st=o_lam)
        k.mark("passes")
        dx_b, o_dx = _tokens(ws, d, w, bufs["d_x"], per["d_x"])
        k.gemm("GAM", out=dx_b, o_out=o_dx)
        k.split("gam")
        if cp.headloop:       # d_B, d_C, d_dt written by the kernels
            db_b, o_db = _tokens(ws, d, w, bufs["d_B"], per["d_B"])
            dc_b, o_dc = _tokens(ws, d, w, bufs["d_C"], per["d_C"])
            ddt_b, o_ddt = _tokens(ws, d, w, bufs["d_dt"], per["d_dt"])
        else:                 # per-head parts, summed below
            (db_b, o_db), (dc_b, o_dc), (ddt_b, o_ddt) = (k.binds["dBp"], 0), (k.binds["dCp"], 0), (k.binds["ddtp"], 0)
        k.gemm("DB", out=db_b, o_out=o_db)
        k.split("db")
        k.gemm("DC", out=dc_b, o_out=o_dc)
        k.mark("dc")
        k.per_head(finish_spec(d, cp), dAp=dAp_b, o_out=o_dAp, ddtp=ddt_b, o_st=o_ddt, NCHA=cp.nch_seq)
        k.mark("finish")
        if not cp.headloop:
            reduce_partials(seq, ws, d, w, 1, (k.binds["dBp"], k.binds["dCp"], k.binds["ddtp"]), bufs,
                            hs=cp.hpart_b, hs_c=cp.hpart_c)
            if j:
                k.mark("reduce")      # before the next window writes its partials
            else:
                k.split("reduce")
    # The last three read what is done (d_A's partials, d_s0) and write apart: no barriers between
    # them, or after the partial sums.
    reduce_dA(seq, ws, p.dims, dAp, bufs["d_A"], rows=cp.nch_seq, KA=1)
    k.split("d_A")
    scatter_rows(ws.ctx, seq, ws, ws.limits, lam, bufs["d_s"], p.ids, row, d.R)
    k.split("d_s")
    recording.flag_end(seq, ws, scratch["flag"])
