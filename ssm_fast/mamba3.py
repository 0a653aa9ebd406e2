"""ssm_fast's Mamba-3 scan: ``mamba3_scan`` and ``mamba3_scan_back`` on the numba CPU kernels
(kernels_m3_fwd, kernels_m3_bwd), with the arguments, results and errors of ssm_ref's.

    y, theta, h, k, v = ssm_fast.mamba3_scan(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta)
    g = ssm_fast.mamba3_scan_back(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, g_y=g_y)

Every argument goes through ssm_ref's one validator (ssm_ref.mamba3_checks), so a bad input
raises here exactly as there. float32 storage and arithmetic; per-row sums of the backward that
cross rows (dα over the channels, d_psi, the biases' sums over sequences and tokens) are added in
float64. Results are bit-identical run to run and for any thread count: tasks are (sequence,
head) and every sum across tasks is made afterwards in a fixed order.

The decode step (``update_cache=True`` with T = 1 and float32 C-contiguous caches, what
generation calls per token) runs one kernel in place on the four caches, with no scratch arrays
besides y.
"""

from __future__ import annotations

import math

import numpy as np

from ssm_ref.checks import check_dtype
from ssm_ref.mamba3_checks import (
    check_mamba3_backward,
    check_mamba3_forward,
    check_mamba3_update_cache,
    drop_rank,
)
from ssm_ref.results import Mamba3Grads, Mamba3Result, Support
from ssm_ref.scan import scatter_rows

from . import config, guard, pool, threads
from . import kernels_m3_bwd as _kb
from . import kernels_m3_fwd as _kf

__all__ = ["OPS", "backward_segment", "mamba3_scan", "mamba3_scan_back", "supports", "warmup"]

OPS = ("mamba3_scan", "mamba3_scan_back")
WHERE = "CPU"
_F32 = np.dtype(np.float32)


def _reference():
    """ssm_ref, for a process that must not launch the kernels (guard.unusable), said once."""
    import ssm_fast

    return ssm_fast._reference()


def _threads(d, op: str) -> int:
    """Threads for one call: 1 when its estimated single-thread time (config.M3_SECONDS_PER_*)
    is below config.SERIAL_BELOW_S, else get_num_threads() (at most one per task). The choice
    never changes the results."""
    tasks = _kf.n_tasks(d.S, d.H)
    states = d.S * d.H * d.P * d.N
    est = (config.M3_SECONDS_PER_UPDATE[op] * states * d.M * max(d.T, 1)
           + config.M3_SECONDS_PER_STATE[op] * states)
    if tasks < 2 or est < config.SERIAL_BELOW_S:
        return 1
    return max(1, min(tasks, threads.get_num_threads()))


def _ro(a: np.ndarray) -> np.ndarray:
    """``a`` read-only (a read-only view where it is writable). numba types a read-only array
    apart from a writable one, so the checked problem's own arrays (zeros for a None cotangent or
    start state, ones for psi None) and the caller's read-only views would otherwise compile one
    kernel per combination (7 s each)."""
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def _inputs(p) -> tuple:
    """The forward's inputs as the kernels take them, all read-only."""
    return tuple(_ro(a) for a in (p.x, p.dt, p.dA, p.lam, p.B, p.C, p.B_bias, p.C_bias, p.dtheta, p.psi))


def _plain_f32(a) -> bool:
    return isinstance(a, np.ndarray) and a.dtype == _F32 and a.flags.c_contiguous and a.flags.writeable


def _cache_view(d, a: np.ndarray) -> np.ndarray:
    """A SISO k or v cache (R, H, N|P) seen with the rank axis of 1 the kernels read (a view)."""
    return a if d.mimo else a[:, :, None]


def mamba3_scan(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi=None, s_theta=None, s_h=None, s_k=None,
                s_v=None, ids=None, *, rotation="interleaved", dtype=np.float32, update_cache=False) -> Mamba3Result:
    """The Mamba-3 scan on the CPU (numba). Arguments, shapes and errors as ssm_ref.mamba3_scan
    (docs/SPEC.md, "Mamba-3"): x (S,T,H,P), dt dA lam (S,T,H), B C (S,T,G,N) SISO | (S,T,M,G,N)
    MIMO, B_bias C_bias (H,N) | (H,M,N), dtheta (S,T,H,F), psi (H,M,P) or None, the start state
    s_theta (R,H,F), s_h (R,H,P,N), s_k (R,H,N)|(R,H,M,N), s_v (R,H,P)|(R,H,M,P) (all four or none),
    ids (S,) or None; rotation "interleaved" | "halved". ``dtype``: np.float32 only (the kernels'
    arithmetic; ValueError otherwise -- the float64 oracle is ssm_ref's). update_cache=True writes
    the four final states into rows ids of the caches in place and returns them as None.

    Returns Mamba3Result(y (S,T,H,P) | (S,T,M,H,P), theta (S,H,F), h (S,H,P,N), k, v), float32,
    where="CPU". Raises TypeError / ValueError naming the argument before any work. Inputs are
    never written, except the caches with update_cache=True.
    """
    _float32_only(dtype)
    if guard.unusable():
        return _reference().mamba3_scan(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v,
                                        ids, rotation=rotation, update_cache=update_cache)
    p = check_mamba3_forward(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v, ids,
                             rotation=rotation, dtype=_F32)
    caches = (s_theta, s_h, s_k, s_v)
    update = check_mamba3_update_cache(update_cache, caches, p)
    d = p.dims
    S, T, H, P, N, M, F = d.S, d.T, d.H, d.P, d.N, d.M, d.F
    halved = p.rotation == "halved"
    y = np.empty((S, T, M, H, P), dtype=_F32)
    n = _kf.n_tasks(S, H)
    if update and T == 1 and all(_plain_f32(c) for c in caches):
        # the decode step: in place on the caches, each state element read and written once
        c_k, c_v = _cache_view(d, s_k), _cache_view(d, s_v)
        args = (np.zeros(1, np.int64), *_inputs(p), s_theta, s_h, c_k, c_v, _ro(p.ids), halved, n, y)
        pool.run(_kf.decode, args, _threads(d, "fwd"))
        return Mamba3Result(y=drop_rank(d, y, 2), theta=None, h=None, k=None, v=None, where=WHERE)
    if T == 0:
        ids_ = p.ids
        theta, h, k, v = (p.s_theta[ids_], p.s_h[ids_], p.s_k[ids_], p.s_v[ids_])
    else:
        theta = np.empty((S, H, F), dtype=_F32)
        h = np.empty((S, H, P, N), dtype=_F32)
        k = np.empty((S, H, M, N), dtype=_F32)
        v = np.empty((S, H, M, P), dtype=_F32)
        args = (np.zeros(1, np.int64), *_inputs(p), _ro(p.s_theta), _ro(p.s_h), _ro(p.s_k), _ro(p.s_v),
                _ro(p.ids), halved, n, y, theta, h, k, v)
        pool.run(_kf.forward, args, _threads(d, "fwd"))
    y, k, v = drop_rank(d, y, 2), drop_rank(d, k, 2), drop_rank(d, v, 2)
    if update:
        for cache, final in zip(caches, (theta, h, k, v), strict=True):
            cache[p.ids] = final
        return Mamba3Result(y=y, theta=None, h=None, k=None, v=None, where=WHERE)
    return Mamba3Result(y=y, theta=theta, h=h, k=k, v=v, where=WHERE)


def _float32_only(dtype) -> None:
    """dtype checked as ssm_ref checks it (the same TypeError), then float32 only."""
    if dtype is np.float32:
        return
    if check_dtype(dtype) != _F32:
        raise ValueError(f"dtype: ssm_fast computes in float32 only, got {np.dtype(dtype).name} "
                         f"(the float64 oracle is ssm_ref.mamba3_scan)")


def backward_segment(d) -> int:
    """Tokens per recompute segment of the backward, a function of the shape only. Its buffers
    (per token the pre-decay state, rotated keys and queries, cos and sin) fit
    config.M3_SEGMENT_BYTES, at least config.SEGMENT_MIN tokens, at most T. Where the checkpoints
    (one state per segment) would then take more than that budget too, segments of about sqrt(T)
    tokens instead: the two buffers together at their smallest, O(sqrt(T) P N) per task."""
    per_token = 4 * (d.P * d.N + 2 * d.M * d.N + 2 * d.F)
    seg = config.M3_SEGMENT_BYTES // max(per_token, 1)
    max_cps = max(1, config.M3_SEGMENT_BYTES // max(4 * d.P * d.N, 1))
    if -(-d.T // max(seg, 1)) > max_cps:
        seg = max(seg, math.isqrt(d.T) + 1)
    return int(max(config.SEGMENT_MIN, min(seg, max(d.T, 1))))


def mamba3_scan_back(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi=None, s_theta=None, s_h=None, s_k=None,
                     s_v=None, ids=None, g_y=None, g_theta=None, g_h=None, g_k=None, g_v=None, *,
                     rotation="interleaved", dtype=np.float32) -> Mamba3Grads:
    """Backward of :func:`mamba3_scan` for the loss Σ y·g_y + Σ theta·g_theta + Σ h·g_h + Σ k·g_k +
    Σ v·g_v (each cotangent in its output's shape or None for zeros); arguments and errors as
    ssm_ref.mamba3_scan_back. Returns Mamba3Grads (a read-only mapping by name), float32: d_x,
    d_dt, d_dA, d_lam, d_B, d_C, d_B_bias, d_C_bias, d_dtheta in their inputs' shapes, d_psi (None
    when psi is None), d_s_theta, d_s_h, d_s_k, d_s_v in the caches' shapes (each sequence's
    start-state gradient scatter-added into row ids[i]; (S, ...) when no states were given).
    Bit-identical for any thread count. Scratch: the backward recomputes the forward's states
    segment by segment (backward_segment), about config.M3_SEGMENT_BYTES per thread, plus two
    (S,T,M,H,N) float32 arrays of per-head key and query gradients when groups hold several heads.
    """
    _float32_only(dtype)
    if guard.unusable():
        return _reference().mamba3_scan_back(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k,
                                             s_v, ids, g_y, g_theta, g_h, g_k, g_v, rotation=rotation)
    p = check_mamba3_backward(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v, ids,
                              g_y, g_theta, g_h, g_k, g_v, rotation=rotation, dtype=_F32)
    d = p.dims
    S, T, H, P, N, G, M, F = d.S, d.T, d.H, d.P, d.N, d.G, d.M, d.F
    f32 = _F32
    d_x = np.zeros((S, T, H, P), f32)
    d_dt = np.zeros((S, T, H), f32)
    d_dA = np.zeros((S, T, H), f32)
    d_lam = np.zeros((S, T, H), f32)
    d_dtheta = np.zeros((S, T, H, F), f32)
    hpg = d.heads_per_group
    if T == 0:   # the outputs are the start state: its gradients are the cotangents
        d0 = (p.g_theta, p.g_h, p.g_k, p.g_v)
        d_B = np.zeros((S, T, M, G, N), f32)
        d_C = np.zeros((S, T, M, G, N), f32)
        d_B_bias = np.zeros((H, M, N), f32)
        d_C_bias = np.zeros((H, M, N), f32)
        d_psi = np.zeros((H, M, P), f32)
    else:
        slab_B = np.empty((S, T, M, H, N), f32)
        slab_C = np.empty((S, T, M, H, N), f32)
        psi_part = np.empty((S, H, M, P), np.float64)
        d0 = (np.empty((S, H, F), f32), np.empty((S, H, P, N), f32), np.empty((S, H, M, N), f32),
              np.empty((S, H, M, P), f32))
        seg = backward_segment(d)
        args = (np.zeros(1, np.int64), *_inputs(p),
                *(_ro(a) for a in (p.s_theta, p.s_h, p.s_k, p.s_v, p.ids, p.g_y, p.g_theta, p.g_h, p.g_k, p.g_v)),
                p.rotation == "halved", seg, _kf.n_tasks(S, H),
                d_x, d_dt, d_dA, d_lam, d_dtheta, slab_B, slab_C, psi_part, *d0)
        pool.run(_kb.backward, args, _threads(d, "bwd"))
        # the sums across tasks, each in a fixed order (numpy, one thread): heads of a group
        # (h ascending), sequences and tokens for the biases and psi, in float64 where long
        if hpg == 1:
            d_B, d_C = slab_B.reshape(S, T, M, G, N), slab_C.reshape(S, T, M, G, N)
        else:
            d_B = slab_B.reshape(S, T, M, G, hpg, N).sum(axis=4)
            d_C = slab_C.reshape(S, T, M, G, hpg, N).sum(axis=4)
        d_B_bias = slab_B.sum(axis=(0, 1), dtype=np.float64).transpose(1, 0, 2).astype(f32)
        d_C_bias = slab_C.sum(axis=(0, 1), dtype=np.float64).transpose(1, 0, 2).astype(f32)
        d_psi = psi_part.sum(axis=0).astype(f32)
    R = d.R
    d_s_theta, d_s_h = scatter_rows(d0[0], p.ids, R), scatter_rows(d0[1], p.ids, R)
    d_s_k, d_s_v = scatter_rows(drop_rank(d, d0[2], 2), p.ids, R), scatter_rows(drop_rank(d, d0[3], 2), p.ids, R)
    return Mamba3Grads(
        d_x=d_x, d_dt=d_dt, d_dA=d_dA, d_lam=d_lam,
        d_B=drop_rank(d, d_B, 2), d_C=drop_rank(d, d_C, 2),
        d_B_bias=drop_rank(d, d_B_bias, 1), d_C_bias=drop_rank(d, d_C_bias, 1),
        d_dtheta=d_dtheta, d_psi=d_psi if p.psi_given else None,
        d_s_theta=d_s_theta, d_s_h=d_s_h, d_s_k=d_s_k, d_s_v=d_s_v, where=WHERE)


def supports(op, *args, **kw) -> Support:
    """ssm_fast runs every Mamba-3 problem the reference accepts (float32). Takes mamba3_scan's
    arguments (``update_cache`` only with op "mamba3_scan"); bad input raises as there."""
    update_cache = kw.pop("update_cache", False)
    dtype = kw.pop("dtype", np.float32)
    _float32_only(dtype)
    p = check_mamba3_forward(*args, **kw, dtype=_F32)
    if update_cache is not False:
        if op != "mamba3_scan":
            raise ValueError(f"update_cache: only mamba3_scan writes into the cache, expected False for {op}")
        names = ("s_theta", "s_h", "s_k", "s_v")
        caches = tuple(kw.get(n, args[10 + k] if len(args) > 10 + k else None) for k, n in enumerate(names))
        check_mamba3_update_cache(update_cache, caches, p)
    return Support(True, "numba CPU kernels run every Mamba-3 shape")


def warmup() -> None:
    """Compile (or load from the cache) the Mamba-3 kernels on tiny SISO and MIMO problems."""
    rng = np.random.default_rng(0)
    S, T, H, P, N, F = 1, 2, 2, 2, 4, 1
    for M in (None, 2):
        rank = () if M is None else (M,)
        a = dict(x=rng.standard_normal((S, T, H, P)), dt=np.full((S, T, H), 0.1), dA=np.full((S, T, H), -0.1),
                 lam=np.full((S, T, H), 0.5), B=rng.standard_normal((S, T, *rank, 1, N)),
                 C=rng.standard_normal((S, T, *rank, 1, N)), B_bias=np.zeros((H, *rank, N)),
                 C_bias=np.zeros((H, *rank, N)), dtheta=np.zeros((S, T, H, F)))
        mamba3_scan(**a)
        mamba3_scan_back(**a, g_y=np.ones((S, T, *rank, H, P)))
        st = dict(s_theta=np.zeros((S, H, F), np.float32), s_h=np.zeros((S, H, P, N), np.float32),
                  s_k=np.zeros((S, H, *rank, N), np.float32), s_v=np.zeros((S, H, *rank, P), np.float32))
        one = {k: (v[:, :1] if k in ("x", "dt", "dA", "lam", "B", "C", "dtheta") else v) for k, v in a.items()}
        mamba3_scan(**one, **st, update_cache=True)
