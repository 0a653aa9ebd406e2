"""Prepared calls (``prepare_scan`` / ``prepare_scan_back``): a device-resident ssm_scan or
ssm_scan_back checked, planned and bound once, then run again and again -- what an inference
engine's decode step or a training loop's fixed-shape step needs, without the per-call Python of
the general path (its validation, look-ups and result objects: more than a decode step's GPU time,
docs/API.md, "Prepared calls").

A :class:`PreparedCall` holds a replay.Replay of its own: a private workspace (never evicted by
other shapes), its output arrays (each run overwrites them: the result object is the same every
run) and so one recorded sequence. The inputs are read as they are at each run -- change them on
the device (``DeviceArray.write``, or any other kernel writing their buffers) between runs; ids,
shapes, the step's form and the planner's settings are fixed when it is prepared.
"""

from __future__ import annotations

import dataclasses

import ssm_ref
from ssm_ref import ScanGrads, ScanResult, check_snapshots, check_update_cache
from ssm_ref.checks import MISSING
from ssm_ref.ops import SCAN
from ssm_ref.precision import check_precision

from . import config
from . import runtime as rt
from .arrays import DeviceArray, upload_to
from .replay import SCAN_CALLS, OpCalls, Replay
from .support import NAME, decision, form_code
from .validate import check_backward, check_forward, frozen_result
from .workspace import BWD_IN, FWD_IN, Workspace, release_all

__all__ = ["PreparedCall", "prepare_scan", "prepare_scan_back"]


def prepare_scan(s, x, dt, A, B, C=MISSING, ids=None, *, dt_softplus="ggml", update_cache=False,
                 snapshots=1, invariant=False, precision="highest") -> PreparedCall:
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
    invariant mode's plan, never a default call's. ``precision`` as ssm_scan (checked now; every
    run computes at "highest").
    """
    check_precision(precision)
    sp = form_code(dt_softplus)
    K = check_snapshots(snapshots)
    knobs = config.invariant_mode(config.settings(), invariant)
    if type(update_cache) is not bool:
        raise TypeError(f"update_cache: expected True or False, got {update_cache!r}")
    p = check_forward(s, x, dt, A, B, C, ids, K)
    defaults = ("s",) if s is None else ()
    _check_resident("prepare_scan", p, tuple(k for k in SCAN.float_inputs if k not in defaults))
    if update_cache:
        check_update_cache(True, s, p.ids, device_arrays=True)
    p, zeros = _zeros_on_device(p, defaults)
    return PreparedCall(False, p, sp, update_cache, zeros, knobs)


def prepare_scan_back(s, x, dt, A, B, C=MISSING, ids=None, g_y=None, g_states=None, *, dt_softplus="ggml",
                      g_snapshots=None, invariant=False, precision="highest") -> PreparedCall:
    """ssm_scan_back's call, prepared: ``run()`` returns the ScanGrads of the inputs as they are
    then. Inputs and errors as :func:`prepare_scan`; ``s``, ``g_y`` and ``g_states`` may be None
    as in ssm_scan_back (zeros, kept on the device by the prepared call; ``g_states`` None beside
    a 1-D ``g_y``: the packed g_y, whose length gives K); ``g_snapshots`` (K,S,H,P,N) a DeviceArray
    or None, as in ssm_scan_back; ``invariant`` and ``precision`` as :func:`prepare_scan`."""
    check_precision(precision)
    sp = form_code(dt_softplus)
    knobs = config.invariant_mode(config.settings(), invariant)
    p = check_backward(s, x, dt, A, B, C, ids, g_y, g_states, g_snapshots)
    packed = g_y is not None and g_states is None and len(getattr(g_y, "shape", ())) == 1
    defaults = tuple(k for k, v in (("s", s), ("g_y", g_y), ("g_states", g_states))
                     if v is None and not (packed and k == "g_states"))
    if packed and p.g_snapshots is not None:   # a packed g_y of K > 1 slots: g_states the validator's zeros
        defaults += ("g_states",)
    _check_resident("prepare_scan_back", p, tuple(k for k in (*SCAN.float_inputs, *SCAN.cotangent_names)
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


class PreparedCall:
    """A prepared ssm_scan (``op == "ssm_scan"``) or ssm_scan_back -- or, made by
    ssm_vk.mamba3_prepared, mamba3_scan or mamba3_scan_back: :meth:`run`, :meth:`close`, a
    ``with`` block. Attributes: ``op``, ``where`` (the device), ``dims``, ``closed``.

    ``run()`` returns the same result object every time, its arrays overwritten by each run (copy
    what must outlive the next run: ``.numpy()``); ``close()`` releases them and the call's
    buffers. Runs of one prepared call are serialised by its lock; prepared calls of other
    shapes, and ordinary calls, may run from other threads meanwhile.
    """

    def __init__(self, backward: bool, p, softplus: int, update: bool, zeros: tuple = (), knobs=None):
        """The scan's prepared call of the checked problem ``p`` (``zeros``: the DeviceArrays it
        made for inputs given as None, its own)."""
        op = "ssm_scan_back" if backward else "ssm_scan"
        knobs = config.settings() if knobs is None else knobs
        dec = decision(op, p, knobs, softplus)
        names = BWD_IN if backward else FWD_IN
        inputs = tuple(a for a in (*(getattr(p, k) for k in names), p.g_snapshots if backward else None)
                       if a is not None)
        self._setup(op, dec, p, backward, update, zeros, inputs, SCAN_CALLS)
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

    def _setup(self, op: str, dec, p, backward: bool, update: bool, zeros: tuple, inputs: tuple,
               calls: OpCalls) -> None:
        """What every op's prepared call holds: the decision ``dec`` (support.Decided's fields:
        ``sup``, ``engine``, ``info``, ``planned``) taken, its own workspace, outputs and recorded
        sequence (a replay.Replay of ``calls``), the DeviceArrays ``inputs`` each run checks live.
        Raises ValueError (the device cannot run it: the reason), releasing ``zeros``."""
        self._zeros = zeros   # the zeros of inputs given as None: this call's own
        if not dec.sup:
            for a in zeros:
                a.release()
            raise ValueError(f"prepare: the Vulkan device cannot run this {op} ({dec.sup.reason}); "
                             f"ssm_vk.{op} computes it on the CPU")
        self.op, self.dims, self.where = op, p.dims, dec.info.where
        self._p = p
        self._calls = calls
        ctx = self._ctx = dec.engine.ctx
        self._inputs = inputs
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

    def _build(self, dec, backward: bool, update: bool) -> Replay:
        """The call's own workspace, its outputs and its recorded sequence (all or nothing)."""
        ws = self._workspace(dec.planned)
        outs = {}
        try:
            outs = self._outputs(ws, backward, update)
            return Replay(dec.engine, dec.info, dec.planned, self._p, ws, backward, update, outs, self._calls)
        except BaseException:
            release_all(outs)
            with ws.lock:
                ws.close()
            raise

    def _workspace(self, planned):
        """A workspace of its own for ``planned`` (an op's prepared call: its class's)."""
        return Workspace(self._ctx, planned)

    def _outputs(self, ws, backward: bool, update: bool) -> dict:
        """Its own outputs, by name."""
        return ws.outputs(True)

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

