"""The replay cache: the prepared calls (replay.Replay) that plain calls keep for their repeats,
by signature (the engine's ``replays``) -- the scan's and Mamba-3's (:func:`m3_signature`: the op,
its rotation, which of its optional inputs are None, each given one's shape, buffer and offset).

A training loop calls ssm_scan / ssm_scan_back with the same shapes every step, its inputs
DeviceArrays whose buffers the pool hands back step after step. Past the ids, everything such a
call works out before it replays its recorded sequence -- the validator's shape checks, the
support decision, the workspace, the input bindings -- is a function of its *signature*: the op,
each input's type, dtype, shape, buffer and offset, the step's form (dt_softplus), whether
the forward writes the cache (update_cache), K (a forward's snapshots) and the planner's knobs
(ssm_vk.config, SSM_VK_TUNE, the subgroup switch); with the context and its limits
(``ctx.info``) checked on the replay. After the full path ran a call on the device, :func:`keep`
prepares it -- a Replay of the decision's plans, in the engine's workspace of the shape, its
inputs bound -- under its signature; a call with that signature finds it in one look-up
(:func:`find`) and runs it, with less Python than the full path (docs/ARCHITECTURE.md,
"Repeated calls").

Every call still pays for what can change under the same signature (replay.Replay):
- each input is live (an array released, or whose buffer or context was closed, raises as on
  the full path: checked once its buffers are marked busy);
- the ids' values and the host memory rule, by ``validate.problem``, which raises exactly as
  ssm_ref's check_forward / check_backward do (ids whose bytes equal the replay's last call's take
  that call's checked copy);
- the context is the open one, not lost, with the same ``info``; the workspace is not closed
  (evicted, or cleared by Engine.clear): else the full path.
A call is kept only after the full path ran it on the device (an accepted decision; the
decisions that refuse are never kept), with the decision's plans (their knobs those its signature
records).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import runtime as rt
from .arrays import DeviceArray
from .replay import SCAN_CALLS, OpCalls, Replay

if TYPE_CHECKING:
    from . import config
    from .engine import Engine

__all__ = ["find", "keep", "m3_signature", "signature"]

_F32 = np.dtype(np.float32)


def signature(ctx, backward: bool, arrays: tuple, knobs: config.Settings, softplus: int = 0,
              update: bool = False, K: int = 1) -> tuple | None:
    """The signature of a call on ``ctx`` with the float arguments ``arrays`` -- (s, x, dt, A, B, C),
    and for the backward (g_y, g_states) -- the step's form ``softplus`` and ``update`` (a forward
    with update_cache) and ``K`` (a forward's snapshots, checked: part of the signature when not
    1), or None when any of them is not a float32 DeviceArray of ``ctx`` (g_states
    may be None beside a packed g_y). Liveness is not part of it: a replay checks its inputs live
    after marking their buffers busy (replay.Replay.run), as it must anyway, and raises as the
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
         update: bool = False, K: int = 1, sign=None) -> tuple[Replay | None, tuple | None]:
    """(the Replay kept for this call or None, its signature or None). ``sign``: another op's
    signature function (``sign(ctx, backward, arrays, knobs, form, update)``: Mamba-3's
    :func:`m3_signature`, its rotation the form); None: the scan's, :func:`signature`."""
    ctx = rt.current_context()
    if ctx is None or ctx.lost:
        return None, None
    engine = ctx.owned.extension("engine")
    if engine is None:
        return None, None
    if sign is None:
        sig = signature(ctx, backward, arrays, knobs, softplus, update, K)
    else:
        sig = sign(ctx, backward, arrays, knobs, softplus, update)
    if sig is None:
        return None, None
    replay = engine.replay(sig)
    if replay is None or replay.info is not ctx.info or replay.ws.closed:
        return None, sig
    return replay, sig


def m3_signature(ctx, backward: bool, arrays: tuple, knobs: config.Settings, rotation: int = 0,
                 update: bool = False) -> tuple | None:
    """The signature of a Mamba-3 call (op mamba3_scan, ``backward`` its backward) on ``ctx`` with the
    float arguments ``arrays`` -- the 14 inputs, and the backward's 5 cotangents -- each a float32
    DeviceArray of ``ctx`` or None (psi, the start state, a cotangent: None is part of the
    signature), ``rotation`` (0 interleaved, 1 halved) and ``update``; None when any is neither."""
    sig = ["mamba3_scan", backward, rotation, update]
    for a in arrays:
        if a is None:
            sig.append(None)
            continue
        if type(a) is not DeviceArray or a.dtype is not _F32 or a.ctx is not ctx:
            return None
        b = a.buffer
        sig += (a.shape, None if b is None else b.serial, a.offset)
    sig.append(knobs.key)
    return tuple(sig)


def keep(sig: tuple, engine: Engine, info, planned, p, backward: bool, arrays: tuple,
         update: bool = False, calls: OpCalls | None = None) -> None:
    """Keep the Replay of signature ``sig``, after the full path ran ``p`` (of the float arguments
    ``arrays``) on the device of ``engine``, whose support decision was taken with ``info`` and
    planned ``planned`` (family.Planned). Nothing is kept when the signature moved meanwhile
    (the knobs changed, an input was released: another thread) or the limits did. ``calls``:
    another op's (mamba3_run.MAMBA3_CALLS; its signature :func:`m3_signature`); None: the scan's."""
    ctx = engine.ctx
    if ctx.info is not info:
        return
    if calls is None:
        if backward and type(p.g_states) is not DeviceArray:
            return   # (a packed g_y of K > 1 slots: the validator's host zeros for g_states, uploaded per call)
        again = signature(ctx, backward, arrays, planned.knobs, planned.softplus, update, 1 if backward else p.dims.K)
    else:
        again = m3_signature(ctx, backward, arrays, planned.knobs, planned.softplus, update)
    calls = SCAN_CALLS if calls is None else calls
    ws = engine.workspace(planned, calls.workspace)
    if ws.closed or again != sig:
        return
    try:
        replay = Replay(engine, info, planned, p, ws, backward, update, calls=calls)
    except (RuntimeError, ValueError):
        return  # released (or closed) since: the next call takes the full path and says so
    if ctx.info is not info:
        return
    engine.keep_replay(sig, replay)
