"""The docs/API.md functions of the Vulkan backend: checks, support decision, fallback, results."""

from __future__ import annotations

import logging
import os
import threading

import ssm_ref
from ssm_ref import ScanGrads, ScanResult, Support, check_backward, check_forward
from ssm_ref.checks import device_problem

from . import budget, lanes, launch, record
from . import runtime as rt
from .arrays import DeviceArray, upload_to
from .plan import TooLarge

NAME = "ssm_vk"
log = logging.getLogger("ssm_vk")
_logged: set[str] = set()
_logged_lock = threading.Lock()
_unopenable: dict[int, str] = {}   # pid -> why the driver would not open the device in it


def _log_once(message: str) -> None:
    """A warning on the ``ssm_vk`` logger, the first time this message comes up in the process."""
    with _logged_lock:
        if message in _logged:
            return
        _logged.add(message)
    log.warning("%s", message)


def _fall_back(reason: str):
    """The CPU backend that computes a case the device cannot run; the reason is logged once."""
    _log_once(f"ssm_vk falls back to ssm_fast on the CPU: {reason}")
    return _fast()


def _context_or_reason():
    ctx = rt.current_context()
    if ctx is not None and not ctx.closed and not ctx.lost:
        return ctx, ""  # the per-call fast path
    if os.getpid() in _unopenable:
        return None, _unopenable[os.getpid()]
    ok, reason = rt.available()
    if not ok:
        return None, f"no Vulkan device: {reason}"
    try:
        return rt.get_context(), ""
    except rt.VulkanUnavailable as e:
        return None, f"no Vulkan device: {e}"
    except rt.VulkanError as e:
        # The driver lists a device but will not open it here. Seen on an H200: in a process
        # forked from one that had used Vulkan, vkCreateDevice fails with
        # VK_ERROR_INITIALIZATION_FAILED. The GPU truly cannot run this process's calls; the
        # answer is kept for this process, so each later call does not try again.
        _unopenable[os.getpid()] = f"the Vulkan device could not be opened in this process: {e}"
        return None, _unopenable[os.getpid()]


_support_cache: dict = {}
_INPUTS = ("s", "x", "dt", "A", "B", "C", "g_y", "g_states")


def _after_fork_in_child() -> None:
    global _logged_lock
    _logged_lock = threading.Lock()
    _support_cache.clear()  # decisions about the parent's context


os.register_at_fork(after_in_child=_after_fork_in_child)


def _support(op: str, p) -> tuple[Support, object, bool]:
    """Whether ``p`` runs on the device, decided before any allocation: a device and context,
    a plan within the device's limits (plan.py), every buffer within maxMemoryAllocationSize and
    all of them within the device-local heap (budget.py), SPIR-V for every kernel it dispatches.

    Decisions are cached by context, limits, op, dims and which inputs are device-resident -- all
    they depend on (budget.py and record.kernels_needed assume the worst about duplicate ids) --
    except a refusal for want of SPIR-V, which glslc on PATH or a warm cache may lift later.

    Returns (the decision, the context, whether any input is device-resident: then the results
    are DeviceArrays).
    """
    sup, ctx, _, device_out = _decision(op, p)
    return sup, ctx, device_out


def _decision(op: str, p) -> tuple[Support, object, object, bool]:
    """_support's answer and the ``ctx.info`` it was taken with: (decision, ctx, info, device_out)."""
    ctx = rt.current_context()
    if ctx is None or ctx.lost:  # (current_context() is open or None)
        ctx, reason = _context_or_reason()
        if ctx is None:
            return Support(False, reason), None, None, False
    info = ctx.info  # override_limits swaps it; the entry keeps it alive, so its id is not reused
    # Which inputs are device-resident is a matter of their types (DeviceArray's class attribute
    # ``_ssm_device_array``): the key holds the types, the set is worked out on a miss.
    types = (type(p.s), type(p.x), type(p.dt), type(p.A), type(p.B), type(p.C), type(p.g_y), type(p.g_states))
    key = (id(ctx), id(info), op, p.dims, types, launch.knobs_key(), launch._no_subgroup())
    hit = _support_cache.get(key)
    if hit is not None and hit[1] is ctx and hit[2] is info:
        return hit[0], ctx, info, hit[3]
    # which inputs are device arrays (is_device_array, inlined)
    resident = frozenset([k for k in _INPUTS if getattr(getattr(p, k), "_ssm_device_array", False) is True])
    sup, cache = _decide(ctx, op, p, resident)
    if cache:
        if len(_support_cache) > 256:
            _support_cache.clear()
        _support_cache[key] = (sup, ctx, info, bool(resident))
    return sup, ctx, info, bool(resident)


def _decide(ctx, op: str, p, resident: frozenset) -> tuple[Support, bool]:
    """(the decision, whether it may be cached)."""
    backward = op == "ssm_scan_back"
    lim = launch.limits_of(ctx.info)
    try:
        pl, dropped = record.choose_plan_why(ctx, p.dims, lim, backward)
    except TooLarge as e:
        return Support(False, str(e)), True
    why = budget.check(ctx.info, budget.buffers(p.dims, pl, lim, backward, resident))
    if why:
        return Support(False, why), True
    why = record.missing_spirv(ctx, record.kernels_needed(p.dims, pl, backward))
    if why:
        return Support(False, why), False
    if dropped:
        # visible, not silent: the reason says so, and the log says it once
        note = f"the token-sequential kernels run it: the chunked kernels' SPIR-V cannot be had ({dropped})"
        _log_once(f"ssm_vk: {note}")
        return Support(True, f"runs on {ctx.info.where} ({ctx.info.name}); {note}"), True
    return Support(True, f"runs on {ctx.info.where} ({ctx.info.name})"), True


def supports(op, s, x, dt, A, B, C, ids=None) -> Support:
    """Whether ssm_vk runs this case on the GPU; ``reason`` says why not (then ssm_scan /
    ssm_scan_back compute it with ssm_fast on the CPU, ``where == "CPU"``).
    Bad input raises as in ssm_ref.ssm_scan."""
    ssm_ref.check_op(op)
    p = check_forward(s, x, dt, A, B, C, ids, keep_device=True)
    return _support(op, p)[0]


def _host(p):
    """The problem with device arrays brought to the host (for the CPU fallback)."""
    return {k: (v.numpy() if isinstance(v, DeviceArray) else v)
            for k, v in dict(s=p.s, x=p.x, dt=p.dt, A=p.A.reshape(p.dims.a_shape) if p.A is not None else None,
                             B=p.B, C=p.C).items()}


_INTERFACE = ("ssm_scan", "ssm_scan_back", "supports")


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
    _log_once(f"ssm_fast is unusable here ({why}); the CPU fallback is ssm_ref, the numpy reference")
    return ssm_ref


def ssm_scan(s, x, dt, A, B, C, ids=None) -> ScanResult:
    """Forward selective scan on the Vulkan device (see ssm_ref.ssm_scan for shapes and errors).

    float32. When any input is a DeviceArray the results are DeviceArrays on that device;
    otherwise numpy arrays. A case the device cannot run is computed by ssm_fast on the CPU
    (``where == "CPU"``, ``backend == "ssm_fast"``), logged once per reason.
    """
    arrays = (s, x, dt, A, B, C)
    lane, sig = lanes.find(False, arrays)  # sig: None unless every float input is a live DeviceArray
    if lane is not None:  # a repeat of a call that ran on the device (lanes.py)
        p = device_problem(lane.dims, arrays, ids)  # the ids and the host memory rule; None: full path
        if p is not None:
            out = launch.forward(lane.ctx, p, True, lane)
            return _result(ScanResult, {"y": out["y"], "states": out["states"], "where": lane.where,
                                        "backend": NAME})
    p = check_forward(s, x, dt, A, B, C, ids, keep_device=True)
    sup, ctx, info, device_out = _decision("ssm_scan", p)  # device_out: any of s..C a DeviceArray
    if not sup:
        cpu = _fall_back(sup.reason)
        h = _host(p)
        return _resident(cpu.ssm_scan(h["s"], h["x"], h["dt"], h["A"], h["B"], h["C"], p.ids), p, ("y", "states"))
    out = launch.forward(ctx, p, device_out=device_out)
    if sig is not None:
        lanes.keep(sig, ctx, info, p, False, arrays)
    return _result(ScanResult, {"y": out["y"], "states": out["states"], "where": info.where, "backend": NAME})


def ssm_scan_back(s, x, dt, A, B, C, ids, g_y, g_states) -> ScanGrads:
    """Backward of ssm_scan (see ssm_ref.ssm_scan_back), on the Vulkan device; device-resident
    and fallback behaviour as :func:`ssm_scan`."""
    arrays = (s, x, dt, A, B, C, g_y, g_states)
    lane, sig = lanes.find(True, arrays)
    if lane is not None:
        p = device_problem(lane.dims, arrays, ids)
        if p is not None:
            return _grads(launch.backward(lane.ctx, p, True, lane), lane.where)
    p = check_backward(s, x, dt, A, B, C, ids, g_y, g_states, keep_device=True)
    sup, ctx, info, device_out = _decision("ssm_scan_back", p)  # device_out: any of s..g_states a DeviceArray
    if not sup:
        cpu = _fall_back(sup.reason)
        h = _host(p)
        gy = p.g_y.numpy() if isinstance(p.g_y, DeviceArray) else p.g_y
        gs = p.g_states.numpy() if isinstance(p.g_states, DeviceArray) else p.g_states
        return _resident(cpu.ssm_scan_back(h["s"], h["x"], h["dt"], h["A"], h["B"], h["C"], p.ids, gy, gs), p,
                         ssm_ref.GRAD_NAMES)
    g = launch.backward(ctx, p, device_out=device_out)
    if sig is not None:
        lanes.keep(sig, ctx, info, p, True, arrays)
    return _grads(g, info.where)


def _resident(result, p, names: tuple):
    """A CPU fallback's ``result`` as a device call would give it: when any input is a
    DeviceArray, its arrays uploaded to that input's device (so code written for the device path
    runs unchanged); ``where`` and ``backend`` still say the CPU computed it."""
    ctx = next((getattr(p, k).ctx for k in _INPUTS if isinstance(getattr(p, k), DeviceArray)), None)
    if ctx is None:
        return result
    return _result(type(result), {**result.__dict__, **{k: upload_to(ctx, getattr(result, k)) for k in names}})


def _grads(g: dict, where: str) -> ScanGrads:
    return _result(ScanGrads, {"d_s": g["d_s"], "d_s0": g["d_s0"], "d_x": g["d_x"], "d_dt": g["d_dt"],
                               "d_A": g["d_A"], "d_B": g["d_B"], "d_C": g["d_C"], "where": where, "backend": NAME})


def _result(cls, fields: dict):
    """``cls(**fields)`` for the frozen result dataclasses (ScanResult, ScanGrads: no
    __post_init__; every field given), without their __init__'s object.__setattr__ a field."""
    r = object.__new__(cls)
    r.__dict__.update(fields)
    return r
