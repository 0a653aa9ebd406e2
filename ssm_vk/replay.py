"""Replay: a device-resident call of an op (ssm_scan / ssm_scan_back, mamba3_scan /
mamba3_scan_back) checked, planned and bound once, then replayed -- the one mechanism for calls
that repeat. What differs between the ops -- how a repeat's problem is made, how a call runs in its
workspace, what a prepared call records -- is the op's :class:`OpCalls` (:data:`SCAN_CALLS`,
mamba3_run.MAMBA3_CALLS); the rest is shared. Two hold a Replay:

- a prepared call (prepared.PreparedCall: ``prepare_scan`` / ``prepare_scan_back``): its own
  workspace and outputs, and so one recorded sequence;
- a plain call that repeats one that ran on the device (replay_cache.py keeps its Replay by the
  call's signature): the workspace is the engine's, the outputs fresh from the pool each call
  (their sequence looked up by them and the ids, as the general path does: run.run_bound), the
  ids checked each call, the result a new object each call.

Either way a run (:meth:`Replay.run`) takes the workspace's lock (a prepared call's runs, and a
shape's plain calls, one at a time), marks its inputs' buffers busy (another thread's release
waits for the run), checks that its inputs (and a prepared call's outputs) are live, submits and
waits; a result its kernels flag as non-finite is computed again token by token (as every call
is) -- into a prepared call's own outputs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ssm_ref.ops import SCAN

from . import run, validate
from . import runtime as rt
from .arrays import check_live, pool
from .workspace import Workspace, release_all

__all__ = ["SCAN_CALLS", "OpCalls", "Replay"]


class OpCalls(NamedTuple):
    """What a Replay asks of its op: ``op`` (its ssm_ref.ops declaration: the names in messages);
    ``problem(dims, arrays, ids, known_ids, template)`` -> the Problem of a plain repeat (None: the
    full path, which raises what is wrong); ``run_bound``, ``run_once``, ``retry``: ssm_vk.run's
    functions of that name for the op; ``record_own(ws, p, backward, bufs, outs, update)`` -> (the
    prepared call's one sequence over its own outputs ``outs``, whether the new states are copied
    into the cache rows after it); ``copy_states(ws, own, p)``: that copy, after the sequence ran
    and its flag was read; ``written(engine, p)``: a forward with update_cache wrote ``p``'s
    cache (the kept tables that read it go); ``template(p)``: what ``problem`` takes of the first
    call's problem ``p`` (no arrays); ``workspace``: the op's workspace class (engine.workspace
    makes one of it). The scan's: :data:`SCAN_CALLS`; Mamba-3's: mamba3_run.MAMBA3_CALLS."""

    op: object
    problem: object
    run_bound: object
    run_once: object
    retry: object
    record_own: object
    copy_states: object
    written: object
    template: object
    workspace: object


def _scan_record_own(ws, p, backward: bool, bufs: dict, outs: dict, update: bool):
    for k, a in outs.items():
        bufs[k] = (a.buffer, a.offset)
    scatter = update and ws.family.scatters(ws, p, bufs["s"])
    return run.recorded_sequence(ws, p, backward, bufs, ("prepared",), scatter), update and not scatter


def _scan_copy_states(ws, own: dict, p) -> None:
    run.copy_rows(ws.ctx, own["states"], p.s, p.ids)


def _scan_written(engine, p) -> None:
    engine.written(p.s)


def _no_template(p) -> None:
    """(The scan's repeats make their problem of the dims alone: validate.problem.)"""


SCAN_CALLS = OpCalls(SCAN, validate.problem, run.run_bound, run.run_once, run.retry, _scan_record_own,
                     _scan_copy_states, _scan_written, _no_template, Workspace)


class Replay:
    """A device-resident call decided and bound once, replayed by :meth:`run` (see the module's
    docstring): the decision's ``engine`` (and so ``ctx``) and the context's ``info`` then (its
    ``where``), the Problem's ``dims``, the decision's plans ``planned`` (family.Planned:
    limits, knobs, the step's form), the workspace ``ws``, ``bound`` (Workspace.bind_inputs of the
    inputs, and their buffers to mark busy), ``backward`` and ``update`` (a forward with
    update_cache). ``outs``: a prepared call's own outputs, ``seq`` the sequence recorded for them
    (and ``copy`` whether the new states are copied into the cache rows after it); None: a plain
    call's. ``ids``: (bytes, checked copy) of the last ids a plain call of it passed."""

    __slots__ = ("backward", "bound", "calls", "copy", "ctx", "dims", "engine", "ids", "info", "outputs", "outs",
                 "planned", "problem_of", "run_plain", "seq", "template", "update", "where", "ws")

    def __init__(self, engine, info, planned, p, ws: Workspace, backward: bool, update: bool = False,
                 outs: dict | None = None, calls: OpCalls = SCAN_CALLS):
        """Bind the inputs of Problem ``p`` (device arrays: checked, nothing uploaded; raises
        RuntimeError or ValueError for one released or of another context) in ``ws``; with
        ``outs``, record the one sequence of those inputs, these outputs and ``p.ids``."""
        self.engine = engine
        self.ctx = engine.ctx
        self.info = info
        self.where = info.where
        self.dims = p.dims
        self.planned = planned
        self.ws = ws
        self.backward = backward
        self.update = update
        self.calls = calls
        # (the two a plain repeat calls, in slots of their own: a slot's read is the cheapest)
        self.problem_of, self.run_plain = calls.problem, calls.run_bound
        # what a repeat's problem takes of the first (Mamba-3's rotation, psi and states given; never
        # an array: a Replay must not keep its first call's inputs alive)
        self.template = None if calls is SCAN_CALLS else calls.template(p)
        bufs, key = ws.bind_inputs(p, backward)
        self.bound = (bufs, key, tuple(v[0] for v in bufs.values() if v[0] is not None))  # and the buffers to mark busy
        self.ids = None
        self.outs = outs
        if outs is not None:   # (``seq``, ``copy``, ``outputs``: a prepared call's alone)
            self.outputs = tuple(a for a in outs.values() if a.buffer is not None)
            self.seq, self.copy = calls.record_own(ws, p, backward, dict(bufs), outs, update)

    def problem(self, arrays: tuple, ids):
        """validate.problem of a plain call of this replay (its float arguments ``arrays``): its
        ids checked (or known from its last call: the same bytes), the host memory rule; None:
        the full path (which raises what is wrong)."""
        p = self.problem_of(self.dims, arrays, ids, self.ids, self.template)
        if p is not None and type(ids) is np.ndarray:
            known = self.ids
            if known is None or known[1] is not p.ids:
                self.ids = (p.ids.tobytes(), p.ids)   # one tuple: a reader sees the old or the new
        return p

    def run(self, p, inputs: tuple) -> dict:
        """The call on Problem ``p`` (its arrays those bound; ``inputs``: the DeviceArrays to
        check live, None entries skipped) -> its outputs: a plain call's fresh DeviceArrays, or a
        prepared call's own. Runs are serialised by the workspace's lock. A plain call whose
        workspace was closed meanwhile (evicted by another thread) runs as the general path does,
        out of device memory once too; a prepared call's closed workspace is a closed call."""
        ctx = self.ctx
        token = ctx.enter()  # the context outlives this call, whatever another thread does to it (DeviceLost if lost)
        try:
            ws, own = self.ws, self.outs
            ws.recent = True
            with ws.lock:
                evicted = ws.closed
                if evicted and own is not None:
                    raise RuntimeError(f"this prepared {self.op} is closed")
                if not evicted:
                    if ctx.pending:  # (Workspace.settle's own first test: the per-call case skips the call)
                        ws.settle()
                    bufs, key, held = self.bound
                    buffers = ws.pool if not ws.pool.closed else pool(ctx)
                    # The inputs' buffers are busy until this call's work is done: released meanwhile
                    # (by another thread), they go back to the pool only then. Liveness is checked
                    # after marking.
                    busy = buffers.busy(held) if held else None
                    try:
                        check_live(inputs)
                        if own is None:   # fresh outputs, their sequence looked up (recorded on first use)
                            out = self.run_plain(self.engine, ws, p, self.backward, True, dict(bufs), list(key),
                                                 self.update)
                        else:             # the call's own outputs and its one sequence
                            try:
                                check_live(self.outputs)
                            except RuntimeError:
                                raise RuntimeError(f"an output of this prepared {self.op} was released (its "
                                                   "result's arrays belong to it): close it and prepare the call "
                                                   "again") from None
                            seq = self.seq
                            if self.engine.kept:   # (written again: a forward that read one keeps no tables)
                                for a in self.outputs:
                                    self.engine.written(a)
                            seq.submit()
                            run.set_last_sequence(seq)   # (run.last_gpu_ns reads it)
                            if ws.flags_nonfinite and ws.nonfinite():
                                self._recompute(p)   # (under the lock: a run is one whole)
                            elif self.copy:
                                self.calls.copy_states(ws, own, p)
                            if self.update:
                                self.calls.written(self.engine, p)
                            out = own
                    finally:
                        if busy is not None:
                            buffers.idle(busy)
            if evicted:
                return self.calls.run_once(self.engine, p, self.backward, self.planned, True, update=self.update)
            if out is None:  # a flagged result held inf or nan: computed again (as in run.run_once)
                self.planned.plan(rerun=True)   # (raises RecomputeOnHost where that is the host's)
                run.note_rerun(self.engine, self.dims)
                return self.calls.run_once(self.engine, p, self.backward, self.planned, True, rerun=True,
                                           update=self.update)
            return out
        except rt.OutOfDeviceMemory:
            if own is not None:
                raise
            return self.calls.retry(self.engine, p, self.backward, self.planned, True, self.update)
        finally:
            ctx.leave(token)

    @property
    def op(self) -> str:
        op = self.calls.op
        return op.backward_name if self.backward else op.name

    def _recompute(self, p) -> None:
        """A prepared call's result its kernels flagged inf or nan: the call again on the
        token-sequential kernels (whose non-finite results are the spec's), copied into its outputs."""
        run.note_rerun(self.engine, self.dims)
        out = self.calls.run_once(self.engine, p, self.backward, self.planned, True, rerun=True, update=self.update)
        try:
            with rt.oneshot(self.ctx) as seq:
                for k, dst in self.outs.items():
                    src = out[k]
                    if dst.buffer is not None and not (self.update and k == "states"):
                        seq.copy(src.buffer, dst.buffer, dst.nbytes, src.offset * 4, dst.offset * 4)
        finally:
            release_all(out)
