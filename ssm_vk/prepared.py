"""Prepared calls: a device-resident ssm_scan or ssm_scan_back checked, planned and bound once,
then replayed -- the one mechanism for calls that repeat. Two hold one:

- :class:`PreparedCall` (``prepare_scan`` / ``prepare_scan_back``): what an inference engine's
  decode step or a training loop's fixed-shape step needs, without the per-call Python of the
  general path (its validation, look-ups and result objects: more than a decode step's GPU time,
  docs/API.md, "Prepared calls"). It owns a private workspace (never evicted by other shapes), its output
  arrays (each run overwrites them: the result object is the same every run) and so one recorded
  sequence. The inputs are read as they are at each run -- change them on the device
  (``DeviceArray.write``, or any other kernel writing their buffers) between runs; ids, shapes,
  the step's form and the planner's settings are fixed when it is prepared.
- a plain call that repeats one that ran on the device (replay_cache.py keeps its :class:`Replay` by
  the call's signature): the workspace is the engine's, the outputs fresh from the pool each call
  (their sequence looked up by them and the ids, as the general path does: run.run_bound), the
  ids checked each call, the result a new object each call.

Either way a run (:meth:`Replay.run`) takes the workspace's lock (a prepared call's runs, and a
shape's plain calls, one at a time), marks its inputs' buffers busy (another thread's release
waits for the run), checks that its inputs (and a prepared call's outputs) are live, submits and
waits; a result its kernels flag as non-finite is computed again token by token (as every
call is) -- into a prepared call's own outputs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

import ssm_ref
from ssm_ref import ScanGrads, ScanResult, check_snapshots, check_update_cache
from ssm_ref.checks import MISSING

from . import config, run, validate
from . import runtime as rt
from .arrays import DeviceArray, check_live, pool, upload_to
from .support import NAME, decision, form_code
from .validate import check_backward, check_forward, frozen_result
from .workspace import BWD_IN, FWD_IN, Workspace, release_all

__all__ = ["PreparedCall", "Replay", "prepare_scan", "prepare_scan_back"]


def prepare_scan(s, x, dt, A, B, C=MISSING, ids=None, *, dt_softplus="ggml", update_cache=False,
                 snapshots=1, invariant=False) -> PreparedCall:
    """ssm_scan's call, prepared: ``run()`` returns the ScanResult of the inputs as they are then.

    Every float input must be a float32 DeviceArray of the open context (``ssm_vk.to_device``),
    or ``s=None``: zero start states (ids None), kept on the device by the prepared call.
    ``dt_softplus`` as ssm_scan takes it (mamba_ssm's booleans included). ``update_cache=True``:
    each run writes the new states into the cache rows s[ids] (``states``
    None), as ssm_scan(update_cache=True) does. ``snapshots=K`` as ssm_scan takes it (the
    result's ``snapshots``: the K slots, overwritten by each run; K = 1 a view of ``states``).
    Raises as ssm_scan for bad input; TypeError
    naming an input that is not a DeviceArray; ValueError when the device cannot run the call
    (the reason; ssm_vk.ssm_scan would compute it on the CPU). ``invariant`` as ssm_scan: the
    invariant mode's plan, never a default call's.
    """
    sp = form_code(dt_softplus)
    K = check_snapshots(snapshots)
    knobs = config.invariant_mode(config.settings(), invariant)
    if type(update_cache) is not bool:
        raise TypeError(f"update_cache: expected True or False, got {update_cache!r}")
    p = check_forward(s, x, dt, A, B, C, ids, K)
    defaults = ("s",) if s is None else ()
    _check_resident("prepare_scan", p, tuple(k for k in ("s", "x", "dt", "A", "B", "C") if k not in defaults))
    if update_cache:
        check_update_cache(True, s, p.ids, device_arrays=True)
    p, zeros = _zeros_on_device(p, defaults)
    return PreparedCall(False, p, sp, update_cache, zeros, knobs)


def prepare_scan_back(s, x, dt, A, B, C=MISSING, ids=None, g_y=None, g_states=None, *, dt_softplus="ggml",
                      g_snapshots=None, invariant=False) -> PreparedCall:
    """ssm_scan_back's call, prepared: ``run()`` returns the ScanGrads of the inputs as they are
    then. Inputs and errors as :func:`prepare_scan`; ``s``, ``g_y`` and ``g_states`` may be None
    as in ssm_scan_back (zeros, kept on the device by the prepared call; ``g_states`` None beside
    a 1-D ``g_y``: the packed g_y, whose length gives K); ``g_snapshots`` (K,S,H,P,N) a DeviceArray
    or None, as in ssm_scan_back; ``invariant`` as :func:`prepare_scan`."""
    sp = form_code(dt_softplus)
    knobs = config.invariant_mode(config.settings(), invariant)
    p = check_backward(s, x, dt, A, B, C, ids, g_y, g_states, g_snapshots)
    packed = g_y is not None and g_states is None and len(getattr(g_y, "shape", ())) == 1
    defaults = tuple(k for k, v in (("s", s), ("g_y", g_y), ("g_states", g_states))
                     if v is None and not (packed and k == "g_states"))
    if packed and p.g_snapshots is not None:   # a packed g_y of K > 1 slots: g_states the validator's zeros
        defaults += ("g_states",)
    _check_resident("prepare_scan_back", p, tuple(k for k in ("s", "x", "dt", "A", "B", "C", "g_y", "g_states")
                                                  if k not in defaults)
                    + (("g_snapshots",) if g_snapshots is not None else ()))
    p, zeros = _zeros_on_device(p, defaults)
    return PreparedCall(True, p, sp, False, zeros, knobs)


def _zeros_on_device(p, names: tuple):
    """The problem with the validator's zeros for the inputs ``names`` (given as None) uploaded to
    the open context, and those DeviceArrays (the prepared call owns them)."""
    if not names:
        return p, ()
    ctx = p.x.ctx
    zeros = {k: upload_to(ctx, getattr(p, k)) for k in names}
    return dataclasses.replace(p, **zeros), tuple(zeros.values())


def _check_resident(fn: str, p, names: tuple) -> None:
    ctx = rt.current_context()
    for k in names:
        a = getattr(p, k)
        if a is None and k == "g_states":
            continue
        if not isinstance(a, DeviceArray):
            raise TypeError(f"{fn}: {k} must be a DeviceArray (ssm_vk.to_device): a prepared call reads its "
                            f"inputs' device memory at each run; got {type(a).__name__}")
        if a.ctx is not ctx:
            raise ValueError(f"{fn}: {k} belongs to another Vulkan context than the open one")


class Replay:
    """A device-resident call decided and bound once, replayed by :meth:`run` (see the module's
    docstring): the decision's ``engine`` (and so ``ctx``) and the context's ``info`` then (its
    ``where``), the Problem's ``dims``, the decision's plans ``planned`` (family.Planned:
    limits, knobs, the step's form), the workspace ``ws``, ``bound`` (Workspace.bind_inputs of the
    inputs, and their buffers to mark busy), ``backward`` and ``update`` (a forward with
    update_cache). ``outs``: a prepared call's own outputs, ``seq`` the sequence recorded for them
    (and ``copy`` whether the new states are copied into the cache rows after it); None: a plain
    call's. ``ids``: (bytes, checked copy) of the last ids a plain call of it passed."""

    __slots__ = ("backward", "bound", "copy", "ctx", "dims", "engine", "ids", "info", "outputs", "outs",
                 "planned", "seq", "update", "where", "ws")

    def __init__(self, engine, info, planned, p, ws: Workspace, backward: bool, update: bool = False,
                 outs: dict | None = None):
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
        bufs, key = ws.bind_inputs(p, backward)
        self.bound = (bufs, key, tuple(b for b, _ in bufs.values() if b is not None))  # and the buffers to mark busy
        self.ids = None
        self.outs = outs
        if outs is not None:   # (``seq``, ``copy``, ``outputs``: a prepared call's alone)
            bufs = dict(bufs)
            for k, a in outs.items():
                bufs[k] = (a.buffer, a.offset)
            scatter = update and ws.family.scatters(ws, p, bufs["s"])
            self.copy = update and not scatter
            self.outputs = tuple(a for a in outs.values() if a.buffer is not None)
            self.seq = run.recorded_sequence(ws, p, backward, bufs, ("prepared",), scatter)

    def problem(self, arrays: tuple, ids):
        """validate.problem of a plain call of this replay (its float arguments ``arrays``): its
        ids checked (or known from its last call: the same bytes), the host memory rule; None:
        the full path (which raises what is wrong)."""
        p = validate.problem(self.dims, arrays, ids, known_ids=self.ids)
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
                            out = run.run_bound(self.engine, ws, p, self.backward, True, dict(bufs), list(key),
                                                self.update)
                        else:             # the call's own outputs and its one sequence
                            try:
                                check_live(self.outputs)
                            except RuntimeError:
                                raise RuntimeError(f"an output of this prepared {self.op} was released (its "
                                                   "result's arrays belong to it): close it and prepare the call "
                                                   "again") from None
                            seq = self.seq
                            seq.submit()
                            run.set_last_sequence(seq)   # (run.last_gpu_ns reads it)
                            if ws.flags_nonfinite and ws.nonfinite():
                                self._recompute(p)   # (under the lock: a run is one whole)
                            elif self.copy:
                                run.copy_rows(ctx, own["states"], p.s, p.ids)
                            if self.update:
                                self.engine.written(p.s)
                            out = own
                    finally:
                        if busy is not None:
                            buffers.idle(busy)
            if evicted:
                return run.run_once(self.engine, p, self.backward, self.planned, True, update=self.update)
            if out is None:  # a flagged result held inf or nan: computed again (as in run.run_once)
                run.note_rerun(self.engine, self.dims)
                return run.run_once(self.engine, p, self.backward, self.planned, True, rerun=True,
                                    update=self.update)
            return out
        except rt.OutOfDeviceMemory:
            if own is not None:
                raise
            return run.retry(self.engine, p, self.backward, self.planned, True, self.update)
        finally:
            ctx.leave(token)

    @property
    def op(self) -> str:
        return "ssm_scan_back" if self.backward else "ssm_scan"

    def _recompute(self, p) -> None:
        """A prepared call's result its kernels flagged inf or nan: the call again on the
        token-sequential kernels (whose non-finite results are the spec's), copied into its outputs."""
        run.note_rerun(self.engine, self.dims)
        out = run.run_once(self.engine, p, self.backward, self.planned, True, rerun=True, update=self.update)
        try:
            with rt.oneshot(self.ctx) as seq:
                for k, dst in self.outs.items():
                    src = out[k]
                    if dst.buffer is not None and not (self.update and k == "states"):
                        seq.copy(src.buffer, dst.buffer, dst.nbytes, src.offset * 4, dst.offset * 4)
        finally:
            release_all(out)


class PreparedCall:
    """A prepared ssm_scan (``op == "ssm_scan"``) or ssm_scan_back: :meth:`run`, :meth:`close`,
    a ``with`` block. Attributes: ``op``, ``where`` (the device), ``dims``, ``closed``.

    ``run()`` returns the same result object every time, its arrays overwritten by each run (copy
    what must outlive the next run: ``.numpy()``); ``close()`` releases them and the call's
    buffers. Runs of one prepared call are serialised by its lock; prepared calls of other
    shapes, and ordinary calls, may run from other threads meanwhile.
    """

    def __init__(self, backward: bool, p, softplus: int, update: bool, zeros: tuple = (), knobs=None):
        op = "ssm_scan_back" if backward else "ssm_scan"
        knobs = config.settings() if knobs is None else knobs
        self._zeros = zeros   # the zeros of inputs given as None: this call's own
        dec = decision(op, p, knobs, softplus)
        if not dec.sup:
            for a in zeros:
                a.release()
            raise ValueError(f"prepare: the Vulkan device cannot run this {op} ({dec.sup.reason}); "
                             f"ssm_vk.{op} computes it on the CPU")
        self.op, self.dims, self.where = op, p.dims, dec.info.where
        self._p = p
        ctx = self._ctx = dec.engine.ctx
        names = BWD_IN if backward else FWD_IN
        self._inputs = tuple(a for a in (*(getattr(p, k) for k in names), p.g_snapshots if backward else None)
                             if a is not None)
        token = ctx.enter()
        try:
            try:
                self._replay = self._build(dec, backward, update)
            except rt.OutOfDeviceMemory:
                # As an ordinary call does: the other shapes' workspaces give their buffers back
                # (the pool frees its idle ones when it next runs out), then once more.
                dec.engine.clear()
                self._replay = self._build(dec, backward, update)
        finally:
            ctx.leave(token)
        outs = self._replay.outs
        if backward:
            fields = {k: outs[k] for k in ssm_ref.GRAD_NAMES}
            self._result = frozen_result(ScanGrads, {**fields, "where": self.where, "backend": NAME})
        else:
            states = outs["states"]
            if self.dims.K > 1:
                snaps = outs["snapshots"]
            else:
                snaps = None if update else states._int_view((1, *states.shape), states.offset)
            self._result = frozen_result(ScanResult, {"y": outs["y"], "states": None if update else states,
                                                      "where": self.where, "backend": NAME, "snapshots": snaps})

    def _build(self, dec, backward: bool, update: bool) -> Replay:
        """The call's own workspace, its outputs and its recorded sequence (all or nothing)."""
        ws = Workspace(self._ctx, dec.planned)
        outs = {}
        try:
            outs = ws.outputs(True)
            return Replay(dec.engine, dec.info, dec.planned, self._p, ws, backward, update, outs)
        except BaseException:
            release_all(outs)
            with ws.lock:
                ws.close()
            raise

    @property
    def closed(self) -> bool:
        return self._replay.ws.closed

    def run(self):
        """Run the recorded call on the inputs as they are now; returns the result (ScanResult or
        ScanGrads), the same object every run. Raises RuntimeError (closed; an input or output
        released), DeviceLost, VulkanTimeout."""
        self._replay.run(self._p, self._inputs)
        return self._result

    def close(self) -> None:
        """Release the outputs and the recorded work (waits for a run in progress). Idempotent."""
        ws = self._replay.ws
        with ws.lock:   # (its runs' lock)
            if ws.closed:
                return
            if not self._ctx.closed:
                release_all(self._replay.outs)
            ws.close()
            if not self._ctx.closed:
                for a in self._zeros:
                    a.release()

    def __enter__(self) -> PreparedCall:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.where
        return f"<prepared {self.op} {self.dims} {state}>"

