"""The workspace of one Mamba-3 call shape on one context (op "mamba3_scan", forward or backward;
docs/SPEC.md section 14): its plan and the family that records it (ssm_vk/mamba3/), the buffers a
call binds by name, and the command sequences recorded for sets of buffers. The context's Engine
keeps it beside the scan's workspaces (engine.Engine.workspace), in the same bounded cache; a call
uses it under its ``lock``. What replay.Replay and the engine read of a workspace is the scan's
Workspace's interface (``lock``, ``closed``, ``recent``, ``settle``, ``pool``, ``bind_inputs``,
``flags_nonfinite``, ``close``).

A call's bindings, by name (what the family's recording asks with :meth:`M3Workspace.bind`):

- a float32 DeviceArray input: its own buffer at its offset, in place (an offset the device cannot
  bind -- not a multiple of minStorageBufferOffsetAlignment -- is copied into a buffer of the
  workspace by the call's own sequence, on the device);
- a host input: written into the workspace's upload buffer of that name before the submit;
- absent start states (zeros) and absent cotangents: the workspace's buffer filled with zeros by
  the sequence; an absent psi: a buffer of ones made once;
- the four cotangents of the final state: one buffer, "g_state" (the kernel reads it so), its
  parts copied, written or zeroed there;
- the ids: a constant of the recorded sequence (the ids' bytes are part of its key);
- in a chunked plan's windows (of sequences, or of one sequence's tokens): what
  ssm_vk.mamba3_windows.M3Windows binds, the workspace's part that knows them.

The sequence begins with those copies and fills and ends with what turns the kernels' buffers
into the op's outputs on the device: update_cache's final states copied into the cache rows
(a copy per run of consecutive rows), the backward's d_dt / d_dA / d_lam and d_B_bias / d_C_bias / d_psi copied
out of the kernels' joint buffers, and the start-state gradients scatter-added by ids
(recording.scatter_rows, in sequence order as ssm_ref's). ssm_vk.mamba3_run runs calls in it.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from . import runtime as rt
from .arrays import DeviceArray, pieces, pool
from .mamba3_windows import STATE_PARTS, M3Windows
from .recording import scatter_rows
from .sizing import F32
from .workspace import FlagHost, close_sequences, keep_sequence, wait_sequences

if TYPE_CHECKING:
    from .family import Planned

__all__ = ["COPIED", "COTANGENTS", "INPUTS", "M3Workspace", "STATE_PARTS"]

INPUTS = ("x", "dt", "dA", "lam", "B", "C", "B_bias", "C_bias", "dtheta", "psi", "s_theta", "s_h", "s_k", "s_v")
COTANGENTS = ("g_y", "g_theta", "g_h", "g_k", "g_v")
COPIED = ("d_dt", "d_dA", "d_lam")   # the backward's outputs of tokens that it writes by copies alone


def _runs(ids) -> list[tuple[int, int, int]]:
    """(first sequence, its row, count) of each run of sequences i, i+1, ... whose rows are
    ids[i], ids[i]+1, ...: one copy each (a decode step of ids arange(S) copies each part once)."""
    out: list = []
    for i, r in enumerate(int(v) for v in ids):
        if out and out[-1][0] + out[-1][2] == i and out[-1][1] + out[-1][2] == r:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
        else:
            out.append((i, r, 1))
    return out


class _Rows:
    """recording.scatter_rows' view of an M3Workspace: the scan workspace's ``bind(buf, base,
    start, count)`` (a binding at an aligned offset and the residual), ``align``, ``constant``."""

    def __init__(self, ws: M3Workspace):
        self.ws, self.align = ws, ws.align

    def bind(self, buf, base: int, start: int, count: int) -> tuple[tuple, int]:
        if buf is None or count <= 0:
            return self.ws.bind(None), 0
        byte0 = (base + start) * F32
        aligned = byte0 - byte0 % self.align
        resid = (byte0 - aligned) // F32
        return (buf, aligned, (resid + count) * F32), resid

    def constant(self, arr: np.ndarray):
        return self.ws.constant(arr)


class M3Workspace(FlagHost, M3Windows):
    """Everything one Mamba-3 call shape needs on one context (see the module's docstring): the
    decision's plan (``plan``, ``family``, ``limits``, ``dims``, ``backward``), its own buffers by
    name, the sequences recorded for sets of bindings. Used under ``lock``; ``closed`` once
    evicted."""

    flags_nonfinite = False   # the Mamba-3 kernels flag nothing: inf and nan flow as the spec's
    tables_tag = None         # (no tables for a backward)
    kept = None

    def __init__(self, ctx, planned: Planned, rerun: bool = False):
        self.ctx = ctx
        d = self.dims = planned.dims
        self.backward = planned.backward
        self.limits = planned.lim
        fp = planned.plan(rerun)
        self.family, self.plan = fp.family, fp.plan
        self.pool = pool(ctx)
        self.align = ctx.info.min_storage_buffer_offset_alignment
        self.lock = threading.Lock()
        self.closed = False
        self.recent = True
        self._own: dict = {}          # name -> Buffer this workspace holds until it closes
        self._named: dict = {}        # the bindings of the recording in progress
        self._constants: list = []
        self._host_outs: dict = {}    # names -> a host call's output DeviceArrays over buffers of its own
        self.sequences: OrderedDict = OrderedDict()   # key -> (Sequence, constant buffers)
        H, P, N, M, F = d.H, d.P, d.N, d.M, d.F
        # elements of one sequence's (one cache row's) part of each state, in STATE_PARTS' order
        self.rows = (H * F, H * P * N, H * M * N, H * M * P)
        self.scratch = dict(fp.family.scratch(d, fp.plan, self.backward))
        # whether the plan's kernels flag inf and nan (the call is then computed again on the
        # recompute's plan: mamba3_run.run_once)
        self.flags_nonfinite = fp.family.flags(fp.plan)
        # the chunked kernels' windows of sequences or of one sequence's tokens
        # (mamba3_chunked_planner.M3ChunkPlan; one window: the call's arrays bound whole, as the
        # token-sequential plan binds them)
        self.windowed = bool(getattr(fp.plan, "windowed", False))
        self.per_token = dict(fp.plan.per_token) if self.windowed else {}
        self.per_chunk = dict(fp.plan.per_chunk) if self.windowed else {}
        self.per_seq = dict(fp.plan.per_seq) if self.windowed else {}
        # the buffers held in pieces ("in:x", "out:y", ...: byte offsets of the pieces, cut at the
        # windows by the decision, mamba3_memory.pieces; the recompute's plan holds none)
        self.cuts = {} if rerun else planned.cuts

    # -- buffers ------------------------------------------------------------------------------
    def own(self, name: str, nbytes: int):
        """The workspace's buffer ``name`` of ``nbytes`` (made on first use; None for no bytes)."""
        if nbytes <= 0:
            return None
        buf = self._own.get(name)
        if buf is None:
            starts = self.cuts.get(name)
            buf = self._own[name] = self.pool.acquire(nbytes) if starts is None else pieces(self.ctx, nbytes, starts)
        return buf

    def host_outputs(self, shapes: dict) -> dict:
        """DeviceArrays of ``shapes`` over buffers of the workspace's own (a host call's outputs,
        read back after it: never handed out)."""
        key = tuple(shapes)
        hit = self._host_outs.get(key)
        if hit is None:   # (made once per set of names: they never leave the workspace)
            hit = self._host_outs[key] = {k: DeviceArray(self.ctx, self.own("out:" + k, math.prod(v) * F32), v,
                                                         owned=False) for k, v in shapes.items()}
        return hit

    def constant(self, arr: np.ndarray):
        """A small buffer holding ``arr``, kept with the sequence being recorded."""
        buf = self.pool.acquire(max(arr.nbytes, 4))
        rt.upload(buf, arr)
        self._constants.append(buf)
        return buf

    def bind(self, name) -> tuple:
        """The binding (buffer, byte offset, bytes) of array ``name`` in the recording in progress
        (the family's recording asks by name); a small stand-in buffer for an array of no elements."""
        hit = self._named.get(name) if name is not None else None
        if hit is not None and hit[0] is not None:
            if type(hit[0]) is rt.Pieces:   # (bound window by window: M3Windows.bind_window)
                raise AssertionError(f"{name}: an array in pieces bound whole")
            return hit
        return (self.own("dummy", 16), 0, 16)

    # -- a call's inputs ----------------------------------------------------------------------
    def _array(self, name: str, a, nbytes: int, pre: list, key: list, bufs: dict) -> None:
        """Bind input ``name``: a DeviceArray in place (or copied, when its offset cannot be bound),
        a host array uploaded, None zeros filled by the sequence."""
        if nbytes == 0:
            bufs[name] = (None, 0, 0)
            key.append(None)
            return
        if type(a) is DeviceArray:
            if a.ctx is not self.ctx:
                raise ValueError(f"{name}: a DeviceArray from another Vulkan context was passed")
            off = a.offset * F32
            if off % self.align == 0 if type(a.buffer) is not rt.Pieces else self.in_place(name, a.buffer, off):
                bufs[name] = (a.buffer, off, nbytes)
                key += (a.buffer.serial, off)
                return
            buf = self.own("in:" + name, nbytes)
            pre.append(("copy", a.buffer, off, buf, 0, nbytes))
            bufs[name] = (buf, 0, nbytes)
            key += ("copy", a.buffer.serial, off)
            return
        buf = self.own("in:" + name, nbytes)
        bufs[name] = (buf, 0, nbytes)
        if a is None:
            pre.append(("fill", buf, 0, nbytes))
            key.append("zeros")
        else:
            rt.upload(buf, np.ascontiguousarray(a, dtype=np.float32))
            key.append(buf.serial)

    def in_place(self, name: str, buf, off: int) -> bool:
        """Whether array ``name`` of a DeviceArray (``buf`` at byte offset ``off``) is bound where it
        is: at an offset the device can bind; in pieces (rt.Pieces), only an array of tokens that
        the windows bind whose every window lies in one piece at such an offset (else the call
        copies it into a buffer of its own, cut at its windows) -- or one the call only copies."""
        if type(buf) is not rt.Pieces:
            return off % self.align == 0
        if name in COPIED:
            return True
        per = self.per_token.get(name)
        if not per:
            return False
        d, row = self.dims, per * F32
        for w in self.plan.windows:
            at, n = off + (w.s0 * d.T + w.t0) * row, w.n * w.nt * row
            try:
                piece_off = buf.at(at, n)[1]
            except ValueError:   # (the window crosses a cut)
                return False
            if piece_off % self.align:
                return False
        return True

    def bind_inputs(self, p, backward: bool) -> tuple[dict, list]:
        """The inputs' bindings of problem ``p`` (an M3Problem whose arrays are DeviceArrays, host
        arrays, or None: zeros) -> ({name: (buffer, byte offset, bytes)}, the start of the
        sequence's key). The copies and fills the sequence makes first are ``bufs["_pre"][1]``.
        Raises RuntimeError for a released DeviceArray, ValueError for one of another context."""
        from .arrays import check_live

        bufs: dict = {}
        key: list = [p.rotation]
        pre: list = []
        for k in INPUTS:
            a = getattr(p, k)
            if k == "psi" and not p.psi_given:
                n = self.dims.H * self.dims.M * self.dims.P * F32
                bufs[k] = (self._ones(n), 0, n) if n else (None, 0, 0)
                key.append("ones")
                continue
            if type(a) is DeviceArray:
                check_live((a,))
            elif k[:2] == "s_" and not p.states_given:
                a = None
            self._array(k, a, math.prod(a.shape) * F32 if a is not None else self._zeros_bytes(k), pre, key, bufs)
        if backward:
            d = self.dims
            self._array("g_y", p.g_y, d.S * d.T * d.M * d.H * d.P * F32, pre, key, bufs)
            self._g_state(p, pre, key, bufs)
        bufs["_pre"] = (None, tuple(pre))   # (a binding's form: no buffer of its own to mark busy)
        return bufs, key

    def _zeros_bytes(self, name: str) -> int:
        return self.dims.S * self.rows[("s_theta", "s_h", "s_k", "s_v").index(name)] * F32

    def _ones(self, nbytes: int):
        buf = self._own.get("ones")
        if buf is None:
            buf = self.own("ones", nbytes)
            rt.upload(buf, np.ones(nbytes // F32, np.float32))
        return buf

    def _g_state(self, p, pre: list, key: list, bufs: dict) -> None:
        """The four cotangents of the final state into one buffer, in STATE_PARTS' order."""
        S = self.dims.S
        total = S * sum(self.rows) * F32
        buf = self.own("g_state", total)
        bufs["g_state"] = (buf, 0, total)
        at = 0
        for name, row in zip(COTANGENTS[1:], self.rows, strict=True):
            a, n = getattr(p, name), S * row * F32
            if n == 0:
                continue
            if type(a) is DeviceArray:
                if a.ctx is not self.ctx:
                    raise ValueError(f"{name}: a DeviceArray from another Vulkan context was passed")
                from .arrays import check_live

                check_live((a,))
                pre.append(("copy", a.buffer, a.offset * F32, buf, at, n))
                key += (name, a.buffer.serial, a.offset)
            elif a is None:
                pre.append(("fill", buf, at, n))
                key += (name, "zeros")
            else:
                rt.upload(buf, np.ascontiguousarray(a, dtype=np.float32), at)
                key += (name, "host")
            at += n

    # -- recorded sequences -------------------------------------------------------------------
    def recorded(self, key) -> rt.Sequence | None:
        """The sequence recorded for binding ``key``, or None (not yet, or no longer kept)."""
        hit = self.sequences.get(key)
        if hit is None:
            return None
        self.sequences.move_to_end(key)
        return hit[0]

    def sequence(self, key, p, bufs: dict, post) -> rt.Sequence:
        """The sequence recorded for binding ``key``: the copies and fills of ``bufs["_pre"][1]``, the
        family's kernels over ``bufs`` (the ids a constant of it), then ``post(seq)``."""
        hit = self.recorded(key)
        if hit is not None:
            return hit
        self._constants = []
        seq = rt.Sequence(self.ctx)
        try:
            ids = self.constant(p.ids.astype(np.uint32))
            self._named = {**bufs, "ids": (ids, 0, ids.size)}
            pre = bufs["_pre"][1]
            for step in pre:
                if step[0] == "fill":
                    seq.fill(step[1], 0, step[2], step[3])
                else:
                    seq.copy(step[1], step[3], step[5], step[2], step[4])
            if pre:
                seq.barrier()
            if self.ctx.info.timestamps:
                seq.timestamp("start")
            if self.backward:
                self.family.record_backward(seq, self, p, bufs)
            else:
                self.family.record_forward(seq, self, p, bufs)
            post(seq)
            if self.ctx.info.timestamps:
                seq.timestamp("end")
            seq.finish()
        except BaseException:
            seq.close()
            self._drop(self._constants)
            raise
        finally:
            self._named = {}
        keep_sequence(self.sequences, key, seq, self._constants, self._drop)
        return seq

    def put_states(self, seq, finals: dict, caches: dict, ids) -> None:
        """Record the final states (``finals``: part -> its buffer) into the rows ids of the
        DeviceArray caches (``caches``: part -> DeviceArray), after the kernels."""
        seq.barrier()
        runs = _runs(ids)
        for part, row in zip(STATE_PARTS, self.rows, strict=True):
            cache = caches.get(part)
            if cache is None or finals[part] is None:
                continue
            for i, r, n in runs:   # (recording.put_rows' copies, a run of consecutive rows in one)
                seq.copy(finals[part], cache.buffer, n * row * F32, i * row * F32, (cache.offset + r * row) * F32)

    def split_grads(self, seq, p, outs: dict) -> None:
        """Record, after the backward's kernels, its outputs made of the kernels' joint buffers:
        d_dt, d_dA, d_lam of d_step (3,S,T,H) and the start-state gradients of d_start
        (:meth:`window_out`, which the chunked recording took after each window where there are
        several); d_B_bias, d_C_bias, d_psi of each head's row of d_parts (H, 2MN+MP); d_s_theta ..
        d_s_v, the start-state gradients scatter-added into the cache rows by ids, in sequence
        order (recording.scatter_rows)."""
        d = self.dims
        MN, MP = d.M * d.N, d.M * d.P
        seq.barrier()
        if not self.windowed:
            self._take(seq, 0, d.S, 0, d.T)
        parts = self._named["d_parts"][0]
        width = 2 * MN + MP
        for k, at, n in (("d_B_bias", 0, MN), ("d_C_bias", MN, MN), ("d_psi", 2 * MN, MP)):
            dst = outs.get(k)
            if dst is None or dst.buffer is None:
                continue
            for h in range(d.H):
                seq.copy(parts, dst.buffer, n * F32, (h * width + at) * F32, h * n * F32)
        rows = _Rows(self)
        seq.barrier()
        for part, row in zip(STATE_PARTS, self.rows, strict=True):
            if d.S * row:
                dst = outs["d_s_" + part]
                scatter_rows(self.ctx, seq, rows, self.limits, self.own("d0:" + part, d.S * row * F32),
                             (dst.buffer, dst.offset), p.ids, row, d.R)

    # -- the workspace's --------------------------------------------------------------------------
    def _drop(self, buffers: list) -> None:
        for b in buffers:
            try:
                self.pool.release(b)
            except ValueError:
                pass

    def settle(self) -> None:
        """Wait for every pending submission of this workspace's sequences (a call whose wait timed
        out): nothing may write the buffers that work reads until it ends."""
        if self.ctx.pending:
            wait_sequences(self.sequences)

    def close(self) -> None:
        self.closed = True
        consts = [b for _, cs in self.sequences.values() for b in cs]
        close_sequences(self.sequences)
        if not self.ctx.closed and not self.pool.closed:
            self._drop([*self._own.values(), *consts])
        self._own.clear()
        self._host_outs.clear()
        self.close_flag(not (self.ctx.closed or self.ctx.lost))
