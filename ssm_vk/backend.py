"""The INTERFACE.md functions of the Vulkan backend: checks, support decision, fallback, results."""

from __future__ import annotations

import logging
import threading

import ssm_ref
from ssm_ref import ScanGrads, ScanResult, Support, check_backward, check_forward, is_device_array

from . import launch
from . import runtime as rt
from .arrays import DeviceArray
from .plan import TooLarge, plan

NAME = "ssm_vk"
log = logging.getLogger("ssm_vk")
_logged: set[str] = set()
_logged_lock = threading.Lock()


def _log_once(reason: str) -> None:
    with _logged_lock:
        if reason in _logged:
            return
        _logged.add(reason)
    log.warning("ssm_vk falls back to ssm_fast on the CPU: %s", reason)


def _context_or_reason():
    ctx = rt.current_context()
    if ctx is not None and not ctx.closed and not ctx.lost:
        return ctx, ""  # the per-call fast path
    ok, reason = rt.available()
    if not ok:
        return None, f"no Vulkan device: {reason}"
    try:
        return rt.get_context(), ""
    except rt.VulkanUnavailable as e:
        return None, f"no Vulkan device: {e}"


def _has_device_arrays(*arrays) -> bool:
    return any(is_device_array(a) for a in arrays)


_support_cache: dict = {}


def _support(op: str, p) -> tuple[Support, object]:
    ctx, reason = _context_or_reason()
    if ctx is None:
        return Support(False, reason), None
    key = (id(ctx), id(ctx.info), op, p.dims)  # override_limits swaps ctx.info
    hit = _support_cache.get(key)
    if hit is not None and hit[1] is ctx:
        return hit
    if len(_support_cache) > 256:
        _support_cache.clear()
    out = _support_cache[key] = (_decide(ctx, op, p.dims), ctx)
    return out


def _decide(ctx, op: str, d) -> Support:
    try:
        plan(d, launch.limits_of(ctx.info), backward=(op == "ssm_scan_back"))
    except TooLarge as e:
        return Support(False, str(e))
    # Whole arrays must each fit one allocation (results and device-resident inputs are buffers).
    biggest = max(d.S * d.T * d.H * d.P, d.R * d.H * d.P * d.N, d.S * d.T * d.G * d.N) * 4
    if biggest > ctx.info.max_memory_allocation_size:
        return Support(False, f"an array of {biggest} bytes exceeds maxMemoryAllocationSize "
                              f"({ctx.info.max_memory_allocation_size} bytes) of {ctx.info.name}")
    return Support(True, f"runs on {ctx.info.where} ({ctx.info.name})")


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


def _fast():
    import ssm_fast

    return ssm_fast


def ssm_scan(s, x, dt, A, B, C, ids=None) -> ScanResult:
    """Forward selective scan on the Vulkan device (see ssm_ref.ssm_scan for shapes and errors).

    float32. When any input is a DeviceArray the results are DeviceArrays on that device;
    otherwise numpy arrays. A case the device cannot run is computed by ssm_fast on the CPU
    (``where == "CPU"``, ``backend == "ssm_fast"``), logged once per reason.
    """
    p = check_forward(s, x, dt, A, B, C, ids, keep_device=True)
    sup, ctx = _support("ssm_scan", p)
    if not sup:
        _log_once(sup.reason)
        h = _host(p)
        return _fast().ssm_scan(h["s"], h["x"], h["dt"], h["A"], h["B"], h["C"], p.ids)
    out = launch.forward(ctx, p, device_out=_has_device_arrays(s, x, dt, A, B, C))
    return ScanResult(y=out["y"], states=out["states"], where=ctx.info.where, backend=NAME)


def ssm_scan_back(s, x, dt, A, B, C, ids, g_y, g_states) -> ScanGrads:
    """Backward of ssm_scan (see ssm_ref.ssm_scan_back), on the Vulkan device; device-resident
    and fallback behaviour as :func:`ssm_scan`."""
    p = check_backward(s, x, dt, A, B, C, ids, g_y, g_states, keep_device=True)
    sup, ctx = _support("ssm_scan_back", p)
    if not sup:
        _log_once(sup.reason)
        h = _host(p)
        gy = p.g_y.numpy() if isinstance(p.g_y, DeviceArray) else p.g_y
        gs = p.g_states.numpy() if isinstance(p.g_states, DeviceArray) else p.g_states
        return _fast().ssm_scan_back(h["s"], h["x"], h["dt"], h["A"], h["B"], h["C"], p.ids, gy, gs)
    g = launch.backward(ctx, p, device_out=_has_device_arrays(s, x, dt, A, B, C, g_y, g_states))
    return ScanGrads(**g, where=ctx.info.where, backend=NAME)
