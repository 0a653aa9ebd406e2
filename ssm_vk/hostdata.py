"""The host arrays of a workspace's calls: :class:`HostData`, the buffers and staging slots a
Workspace keeps for host inputs and host results, and how a call's host data moves.

Host data moves with the call, never one array at a time. Where the device's memory is mapped
(lavapipe, integrated GPUs: the memory type runtime/memory.py picks there) host inputs are written
straight into their buffers and results read straight out of theirs: no submission, nothing
waits. Elsewhere (a discrete GPU; the ``force_staging`` seam) the host inputs are copied into the
workspace's staging slots (runtime.Stage) and the call's recorded sequence itself begins with the
copies into the upload buffers and ends with the copies of the results into their slots: one
submission per call. The slots are pinned host memory the size of the workspace's host data, kept
with it; all workspaces' together stay within the context's budget for them (a sixteenth of the
host memory heap, runtime.transfer.StageBudget). A workspace beyond it moves its arrays one at a
time through the context's staging buffer (runtime.upload): a submission and a wait per array
and per 64 MiB.

A backward given the host arrays its forward just staged binds the forward workspace's upload
buffers instead of staging them again (:meth:`HostData.holding`). The rule: a buffer is bound
when it holds exactly the bytes of the array as the call would upload them (float32, C order),
compared in full (memcmp) with the forward's staging slot, which keeps those bytes until that
workspace's next call. So an array written in place between the calls, even one element, is
staged again, and a stale result cannot come out; the object's identity plays no part (PyTorch's
bridge hands new numpy views of the same tensors to each call). The compare costs what copying
the bytes into the slot would (memcmp and memcpy run at the same speed on the host) and saves the
device copy. Mapped memory is written again instead: there a write costs what the compare would,
and reading device memory through a mapping may be uncached.

Zeros the call stands in for an absent input (``s=None``; ``g_y``, ``g_states`` None: the
validator's zero-stride stand-ins, ssm_ref.checks.zero_stand_in) are never uploaded: the call's
sequence fills the input's upload buffer with zeros (vkCmdFillBuffer) before the work, beside
the staged copies and behind the same barrier -- on mapped memory too, where the host would
otherwise write every byte through the mapping (uncached write-combined memory on an integrated
GPU) and the device writes its own memory at its own speed. The key of the sequence says which
inputs it fills and which it copies (:meth:`HostData.staged_key`), so a call with a real array
for an input that a former call filled records the copy, and the reverse. A filled buffer holds
no slot's bytes: it is never bound by a backward (``held`` forgets it). A user's array that
holds zeros (np.zeros) is an array like any other, uploaded.

Arrays of tokens beyond one allocation (``cuts``: where the decision cut them, budget.pieces) get
upload and output buffers in pieces (runtime.Pieces), written and read piece by piece, never
staged (the slots are one buffer); a DeviceArray in pieces cut otherwise is copied into them by
the call's own sequence (:meth:`HostData.rebind_pieces`, at the recording).
"""

from __future__ import annotations

import math

import numpy as np

from . import runtime as rt
from .sizing import F32, input_shapes, token_arrays, window_ranges

__all__ = ["HostData"]


class HostData:
    """A workspace's buffers and staging of host data: the upload buffers of host inputs
    (``uploads``: name -> Buffer), the output buffers of host calls (``out``: name -> Buffer) and
    the DeviceArrays over them (``views``), the staging slots (``stage``, an rt.Stage made on
    first use, and ``stage_bytes``, their sizes), what the call's sequence moves in (``staged``:
    (name, upload Buffer, nbytes, zeros) each, ``zeros`` True where it fills the buffer with
    zeros, False where it copies from the input's slot; ``staged_out``: (name, output Buffer, nbytes) each; both
    empty outside a call, which run.py ends with :meth:`unstage`), which upload buffers hold
    their slot's bytes since a finished call (``held``: name -> (Buffer, nbytes)) and whether a
    call that bound them failed and may still run (``lent``); the forward workspace whose upload
    buffers the call being run may bind (``donor``, its lock held; None outside a call); and
    ``pair``, the hash of the workspace's ``kept_key``, by which a backward finds the forward of
    its shape (engine.lend_uploads) without hashing the key's dataclasses each call (a wrong
    pair could only bind buffers that hold exactly the bytes asked for: still right).

    One attribute of the Workspace, on purpose: an instance of 30 attributes or more loses
    CPython 3.11's shared-key dict, and each attribute load of the device-resident path's Python
    with it (+0.8k instructions per call, benchmarks/vk_call_instructions.py). Used under the
    workspace's lock."""

    __slots__ = ("cuts", "donor", "held", "lent", "out", "pair", "stage", "stage_bytes", "staged", "staged_out",
                 "uploads", "views")

    def __init__(self, pair: int, cuts: dict | None = None):
        self.pair = pair
        self.cuts = cuts or {}   # name -> byte offsets of its pieces (budget.pieces): the arrays held in pieces
        self.uploads: dict = {}
        self.out: dict = {}
        self.views: dict | None = None
        self.stage = None
        self.stage_bytes = None
        self.staged: tuple = ()
        self.staged_out: tuple | list = ()
        self.held: dict = {}
        self.lent = False
        self.donor = None

    # -- inputs -------------------------------------------------------------------------------
    def write(self, ws, name: str, a: np.ndarray) -> tuple:
        """(buffer, 0) of host input ``name`` (``a``: float32, C order, not empty) of workspace
        ``ws``: the donor's upload buffer that holds exactly these bytes, else ``ws``'s own,
        written straight through its mapping or staged into its slot."""
        donor = self.donor
        if donor is not None:
            buf = donor.host.holding(name, a)
            if buf is not None:
                return buf, 0
        buf = self.uploads.get(name)
        if buf is None or buf.size < a.nbytes:
            buf = self.uploads[name] = ws.acquire(a.nbytes, name)
        if self.held:
            self.held.pop(name, None)   # written now: its slot no longer tells what it holds
        if not buf.mappable or ws.ctx.seams.force_staging:   # (not rt.direct(buf), inlined: each input)
            stage = self.slots(ws)
            if stage is not None and stage.fits(name, a.nbytes):
                stage.put(name, a)
                self.staged += ((name, buf, a.nbytes, False),)
                return buf, 0
        rt.upload(buf, a)
        return buf, 0

    def rebind_pieces(self, seq, ws, bufs: dict) -> list:
        """At the recording of a call of ``ws`` (``bufs``: name -> (buffer, element offset), as
        bound): each array in pieces (an rt.Pieces: a DeviceArray made in pieces, or a view of one)
        whose pieces do not hold each window of the plan whole is bound to ``ws``'s own buffer for
        its name instead (cut at the windows where it is beyond one allocation: budget.pieces
        counted it): an input copied into it now, before the work; an output (out=) copied out
        of it after the work -- those copies returned, (own, the caller's Pieces, bytes, byte
        offset) each, for the caller to record. The key of the sequence names the arrays' buffers
        and offsets, so the same key records the same copies."""
        after = []
        d, backward = ws.dims, ws.backward
        tokens = token_arrays(d, backward)
        sizes = {k: math.prod(v) * F32 for k, v in input_shapes(d, backward).items()}
        sizes.update({k: n * F32 for k, n in ws.sizes.items()})
        for name, (buf, off) in list(bufs.items()):
            if type(buf) is not rt.Pieces or name not in sizes:
                continue
            offset, nbytes = off * F32, sizes[name]
            ranges = window_ranges(d, ws.plan, backward, name) if name in tokens else []
            if ranges and all(_one_piece(buf, offset + a, b - a) for a, b in ranges):
                continue   # bound in place: every window in one piece
            if name in ws.sizes:   # an out= array
                own = self.out.get(name)
                if own is None:
                    own = self.out[name] = ws.acquire(nbytes, name)
                    self.views = None   # (the host results' views are made again over it)
                after.append((own, buf, nbytes, offset))
            else:
                own = self.uploads.get(name)
                if own is None or own.size < nbytes:
                    own = self.uploads[name] = ws.acquire(nbytes, name)
                self.held.pop(name, None)
                seq.copy(buf, own, nbytes, offset, 0)
                seq.barrier()
                if name == "s":   # the cache, which a forward with update_cache may write in place: back after
                    after.append((own, buf, nbytes, offset))
            bufs[name] = (own, 0)
        return after

    def zeros(self, ws, name: str, nbytes: int) -> tuple:
        """(buffer, 0) of host input ``name`` given as zeros of ``nbytes`` (a zero-stride
        stand-in): ``ws``'s own upload buffer, which the call's sequence fills with zeros."""
        buf = self.uploads.get(name)
        if buf is None or buf.size < nbytes:
            buf = self.uploads[name] = ws.acquire(nbytes, name)
        if self.held:
            self.held.pop(name, None)   # it will hold zeros, not its slot's bytes: never bound by a backward
        self.staged += ((name, buf, nbytes, True),)
        return buf, 0

    def staged_key(self) -> tuple:
        """The part of the sequence's key that says which host inputs the call staged (its
        recording copies them in) and which it fills with zeros ((name, 0)), () when none."""
        staged = self.staged
        if not staged:
            return ()
        stage = self.stage
        return ("staged", None if stage is None else stage.buffer.serial,
                *((n, 0) if z else n for n, _, _, z in staged))

    def holding(self, name: str, a: np.ndarray):
        """The upload buffer of ``name`` when it holds exactly the bytes of ``a`` (float32, C
        order), else None. Compared in full with the staging slot the buffer was filled from."""
        held = self.held.get(name)
        if held is None or held[1] != a.nbytes or held[0].closed or not self.stage.holds(name, a):
            return None
        return held[0]

    def slots(self, ws):
        """``ws``'s staging slots (rt.Stage: every input and output of the shape), made on first
        use; None when they do not fit what is left of the context's budget for them
        (runtime.transfer.StageBudget)."""
        stage = self.stage
        if stage is not None and not stage.closed:
            return stage
        if self.stage_bytes is None:
            sizes = {k: math.prod(v) * F32 for k, v in input_shapes(ws.dims, ws.backward).items()}
            sizes.update({"out:" + k: n * F32 for k, n in ws.sizes.items()})
            self.stage_bytes = {k: n for k, n in sizes.items() if n}
        if self.cuts:   # arrays in pieces: more than one allocation, so more than the slots' one buffer
            return None
        self.stage = rt.Stage.within_budget(ws.ctx, self.stage_bytes)
        return self.stage

    # -- outputs ------------------------------------------------------------------------------
    def stage_outputs(self, ws) -> tuple:
        """For a call of ``ws`` with host outputs: which outputs its sequence copies into the
        staging slots (all, where their buffers are not mapped), as the part its key ends with."""
        outs = ws.outputs(False)
        # the buffers are all of one memory type (the pool's): mapped, or staged every one
        first = next((a.buffer for a in outs.values() if a.buffer is not None), None)
        stage = None if first is None or rt.direct(first) else self.slots(ws)
        if stage is None:
            return ()
        staged = self.staged_out = [(k, a.buffer, a.nbytes) for k, a in outs.items() if a.buffer is not None]
        return ("out", stage.buffer.serial, *(k for k, _, _ in staged))

    def results(self, outs: dict) -> dict:
        """The host results of a finished call: new numpy arrays, read from the staging slots
        (outputs the sequence copied there) or the buffers' mapping."""
        if not self.staged_out:
            return {k: a.numpy() for k, a in outs.items()}
        stage = self.stage
        return {k: stage.take("out:" + k, a.shape) if a.buffer is not None else a.numpy() for k, a in outs.items()}

    # -- the recording, the call's end, the workspace's ---------------------------------------
    def copy_in(self, seq) -> None:
        """Record the copies of the staged inputs into their upload buffers and the fills of the
        zeros (before the work)."""
        for name, buf, nbytes, zeros in self.staged:
            if zeros:
                seq.fill(buf, 0, 0, nbytes)
            else:
                self.stage.copy_in(seq, name, buf, nbytes)
        if self.staged:
            seq.barrier()

    def copy_out(self, seq) -> None:
        """Record the copies of the staged outputs into their slots (after the work)."""
        if self.staged_out:
            seq.barrier()
            for name, buf, nbytes in self.staged_out:
                self.stage.copy_out(seq, "out:" + name, buf, nbytes)

    def staged_done(self) -> None:
        """The call's submission ran: each upload buffer staged now holds its slot's bytes."""
        for name, buf, nbytes, zeros in self.staged:
            if not zeros:
                self.held[name] = (buf, nbytes)

    def unstage(self) -> None:
        """End the call's staging (what the next recording copies is the next call's)."""
        self.staged = self.staged_out = ()
        self.donor = None

    def close(self, live: bool) -> None:
        """The workspace closes: the slots are freed (``live``: the context is neither closed nor
        lost; else its own close frees them, after its wait)."""
        if self.stage is not None and live:
            self.stage.close()
        self.stage = None
        self.held.clear()


def _one_piece(src, offset: int, nbytes: int) -> bool:
    """Whether bytes [offset, offset + nbytes) of ``src`` (an rt.Pieces) lie in one piece."""
    try:
        src.at(offset, nbytes)
    except ValueError:
        return False
    return True
