"""The functions of docs/API.md for the Vulkan backend: validate -> decide (ssm_vk.decision) -> run
(ssm_vk.run) or fall back to the CPU; the results. The Mamba-3 op's (``mamba3_scan``,
``mamba3_scan_back``) are ssm_vk.mamba3_api's; :func:`supports` answers for every op."""

from __future__ import annotations

import ssm_ref
from ssm_ref import ScanGrads, ScanResult, Support, check_snapshots, check_update_cache
from ssm_ref.checks import MISSING, write_cache_rows
from ssm_ref.ops import SCAN
from ssm_ref.precision import check_precision

from . import config, mamba3_api, outputs, replay_cache, run
from .arrays import DeviceArray, upload_to
from .support import FORMS, INPUTS, NAME, PRECISION, decision, form_code, log_once, with_precision
from .validate import check_backward, check_forward, frozen_result


def _fall_back(reason: str):
    """The CPU backend that computes a case the device cannot run; the reason is logged once."""
    log_once(f"ssm_vk falls back to ssm_fast on the CPU: {reason}")
    return _fast()


def _scan_result(y, states, snapshots, where: str, backend: str = NAME) -> ScanResult:
    """A ScanResult; ``snapshots`` None with K = 1 (the one slot's view made when first read)."""
    fields = {"y": y, "states": states, "where": where, "backend": backend}
    if snapshots is not None:
        fields["snapshots"] = snapshots
    return frozen_result(ScanResult, fields)


def _out_result(out: dict, where: str, K: int) -> ScanResult:
    """The ScanResult of a device call's outputs (K > 1: their ``snapshots``; K = 1 left out:
    ScanResult makes the one slot's view of states when it is first read). One call of Python:
    the per-call cost of a K = 1 call stays what it was."""
    r = object.__new__(ScanResult)   # (validate.frozen_result, inlined)
    if K > 1:
        r.__dict__.update(y=out["y"], states=out["states"], where=where, backend=NAME, snapshots=out["snapshots"])
    else:
        r.__dict__.update(y=out["y"], states=out["states"], where=where, backend=NAME)
    return r


def supports(op, *args, **kw) -> Support:
    """Whether ssm_vk runs this case on the GPU, and why not. ``op`` "ssm_scan" or "ssm_scan_back"
    takes the arguments of ssm_scan (:func:`supports_scan`); "mamba3_scan" or "mamba3_scan_back"
    those of mamba3_scan (ssm_vk.mamba3_api.supports). Bad input raises as the call would."""
    if op in mamba3_api.OPS:
        return mamba3_api.supports(op, *args, **kw)
    ssm_ref.check_op(op)   # (the scan's message for an op of neither)
    return supports_scan(op, *args, **kw)


def supports_scan(op, s, x, dt, A, B, C=MISSING, ids=None, *, dt_softplus="ggml", update_cache=False, snapshots=1,
                  invariant=False, precision="highest") -> Support:
    """Whether ssm_vk runs this case of the selective scan on the GPU; ``reason`` says why not (then ssm_scan /
    ssm_scan_back compute it with ssm_fast on the CPU, ``where == "CPU"``) -- the very decision
    the call takes, for the step's form ``dt_softplus``. Takes the arguments of ssm_scan
    (``s=None`` and ``snapshots=K`` included: for ``ssm_scan_back`` the answer for a backward
    given g_snapshots of K slots when K > 1); bad input raises as in ssm_ref.ssm_scan
    (``dt_softplus``, ``update_cache`` and ``snapshots`` checked as there); an illegal setting
    (ssm_vk.config) raises ValueError naming it. ``invariant``: the decision of the invariant mode
    (:func:`ssm_scan`); ``precision``: what a call asking for it computes (:func:`ssm_scan`), in the
    reason."""
    ssm_ref.check_op(op)
    if precision is not PRECISION:
        check_precision(precision)
    sp = form_code(dt_softplus)
    K = check_snapshots(snapshots)
    knobs = config.invariant_mode(config.settings(), invariant)
    p = check_forward(s, x, dt, A, B, C, ids, K)
    if op == "ssm_scan_back" and K > 1:   # the backward of such a forward: given g_snapshots (K slots)
        p = _with_g_snapshots(p)
    check_update_cache(update_cache, s, p.ids, device_arrays=True, op=op)
    return with_precision(decision(op, p, knobs, sp).sup, precision)


def _host(p):
    """The problem with device arrays brought to the host (for the CPU fallback)."""
    return {k: (v.numpy() if isinstance(v, DeviceArray) else v)
            for k, v in dict(s=p.s, x=p.x, dt=p.dt, A=p.A.reshape(p.dims.a_shape) if p.A is not None else None,
                             B=p.B, C=p.C).items()}


_INTERFACE = ("ssm_scan", "ssm_scan_back", "supports")


def _with_g_snapshots(p):
    """Problem ``p`` as a backward given g_snapshots of its K slots sees it (for supports(); the
    decision reads only that one is given)."""
    import dataclasses

    import numpy as np

    return dataclasses.replace(p, g_snapshots=np.broadcast_to(np.float32(0), (p.dims.K, p.dims.S, p.dims.H,
                                                                                p.dims.P, p.dims.N)))


def _fast():
    """The CPU backend of the fallback: ssm_fast; ssm_ref when ssm_fast cannot be imported here
    (numba missing or broken) or is not built yet -- logged once, and visible in ``backend``."""
    try:
        import ssm_fast
    except Exception as exc:  # ImportError, or numba failing at import on this machine
        why = f"{type(exc).__name__}: {exc}"
    else:
        if all(hasattr(ssm_fast, f) for f in _INTERFACE):
            return ssm_fast
        why = "it has no ssm_scan / ssm_scan_back yet"
    log_once(f"ssm_fast is unusable here ({why}); the CPU fallback is ssm_ref, the numpy reference")
    return ssm_ref


def _repeat(replay, arrays: tuple, ids):
    """The result of a device-resident call that repeats one that ran on the device, through the
    prepared call kept for its signature (``replay``: replay_cache.find's) on these arrays and ids, a new
    result object; None: the full path (its ids or the host memory rule fail: the validator says
    what)."""
    p = replay.problem(arrays, ids)
    if p is None:
        return None
    if replay.backward:
        return _grads(replay.run(p, arrays), replay.where)
    if not replay.update:
        return _out_result(replay.run(p, arrays), replay.where, replay.dims.K)
    check_update_cache(True, arrays[0], p.ids, device_arrays=True)
    out = replay.run(p, arrays)
    out["states"].release()
    return _scan_result(out["y"], None, out.get("snapshots"), replay.where)


def ssm_scan(s, x, dt, A, B, C=MISSING, ids=None, *, dt_softplus="ggml", update_cache=False, snapshots=1,
             invariant=False, precision="highest", out=None) -> ScanResult:
    """Forward selective scan on the Vulkan device (see ssm_ref.ssm_scan for shapes and errors).

    float32. When any input is a DeviceArray the results are DeviceArrays on that device (also
    when the call falls back); otherwise numpy arrays. A case the device cannot run is computed
    by ssm_fast on the CPU (``where == "CPU"``, ``backend == "ssm_fast"``), logged once per reason.
    ``s=None``: zero start states (S,H,P,N), ids None, as in ssm_ref.ssm_scan.
    ``dt_softplus``: "ggml" (default), "log1p" or True (mamba_ssm's), None or False, as in
    ssm_ref.ssm_scan. The result unpacks as ``y, states``.
    ``update_cache``: as in ssm_ref.ssm_scan; ``s`` a writeable numpy array or a DeviceArray, whose
    rows ids[i] the call writes on the device (by the scan itself in a decode step).
    ``snapshots``: K >= 1, as in ssm_ref.ssm_scan: the result's ``snapshots`` (K,S,H,P,N), slot k
    the state after T - k tokens (K = 1: a view of ``states``). K > 1 runs on the token-sequential
    kernels; a fallback for K > 1 is computed by ssm_ref when ssm_fast takes no snapshots.
    ``invariant``: True for the invariant mode (docs/SPEC.md section 3.2): a sequence's results
    the same bits whatever S, its companions, its position and the split of its tokens into calls
    (prefill, decode steps), on one device and driver; the plan is that of the per-sequence problem
    (ssm_vk.registry.plan). False (default): the fastest plan of the shape, deterministic only.
    ``precision``: the products' arithmetic, PyTorch's names (docs/SPEC.md section 15): "highest"
    (default), "high" or "medium" (ValueError naming ``precision`` otherwise). No ssm_vk kernel runs
    on the matrix units yet: every call computes at "highest", its result's ``precision`` says so
    and supports() tells a call asking for more.
    ``out``: {name: DeviceArray} of every output ("y", "states", and "snapshots" when K > 1),
    written by the call and returned as its result's arrays (ssm_vk.outputs.check: the rules).
    """
    if precision is not PRECISION:
        check_precision(precision)
    sp = form_code(dt_softplus)
    K = 1 if type(snapshots) is int and snapshots == 1 else check_snapshots(snapshots)
    knobs = config.settings()
    if invariant is not False:
        knobs = config.invariant_mode(knobs, invariant)
    if out is not None:   # the caller's outputs: checked, then the full path (no kept replay)
        p = check_forward(s, x, dt, A, B, C, ids, K)
        return _forward_checked(p, knobs, sp, FORMS[sp], given=outputs.check(out, p, False, update_cache))
    if update_cache is not False:
        return _scan_updating(s, x, dt, A, B, C, ids, FORMS[sp], sp, update_cache, knobs, K)
    arrays = (s, x, dt, A, B, C)
    # sig: None unless every input is a live DeviceArray
    replay, sig = replay_cache.find(False, arrays, knobs, sp, False, K)
    if replay is not None:   # a repeat of a call that ran on the device: the prepared call kept for it
        r = _repeat(replay, arrays, ids)
        if r is not None:
            return r
    p = check_forward(s, x, dt, A, B, C, ids, K)
    return _forward_checked(p, knobs, sp, FORMS[sp], sig, arrays)   # (the checked form: the CPU's)


def _cpu_scan(cpu, h: dict, p, dt_softplus, update_cache: bool = False, s=None):
    """The CPU backend's ssm_scan of problem ``p`` (``h``: its host inputs), K passed when > 1."""
    K = p.dims.K
    extra = {"snapshots": K} if K > 1 else {}
    return cpu.ssm_scan(h["s"] if s is None else s, h["x"], h["dt"], h["A"], h["B"], h["C"], p.ids,
                        dt_softplus=dt_softplus, update_cache=update_cache, **extra)


def _forward_checked(p, knobs, sp: int, dt_softplus, sig=None, arrays=(), given=None) -> ScanResult:
    """ssm_scan of the checked problem ``p``: on the device where it can run, else on the CPU;
    with ``sig`` (replay_cache.find's), the call is kept for its repeats (replay_cache.keep); ``given``: the
    checked ``out`` (the CPU's results uploaded into it)."""
    K = p.dims.K
    dec = decision("ssm_scan", p, knobs, sp)
    if not dec.sup:
        cpu = _fall_back(dec.sup.reason)
        if given is not None:
            r = _cpu_scan(cpu, _host(p), p, dt_softplus)
            outputs.fill(given, r)
            return _scan_result(given["y"], given["states"], given.get("snapshots"), r.where, r.backend)
        r = _resident(_cpu_scan(cpu, _host(p), p, dt_softplus), p, (*SCAN.output_names, "snapshots") if K > 1
                      else SCAN.output_names)
        return _scan_result(r.y, r.states, r.snapshots if K > 1 else None, r.where, r.backend)
    out = run.forward(dec.engine, p, dec.planned, device_out=dec.device_out, given=given)
    if sig is not None:
        replay_cache.keep(sig, dec.engine, dec.info, dec.planned, p, False, arrays)
    return _out_result(out, dec.info.where, K)


def _scan_updating(s, x, dt, A, B, C, ids, dt_softplus, sp: int, update_cache, knobs, K: int = 1) -> ScanResult:
    """ssm_scan with update_cache (checked here, after the shapes): the final states go into the
    cache rows s[ids]; ``states`` None, ``snapshots`` the K slots when K > 1, else None. A
    repeated device-resident call runs the prepared call kept for it, as ssm_scan does (its ids
    checked distinct every call). ``knobs``: the call's settings (its invariant mode in them)."""
    arrays = (s, x, dt, A, B, C)
    if update_cache is True:
        replay, sig = replay_cache.find(False, arrays, knobs, sp, True, K)
        if replay is not None:
            r = _repeat(replay, arrays, ids)
            if r is not None:
                return r
    else:
        sig = None
    p = check_forward(s, x, dt, A, B, C, ids, K)
    check_update_cache(update_cache, s, p.ids, device_arrays=True)   # (not False: the caller's test)
    if not isinstance(s, DeviceArray):     # a host cache: the call as usual, the rows written here
        r = _forward_checked(p, knobs, sp, dt_softplus)
        states = r.states
        write_cache_rows(s, p.ids, states.numpy() if isinstance(states, DeviceArray) else states)
        if isinstance(states, DeviceArray):
            states.release()
        return _scan_result(r.y, None, r.snapshots if K > 1 else None, r.where, r.backend)
    dec = decision("ssm_scan", p, knobs, sp)
    if not dec.sup:                        # on the CPU; the rows uploaded into the cache
        cpu = _fall_back(dec.sup.reason)
        h = _host(p)
        r = _cpu_scan(cpu, h, p, dt_softplus)
        s._write_rows(p.ids, r.states)
        return _scan_result(upload_to(s.ctx, r.y), None, upload_to(s.ctx, r.snapshots) if K > 1 else None,
                            r.where, r.backend)
    out = run.forward(dec.engine, p, dec.planned, device_out=True, update=True)
    if sig is not None:
        replay_cache.keep(sig, dec.engine, dec.info, dec.planned, p, False, arrays, update=True)
    out["states"].release()
    return _scan_result(out["y"], None, out.get("snapshots"), dec.info.where)


def ssm_scan_back(s, x, dt, A, B, C=MISSING, ids=None, g_y=None, g_states=None, *, dt_softplus="ggml",
                  g_snapshots=None, invariant=False, precision="highest", out=None) -> ScanGrads:
    """Backward of ssm_scan (see ssm_ref.ssm_scan_back: g_y / g_states None for zeros, the packed
    g_y with K slots, s=None, ``g_snapshots`` (K,S,H,P,N), the gradient of the forward's K state
    slots), on the Vulkan device; device-resident and fallback behaviour and ``dt_softplus`` as
    :func:`ssm_scan` (g_snapshots or a packed g_y of K > 1 slots: the token-sequential kernels).
    Returns ScanGrads, a mapping by name. ``invariant``: as :func:`ssm_scan` (a sequence's own
    gradients; d_A the sum of the sequences' own, in sequence order; docs/SPEC.md section 3.2).
    ``out``: {name: DeviceArray} of the seven gradients (ssm_ref.GRAD_NAMES), as :func:`ssm_scan`'s.
    ``precision``: as :func:`ssm_scan`."""
    if precision is not PRECISION:
        check_precision(precision)
    sp = form_code(dt_softplus)
    knobs = config.settings()
    if invariant is not False:
        knobs = config.invariant_mode(knobs, invariant)
    arrays = (s, x, dt, A, B, C, g_y, g_states)
    replay, sig = replay_cache.find(True, arrays, knobs, sp) if g_snapshots is None and out is None else (None, None)
    if replay is not None:
        r = _repeat(replay, arrays, ids)
        if r is not None:
            return r
    p = check_backward(s, x, dt, A, B, C, ids, g_y, g_states, g_snapshots)
    given = None if out is None else outputs.check(out, p, True)
    dec = decision("ssm_scan_back", p, knobs, sp)
    if not dec.sup:
        snap = p.g_snapshots is not None
        cpu = _fall_back(dec.sup.reason)
        h = _host(p)
        gy = p.g_y.numpy() if isinstance(p.g_y, DeviceArray) else p.g_y
        gs = p.g_states.numpy() if isinstance(p.g_states, DeviceArray) else p.g_states
        extra = {}
        if snap:
            gsn = p.g_snapshots
            extra["g_snapshots"] = gsn.numpy() if isinstance(gsn, DeviceArray) else gsn
        g = cpu.ssm_scan_back(h["s"], h["x"], h["dt"], h["A"], h["B"], h["C"], p.ids, gy, gs, dt_softplus=FORMS[sp],
                              **extra)
        if given is not None:
            outputs.fill(given, g)
            return frozen_result(ScanGrads, {**given, "where": g.where, "backend": g.backend})
        return _resident(g, p, ssm_ref.GRAD_NAMES)
    g = run.backward(dec.engine, p, dec.planned, device_out=dec.device_out, given=given)
    if sig is not None:
        replay_cache.keep(sig, dec.engine, dec.info, dec.planned, p, True, arrays)
    return _grads(g, dec.info.where)


def _resident(result, p, names: tuple):
    """A CPU fallback's ``result`` as a device call would give it: when any input is a
    DeviceArray, its arrays uploaded to that input's device (so code written for the device path
    runs unchanged); ``where`` and ``backend`` still say the CPU computed it."""
    ctx = next((getattr(p, k).ctx for k in (*INPUTS, "g_snapshots") if isinstance(getattr(p, k), DeviceArray)),
               None)
    if ctx is None:
        return result
    return frozen_result(type(result), {**result.__dict__, **{k: upload_to(ctx, getattr(result, k)) for k in names}})


def _grads(g: dict, where: str) -> ScanGrads:
    return frozen_result(ScanGrads, {"d_s": g["d_s"], "d_s0": g["d_s0"], "d_x": g["d_x"], "d_dt": g["d_dt"],
                               "d_A": g["d_A"], "d_B": g["d_B"], "d_C": g["d_C"], "where": where, "backend": NAME})
