"""The Mamba-3 scan on the Vulkan device (docs/SPEC.md section 14; docs/API.md): ``mamba3_scan``,
``mamba3_scan_back`` and their support decision, beside the selective scan's (api.py).

A call: ssm_ref's validator (ssm_ref.mamba3_checks) checks every argument before any Vulkan call
(a DeviceArray by its shape and dtype: never read back); the support decision (:func:`decide`: the
context, the plan of the op's family through ssm_vk.registry, the memory budget, the kernels'
SPIR-V and limits) is cached in the context's Engine; a call the device runs goes through
ssm_vk.mamba3_run in the Engine's workspace of its shape (float32 DeviceArrays bound in place,
host arrays uploaded), one submission; one it cannot is computed by ssm_fast on the CPU
(``where == "CPU"``), the reason logged once. As the scan's: when any input is a DeviceArray the
results are DeviceArrays (also from the CPU, uploaded), else numpy arrays.

A call whose every input is a DeviceArray (or None) and that repeats one that ran on the device
runs through the Replay kept for its signature (replay_cache.py, ``m3_signature``; the scan's one
mechanism for repeated calls), skipping the validator's shape checks, the decision and the
bindings. update_cache=True writes the four final state parts into the rows ids of the caches:
DeviceArray caches on the device, by the call's own sequence; host caches after the call.
"""

from __future__ import annotations

import numpy as np

from ssm_ref import Support
from ssm_ref.checks import check_dtype
from ssm_ref.ids import check_distinct_ids
from ssm_ref.mamba3_checks import ROTATIONS, check_mamba3_backward, check_mamba3_forward, check_mamba3_update_cache
from ssm_ref.ops import MAMBA3
from ssm_ref.precision import check_precision
from ssm_ref.results import Mamba3Grads, Mamba3Result

from . import config, mamba3_run, outputs, registry, replay_cache
from .arrays import DeviceArray, upload_to
from .decision import kernels_problem
from .engine import engine_of
from .family import OnHost, Planned, RecomputeOnHost
from .mamba3_memory import memory
from .mamba3_workspace import STATE_PARTS
from .sizing import TooLarge
from .support import PRECISION, context_or_reason, log_once, with_precision
from .validate import frozen_result

__all__ = ["OPS", "check_update", "decide", "device_problem", "float32_only", "mamba3_scan", "mamba3_scan_back",
           "stand_ins", "supports"]

OPS = (MAMBA3.name, MAMBA3.backward_name)   # "mamba3_scan", "mamba3_scan_back"
_F32 = np.dtype(np.float32)
_STATES = ("s_theta", "s_h", "s_k", "s_v")
_INPUTS = MAMBA3.float_inputs      # the 14 float inputs, x .. s_v
_COTS = MAMBA3.cotangent_names     # g_y, g_theta, g_h, g_k, g_v


def float32_only(dtype) -> None:
    """dtype checked as ssm_ref checks it (the same TypeError), then float32 only (ValueError)."""
    if dtype is np.float32:
        return
    if check_dtype(dtype) != _F32:
        raise ValueError(f"dtype: ssm_vk computes in float32 only, got {np.dtype(dtype).name} "
                         f"(the float64 oracle is ssm_ref.mamba3_scan)")


def stand_ins(arrays) -> list:
    """What the validator reads of each argument: a DeviceArray as an uninitialised host array of
    its shape and dtype (its shape and dtype checked as a host array's, nothing read back; the
    memory is never touched, so not even allocated for a large one); the rest as given."""
    return [np.empty(a.shape, a.dtype) if type(a) is DeviceArray else a for a in arrays]


class _Decided:
    """A support decision (support.Decided's fields): ``sup``, ``engine``, ``info`` (the context's
    then), ``planned`` (family.Planned: its ``softplus`` slot holds the rotation's code)."""

    __slots__ = ("engine", "info", "planned", "sup")

    def __init__(self, sup: Support, engine=None, info=None, planned=None):
        self.sup, self.engine, self.info, self.planned = sup, engine, info, planned


def decide(op: str, d, knobs=None, rotation: str = "interleaved") -> _Decided:
    """Whether a problem of dims ``d`` (ssm_ref.mamba3_checks.M3Dims) runs on the device for ``op``
    ("mamba3_scan" or "mamba3_scan_back"), and its plans -- cached in the context's Engine."""
    ctx, reason = context_or_reason()
    if ctx is None:
        return _Decided(Support(False, reason))
    knobs = config.settings() if knobs is None else knobs
    engine = engine_of(ctx)
    info = ctx.info
    form = ROTATIONS.index(rotation)
    key = (id(info), op, d, knobs.key, form)
    hit = engine.decision(key)
    if hit is not None and hit.info is info:
        return hit
    backward = op == MAMBA3.backward_name
    lim = engine.limits(info, knobs)
    try:
        fp = registry.plan(d, lim, backward, knobs, op=MAMBA3.name)
    except TooLarge as e:
        out = _Decided(Support(False, str(e)), info=info)
        engine.remember(key, out)
        return out
    cuts, why = memory(d, backward, fp, lim, info, ctx.live_allocations.count)
    if why:
        return _Decided(Support(False, why))
    why = kernels_problem(lim, registry.kernels_needed(d, fp, backward))
    if why:   # (not cached: glslc on PATH or a warm cache may lift it)
        return _Decided(Support(False, why))
    where = f"runs on {info.where} ({info.name})"
    if isinstance(fp.rerun, OnHost):   # (said where the call may leave the device)
        where += f"; a result holding inf or nan is computed on the CPU: {fp.rerun.reason}"
    out = _Decided(Support(True, where), engine, info, Planned(fp, d, lim, backward, knobs, form, cuts=cuts))
    engine.remember(key, out)
    return out


def _fall_back(reason: str):
    log_once(f"ssm_vk computes mamba3 on the CPU (ssm_fast): {reason}")
    import ssm_fast

    return ssm_fast


def _host(a):
    return a.numpy() if type(a) is DeviceArray else a


def _ctx_of(arrays):
    """The context of the first DeviceArray of ``arrays``, or None (every one on the host)."""
    return next((a.ctx for a in arrays if type(a) is DeviceArray), None)


def device_problem(p, given: dict):
    """Checked problem ``p`` with the caller's DeviceArrays (``given``: name -> argument) in place of
    the validator's stand-ins, and None for absent cotangents (zeros the call fills)."""
    q = object.__new__(type(p))
    q.__dict__.update(p.__dict__)
    q.__dict__.update({k: v for k, v in given.items() if type(v) is DeviceArray or (v is None and k in _COTS)})
    return q


def check_update(update_cache, caches: tuple, p) -> bool:
    """check_mamba3_update_cache, a DeviceArray cache taking the place of a writeable array (its
    dtype checked: a float32 one)."""
    if update_cache is not True:
        return check_mamba3_update_cache(update_cache, caches, p)
    return check_mamba3_update_cache(True, tuple(stand_ins(caches)), p)


def supports(op, x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi=None, s_theta=None, s_h=None, s_k=None,
             s_v=None, ids=None, *, rotation="interleaved", dtype=np.float32, update_cache=False,
             precision="highest") -> Support:
    """Whether ssm_vk runs this Mamba-3 case on the device (else the call computes it with ssm_fast
    on the CPU, ``where == "CPU"``), and why not: the decision the call takes. ``op``:
    "mamba3_scan" or "mamba3_scan_back"; the arguments are mamba3_scan's (DeviceArrays or host
    arrays; ``precision``: what a call asking for it computes, in the reason). Bad input raises as
    the call would."""
    if op not in OPS:
        raise ValueError(f"op: expected one of {', '.join(map(repr, OPS))}, got {op!r}")
    float32_only(dtype)
    args = stand_ins((x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v))
    p = check_mamba3_forward(*args, ids, rotation=rotation, dtype=_F32)
    if update_cache is not False:
        if op != MAMBA3.name:
            raise ValueError(f"update_cache: only mamba3_scan writes into the cache, expected False for {op}")
        check_update(update_cache, (s_theta, s_h, s_k, s_v), p)
    if precision is not PRECISION:
        check_precision(precision)
    return with_precision(decide(op, p.dims, rotation=p.rotation).sup, precision)


def _result(out: dict, where: str, ctx=None) -> Mamba3Result:
    """The Mamba3Result of a call's outputs (``ctx``: a CPU call's arrays uploaded there)."""
    if ctx is not None:
        out = {k: None if v is None else upload_to(ctx, v) for k, v in out.items()}
    return frozen_result(Mamba3Result, {"y": out["y"], "theta": out["theta"], "h": out["h"], "k": out["k"],
                                        "v": out["v"], "where": where})


def mamba3_scan(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi=None, s_theta=None, s_h=None, s_k=None,
                s_v=None, ids=None, *, rotation="interleaved", dtype=np.float32, update_cache=False,
                precision="highest", out=None) -> Mamba3Result:
    """The Mamba-3 scan on the Vulkan device. Arguments, shapes and errors as ssm_ref.mamba3_scan
    (docs/SPEC.md section 14): x (S,T,H,P), dt dA lam (S,T,H), B C (S,T,G,N) SISO | (S,T,M,G,N)
    MIMO, B_bias C_bias (H,N) | (H,M,N), dtheta (S,T,H,F), psi (H,M,P) or None, the start state
    s_theta (R,H,F), s_h (R,H,P,N), s_k (R,H,N)|(R,H,M,N), s_v (R,H,P)|(R,H,M,P) (all four or
    none), ids (S,) or None; rotation "interleaved" | "halved"; ``dtype`` np.float32 only
    (ValueError otherwise). Each array a host array or a float32 DeviceArray of the open context
    (``ssm_vk.to_device``: bound in place, never read back); when any input is a DeviceArray the
    results are DeviceArrays on that device (also when the call falls back to the CPU), else numpy
    arrays. update_cache=True writes the four final states into rows ids of the caches (ids
    distinct) and returns them as None: a DeviceArray cache on the device, by the call itself
    (nothing read back); a host cache (a writeable numpy float array) after the call.
    ``out``: {name: DeviceArray} of every output (y, theta, h, k, v in their shapes), written by
    the call and returned as the result's arrays (the rules of ssm_vk.ssm_scan's ``out``; not
    with update_cache). ``precision``: as ssm_vk.ssm_scan's (every call computes at "highest", its
    result's ``precision`` says so).

    Returns Mamba3Result(y, theta, h, k, v, where="Vulkan<i>"); a case the device cannot run
    (supports() says why) is computed by ssm_fast (where="CPU"). Raises TypeError / ValueError
    naming the argument before any Vulkan call; RuntimeError for a released DeviceArray.
    """
    if precision is not PRECISION:
        check_precision(precision)
    float32_only(dtype)
    arrays = (x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v)
    if out is None and (update_cache is False or update_cache is True) and type(rotation) is str:
        replay, sig = replay_cache.find(False, arrays, config.settings(), ROTATIONS.index(rotation)
                                        if rotation in ROTATIONS else -1, update_cache, sign=replay_cache.m3_signature)
        if replay is not None:
            p = replay.problem(arrays, ids)
            if p is not None:
                if update_cache:
                    check_distinct_ids(p.ids, "the cache")
                try:
                    return _result(replay.run(p, arrays), replay.where)
                except RecomputeOnHost as e:   # (flagged inf or nan, the recompute beyond the device)
                    return _scan_on_cpu(str(e), arrays, ids, p, update_cache, None)
    else:
        sig = None
    p = check_mamba3_forward(*stand_ins(arrays), ids, rotation=rotation, dtype=_F32)
    caches = (s_theta, s_h, s_k, s_v)
    update = check_update(update_cache, caches, p)
    given = None if out is None else outputs.check(out, p, False, update_cache, mamba3_run.forward_shapes(p.dims),
                                                   MAMBA3.name, _INPUTS, dict(zip(_INPUTS, arrays, strict=True)))
    dec = decide(MAMBA3.name, p.dims, rotation=p.rotation)
    if not dec.sup:
        return _scan_on_cpu(dec.sup.reason, arrays, ids, p, update, given)
    q = device_problem(p, dict(zip(_INPUTS, arrays, strict=True)))
    device_out = given is not None or _ctx_of(arrays) is not None
    try:
        res = mamba3_run.run_call(dec.engine, q, False, dec.planned, device_out, update, given)
    except RecomputeOnHost as e:   # (flagged inf or nan, the recompute beyond the device: arrays in pieces)
        return _scan_on_cpu(str(e), arrays, ids, p, update, given)
    if sig is not None:
        replay_cache.keep(sig, dec.engine, dec.info, dec.planned, q, False, arrays, update,
                          mamba3_run.MAMBA3_CALLS)
    if update:
        for cache, part in zip(caches, STATE_PARTS, strict=True):
            if type(cache) is not DeviceArray:
                cache[p.ids] = res[part].reshape((p.dims.S, *cache.shape[1:]))
                res[part] = None
    return _result(res, dec.info.where)


def _scan_on_cpu(reason: str, arrays: tuple, ids, p, update: bool, given) -> Mamba3Result:
    """mamba3_scan computed by ssm_fast: host copies of DeviceArrays in, the results uploaded when
    any input was a DeviceArray (into ``given`` when given), DeviceArray caches' rows uploaded."""
    host = [_host(a) for a in arrays]
    caches = arrays[10:]
    device_caches = update and any(type(c) is DeviceArray for c in caches)
    cpu = _fall_back(reason)
    r = cpu.mamba3_scan(*host, ids, rotation=p.rotation, update_cache=update and not device_caches)
    res = {"y": r.y, "theta": r.theta, "h": r.h, "k": r.k, "v": r.v}
    if device_caches:   # the final states into the rows: host caches in place, DeviceArray ones uploaded
        for cache, part in zip(caches, STATE_PARTS, strict=True):
            if type(cache) is DeviceArray:
                cache._write_rows(p.ids, res[part])
            else:
                cache[p.ids] = res[part]
            res[part] = None
    if given is not None:
        for k, a in given.items():
            a.write(res[k])
        return _result(given, r.where)
    return _result(res, r.where, _ctx_of(arrays))


def mamba3_scan_back(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi=None, s_theta=None, s_h=None, s_k=None,
                     s_v=None, ids=None, g_y=None, g_theta=None, g_h=None, g_k=None, g_v=None, *,
                     rotation="interleaved", dtype=np.float32, precision="highest", out=None) -> Mamba3Grads:
    """Backward of :func:`mamba3_scan` on the Vulkan device for the loss Σ y·g_y + Σ theta·g_theta
    + Σ h·g_h + Σ k·g_k + Σ v·g_v (each cotangent in its output's shape, or None for zeros);
    arguments and errors as ssm_ref.mamba3_scan_back, DeviceArrays as :func:`mamba3_scan` takes
    them (results DeviceArrays when any input is one). Returns Mamba3Grads (a read-only mapping by
    name), float32: d_x, d_dt, d_dA, d_lam, d_B, d_C, d_B_bias, d_C_bias, d_dtheta, d_psi (None
    when psi is None), d_s_theta, d_s_h, d_s_k, d_s_v in the caches' shapes (each sequence's
    start-state gradient added into row ids[i], in sequence order). Every sum over heads,
    channels and sequences is taken in a fixed order: reruns are bit-identical. A case the
    device cannot run is computed by ssm_fast (where="CPU"), and so is one whose result the
    chunked kernels flag as non-finite where the token-sequential recompute does not fit the
    device (family.OnHost). ``precision``: as :func:`mamba3_scan`. ``out``: {name: DeviceArray}
    of every gradient this call returns (d_psi only where psi is given; d_s_theta .. d_s_v in the
    caches' shapes, also without start states: R = S), written by the call and returned as the
    result's arrays (the rules of :func:`mamba3_scan`'s ``out``)."""
    if precision is not PRECISION:
        check_precision(precision)
    float32_only(dtype)
    arrays = (x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v, g_y, g_theta, g_h, g_k, g_v)
    sig = None
    if out is None and type(rotation) is str:
        replay, sig = replay_cache.find(True, arrays, config.settings(), ROTATIONS.index(rotation)
                                        if rotation in ROTATIONS else -1, sign=replay_cache.m3_signature)
        if replay is not None:
            p = replay.problem(arrays, ids)
            if p is not None:
                try:
                    return _grads(replay.run(p, arrays), replay.where, p.psi_given)
                except RecomputeOnHost as e:   # (flagged inf or nan, the recompute beyond the device)
                    return _back_on_cpu(str(e), arrays, ids, p)
    p = check_mamba3_backward(*stand_ins(arrays[:14]), ids, *stand_ins(arrays[14:]), rotation=rotation, dtype=_F32)
    names = (*_INPUTS, *_COTS)
    given = None if out is None else outputs.check(out, p, True, False, mamba3_run.backward_shapes(p.dims, p.psi_given),
                                                   MAMBA3.backward_name, names, dict(zip(names, arrays, strict=True)))
    dec = decide(MAMBA3.backward_name, p.dims, rotation=p.rotation)
    if not dec.sup:
        return _back_on_cpu(dec.sup.reason, arrays, ids, p, given)
    q = device_problem(p, dict(zip((*_INPUTS, *_COTS), arrays, strict=True)))
    try:
        g = mamba3_run.run_call(dec.engine, q, True, dec.planned, given is not None or _ctx_of(arrays) is not None,
                                given=given)
    except RecomputeOnHost as e:   # (flagged inf or nan, the recompute beyond the device)
        return _back_on_cpu(str(e), arrays, ids, p, given)
    if sig is not None:
        replay_cache.keep(sig, dec.engine, dec.info, dec.planned, q, True, arrays, False, mamba3_run.MAMBA3_CALLS)
    return _grads(g, dec.info.where, p.psi_given)


def _back_on_cpu(reason: str, arrays: tuple, ids, p, given=None) -> Mamba3Grads:
    """mamba3_scan_back computed by ssm_fast: host copies of DeviceArrays in, the gradients
    uploaded when any input was a DeviceArray (into ``given`` when given)."""
    host = [_host(a) for a in arrays]
    g = _fall_back(reason).mamba3_scan_back(*host[:14], ids, *host[14:], rotation=p.rotation)
    if given is not None:
        for k, a in given.items():
            a.write(g[k])
        return _grads(given, g.where, p.psi_given)
    ctx = _ctx_of(arrays)
    if ctx is None:
        return g
    return _grads({k: None if v is None else upload_to(ctx, v) for k, v in g.items()}, g.where, p.psi_given)


def _grads(g: dict, where: str, psi_given: bool) -> Mamba3Grads:
    return Mamba3Grads(**{k: g.get(k) for k in MAMBA3.grad_names}, where=where)
