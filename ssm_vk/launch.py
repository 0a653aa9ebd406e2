"""Running the scan on the device: the workspaces' cache, calls, their reruns, and the forward's
tables kept for the backward.

A call goes: look up the Workspace (workspace.py) of its shape (plan, kernels, persistent scratch and upload
buffers) -> upload host inputs into the workspace's buffers (device-resident inputs are bound in
place) -> find the Sequence recorded for exactly these buffers, or record it (record.py) ->
submit and wait -> download (host calls) or hand out DeviceArrays.

Replay is what makes small calls cheap: a training loop that passes the same shapes each step
(host arrays, or device arrays whose buffers the pool hands back) records once and then pays one
submit + wait per call. Workspaces and sequences live in bounded LRU caches per context.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections import OrderedDict

from ssm_ref import Problem
from ssm_ref.environ import EnvVar

from . import plan as _plan
from . import runtime as rt
from .arrays import DeviceArray
from .arrays import pool as arrays_pool
from .plan import Limits
from .record import record_backward, record_forward
from .workspace import Workspace, _release

__all__ = ["forward", "backward", "limits_of", "subgroup_ops", "last_gpu_ns", "clear_cache"]

# Set by tests (and SSM_VK_NO_SUBGROUP=1) to exercise the shared-memory reduction path.
FORCE_SHARED_MEMORY = False
MAX_WORKSPACES = 8          # shapes kept per context

_timing = threading.local()
log = logging.getLogger("ssm_vk")
# Calls whose chunked results held a non-finite value and were recomputed by the token-sequential
# kernels (see _run_in); read by tests.
reruns = 0
# Backward calls that took the chunk states (and C.B) their forward left (see _saved_forward); read
# by tests.
states_reused = 0
_rerun_logged = False
_caches: dict[int, tuple[object, OrderedDict]] = {}
_caches_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _caches_lock
    _caches_lock = threading.Lock()  # the inherited workspaces belong to the abandoned context
    _caches.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)

FWD_IN = ("s", "x", "dt", "A", "B", "C")
BWD_IN = (*FWD_IN, "g_y", "g_states")
FWD_OUT = ("y", "states")
BWD_OUT = ("d_s", "d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C")


def last_gpu_ns() -> float | None:
    """GPU time (timestamps) of this thread's last forward or backward, in ns; None when the
    device has no timestamps. Read on demand (a query costs some microseconds)."""
    seq = getattr(_timing, "seq", None)
    if seq is None or seq.closed or not seq.ctx.info.timestamps:
        return None
    return seq.gpu_times().get("end")


_NO_SUBGROUP_ENV = EnvVar("SSM_VK_NO_SUBGROUP")
_TUNE_ENV = EnvVar("SSM_VK_TUNE")


def _no_subgroup() -> bool:
    return FORCE_SHARED_MEMORY or _NO_SUBGROUP_ENV.get() == "1"


def subgroup_ops(info) -> frozenset:
    """The subgroup operations the kernels may use; none when FORCE_SHARED_MEMORY is set or
    SSM_VK_NO_SUBGROUP=1 (the shared-memory path, tested on devices that have subgroups)."""
    if _no_subgroup():
        return frozenset()
    return frozenset(info.subgroup_ops)


_limits: dict = {}  # (id(info), no subgroup ops) -> (info, Limits): a call asks twice per call


def limits_of(info) -> Limits:
    """The planner's Limits of device ``info`` (a frozen DeviceInfo) as things stand now."""
    no_subgroup = _no_subgroup()
    key = (id(info), no_subgroup)
    hit = _limits.get(key)
    if hit is not None and hit[0] is info:  # the entry keeps ``info`` alive: its id is not reused
        return hit[1]
    lim = Limits(
        subgroup_size=info.subgroup_size, subgroup_ops=frozenset() if no_subgroup else frozenset(info.subgroup_ops),
        max_workgroup_invocations=info.max_workgroup_invocations, max_shared_memory=info.max_shared_memory,
        max_workgroup_count=tuple(info.max_workgroup_count),
        max_storage_buffer_range=info.max_storage_buffer_range,
        max_memory_allocation_size=info.max_memory_allocation_size,
        min_storage_buffer_offset_alignment=info.min_storage_buffer_offset_alignment)
    if len(_limits) >= 64:
        _limits.clear()
    _limits[key] = (info, lim)
    return lim


def knobs_key() -> tuple:
    """What the planner's tuning knobs (ssm_vk.plan.TUNE, SSM_VK_TUNE) are now, cheaply: part of
    every cache key that depends on the plan (read through the module: tests replace TUNE)."""
    tune = _plan.TUNE
    return _TUNE_ENV.get(), tuple(tune.items()) if tune else ()


def _workspace(ctx, dims, backward: bool, chunked: bool = True) -> Workspace:
    key = (dims, backward, limits_of(ctx.info), chunked, knobs_key())
    with _caches_lock:
        owner, cache = _caches.get(id(ctx), (None, None))
        if owner is not ctx:  # ctx's first call (ctx is open: the contexts before it are closed or lost)
            for k in [k for k, (owner, _) in _caches.items() if owner.closed]:
                del _caches[k]  # a closed (lost) context's workspaces: its buffers are gone already
            cache = OrderedDict()
            _caches[id(ctx)] = (ctx, cache)
        ws = cache.get(key)
        if ws is None:
            ws = cache[key] = Workspace(ctx, dims, backward, key[2], chunked)
            while len(cache) > MAX_WORKSPACES:
                k, old = next(iter(cache.items()))
                if old.recent:  # used through a lane since it came to the front: not the least recent
                    old.recent = False
                    cache.move_to_end(k)
                    continue
                del cache[k]
                with old.lock:
                    old.close()
        cache.move_to_end(key)
        return ws


def clear_cache(ctx=None) -> None:
    """Drop the workspaces (and their buffers and recorded sequences) of ``ctx`` or of all."""
    with _caches_lock:
        items = list(_caches.items()) if ctx is None else [(id(ctx), _caches.get(id(ctx)))]
        for k, entry in items:
            if entry is None:
                continue
            for ws in entry[1].values():
                with ws.lock:
                    ws.close()
            _caches.pop(k, None)


def _run(ctx, p: Problem, backward: bool, device_out: bool, lane=None) -> dict:
    ctx.enter()  # the context outlives this call, whatever another thread does to it (DeviceLost if lost)
    try:
        try:
            return _run_once(ctx, p, backward, device_out, lane=lane)
        except rt.OutOfDeviceMemory:
            # The workspaces of other shapes hold buffers between calls: give them all back (the pool
            # frees its idle ones when it next runs out) and try once more; a second failure raises.
            clear_cache(ctx)
            return _run_once(ctx, p, backward, device_out)
    finally:
        ctx.leave()


def _run_once(ctx, p: Problem, backward: bool, device_out: bool, chunked: bool = True, lane=None) -> dict:
    while True:
        if lane is not None:  # the lane's workspace and input bindings (lanes.py; chunked is True)
            ws = lane.ws
            ws.recent = True
        else:
            ws = _workspace(ctx, p.dims, backward, chunked)
        with ws.lock:
            if ws.closed:  # another thread evicted it after our look-up: look again
                lane = None
                continue
            out = _run_in(ws, ctx, p, backward, device_out, None if lane is None else lane.bound)
        if out is not None:
            return out
        # The chunked kernels flagged a non-finite output: recompute with the token-sequential
        # kernels, whose inf and nan follow docs/SPEC.md (the matrix form's sums can turn an inf into
        # nan and back). Same device; finite results never take this path.
        _note_rerun(p.dims)
        return _run_once(ctx, p, backward, device_out, chunked=False)


def _note_rerun(dims) -> None:
    global reruns, _rerun_logged
    reruns += 1
    if not _rerun_logged:
        _rerun_logged = True
        log.info("ssm_vk: a result of the chunked kernels held inf or nan (%s); such calls are recomputed "
                 "with the token-sequential kernels, whose non-finite results follow docs/SPEC.md", dims)


def bind_inputs(ws: Workspace, p: Problem, backward: bool) -> tuple[dict, list]:
    """The inputs' bindings in ``ws``: {name: (buffer, element offset)}, and the start of the
    sequence's key -- serial and offset of each, in the workspace's fixed order (inputs, then
    outputs, then the ids). Host inputs are uploaded into the workspace's buffers."""
    bufs: dict = {}
    key: list = []
    for k in BWD_IN if backward else FWD_IN:
        b, off = bufs[k] = ws.input(k, getattr(p, k))
        key += (None if b is None else b.serial, off)
    return bufs, key


def _run_in(ws: Workspace, ctx, p: Problem, backward: bool, device_out: bool, bound=None) -> dict | None:
    """One call in workspace ``ws`` (its lock held); None when the chunked kernels flagged a
    non-finite output (the caller recomputes with the sequential kernels). A call that raises
    keeps no results: device outputs go back to the pool before the exception leaves, so a caller
    that holds the exception (and so its frames) holds no device memory. ``bound``: what
    bind_inputs gives for these inputs, kept by a lane (device inputs only: nothing to upload)."""
    ws.settle()
    names = BWD_IN if backward else FWD_IN
    resident = [getattr(p, k) for k in names if type(getattr(p, k)) is DeviceArray]
    pool = ws.pool if not ws.pool.closed else arrays_pool(ctx)
    # The inputs' buffers are busy until this call's work is done: released meanwhile (by another
    # thread), they go back to the pool only then. Liveness is checked after they are marked.
    token = pool.busy(tuple(a.buffer for a in resident if a.buffer is not None)) if resident else None
    try:
        if bound is None:
            bufs, key = bind_inputs(ws, p, backward)
        else:
            for a in resident:
                a._check_live()
            bufs, key = dict(bound[0]), list(bound[1])
        return _run_bound(ws, ctx, p, backward, device_out, bufs, key)
    finally:
        if token is not None:
            pool.idle(token)


def _run_bound(ws: Workspace, ctx, p: Problem, backward: bool, device_out: bool, bufs: dict, key: list):
    outs = ws.outputs(device_out)
    try:
        for k, a in outs.items():
            b, off = bufs[k] = (a.buffer, a.offset)
            key += (None if b is None else b.serial, off)
        key.append(p.ids.tobytes())
        key = tuple(key)
        rec = record_backward if backward else record_forward
        fwd = _saved_forward(ctx, ws, p) if backward and ws.plan.chunked is not None else None
        try:
            if fwd is not None:      # the forward's chunk states, C.B, M o C.B, bound in place of a recompute
                bufs["kept"] = fwd.kept
                key = (*key, *(b.serial for b in fwd.kept.values()))
            seq = ws.sequence(key, lambda seq: rec(seq, ws, p, bufs))
            if not backward:
                ws.saved = None     # the chunk states are overwritten from here on
            seq.submit()
        finally:
            if fwd is not None:
                fwd.lock.release()
        _timing.seq = seq
        if ws.plan.chunked is not None and ws.nonfinite():
            if device_out:
                _release(outs)
            return None
        if fwd is not None:
            global states_reused
            states_reused += 1
        cp = ws.plan.chunked
        if not backward and ws.kept is not None and cp.keep and len(cp.windows) == 1:
            ws.saved = _who(p)
        if device_out:
            return outs
        return {k: a.numpy() for k, a in outs.items()}
    except BaseException:
        if device_out:
            _release(outs)
        raise


def _who(p: Problem) -> tuple | None:
    """Who the forward inputs of ``p`` are -- for each, its owning DeviceArray (weakly), offset and
    shape -- and the ids; None unless every input is device-resident. DeviceArrays are never
    written after they are made, so while an owner is alive and not released its contents are
    what they were."""
    who = []
    for k in FWD_IN:
        a = getattr(p, k)
        if not isinstance(a, DeviceArray):
            return None
        who.append((weakref.ref(a._base or a), a.offset, a.shape))
    return tuple(who), p.ids.tobytes()


def _same_inputs(saved, p: Problem) -> bool:
    who, ids = saved
    for (ref, offset, shape), k in zip(who, FWD_IN, strict=True):
        a = getattr(p, k)
        if not isinstance(a, DeviceArray):
            return False
        owner = a._base or a
        if ref() is not owner or owner.released or a.offset != offset or a.shape != shape:
            return False
    return ids == p.ids.tobytes()


def _saved_forward(ctx, ws: Workspace, p: Problem):
    """The forward workspace whose chunk states are this backward call's (the last chunked
    forward of the same shape ran on these very device-resident inputs, in one window, with the
    same chunk length), locked -- the caller releases it after its submit -- or None: the
    backward then recomputes them (always with the knob KEEP_STATES=0, for benchmarks). Never
    waits for the lock: a forward running now is overwriting them anyway."""
    # No _caches_lock here: the caller holds ``ws.lock``, which _workspace may wait for while it
    # holds _caches_lock (evicting ws). A dict look-up is atomic on its own.
    _, cache = _caches.get(id(ctx), (None, None))
    fwd = cache.get((ws.dims, False, ws.limits, True, knobs_key())) if cache is not None else None
    if fwd is None or fwd.saved is None:     # (never saved under the knob KEEP_STATES=0)
        return None
    if not fwd.lock.acquire(blocking=False):
        return None
    try:
        fp, bp = fwd.plan.chunked, ws.plan.chunked
        ok = (not fwd.closed and fwd.saved is not None and fwd.kept is not None and fp is not None
              and fp.CL == bp.CL and len(fp.windows) == len(bp.windows) == 1 and _same_inputs(fwd.saved, p))
        if ok:
            fwd.settle()
            return fwd
    except BaseException:
        fwd.lock.release()
        raise
    fwd.lock.release()
    return None


def forward(ctx, p: Problem, device_out: bool = True, lane=None) -> dict:
    """Run the forward; returns {"y", "states"} as DeviceArrays (device_out) or numpy arrays.
    ``lane``: the lanes.Lane of this call (its workspace and input bindings), if found."""
    return _run(ctx, p, False, device_out, lane)


def backward(ctx, p: Problem, device_out: bool = True, lane=None) -> dict:
    """Run the backward; returns the seven gradients as DeviceArrays or numpy arrays."""
    return _run(ctx, p, True, device_out, lane)
