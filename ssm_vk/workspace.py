"""The Workspace of one problem shape on one context: its plan (and family), scratch and upload buffers,
output buffers (pooled DeviceArrays, or its own for host calls), the staging slots of host data
and the command sequences recorded for sets of buffers -- nothing else. The context's Engine keeps
workspaces in a bounded cache and ssm_vk.run runs calls in them.

Host data moves with the call, in its one submission: hostdata.py.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from ssm_ref.checks import zero_stand_in
from ssm_ref.ops import SCAN

from . import config
from . import runtime as rt
from .arrays import DeviceArray, pieces, pool
from .hostdata import HostData
from .sizing import F32, output_shapes, piece_sizes

if TYPE_CHECKING:
    from .family import Planned

__all__ = ["FlagHost", "Workspace", "MAX_SEQUENCES", "MAX_ATTRIBUTES", "release_all", "close_sequences",
           "keep_sequence", "wait_sequences", "FWD_IN", "BWD_IN"]

MAX_SEQUENCES = 4           # recorded sequences kept per workspace (sets of buffers)
MAX_ATTRIBUTES = 29         # a Workspace's attributes, at most (Workspace.__init__ says why)
FWD_IN = SCAN.float_inputs                       # the inputs a call binds, in the order of its key
BWD_IN = (*FWD_IN, *SCAN.cotangent_names)
_ZEROS = frozenset(("s", "g_y", "g_states"))   # the inputs an absent argument stands zeros in for (s=None, ...)



class FlagHost:
    """The host-visible copy of a flagging plan's non-finite flag (recording.flag_end copies the
    kernels' flag into it), made on first use: both ops' workspaces."""

    _flag_host = None

    def flag_host(self):
        """The host-visible buffer the kernels' non-finite flag is copied into."""
        if self._flag_host is None:
            self._flag_host = rt.Buffer(self.ctx, 16, staging=True)
        return self._flag_host

    def nonfinite(self) -> bool:
        """Whether the last (waited-for) call of a flagging plan flagged a non-finite output."""
        buf = self._flag_host
        word = buf.peek(4)   # host-visible: read in place (a uint32)
        if word is not None:
            return word != b"\0\0\0\0"
        return bool(rt.download(buf, ((1,), np.uint32))[0])

    def close_flag(self, live: bool) -> None:
        """The flag's buffer closed (``live``: the context neither closed nor lost)."""
        if self._flag_host is not None and live:
            self._flag_host.close()
        self._flag_host = None

class Workspace(FlagHost):
    """Everything one problem shape needs on one context, kept between calls: the plan and the
    family that records and runs it (``plan``, ``family``), upload buffers for host inputs,
    output buffers for host calls, scratch, recorded sequences.
    Used under ``lock`` (one call at a time per shape); ``closed`` once evicted, after which a
    caller that looked it up before the eviction must look up a new one."""

    def __init__(self, ctx, planned: Planned, rerun: bool = False):
        """The workspace of the shape the decision planned (``planned``: family.Planned), running
        its first plan, or (``rerun``) the plan that recomputes a result the first flagged as
        non-finite. It plans nothing: the plan is the decision's.

        At most 29 attributes (MAX_ATTRIBUTES): a 30th leaves CPython 3.11's shared keys, and every
        attribute read of every call slows (benchmarks/vk_call_instructions.py: +0.6 k
        instructions a forward, +4.7 k one that misses its kept replay)."""
        self.ctx = ctx
        dims = self.dims = planned.dims
        self.backward = planned.backward
        self.limits = planned.lim
        self.profile = config.profile()   # SSM_VK_PROFILE, read when the workspace is made
        fp = planned.plan(rerun)
        self.family, self.plan = fp.family, fp.plan   # the family records and runs its own plan
        # What a call asks of the plan, answered once (family.Family): whether its results are
        # flagged when non-finite (then computed again: run.py), and the tag of the tables a
        # forward leaves for its backward or a backward takes (None: neither).
        self.flags_nonfinite = fp.family.flags(fp.plan)
        self.tables_tag = fp.family.tables(fp.plan, self.backward)
        # the one key of a forward's tables, which its backward looks up (engine.KeptForward):
        # the step's form too, as the tables hold the decays
        self.kept_key = (dims, planned.lim, planned.knobs.key, planned.softplus)
        self.pool = pool(ctx)
        self.align = ctx.info.min_storage_buffer_offset_alignment
        self.lock = threading.Lock()
        self.shapes = {k: tuple(int(n) for n in v) for k, v in output_shapes(dims, self.backward).items()}
        self.sizes = {k: math.prod(v) for k, v in self.shapes.items()}
        self._out_specs = tuple((k, v, self.sizes[k] * F32) for k, v in self.shapes.items())
        self._out_nbytes = [n for _, _, n in self._out_specs if n]
        self._owned: list = []            # every buffer this workspace acquired
        self._scratch: list = []          # by request order while recording
        self._k = 0
        self.host = HostData(hash(self.kept_key), planned.cuts.get(rerun))   # the buffers and staging of host
                                                    # inputs and outputs, and where those in pieces are cut
        if any(k in self.host.cuts for k in self.shapes):
            self._out_nbytes = None   # outputs in pieces: made per call (outputs), no recorded sets of them
                                                    # (one attribute: hostdata.HostData says why)
        self._dummy = None
        self._flag_host = None            # host-visible copy of the kernels' non-finite flag
        self._out_sets: list = []         # output buffer sets of recent device-output calls, newest first
        self.kept = None                  # a forward's tables for its backward, by name (its recording's)
        self.sequences: OrderedDict = OrderedDict()   # binding key -> (Sequence, constant buffers)
        self._constants: list = []
        self.closed = False
        # Set when made and by each replay of a kept call (replay_cache.py, replay.Replay), which skips
        # Engine.workspace's look-up and so its move to the most recent end: eviction moves a
        # workspace so marked to that end once (clearing the mark) instead of closing it.
        self.recent = True

    # -- buffers ------------------------------------------------------------------------------
    def acquire(self, nbytes: int, name: str = ""):
        """A buffer of the pool that this workspace holds until it closes; for the host array
        ``name`` that the plan holds in pieces (``host.cuts``), an rt.Pieces of such buffers."""
        starts = self.host.cuts.get(name) if name else None
        if starts is not None:
            bufs = []
            for n in piece_sizes(nbytes, starts):
                bufs.append(self.pool.acquire(n))
                self._owned.append(bufs[-1])
            return rt.Pieces(bufs, starts, nbytes)
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
            buf = self.acquire(n_elems * F32)
            self._scratch.append(buf)
        self._k += 1
        return buf

    def constant(self, arr: np.ndarray):
        """A small buffer holding ``arr``, kept with the sequence being recorded."""
        buf = self.acquire(arr.nbytes)
        rt.upload(buf, arr)
        self._constants.append(buf)
        return buf

    def dummy(self):
        if self._dummy is None:
            self._dummy = self.acquire(16)
        return self._dummy

    def bind(self, buf, base: int, start: int, count: int) -> tuple[tuple, int]:
        """A binding of elements [base + start, base + start + count) of ``buf`` and the residual
        element offset the shader adds (binding offsets must be aligned)."""
        if buf is None or count <= 0:
            return (self.dummy(), 0, 16), 0
        byte0 = (base + start) * F32
        if type(buf) is rt.Pieces:   # an array in pieces: the piece this window lies in
            buf, byte0 = buf.at(byte0, count * F32)
        aligned = byte0 - byte0 % self.align
        resid = (byte0 - aligned) // F32
        return (buf, aligned, (resid + count) * F32), resid

    def input(self, name: str, arr) -> tuple:
        """(buffer, element offset) of input ``arr``: DeviceArrays in place; host arrays in the
        upload buffer of the call's donor (``host.donor``: a forward's workspace, its lock held)
        that holds exactly their bytes, else written into this workspace's buffer for ``name`` --
        straight through its mapping, or into the staging slot the call's sequence copies from
        (hostdata.HostData.write); the validator's zeros (a zero-stride stand-in) in this
        workspace's buffer, which the call's sequence fills (HostData.zeros)."""
        if isinstance(arr, DeviceArray):
            arr._check_live()
            if arr.ctx is not self.ctx:
                raise ValueError(f"{name}: a DeviceArray from another Vulkan context was passed")
            return arr.buffer, arr.offset   # (in pieces: bound in place or copied, HostData.rebind_pieces)
        # (the inputs the validator stands zeros in for; a contiguous array pays the flag test alone)
        if name in _ZEROS and not arr.flags.c_contiguous and zero_stand_in(arr):
            return self.host.zeros(self, name, arr.size * F32)
        a = np.ascontiguousarray(arr, dtype=np.float32)
        if a.size == 0:
            return None, 0
        return self.host.write(self, name, a)

    def bind_inputs(self, p, backward: bool) -> tuple[dict, list]:
        """The inputs' bindings: {name: (buffer, element offset)}, and the start of the sequence's
        key -- serial and offset of each, in the fixed order (inputs, then outputs, then the ids).
        Host inputs are written into this workspace's buffers or its staging slots, or bound in
        the donor's (:meth:`input`); when any was staged, the caller appends ``host.staged_key()``."""
        bufs: dict = {}
        key: list = []
        try:
            for k in BWD_IN if backward else FWD_IN:
                b, off = bufs[k] = self.input(k, getattr(p, k))
                key += (None if b is None else b.serial, off)
            if backward and p.g_snapshots is not None:   # ssm_scan_back(g_snapshots=...)
                b, off = bufs["g_snapshots"] = self.input("g_snapshots", p.g_snapshots)
                key += (None if b is None else b.serial, off)
        except BaseException:
            if self.host.staged:
                self.host.unstage()
            raise
        return bufs, key

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
                if self._out_nbytes is None:
                    return self._outputs_in_pieces(ctx, p)
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
                    out[k] = DeviceArray._from_pool(ctx, bufs[i] if nbytes else None, shape, p)
                    i += 1 if nbytes else 0
            except BaseException:
                release_all(out)
                for b in bufs[i:]:
                    p.release(b)
                raise
            return out
        host = self.host
        if host.views is None:  # made once: they never leave the workspace (results are copies)
            out = {}
            for k, shape in self.shapes.items():
                n = self.sizes[k] * F32
                if n and k not in host.out:
                    host.out[k] = self.acquire(n, k)
                out[k] = DeviceArray(self.ctx, host.out.get(k), shape, owned=False)
            host.views = out
        return host.views

    def _outputs_in_pieces(self, ctx, p) -> dict:
        """outputs(True) of a plan that holds outputs in pieces (``host.cuts``): fresh DeviceArrays,
        those beyond one allocation over rt.Pieces cut at the plan's windows (arrays.pieces)."""
        out: dict = {}
        cuts = self.host.cuts
        try:
            for k, shape, nbytes in self._out_specs:
                if not nbytes:
                    out[k] = DeviceArray._from_pool(ctx, None, shape, p)
                elif k in cuts:
                    out[k] = DeviceArray._from_pool(ctx, pieces(ctx, nbytes, cuts[k]), shape, p)
                else:
                    out[k] = DeviceArray._from_pool(ctx, p.acquire(nbytes), shape, p)
        except BaseException:
            release_all(out)
            raise
        return out

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
            # Staged host data moves in this very submission: copied in before the work (outside
            # its timestamps), the host outputs copied out after it.
            self.host.copy_in(seq)
            if self.ctx.info.timestamps:
                seq.timestamp("start")
            record(seq)
            if self.ctx.info.timestamps:
                seq.timestamp("end")
            self.host.copy_out(seq)
            seq.finish()
        except BaseException:
            seq.close()
            self._drop(self._constants)  # a recording that failed keeps none of its constants
            raise
        keep_sequence(self.sequences, key, seq, self._constants, self._drop)
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
        if self.host.lent:   # a call that read this workspace's upload buffers failed: it may still run
            self.ctx.wait_idle()
            self.host.lent = False
        wait_sequences(self.sequences)

    def close(self) -> None:
        self.closed = True
        close_sequences(self.sequences)
        if not self.ctx.closed:
            for b in self._owned:
                try:
                    self.pool.release(b)
                except ValueError:
                    pass
        self._owned.clear()
        # Buffers of its own, not the pool's: closed here, unless the context is lost -- work that
        # timed out may still read them, and the context's close frees them after its wait.
        live = not (self.ctx.closed or self.ctx.lost)
        self.close_flag(live)
        self.host.close(live)
        if not self.ctx.closed and not self.pool.closed:
            for bufs in self._out_sets:
                self.pool.unreserve(bufs)
        self._out_sets = []


def keep_sequence(sequences: OrderedDict, key, seq, constants: list, drop) -> None:
    """Keep ``seq`` (and the constant buffers recorded with it) in a workspace's ``sequences``
    under ``key``; the least recent beyond MAX_SEQUENCES closed, their constants given to ``drop``."""
    sequences[key] = (seq, constants)
    while len(sequences) > MAX_SEQUENCES:
        _, (old, consts) = sequences.popitem(last=False)
        old.close()
        drop(consts)


def wait_sequences(sequences: dict) -> None:
    """Wait for each pending sequence of a workspace's ``sequences`` (key -> (Sequence, ...))."""
    for seq, *_ in sequences.values():
        if seq.pending:
            seq.wait()


def close_sequences(sequences: dict) -> None:
    """Close every sequence of a workspace's ``sequences`` and forget them."""
    for seq, *_ in sequences.values():
        seq.close()
    sequences.clear()


def release_all(arrays: dict) -> None:
    """Release every DeviceArray of ``arrays`` (a call's outputs it will not hand out; None: a
    state part that update_cache wrote into the cache)."""
    for a in arrays.values():
        if a is not None:
            a.release()
