"""Lanes: what a device-resident call looked up, kept for the calls that repeat it.

A training loop calls ssm_scan / ssm_scan_back with the same shapes every step, its inputs
DeviceArrays whose buffers the pool hands back step after step. Past the ids, everything such a
call works out before it replays its recorded sequence -- the validator's shape checks, the
support decision, the workspace, the input bindings -- is a function of its *signature*: the op,
each input's type, dtype, shape, buffer and offset, the step's form (dt_softplus), whether
the forward writes the cache (update_cache) and the planner's knobs (ssm_vk.config,
SSM_VK_TUNE, the subgroup switch); with the context and its limits (``ctx.info``) checked on the
lane. A :class:`Lane` keeps those answers for a signature
that ran on the device; a call with that signature takes them in one look-up (~15 us of Python
less per call on lavapipe's VM).

Every call still pays for what can change under the same signature:
- each input is live (an array released, or whose buffer or context was closed, raises as on
  the full path: checked once its buffers are marked busy);
- the ids' values and the host memory rule, by ``validate.problem``, which raises exactly as
  ssm_ref's check_forward / check_backward do (ids whose bytes equal the lane's last call's take
  that call's checked copy);
- the context is the open one, not lost, with the same ``info``; the workspace is not closed
  (evicted, or cleared by Engine.clear): else the full path.
A lane is made only after the full path ran the call on the device (an accepted decision; the
decisions that refuse are never laned), with the decision's plans (their knobs those its signature
records).
"""

from __future__ import annotations

import numpy as np

from ssm_ref.checks import Problem

from . import config, validate
from . import runtime as rt
from .arrays import DeviceArray
from .engine import Engine

__all__ = ["Lane", "find", "keep", "signature"]

_F32 = np.dtype(np.float32)


class Lane:
    """The answers of the full path for one signature: the ``engine`` (and so the context) and
    the context's ``info`` then, the ``dims`` of the validated Problem, the decision's plans
    ``planned`` (decision.Planned: limits, knobs, the step's form), the workspace ``ws``
    (chunked kernels allowed, as every call's first attempt),
    ``bound`` (Workspace.bind_inputs of the inputs, and their buffers) and ``where``."""

    __slots__ = ("bound", "ctx", "dims", "engine", "ids", "info", "planned", "where", "ws")

    def __init__(self, engine, info, dims, planned, ws, bound):
        self.engine, self.ctx, self.info, self.dims, self.ws, self.bound = engine, engine.ctx, info, dims, ws, bound
        self.planned = planned
        self.where = info.where
        self.ids = None   # (bytes, checked copy) of the last ids a call of this lane passed

    def problem(self, arrays: tuple, ids):
        """validate.problem of a call of this lane: its ids checked (or known from the lane's
        last call: the same bytes), the host memory rule; None: the full path."""
        p = validate.problem(self.dims, arrays, ids, known_ids=self.ids)
        if p is not None and type(ids) is np.ndarray:
            known = self.ids
            if known is None or known[1] is not p.ids:
                self.ids = (p.ids.tobytes(), p.ids)   # one tuple: a reader sees the old or the new
        return p


def signature(ctx, backward: bool, arrays: tuple, knobs: config.Settings, softplus: int = 0,
              update: bool = False, K: int = 1) -> tuple | None:
    """The signature of a call on ``ctx`` with the float arguments ``arrays`` -- (s, x, dt, A, B, C),
    and for the backward (g_y, g_states) -- the step's form ``softplus`` and ``update`` (a forward
    with update_cache) and ``K`` (a forward's snapshots, checked: part of the signature when not
    1), or None when any of them is not a float32 DeviceArray of ``ctx`` (g_states
    may be None beside a packed g_y). Liveness is not part of it: a call through a lane checks its
    inputs live after marking their buffers busy (run.py), as it must anyway, and raises as the
    full path does."""
    sig = [backward, softplus, update]
    # g_states (the eighth) may be None beside a packed (1-D) g_y, a DeviceArray checked in the
    # loop; every other None (s, g_y, g_states beside a structured g_y: zeros the validator
    # makes) takes the full path. (Checked apart, so that the loop needs no index.)
    packed = len(arrays) == 8 and arrays[7] is None
    for a in arrays[:7] if packed else arrays:
        if type(a) is not DeviceArray or a.dtype is not _F32 or a.ctx is not ctx:
            return None
        b = a.buffer
        sig += (a.shape, None if b is None else b.serial, a.offset)  # serials are unique in the process
    if packed:
        if len(arrays[6].shape) != 1:
            return None
        sig.append(None)
    sig.append(knobs.key)
    if K != 1:
        sig.append(K)
    return tuple(sig)


def find(backward: bool, arrays: tuple, knobs: config.Settings, softplus: int = 0,
         update: bool = False, K: int = 1) -> tuple[Lane | None, tuple | None]:
    """(the lane of this call or None, its signature or None)."""
    ctx = rt.current_context()
    if ctx is None or ctx.lost:
        return None, None
    engine = ctx.owned.extension("engine")
    if engine is None:
        return None, None
    sig = signature(ctx, backward, arrays, knobs, softplus, update, K)
    if sig is None:
        return None, None
    lane = engine.lane(sig)
    if lane is None or lane.info is not ctx.info or lane.ws.closed:
        return None, sig
    return lane, sig


def keep(sig: tuple, engine: Engine, info, planned, p: Problem, backward: bool, arrays: tuple,
         update: bool = False) -> None:
    """Make the lane of signature ``sig``, after the full path ran ``p`` (of the float arguments
    ``arrays``) on the device on ``ctx``, whose support decision was taken with ``info`` and
    planned ``planned`` (decision.Planned). Nothing
    is kept when the signature moved meanwhile (the knobs changed, an input was released: another
    thread) or the limits did."""
    ctx = engine.ctx
    if ctx.info is not info:
        return
    if backward and type(p.g_states) is not DeviceArray:
        return   # (a packed g_y of K > 1 slots: the validator's host zeros for g_states, uploaded per call)
    ws = engine.workspace(planned)
    K = 1 if backward else p.dims.K
    if ws.closed or signature(ctx, backward, arrays, planned.knobs, planned.softplus, update, K) != sig:
        return
    try:
        bufs, key = ws.bind_inputs(p, backward)  # device arrays: checked, nothing uploaded
    except (RuntimeError, ValueError):
        return  # released (or closed) since: the next call takes the full path and says so
    bound = (bufs, key, tuple(b for b, _ in bufs.values() if b is not None))  # and the buffers to mark busy
    if ctx.info is not info:
        return
    engine.add_lane(sig, Lane(engine, info, p.dims, planned, ws, bound))
