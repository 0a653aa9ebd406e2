"""Running the scan on the device: workspaces, recorded sequences and their replay.

A call goes: look up the Workspace of its shape (plan, kernels, persistent scratch and upload
buffers) -> upload host inputs into the workspace's buffers (device-resident inputs are bound in
place) -> find the Sequence recorded for exactly these buffers, or record it (record.py) ->
submit and wait -> download (host calls) or hand out DeviceArrays.

Replay is what makes small calls cheap: a training loop that passes the same shapes each step
(host arrays, or device arrays whose buffers the pool hands back) records once and then pays one
submit + wait per call. Workspaces and sequences live in bounded LRU caches per context.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import weakref
from collections import OrderedDict

import numpy as np

from ssm_ref import Problem
from ssm_ref.environ import EnvVar

from . import plan as _plan
from . import runtime as rt
from .arrays import DeviceArray, pool
from .plan import Limits
from .record import F32, choose_plan, record_backward, record_forward

__all__ = ["forward", "backward", "limits_of", "subgroup_ops", "last_gpu_ns", "clear_cache"]

# Set by tests (and SSM_VK_NO_SUBGROUP=1) to exercise the shared-memory reduction path.
FORCE_SHARED_MEMORY = False
MAX_WORKSPACES = 8          # shapes kept per context
MAX_SEQUENCES = 4           # recorded sequences kept per workspace (sets of buffers)

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


def _shapes(d, backward: bool) -> dict:
    shapes = {"y": (d.S, d.T, d.H, d.P), "states": (d.S, d.H, d.P, d.N)}
    if backward:
        shapes = {"d_s": (d.R, d.H, d.P, d.N), "d_s0": (d.S, d.H, d.P, d.N), "d_x": (d.S, d.T, d.H, d.P),
                  "d_dt": (d.S, d.T, d.H), "d_A": d.a_shape, "d_B": (d.S, d.T, d.G, d.N),
                  "d_C": (d.S, d.T, d.G, d.N)}
    return shapes


class Workspace:
    """Everything one problem shape needs on one context, kept between calls: the plan, upload
    buffers for host inputs, output buffers for host calls, scratch, recorded sequences.
    Used under ``lock`` (one call at a time per shape); ``closed`` once evicted, after which a
    caller that looked it up before the eviction must look up a new one."""

    def __init__(self, ctx, dims, backward: bool, chunked: bool = True):
        self.ctx = ctx
        self.dims = dims
        self.backward = backward
        self.limits = limits_of(ctx.info)
        self.plan = choose_plan(ctx, dims, self.limits, backward, chunked=chunked)
        self.pool = pool(ctx)
        self.align = ctx.info.min_storage_buffer_offset_alignment
        self.lock = threading.Lock()
        self.shapes = {k: tuple(int(n) for n in v) for k, v in _shapes(dims, backward).items()}
        self.sizes = {k: math.prod(v) for k, v in self.shapes.items()}
        self._out_specs = tuple((k, v, self.sizes[k] * F32) for k, v in self.shapes.items())
        self._out_nbytes = [n for _, _, n in self._out_specs if n]
        self._owned: list = []            # every buffer this workspace acquired
        self._scratch: list = []          # by request order while recording
        self._k = 0
        self._uploads: dict = {}          # input name -> Buffer
        self._host_out: dict = {}         # output name -> Buffer
        self._host_views: dict | None = None  # output name -> DeviceArray over _host_out's buffer
        self._dummy = None
        self._flag_host = None            # host-visible copy of the chunked kernels' flag
        self._out_sets: list = []         # output buffer sets of recent device-output calls, newest first
        self.kept = None                  # forward, chunked: its hs (chunk states), cb, mcb scratch buffers
        self.saved = None                 # ... and who the inputs were of the call that left them there
        self.sequences: OrderedDict = OrderedDict()   # binding key -> (Sequence, constant buffers)
        self._constants: list = []
        self.closed = False
        # Set when made and by each call that comes through a lane (lanes.py), which skips
        # _workspace's look-up and so its move to the most recent end: eviction moves a workspace
        # so marked to that end once (clearing the mark) instead of closing it.
        self.recent = True

    # -- buffers ------------------------------------------------------------------------------
    def _acquire(self, nbytes: int):
        buf = self.pool.acquire(nbytes)
        self._owned.append(buf)
        return buf

    def scratch(self, n_elems: int):
        """The k-th scratch buffer of the recording (the same buffer for every recording)."""
        if n_elems <= 0:
            return None
        if self._k < len(self._scratch):
            buf = self._scratch[self._k]
            assert buf.size >= n_elems * F32
        else:
            buf = self._acquire(n_elems * F32)
            self._scratch.append(buf)
        self._k += 1
        return buf

    def constant(self, arr: np.ndarray):
        """A small buffer holding ``arr``, kept with the sequence being recorded."""
        buf = self._acquire(arr.nbytes)
        rt.upload(buf, arr)
        self._constants.append(buf)
        return buf

    def dummy(self):
        if self._dummy is None:
            self._dummy = self._acquire(16)
        return self._dummy

    def flag_host(self):
        """The host-visible buffer the chunked kernels' non-finite flag is copied into."""
        if self._flag_host is None:
            self._flag_host = rt.Buffer(self.ctx, 16, staging=True)
        return self._flag_host

    def nonfinite(self) -> bool:
        """Whether the last (waited-for) chunked call flagged a non-finite output."""
        buf = self._flag_host
        if buf.mappable and not self.ctx.force_staging:   # host-visible: read in place (a uint32: 4 bytes)
            return buf._mapped[0:4] != b"\0\0\0\0"
        return bool(rt.download(buf, ((1,), np.uint32))[0])

    def bind(self, buf, base: int, start: int, count: int) -> tuple[tuple, int]:
        """A binding of elements [base + start, base + start + count) of ``buf`` and the residual
        element offset the shader adds (binding offsets must be aligned)."""
        if buf is None or count <= 0:
            return (self.dummy(), 0, 16), 0
        byte0 = (base + start) * F32
        aligned = byte0 - byte0 % self.align
        resid = (byte0 - aligned) // F32
        return (buf, aligned, (resid + count) * F32), resid

    def input(self, name: str, arr) -> tuple:
        """(buffer, element offset) of input ``arr``: DeviceArrays in place, host arrays
        uploaded into this workspace's buffer for ``name``."""
        if isinstance(arr, DeviceArray):
            arr._check_live()
            if arr.ctx is not self.ctx:
                raise ValueError(f"{name}: a DeviceArray from another Vulkan context was passed")
            return arr.buffer, arr.offset
        a = np.ascontiguousarray(arr, dtype=np.float32)
        if a.size == 0:
            return None, 0
        buf = self._uploads.get(name)
        if buf is None or buf.size < a.nbytes:
            buf = self._uploads[name] = self._acquire(a.nbytes)
        rt.upload(buf, a)
        return buf, 0

    def outputs(self, device_out: bool) -> dict:
        """Output arrays: fresh DeviceArrays from the pool, or this workspace's host buffers."""
        if device_out:
            # What empty(ctx, shape) makes for each output, the buffers taken from the pool at once.
            ctx, p = self.ctx, self.pool
            if p.closed:
                p = pool(ctx)
            # A set of output buffers this workspace has recorded for, where one is wholly free
            # (most recently used first): a training loop replays its recorded sequences instead
            # of cycling through new sets of buffers (and recording anew) when outputs share a
            # size class -- also while it holds the results of its last step or two.
            sets = self._out_sets
            bufs = p.acquire_set(sets) if sets else None
            if bufs is None:
                bufs = p.acquire_all(self._out_nbytes)
                p.reserve(bufs)
            else:
                sets.remove(bufs)
            sets.insert(0, bufs)
            if len(sets) > MAX_SEQUENCES:
                p.unreserve(sets.pop())
            out: dict = {}
            i = 0
            try:
                for k, shape, nbytes in self._out_specs:
                    out[k] = DeviceArray._from_pool(ctx, bufs[i] if nbytes else None, shape)
                    i += 1 if nbytes else 0
            except BaseException:
                _release(out)
                for b in bufs[i:]:
                    p.release(b)
                raise
            return out
        if self._host_views is None:  # made once: they never leave the workspace (results are copies)
            out = {}
            for k, shape in self.shapes.items():
                n = self.sizes[k] * F32
                if n and k not in self._host_out:
                    self._host_out[k] = self._acquire(n)
                out[k] = DeviceArray(self.ctx, self._host_out.get(k), shape, owned=False)
            self._host_views = out
        return self._host_views

    # -- recorded sequences ---------------------------------------------------------------------
    def sequence(self, key, record):
        """The sequence recorded for binding ``key``, recording it with ``record(seq)`` if new."""
        hit = self.sequences.get(key)
        if hit is not None:
            self.sequences.move_to_end(key)
            return hit[0]
        self._k = 0
        self._constants = []
        seq = rt.Sequence(self.ctx)
        try:
            if self.ctx.info.timestamps:
                seq.timestamp("start")
            record(seq)
            if self.ctx.info.timestamps:
                seq.timestamp("end")
            seq.finish()
        except BaseException:
            seq.close()
            self._drop(self._constants)  # a recording that failed keeps none of its constants
            raise
        self.sequences[key] = (seq, self._constants)
        while len(self.sequences) > MAX_SEQUENCES:
            _, (old, consts) = self.sequences.popitem(last=False)
            old.close()
            self._drop(consts)
        return seq

    def _drop(self, buffers: list) -> None:
        for b in buffers:
            self._owned.remove(b)
            self.pool.release(b)

    def settle(self) -> None:
        """Wait for every submission of this workspace's sequences. A call whose wait timed out
        left its sequence pending; nothing may write the buffers that work reads until it ends
        (raises VulkanTimeout again if it still has not)."""
        if not self.ctx.pending:  # no sequence of the context is pending (the per-call case)
            return
        for seq, _ in self.sequences.values():
            if seq.pending:
                seq.wait()

    def close(self) -> None:
        self.closed = True
        for seq, _ in self.sequences.values():
            seq.close()
        self.sequences.clear()
        if not self.ctx.closed:
            for b in self._owned:
                try:
                    self.pool.release(b)
                except ValueError:
                    pass
        self._owned.clear()
        if self._flag_host is not None and not self.ctx.closed:
            self._flag_host.close()
        self._flag_host = None
        if not self.ctx.closed and not self.pool.closed:
            for bufs in self._out_sets:
                self.pool.unreserve(bufs)
        self._out_sets = []


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
            ws = cache[key] = Workspace(ctx, dims, backward, chunked)
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


def _release(arrays: dict) -> None:
    for a in arrays.values():
        a.release()


def _run(ctx, p: Problem, backward: bool, device_out: bool, lane=None) -> dict:
    try:
        return _run_once(ctx, p, backward, device_out, lane=lane)
    except rt.OutOfDeviceMemory:
        # The workspaces of other shapes hold buffers between calls: give them all back (the pool
        # frees its idle ones when it next runs out) and try once more; a second failure raises.
        clear_cache(ctx)
        return _run_once(ctx, p, backward, device_out)


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
        # kernels, whose inf and nan are SCAN.md's (the matrix form's sums can turn an inf into
        # nan and back). Same device; finite results never take this path.
        _note_rerun(p.dims)
        return _run_once(ctx, p, backward, device_out, chunked=False)


def _note_rerun(dims) -> None:
    global reruns, _rerun_logged
    reruns += 1
    if not _rerun_logged:
        _rerun_logged = True
        log.info("ssm_vk: a result of the chunked kernels held inf or nan (%s); such calls are recomputed "
                 "with the token-sequential kernels, whose non-finite results follow SCAN.md", dims)


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
    if bound is None:
        bufs, key = bind_inputs(ws, p, backward)
    else:
        bufs, key = dict(bound[0]), list(bound[1])
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
        if not backward and ws.kept is not None and len(ws.plan.chunked.windows) == 1:
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
    if fwd is None or fwd.saved is None or _plan._tune().get("KEEP_STATES", 1) == 0:
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
