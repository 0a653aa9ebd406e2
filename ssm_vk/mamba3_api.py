"""The Mamba-3 scan on the Vulkan device (docs/SPEC.md section 14; docs/API.md): ``mamba3_scan``,
``mamba3_scan_back`` and their support decision, beside the selective scan's (api.py).

A call: ssm_ref's validator (ssm_ref.mamba3_checks) checks every argument before any Vulkan
call; the support decision (:func:`decide`: the context, the plan of the op's family through
ssm_vk.registry, the memory budget, the kernels' SPIR-V and limits through ssm_vk.decision)
is cached in the context's Engine; a call the device runs takes buffers from the context's pool,
uploads its inputs, records its family's kernels (registry: op "mamba3_scan") in one submission
and reads the results back; one it cannot is computed by ssm_fast on the CPU (``where == "CPU"``),
the reason logged once. Inputs are host arrays (DeviceArrays are read back to the host); results
are numpy arrays. float32 only (the float64 oracle is ssm_ref's).

A call's buffers and its recorded command sequence are kept for its repeats (:class:`Kept`: per
context, by op, dims, rotation and plan, the MAX_KEPT most recent): a repeat of a shape -- a decode loop,
a training loop -- uploads its inputs into the same buffers and submits the sequence recorded
the first time.

update_cache=True (a decode step: T = 1) writes the four final state parts into the rows ids of
the caller's four cache arrays in place, once the call has run.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from ssm_ref import Support
from ssm_ref.checks import check_dtype
from ssm_ref.mamba3_checks import check_mamba3_backward, check_mamba3_forward, check_mamba3_update_cache, drop_rank
from ssm_ref.ops import MAMBA3
from ssm_ref.results import Mamba3Grads, Mamba3Result
from ssm_ref.scan import scatter_rows

from . import budget, config, registry
from . import runtime as rt
from .arrays import DeviceArray, pool
from .decision import kernels_problem
from .engine import engine_of
from .run import note_rerun
from .sizing import TooLarge
from .support import context_or_reason, log_once

__all__ = ["MAX_KEPT", "OPS", "Kept", "M3Call", "decide", "kept", "mamba3_scan", "mamba3_scan_back", "supports"]

MAX_KEPT = 8   # calls (buffers and a recorded sequence each) kept per context for their repeats

OPS = (MAMBA3.name, MAMBA3.backward_name)   # "mamba3_scan", "mamba3_scan_back"
_F32 = np.dtype(np.float32)
_STATES = ("s_theta", "s_h", "s_k", "s_v")
_FLAG = "m3c_flag"   # the chunked kernels' non-finite flag (ssm_vk/mamba3/mamba3_chunked_recording.py)


def _float32_only(dtype) -> None:
    """dtype checked as ssm_ref checks it (the same TypeError), then float32 only (ValueError)."""
    if dtype is np.float32:
        return
    if check_dtype(dtype) != _F32:
        raise ValueError(f"dtype: ssm_vk computes in float32 only, got {np.dtype(dtype).name} "
                         f"(the float64 oracle is ssm_ref.mamba3_scan)")


def _host(a):
    """A DeviceArray read back to the host (the Mamba-3 kernels take host arrays); else as it is."""
    return a.numpy() if isinstance(a, DeviceArray) else a


class _Decided:
    __slots__ = ("ctx", "engine", "fp", "sup")

    def __init__(self, sup: Support, ctx=None, engine=None, fp=None):
        self.sup, self.ctx, self.engine, self.fp = sup, ctx, engine, fp


def _sizes(d, backward: bool, fp) -> dict:
    """Bytes of every buffer a call holds, by name (the memory budget's input)."""
    S, T, H, P, N, G, M, F, R = d.S, d.T, d.H, d.P, d.N, d.G, d.M, d.F, d.R
    n = dict(x=S * T * H * P, steps=3 * S * T * H, B=2 * S * T * M * G * N, bias=2 * H * M * N, dtheta=S * T * H * F,
             psi=H * M * P, states=R * H * (F + P * N + M * N + M * P), ids=S,
             y=S * T * M * H * P, finals=S * H * (F + P * N + M * N + M * P))
    if backward:
        n.update(grads=2 * n["y"] + 2 * n["finals"] + n["x"] + n["steps"] + n["dtheta"] + n["B"]
                 + H * (2 * M * N + M * P))
    n.update(fp.family.scratch(d, fp.plan, backward))
    return {k: 4 * v for k, v in n.items() if v}


def decide(op: str, d, knobs=None) -> _Decided:
    """Whether a problem of dims ``d`` (ssm_ref.mamba3_checks.M3Dims) runs on the device for ``op``
    ("mamba3_scan" or "mamba3_scan_back"), and its plan -- cached in the context's Engine."""
    ctx, reason = context_or_reason()
    if ctx is None:
        return _Decided(Support(False, reason))
    knobs = config.settings() if knobs is None else knobs
    engine = engine_of(ctx)
    info = ctx.info
    key = (id(info), op, d, knobs.key)
    hit = engine.decision(key)
    if hit is not None and hit.ctx is ctx:
        return hit
    backward = op == MAMBA3.backward_name
    lim = engine.limits(info, knobs)
    try:
        fp = registry.plan(d, lim, backward, knobs, op=MAMBA3.name)
    except TooLarge as e:
        out = _Decided(Support(False, str(e)))
        engine.remember(key, out)
        return out
    why = budget.check(info, _sizes(d, backward, fp), ctx.live_allocations.count)
    if why:
        return _Decided(Support(False, why))
    why = kernels_problem(lim, registry.kernels_needed(d, fp, backward))
    if why:   # (not cached: glslc on PATH or a warm cache may lift it)
        return _Decided(Support(False, why))
    out = _Decided(Support(True, f"runs on {info.where} ({info.name})"), ctx, engine, fp)
    engine.remember(key, out)
    return out


class M3Call:
    """One call shape's buffers on the device, by name (the recording binds them: ``bind``), with
    the plan (``plan``), the planner's ``limits`` and the sequence recorded by its first run;
    ``close`` gives them back to the pool. A repeat of the shape (:class:`Kept`) fills the same
    buffers and submits the same sequence."""

    def __init__(self, ctx, engine, fp, knobs):
        self.ctx, self.plan = ctx, fp.plan
        self.limits = engine.limits(ctx.info, knobs)
        self.pool = pool(ctx)
        self.bufs: dict = {}        # name -> (Buffer, nbytes)
        self._dummy = None
        self.seq = None             # recorded by the first run

    def put(self, name: str, arr: np.ndarray) -> None:
        """``arr`` (float32 or uint32, C order) into the buffer ``name`` (made on first use)."""
        a = np.ascontiguousarray(arr)
        if a.nbytes:
            hit = self.bufs.get(name)
            if hit is None:
                hit = self.bufs[name] = (self.pool.acquire(a.nbytes), a.nbytes)
            assert hit[1] == a.nbytes, name
            rt.upload(hit[0], a)

    def empty(self, name: str, n_elems: int) -> None:
        """A buffer of ``n_elems`` float32 under ``name`` (written by the kernels; made once)."""
        if n_elems and name not in self.bufs:
            self.bufs[name] = (self.pool.acquire(4 * n_elems), 4 * n_elems)

    def get(self, name: str, shape: tuple) -> np.ndarray:
        """The float32 array ``name`` read back, in ``shape``."""
        if name not in self.bufs:
            return np.zeros(shape, _F32)
        return rt.download(self.bufs[name][0], (shape, _F32))

    def bind(self, name: str) -> tuple:
        hit = self.bufs.get(name)
        if hit is None:
            if self._dummy is None:
                self._dummy = self.pool.acquire(16)
            return (self._dummy, 0, 16)
        return (hit[0], 0, hit[1])

    def run(self, record) -> None:
        """Submit the sequence (recorded with ``record(seq)`` the first time) and wait."""
        if self.seq is None:
            seq = rt.Sequence(self.ctx)
            try:
                record(seq)
                seq.finish()
            except BaseException:
                seq.close()
                raise
            self.seq = seq
        self.seq.submit()

    def close(self) -> None:
        """The sequence freed, the buffers back to the pool (unless the context closed: its
        pool frees them)."""
        if self.seq is not None:
            self.seq.close()
            self.seq = None
        bufs = [b for b, _ in self.bufs.values()] + ([self._dummy] if self._dummy is not None else [])
        self.bufs.clear()
        self._dummy = None
        if self.ctx.closed or self.pool.closed:
            return
        for buf in bufs:
            try:
                self.pool.release(buf)
            except ValueError:   # (the pool was replaced meanwhile: it is no longer this one's)
                pass


class Kept:
    """The M3Calls of one context kept for their repeats, by key (op, dims, rotation, plan): a call
    takes its shape's (:meth:`take`: exclusive, so two threads never share one) and gives it
    back after (:meth:`give`); the least recent beyond MAX_KEPT are closed. Closed with the
    context."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.lock = threading.Lock()
        self.calls: OrderedDict = OrderedDict()
        self.closed = False
        ctx.owned.adopt(self)

    def take(self, key) -> M3Call | None:
        with self.lock:
            return self.calls.pop(key, None)

    def give(self, key, call: M3Call) -> None:
        with self.lock:
            if self.closed:
                old = [call]
            else:
                old = [self.calls.pop(key)] if key in self.calls else []
                self.calls[key] = call
                while len(self.calls) > MAX_KEPT:
                    old.append(self.calls.popitem(last=False)[1])
        for c in old:
            c.close()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            calls = list(self.calls.values())
            self.calls.clear()
        for c in calls:
            c.close()
        self.ctx.owned.forget(self)


def kept(ctx) -> Kept:
    """The context's kept Mamba-3 calls (made on first use, closed with the context)."""
    return ctx.owned.extension("mamba3_calls", Kept)


def _put_inputs(call: M3Call, p) -> None:
    for k in ("x", "dt", "dA", "lam", "B", "C", "B_bias", "C_bias", "dtheta", "psi", *_STATES):
        call.put(k, getattr(p, k))
    call.put("ids", p.ids.astype(np.uint32))


def _on_device(dec: _Decided, key: tuple, body, fp=None):
    """``body(call)`` on the decided device, the context held, in the call kept for ``key`` (or
    a new one, kept after it ran; one that raised is closed). ``fp``: the plan the call runs
    (default the decision's; its recompute's for a flagged result)."""
    ctx = dec.ctx
    token = ctx.enter()
    try:
        store = kept(ctx)
        call = store.take(key) or M3Call(ctx, dec.engine, dec.fp if fp is None else fp, config.settings())
        try:
            out = body(call)
        except BaseException:
            call.close()
            raise
        store.give(key, call)
        return out
    finally:
        ctx.leave(token)


def _fall_back(reason: str):
    log_once(f"ssm_vk computes mamba3 on the CPU (ssm_fast): {reason}")
    import ssm_fast

    return ssm_fast


def supports(op, x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi=None, s_theta=None, s_h=None, s_k=None,
             s_v=None, ids=None, *, rotation="interleaved", dtype=np.float32, update_cache=False) -> Support:
    """Whether ssm_vk runs this Mamba-3 case on the device (else the call computes it with ssm_fast
    on the CPU, ``where == "CPU"``), and why not: the decision the call takes. ``op``:
    "mamba3_scan" or "mamba3_scan_back"; the arguments are mamba3_scan's. Bad input raises as
    the call would."""
    if op not in OPS:
        raise ValueError(f"op: expected one of {', '.join(map(repr, OPS))}, got {op!r}")
    _float32_only(dtype)
    args = [_host(a) for a in (x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v)]
    p = check_mamba3_forward(*args, ids, rotation=rotation, dtype=_F32)
    if update_cache is not False:
        if op != MAMBA3.name:
            raise ValueError(f"update_cache: only mamba3_scan writes into the cache, expected False for {op}")
        check_mamba3_update_cache(update_cache, (s_theta, s_h, s_k, s_v), p)
    return decide(op, p.dims).sup


def mamba3_scan(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi=None, s_theta=None, s_h=None, s_k=None,
                s_v=None, ids=None, *, rotation="interleaved", dtype=np.float32, update_cache=False) -> Mamba3Result:
    """The Mamba-3 scan on the Vulkan device. Arguments, shapes and errors as ssm_ref.mamba3_scan
    (docs/SPEC.md section 14): x (S,T,H,P), dt dA lam (S,T,H), B C (S,T,G,N) SISO | (S,T,M,G,N)
    MIMO, B_bias C_bias (H,N) | (H,M,N), dtheta (S,T,H,F), psi (H,M,P) or None, the start state
    s_theta (R,H,F), s_h (R,H,P,N), s_k (R,H,N)|(R,H,M,N), s_v (R,H,P)|(R,H,M,P) (all four or
    none), ids (S,) or None; rotation "interleaved" | "halved"; ``dtype`` np.float32 only
    (ValueError otherwise). update_cache=True writes the four final states into rows ids of the
    caches in place (writeable numpy float arrays, ids distinct) and returns them as None.

    Returns Mamba3Result(y, theta, h, k, v, where="Vulkan<i>"), float32 numpy arrays; a case the
    device cannot run (supports() says why) is computed by ssm_fast (where="CPU"). Raises
    TypeError / ValueError naming the argument before any Vulkan call.
    """
    _float32_only(dtype)
    states = tuple(_host(s) for s in (s_theta, s_h, s_k, s_v))
    p = check_mamba3_forward(*(_host(a) for a in (x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi)), *states, ids,
                             rotation=rotation, dtype=_F32)
    caches = (s_theta, s_h, s_k, s_v)
    update = check_mamba3_update_cache(update_cache, caches, p)
    d = p.dims
    dec = decide(MAMBA3.name, d)
    if not dec.sup:
        return _fall_back(dec.sup.reason).mamba3_scan(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, *caches, ids,
                                                      rotation=rotation, update_cache=update_cache)
    S, T, H, P, N, M, F = d.S, d.T, d.H, d.P, d.N, d.M, d.F

    def forward(fp):
        fam = fp.family   # (the outputs on plan fp, or None where its kernels flagged a non-finite value)

        def body(call: M3Call):
            _put_inputs(call, p)
            for k, n in (("y", S * T * M * H * P), ("theta", S * H * F), ("h", S * H * P * N),
                         ("k", S * H * M * N), ("v", S * H * M * P), *fam.scratch(d, fp.plan, False).items()):
                call.empty(k, n)
            call.run(lambda seq: fam.record_forward(seq, call, p, call.bufs))
            if fam.flags(fp.plan) and call.get(_FLAG, (4,)).view(np.uint32)[0]:
                return None
            return (call.get("y", (S, T, M, H, P)), call.get("theta", (S, H, F)), call.get("h", (S, H, P, N)),
                    call.get("k", (S, H, M, N)), call.get("v", (S, H, M, P)))

        return _on_device(dec, (MAMBA3.name, d, p.rotation, fp.plan), body, fp)

    # A result the chunked kernels flag (an input or output not finite) is computed again by the
    # token-sequential kernels, whose inf and nan follow the spec (counted in engine.reruns).
    out = forward(dec.fp)
    if out is None:
        note_rerun(dec.engine, d)
    y, theta, h, k, v = out if out is not None else forward(dec.fp.rerun)
    where = dec.ctx.info.where
    y, k, v = drop_rank(d, y, 2), drop_rank(d, k, 2), drop_rank(d, v, 2)
    if update:
        for cache, final in zip(caches, (theta, h, k, v), strict=True):
            cache[p.ids] = final
        return Mamba3Result(y=y, theta=None, h=None, k=None, v=None, where=where)
    return Mamba3Result(y=y, theta=theta, h=h, k=k, v=v, where=where)


def mamba3_scan_back(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi=None, s_theta=None, s_h=None, s_k=None,
                     s_v=None, ids=None, g_y=None, g_theta=None, g_h=None, g_k=None, g_v=None, *,
                     rotation="interleaved", dtype=np.float32) -> Mamba3Grads:
    """Backward of :func:`mamba3_scan` on the Vulkan device for the loss Σ y·g_y + Σ theta·g_theta
    + Σ h·g_h + Σ k·g_k + Σ v·g_v (each cotangent in its output's shape, or None for zeros);
    arguments and errors as ssm_ref.mamba3_scan_back. Returns Mamba3Grads (a read-only mapping by
    name), float32: d_x, d_dt, d_dA, d_lam, d_B, d_C, d_B_bias, d_C_bias, d_dtheta, d_psi (None
    when psi is None), d_s_theta, d_s_h, d_s_k, d_s_v in the caches' shapes (each sequence's
    start-state gradient added into row ids[i], in sequence order). Every sum over heads,
    channels and sequences is taken in a fixed order: reruns are bit-identical. A case the
    device cannot run is computed by ssm_fast (where="CPU")."""
    _float32_only(dtype)
    args = [_host(a) for a in (x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v)]
    cots = [_host(a) for a in (g_y, g_theta, g_h, g_k, g_v)]
    p = check_mamba3_backward(*args, ids, *cots, rotation=rotation, dtype=_F32)
    d = p.dims
    dec = decide(MAMBA3.backward_name, d)
    if not dec.sup:
        return _fall_back(dec.sup.reason).mamba3_scan_back(*args, ids, *cots, rotation=rotation)
    S, T, H, P, N, G, M, F, R = d.S, d.T, d.H, d.P, d.N, d.G, d.M, d.F, d.R
    MN, MP = M * N, M * P
    fam = dec.fp.family
    st = (S * H * F, S * H * P * N, S * H * MN, S * H * MP)
    gstate = np.concatenate([a.reshape(-1) for a in (p.g_theta, p.g_h, p.g_k, p.g_v)])

    def body(call: M3Call):
        _put_inputs(call, p)
        call.put("g_y", p.g_y)
        call.put("g_state", gstate)
        for k, n in (("d_x", S * T * H * P), ("d_step", 3 * S * T * H), ("d_dtheta", S * T * H * F),
                     ("d_B", S * T * MN * G), ("d_C", S * T * MN * G), ("d_parts", H * (2 * MN + MP)),
                     ("d_start", sum(st)), *fam.scratch(d, call.plan, True).items()):
            call.empty(k, n)
        call.run(lambda seq: fam.record_backward(seq, call, p, call.bufs))
        return {k: call.get(k, shape) for k, shape in (
            ("d_x", (S, T, H, P)), ("d_step", (3, S, T, H)), ("d_dtheta", (S, T, H, F)), ("d_B", (S, T, M, G, N)),
            ("d_C", (S, T, M, G, N)), ("d_parts", (H, 2 * MN + MP)), ("d_start", (sum(st),)))}

    g = _on_device(dec, (MAMBA3.backward_name, d, p.rotation, dec.fp.plan), body)
    parts, start = g["d_parts"], g["d_start"]
    cut = np.cumsum(st)
    d0_th, d0_h, d0_k, d0_v = np.split(start, cut[:-1])
    out = {"d_x": g["d_x"], "d_dt": g["d_step"][0], "d_dA": g["d_step"][1], "d_lam": g["d_step"][2],
           "d_dtheta": g["d_dtheta"],
           "d_B": drop_rank(d, g["d_B"], 2), "d_C": drop_rank(d, g["d_C"], 2),
           "d_B_bias": drop_rank(d, parts[:, :MN].reshape(H, M, N), 1),
           "d_C_bias": drop_rank(d, parts[:, MN:2 * MN].reshape(H, M, N), 1),
           "d_psi": parts[:, 2 * MN:].reshape(H, M, P) if p.psi_given else None,
           "d_s_theta": scatter_rows(d0_th.reshape(S, H, F), p.ids, R),
           "d_s_h": scatter_rows(d0_h.reshape(S, H, P, N), p.ids, R),
           "d_s_k": scatter_rows(drop_rank(d, d0_k.reshape(S, H, M, N), 2), p.ids, R),
           "d_s_v": scatter_rows(drop_rank(d, d0_v.reshape(S, H, M, P), 2), p.ids, R)}
    return Mamba3Grads(**out, where=dec.ctx.info.where)
