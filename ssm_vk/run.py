"""Running a call on the device, once it is decided: its workspace, inputs bound, the recorded
sequence replayed (or recorded), submit and wait, the results; the recompute of a flagged result
that held inf or nan; the forward's tables taken by its backward.

A call goes: look up the Workspace of its shape in the context's Engine -> write host inputs
into the workspace's buffers or its staging slots (device-resident inputs are bound in place; a
backward binds the buffers its forward filled with the same host bytes) -> find the Sequence
recorded for exactly these buffers, or record it (its family's recording: ``ws.family``, between
the copies of staged host data in and out) -> submit and wait -> read host results (host calls)
or hand out DeviceArrays.

Replay is what makes small calls cheap: a training loop that passes the same shapes each step
(host arrays, or device arrays whose buffers the pool hands back) records once and then pays one
submit + wait per call. A device-resident call that repeats one that ran skips the look-ups before
that too: the prepared call kept for it (replay.Replay, replay_cache.py) runs it through
:func:`run_bound`.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from ssm_ref import Problem

from . import runtime as rt
from .arrays import DeviceArray, check_live, pool
from .recording import put_rows
from .workspace import BWD_IN, FWD_IN, Workspace, release_all

if TYPE_CHECKING:
    from .engine import Engine
    from .family import Planned

__all__ = ["forward", "backward", "in_context", "last_gpu_ns", "last_sequence", "set_last_sequence", "run_once",
           "retry", "run_bound", "note_rerun", "recorded_sequence", "copy_rows"]

_timing = threading.local()
log = logging.getLogger("ssm_vk")
_rerun_logged = False



def last_sequence():
    """The Sequence this thread's last forward or backward submitted, or None (benchmarks read its
    timestamps)."""
    return getattr(_timing, "seq", None)


def set_last_sequence(seq) -> None:
    """Record ``seq`` as this thread's last call (a prepared call's run: last_gpu_ns reads it)."""
    _timing.seq = seq


def last_gpu_ns() -> float | None:
    """GPU time (timestamps) of this thread's last forward or backward, in ns; None when the
    device has no timestamps. Read on demand (a query costs some microseconds)."""
    seq = last_sequence()
    if seq is None or seq.closed or not seq.ctx.info.timestamps:
        return None
    return seq.gpu_times().get("end")


def forward(engine: Engine, p: Problem, planned: Planned, device_out: bool = True, update: bool = False,
            given: dict | None = None) -> dict:
    """Run the forward; returns {"y", "states"} as DeviceArrays (device_out) or numpy arrays.
    ``given``: the caller's output DeviceArrays by name (ssm_scan's ``out``, checked by
    ssm_vk.outputs: every output, device_out implied), which the call writes and returns, never
    releases;
    ``planned``: the decision's plans of the shape (family.Planned: limits, knobs, the step's
    form); ``update``: also write the final states into the cache rows s[ids] (ssm_scan's
    update_cache: ``p.s`` a DeviceArray, the ids distinct) -- by the scan itself where it reads
    those rows in place, else by copies once the call came out finite (the ``states`` returned
    are then unwritten where the scan wrote the rows)."""
    return _run(engine, p, False, planned, device_out, update, given=given)


def backward(engine: Engine, p: Problem, planned: Planned, device_out: bool = True, given: dict | None = None) -> dict:
    """Run the backward; returns the seven gradients as DeviceArrays or numpy arrays (``given``:
    as :func:`forward`)."""
    return _run(engine, p, True, planned, device_out, given=given)


def _run(engine: Engine, p: Problem, backward: bool, planned: Planned, device_out: bool, update: bool = False,
         given: dict | None = None, once=None, again=None) -> dict:
    """The call (``once``: an op's run_once, default the scan's) with the context held; out of
    device memory, ``again`` (its retry, default the scan's: the other shapes' workspaces closed
    first). Another op's calls take it as :func:`in_context`."""
    ctx = engine.ctx
    token = ctx.enter()  # the context outlives this call, whatever another thread does to it (DeviceLost if lost)
    try:
        try:
            return (once or run_once)(engine, p, backward, planned, device_out, update=update, given=given)
        except rt.OutOfDeviceMemory:
            return (again or retry)(engine, p, backward, planned, device_out, update, given)
    finally:
        ctx.leave(token)


in_context = _run   # (the name Mamba-3's calls take it by; tests patch ``_run``, the scan's)


def retry(engine: Engine, p: Problem, backward: bool, planned: Planned, device_out: bool, update: bool = False,
          given: dict | None = None) -> dict:
    """The call once more after it ran out of device memory: the workspaces of other shapes hold
    buffers between calls, so they all give them back (the pool frees its idle ones when it next
    runs out) first; a second failure raises."""
    engine.clear()
    return run_once(engine, p, backward, planned, device_out, update=update, given=given)


def run_once(engine, p: Problem, backward: bool, planned: Planned, device_out: bool, rerun: bool = False,
             update: bool = False, given: dict | None = None) -> dict:
    """One call in the workspace of ``planned``'s first plan (``rerun``: of its recompute's plan);
    a result the first plan's kernels flag as non-finite is computed again so (into the ``given``
    outputs too: the recompute binds them in its own workspace, no copy)."""
    while True:
        ws = engine.workspace(planned, Workspace, rerun)
        with ws.lock:
            if ws.closed:  # another thread evicted it after our look-up: look again
                continue
            out = _run_in(engine, ws, p, backward, device_out, update, given)
        if out is not None:
            return out
        # The kernels flagged a non-finite output: recompute on the plan of the op's fallback
        # family (the token-sequential kernels), whose inf and nan are the spec's (the chunked
        # matrix form's sums, and the carries over time chunks, can turn an inf into nan and
        # back). Same device; finite results never take this path.
        note_rerun(engine, p.dims)
        return run_once(engine, p, backward, planned, device_out, rerun=True, update=update, given=given)


def note_rerun(engine: Engine, dims) -> None:
    global _rerun_logged
    engine.reruns += 1
    if not _rerun_logged:
        _rerun_logged = True
        log.info("ssm_vk: a result of kernels that flag inf and nan held them (%s); such calls are recomputed "
                 "with the token-sequential kernels, whose non-finite results follow docs/SPEC.md", dims)


def _run_in(engine, ws: Workspace, p: Problem, backward: bool, device_out: bool, update: bool = False,
            given: dict | None = None) -> dict | None:
    """One call in workspace ``ws`` (its lock held); None when its kernels flagged a non-finite
    output (the caller recomputes it on the recompute's plan). ``given`` outputs take
    the device-output path, whatever the inputs (host ones are written or staged as beside
    device ones), marked busy with the inputs and checked live after."""
    ws.settle()
    if given is not None:
        device_out = True
    elif not device_out:   # every input on the host
        return _run_host(engine, ws, p, backward, update)
    names = BWD_IN if backward else FWD_IN
    buffers = ws.pool if not ws.pool.closed else pool(ws.ctx)
    # The inputs' buffers are busy until this call's work is done: released meanwhile (by another
    # thread), they go back to the pool only then. Liveness is checked after they are marked
    # (Workspace.bind_inputs checks each DeviceArray).
    resident = [a for a in (getattr(p, k) for k in names) if type(a) is DeviceArray]
    if backward and type(p.g_snapshots) is DeviceArray:
        resident.append(p.g_snapshots)
    if given is not None:
        resident += given.values()
    held = tuple(a.buffer for a in resident if a.buffer is not None)
    token = buffers.busy(held) if held else None
    try:
        if given is not None:
            check_live(given.values())   # (after marking: a release meanwhile is seen here)
        bufs, key = ws.bind_inputs(p, backward)
        if ws.host.staged:   # host inputs beside device ones, staged (or zeros): the sequence copies (fills) them
            try:
                key.append(ws.host.staged_key())
                return run_bound(engine, ws, p, backward, device_out, bufs, key, update, given)
            finally:
                ws.host.unstage()
        return run_bound(engine, ws, p, backward, device_out, bufs, key, update, given)
    finally:
        if token is not None:
            buffers.idle(token)


def _run_host(engine, ws: Workspace, p: Problem, backward: bool, update: bool) -> dict | None:
    """_run_in's call on host inputs with host results: a backward binds the upload buffers of
    the forward of its shape where they hold these very bytes (engine.lend_uploads); a forward
    that staged inputs offers its own for the backward to come."""
    donor = ws.host.donor = engine.lend_uploads(ws) if backward else None
    try:
        bufs, key = ws.bind_inputs(p, backward)
        staged = ws.host.staged
        key += (ws.host.staged_key() if staged else (), ws.host.stage_outputs(ws))
        out = run_bound(engine, ws, p, backward, False, bufs, key, update)
        if staged:
            ws.host.staged_done()   # (the submission ran, whatever its flag said)
            if not backward and ws.host.held:   # (inputs it only filled with zeros: nothing to lend)
                engine.offer_uploads(ws)
        return out
    except BaseException:
        if donor is not None:
            donor.host.lent = True   # the failed call may still read its buffers: its next call waits
        raise
    finally:
        ws.host.unstage()
        if donor is not None:
            donor.lock.release()


def run_bound(engine, ws: Workspace, p: Problem, backward: bool, device_out: bool, bufs: dict, key: list,
              update: bool = False, given: dict | None = None):
    """The call with its inputs bound: outputs (``given``: the caller's, else the workspace's),
    the sequence, submit, the non-finite check. A call that raises keeps no results: device
    outputs of its own go back to the pool before the exception leaves, so a caller that holds
    the exception (and so its frames) holds no device memory; ``given`` ones are the caller's and
    stay."""
    own = given is None
    outs = ws.outputs(device_out) if own else given
    if not own and engine.kept:
        for a in given.values():
            engine.written(a)   # (a forward's input written over: its kept tables go)
    try:
        for k, a in outs.items():
            b, off = bufs[k] = (a.buffer, a.offset)
            key += (None if b is None else b.serial, off)
        ids = p.ids.tobytes()
        key.append(ids)
        scatter = update and ws.family.scatters(ws, p, bufs["s"])
        if update:
            key.append(("update", scatter))   # another recording: the scan writes s, or copies follow
            engine.written(p.s)               # no kept forward tables of the old s outlive this call
        tag = ws.tables_tag   # the forward's tables this plan leaves or takes (None: none)
        kept_key = ws.kept_key
        kept = None
        if backward and tag is not None:
            kept = engine.kept_for(kept_key, tuple(getattr(p, k) for k in FWD_IN), ids, tag)
        try:
            if kept is not None:      # the forward's tables (chunk states, ...), bound in place of a recompute
                key = (*key, *(b.serial for b in kept.tables.values()))
            elif not backward and tag is not None:
                engine.forget(kept_key)  # this forward overwrites its tables from here on
            seq = recorded_sequence(ws, p, backward, bufs, tuple(key), scatter, kept)
            seq.submit()
        finally:
            if kept is not None:
                kept.ws.lock.release()
        _timing.seq = seq
        if ws.flags_nonfinite and ws.nonfinite():
            if device_out and own:
                release_all(outs)
            return None
        if kept is not None:
            engine.states_reused += 1
        if update and not scatter:
            copy_rows(ws.ctx, outs["states"], p.s, p.ids)
        if not backward and not update and ws.kept is not None and tag is not None:
            arrays = tuple(getattr(p, k) for k in FWD_IN)
            if all(type(a) is DeviceArray for a in arrays):
                engine.keep(kept_key, ws, arrays, ids)
        if device_out:
            return outs
        return ws.host.results(outs)
    except BaseException:
        if device_out and own:
            release_all(outs)
        raise


def recorded_sequence(ws: Workspace, p: Problem, backward: bool, bufs: dict, key: tuple, scatter: bool = False,
                      kept=None):
    """The call's sequence in ``ws`` under binding ``key``, recorded on first use: the backward
    (with the forward's ``kept`` tables where given) or the forward (``scatter``: its final states
    into the cache rows)."""
    if backward:
        return ws.sequence(key, lambda seq: _record(seq, ws, p, True, bufs, kept))
    return ws.sequence(key, lambda seq: _record(seq, ws, p, False, bufs, scatter))


def _record(seq, ws: Workspace, p: Problem, backward: bool, bufs: dict, extra) -> None:
    """The recording of a call's sequence (on a miss; ``extra``: the backward's kept tables, the
    forward's scatter): DeviceArrays in pieces cut unlike the plan's windows copied into (out of)
    the workspace's own pieces around the family's recording (HostData.rebind_pieces), which
    binds ``bufs``."""
    after = ws.host.rebind_pieces(seq, ws, bufs)
    if backward:
        ws.family.record_backward(seq, ws, p, bufs, extra)
    else:
        ws.family.record_forward(seq, ws, p, bufs, extra)
    if after:
        seq.barrier()
        for src, dst, nbytes, off in after:
            seq.copy(src, dst, nbytes, 0, off)


def copy_rows(ctx, states: DeviceArray, s: DeviceArray, ids) -> None:
    """s[ids[i]] <- states[i] on the device, in one one-shot submission (recording.put_rows)."""
    row = s.size // s.shape[0] if s.shape[0] else 0
    if row and len(ids):
        with rt.oneshot(ctx) as seq:
            put_rows(seq, states.buffer, states.offset, s.buffer, s.offset, ids, row)
