"""What a chunked Mamba-3 plan's windows bind (mamba3_chunked_planner.M3ChunkPlan.windows: of
whole sequences, or of one sequence's tokens): :class:`M3Windows`, the part of the workspace
(ssm_vk.mamba3_workspace.M3Workspace, which inherits it) that the family's recording asks for a
window's bindings and its copies in and out. It reads the workspace's plan, dims, rows and the
bindings of the recording in progress, and owns nothing of its own. An array of tokens held in
pieces (runtime.Pieces: beyond one allocation) is cut at the windows, so each window binds it in
one piece.

In a window, each array of the call is bound from the window's first sequence and token (the plan
keeps those offsets bindable), the window's ids are a constant of their own, and the backward's
final-state cotangents and joint outputs (d_step, d_start) live in buffers of one window, copied in
before it and out after it. In windows of tokens the state a window starts from is the one the
window before it left (a slot per window of the plan's start states), and the backward carries
each window's start-state cotangent to the window before it.
"""

from __future__ import annotations

import numpy as np

from .runtime import Pieces
from .sizing import F32

__all__ = ["M3Windows", "STATE_PARTS"]

STATE_PARTS = ("theta", "h", "k", "v")   # the final state's outputs, in the order of the start-state inputs
_CACHES = ("s_theta", "s_h", "s_k", "s_v")
_RECOMPUTED = ("m3b_th", "m3b_h", "m3b_k", "m3b_v")   # the chunked backward's recompute's final state


class M3Windows:
    """The window methods of M3Workspace (see the module's docstring): the workspace provides
    ``dims``, ``plan``, ``rows``, ``backward``, ``windowed``, ``per_token``, ``per_chunk``,
    ``per_seq``, ``_named``, ``bind``, ``own`` and ``constant``."""

    def bind_window(self, name: str, w, walk: bool = False) -> tuple:
        """The binding of array ``name`` for window ``w`` (mamba3_chunked_planner.M3Window): an
        array of the call from the window's first sequence and token (the plan keeps that offset
        bindable), the final state's cotangents from the window's own copy (:meth:`window_in`), the
        rest whole. In a window of tokens (:meth:`_token_window`): the state it starts from and
        leaves in the plan's slots, the backward's start-state cotangents carried by turns."""
        if not self.windowed:
            return self.bind(name)
        d = self.dims
        if w.nt < d.T:
            hit = self._token_window(name, w, walk)
            if hit is not None:
                return hit
        if name == "g_state":
            return self.bind("g_state_w")
        hit = self._named.get(name)
        if hit is None or hit[0] is None:
            return self.bind(name)
        per = self.per_token.get(name)
        if per:
            at, n = hit[1] + (w.s0 * d.T + w.t0) * per * F32, w.n * w.nt * per * F32
            if type(hit[0]) is Pieces:   # an array in pieces: the piece the window lies in (cut at windows)
                return (*hit[0].at(at, n), n)
            return (hit[0], at, n)
        per = self.per_chunk.get(name)
        if per:
            first = w.s0 * self.plan.NC + w.t0 // self.plan.L
            return (hit[0], hit[1] + first * per * F32, w.n * w.NC * per * F32)
        per = self.per_seq.get(name)
        if per:
            return (hit[0], hit[1] + w.s0 * per * F32, w.n * per * F32)
        return self.bind(name)

    def _token_window(self, name: str, w, walk: bool) -> tuple | None:
        """Window ``w`` of tokens, the ``k``-th of its sequence: the start state (s_theta .. s_v)
        from slot k of the plan's starts (k > 0; slot 0: the cache rows); the final state (the
        forward's theta .. v, and with ``walk`` -- the backward's walk forward to each window's
        start state -- its recompute's) into slot k + 1, unless it is the sequence's last window;
        the backward's final-state cotangent (g_state) from the start-state cotangent the window
        after it left (its sequence's last: the call's, :meth:`window_in`) and its start-state
        cotangent (d_start) left for the window before it (its sequence's first: the call's,
        :meth:`window_out`). None for every other name."""
        plan, k = self.plan, w.t0 // self.plan.Tw
        last = w.t0 + w.nt >= self.dims.T
        # the final state a window leaves in the next one's slot: the forward's outputs; in the
        # backward only during its walk forward, whose recompute writes it (its outputs otherwise
        # go to scratch nobody reads)
        if walk:
            finals = (*STATE_PARTS, *_RECOMPUTED)
        else:
            finals = () if self.backward else STATE_PARTS
        if name in _CACHES and k > 0:
            return self._slot(_CACHES.index(name), k)
        if name in finals and not last:
            return self._slot(finals.index(name) % 4, k + 1)
        if name == "g_state" and not last:
            return self.bind(plan.carried[(k + 1) % 2])
        if name == "d_start" and k > 0:
            return self.bind(plan.carried[k % 2])
        return None

    def _slot(self, part: int, k: int) -> tuple:
        """Slot ``k`` of part ``part`` of the plan's start states (one sequence's part)."""
        name, stride = self.plan.starts[part]
        buf = self.bind(name)
        n = self.rows[part] * F32
        return (buf[0], k * stride * F32, n) if n else buf

    def window_ids(self, p, w) -> tuple:
        """The binding of window ``w``'s ids (a constant of the sequence being recorded): a window
        of tokens after its sequence's first reads the one row of the state left for it."""
        if not self.windowed:
            return self.bind("ids")
        ids = [0] if w.t0 else p.ids[w.s0:w.s0 + w.n]
        buf = self.constant(np.ascontiguousarray(ids, dtype=np.uint32))
        return (buf, 0, w.n * 4)

    def _parts(self, n: int):
        """(part, elements per sequence, offset of the part) of a buffer of the four state parts
        (g_state, d_start) of ``n`` sequences, each part's rows together."""
        at = 0
        for part, row in zip(STATE_PARTS, self.rows, strict=True):
            yield part, row, at
            at += n * row

    def window_in(self, seq, w) -> None:
        """Record the copy of window ``w``'s rows of the final state's cotangents (g_state, every
        sequence) into the window's own buffer, after what ran before (a barrier each side); a
        window of tokens other than its sequence's last takes the cotangent the window after it
        left instead (:meth:`_token_window`), and copies nothing."""
        if w.t0 + w.nt < self.dims.T:
            return
        src, dst = self.bind("g_state")[0], self.bind("g_state_w")[0]
        seq.barrier()
        for (_, row, at), (_, _, at_w) in zip(self._parts(self.dims.S), self._parts(w.n), strict=True):
            if row:
                seq.copy(src, dst, w.n * row * F32, (at + w.s0 * row) * F32, at_w * F32)
        seq.barrier()

    def window_out(self, seq, w) -> None:
        """Record, after window ``w``'s kernels, its rows of the backward's joint buffers into the
        outputs: d_dt, d_dA, d_lam of d_step (3, n, nt, H) and, for a window that starts its
        sequences, each start-state part of d_start into the workspace's buffer of that part ("d0:"
        part, every sequence), which split_grads scatters by ids."""
        seq.barrier()
        self._take(seq, w.s0, w.n, w.t0, w.nt)

    def _take(self, seq, s0: int, n: int, t0: int, nt: int) -> None:
        d = self.dims
        step = self._named["d_step"][0]
        sth = n * nt * d.H * F32
        for j, k in enumerate(("d_dt", "d_dA", "d_lam")):
            out = self._named[k]
            if sth:
                seq.copy(step, out[0], sth, j * sth, out[1] + (s0 * d.T + t0) * d.H * F32)
        if t0:
            return
        start = self._named["d_start"][0]
        for part, row, at in self._parts(n):
            if row:
                seq.copy(start, self.own("d0:" + part, d.S * row * F32), n * row * F32, at * F32, s0 * row * F32)
