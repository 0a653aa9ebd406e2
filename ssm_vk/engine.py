"""The Engine: every scan-level state of one Vulkan context, made with its first scan call and
closed with the context (``ctx.owned.extension``) -- so nothing lives in a module-level dict keyed
by a context, and a lost or forked-away context takes all of it along.

It owns:

- the workspaces (one per problem shape, knobs and limits: the scan's workspace.Workspace,
  Mamba-3's mamba3_workspace.M3Workspace, by the op of the plan's family), a bounded LRU;
- the support decisions (decision.decide), by problem signature;
- the replay cache (replay_cache.py): the prepared calls (replay.Replay) that plain
  device-resident calls keep for their repeats, by signature;
- the forward's tables kept for the backward (:class:`KeptForward`), keyed once, by
  ``Workspace.kept_key`` (dims, limits, knobs, the step's form: what a forward and its backward
  share); by its hash (``ws.host.pair``), the forward workspace whose upload buffers hold its
  last staged host inputs (``lend_uploads``: hostdata.py says when a backward binds them);
- the planner Limits of each DeviceInfo the context had (``override_limits`` swaps them);
- counters (``reruns``, ``states_reused``) for tests and benchmarks.

The context's buffer pool is the context's own (``arrays.pool``): DeviceArrays, below the engine,
hand their buffers back to it.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .sizing import Limits

if TYPE_CHECKING:
    from .config import Settings
    from .family import Planned
    # The workspaces it keeps are either op's (workspace.Workspace, mamba3_workspace.M3Workspace),
    # made by the caller's class (Engine.workspace's ``make``): neither is imported here, so the
    # engine sits below both (the layers: tests/test_layers.py).
    Workspace = Any

__all__ = ["Engine", "KeptForward", "clear", "current", "engine_of", "MAX_WORKSPACES"]

MAX_WORKSPACES = 8          # shapes kept per context
MAX_DECISIONS = 256
MAX_REPLAYS = 64


@dataclass
class KeptForward:
    """What a forward left for the backward of the same device-resident inputs (a family whose
    plans tag tables: family.Family.tables): its workspace (whose scratch holds them: ``tables``,
    the chunked kernels' chunk states, C.B and M o C.B) and who the inputs were (for each, its
    owning DeviceArray weakly, offset, shape and the owner's count of host writes; and the ids).
    A DeviceArray is written after it is made by the host (``write``: its count moves on) or by
    a call: a forward with update_cache=True, or a call given it as an ``out=`` array, which drop
    the tables of every call that read the array they write (Engine.written); so while each
    owner is alive, not released and not written from the host, the tables are those of these
    inputs."""

    ws: Workspace
    who: tuple
    ids: bytes

    @property
    def tables(self) -> dict:
        return self.ws.kept

    def matches(self, arrays: tuple, ids: bytes) -> bool:
        if ids != self.ids:
            return False
        for (ref, offset, shape, writes), a in zip(self.who, arrays, strict=True):
            owner = getattr(a, "owner", None)
            if (owner is None or ref() is not owner or owner.released or a.offset != offset or a.shape != shape
                    or owner.writes != writes):
                return False
        return True


class Engine:
    """The scan-level state of context ``ctx`` (see the module's docstring). Thread-safe: the
    caches are guarded by ``lock``; a workspace is used under its own lock."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.closed = False
        self.lock = threading.Lock()         # the caches; eviction waits for a workspace's lock under it
        self._kept_lock = threading.Lock()   # ``kept``: taken by calls that hold a workspace's lock, so
                                             # never held while waiting for one
        self.workspaces: OrderedDict = OrderedDict()
        self.decisions: dict = {}
        self.replays: dict = {}              # signature -> replay.Replay (replay_cache.py)
        self.kept: dict = {}                 # kept_key -> KeptForward
        self.uploads: dict = {}              # hash(kept_key) (ws.host.pair) -> the forward Workspace that
                                             # staged host inputs last
        self._limits: dict = {}              # (id(info), no_subgroup) -> (info, Limits)
        self.reruns = 0                      # flagged results recomputed for inf/nan
        self.states_reused = 0               # backwards that took their forward's tables
        ctx.owned.adopt(self)

    # -- limits ---------------------------------------------------------------------------------
    def limits(self, info, knobs: Settings) -> Limits:
        """The planner's Limits of DeviceInfo ``info`` under ``knobs`` (the subgroup switch)."""
        key = (id(info), knobs.no_subgroup)
        hit = self._limits.get(key)
        if hit is not None and hit[0] is info:   # the entry keeps ``info`` alive: its id is not reused
            return hit[1]
        lim = Limits.of(info, knobs.no_subgroup)
        with self.lock:
            if len(self._limits) >= 64:
                self._limits.clear()
            self._limits[key] = (info, lim)
        return lim

    # -- workspaces -----------------------------------------------------------------------------
    def workspace(self, planned: Planned, make, rerun: bool = False) -> Workspace:
        """The workspace of the shape, knobs, limits and step's form the decision planned
        (``planned``: family.Planned), running its first plan or (``rerun``) the recompute's
        -- made on first use with that plan by ``make(ctx, planned, rerun)`` (the op's workspace
        class: workspace.Workspace, mamba3_workspace.M3Workspace); the least recently used beyond
        MAX_WORKSPACES is closed."""
        key = (planned.key, rerun)
        with self.lock:
            if self.closed:
                raise RuntimeError("this Vulkan context is closed")
            ws = self.workspaces.get(key)
            if ws is None:
                ws = self.workspaces[key] = make(self.ctx, planned, rerun)
                while len(self.workspaces) > MAX_WORKSPACES:
                    k, old = next(iter(self.workspaces.items()))
                    if old.recent:  # replayed (replay_cache.py) since it came to the front: not the least recent
                        old.recent = False
                        self.workspaces.move_to_end(k)
                        continue
                    del self.workspaces[k]
                    with old.lock:
                        old.close()
            self.workspaces.move_to_end(key)
            return ws

    def find_workspace(self, dims, backward: bool, lim: Limits, knobs: Settings, rerun: bool = False,
                       softplus: int = 0) -> Workspace | None:
        """The workspace a call of this shape made, or None (a look-up only: tests and tools read
        the plan a call ran)."""
        return self.workspaces.get(((dims, backward, lim, knobs.key, softplus), rerun))

    def clear(self) -> None:
        """Close every workspace (their buffers back to the pool, their sequences freed)."""
        with self.lock:
            spaces = list(self.workspaces.values())
            self.workspaces.clear()
        with self._kept_lock:
            self.kept.clear()
        self.uploads.clear()
        for ws in spaces:
            with ws.lock:
                ws.close()

    # -- the forward's tables for the backward ---------------------------------------------------

    def keep(self, key: tuple, ws: Workspace, arrays: tuple, ids: bytes) -> None:
        """Record that forward workspace ``ws`` holds the tables of device-resident ``arrays``."""
        who = tuple((weakref.ref(a.owner), a.offset, a.shape, a.writes) for a in arrays)
        with self._kept_lock:
            self.kept[key] = KeptForward(ws, who, ids)

    def forget(self, key: tuple) -> None:
        if key in self.kept:      # (a look-up needs no lock; most forwards have nothing to forget)
            with self._kept_lock:
                self.kept.pop(key, None)

    def written(self, array) -> None:
        """``array`` (a DeviceArray) is being written in place (ssm_scan's update_cache): the kept
        forward tables of any call that read it go."""
        owner = getattr(array, "owner", None)
        if not self.kept or owner is None:
            return
        with self._kept_lock:
            for key in [k for k, v in self.kept.items() if any(ref() is owner for ref, _, _, _ in v.who)]:
                del self.kept[key]

    def kept_for(self, key: tuple, arrays: tuple, ids: bytes, tag) -> KeptForward | None:
        """The forward tables these backward inputs may take -- the last forward of the same
        shape that kept its tables ran on these very arrays, with tables of tag ``tag`` (the
        backward's plan's: Workspace.tables_tag) -- with their workspace locked (the caller releases
        ``kept.ws.lock`` after its submit); None when there are none. Never waits for the lock: a
        forward running now is overwriting them anyway."""
        kept = self.kept.get(key)
        if kept is None or not kept.ws.lock.acquire(blocking=False):
            return None
        try:
            ok = (not kept.ws.closed and kept.tables is not None and kept.ws.tables_tag == tag
                  and self.kept.get(key) is kept and kept.matches(arrays, ids))
            if ok:
                kept.ws.settle()
                return kept
        except BaseException:
            kept.ws.lock.release()
            raise
        kept.ws.lock.release()
        return None

    # -- a forward's host inputs for the backward -------------------------------------------------

    def offer_uploads(self, ws: Workspace) -> None:
        """Forward workspace ``ws`` (its lock held) staged host inputs: its upload buffers hold them."""
        self.uploads[ws.host.pair] = ws

    def lend_uploads(self, ws: Workspace) -> Workspace | None:
        """The forward workspace of backward workspace ``ws``'s shape whose upload buffers hold
        staged host inputs, locked (the caller releases its lock once its call is over); None
        when there is none, or it is busy (never waits: a forward running now rewrites them)."""
        donor = self.uploads.get(ws.host.pair)
        if donor is None or donor is ws or not donor.lock.acquire(blocking=False):
            return None
        if donor.closed:
            donor.lock.release()
            return None
        return donor

    # -- decisions and replays ------------------------------------------------------------------
    def decision(self, key: tuple):
        return self.decisions.get(key)

    def remember(self, key: tuple, value) -> None:
        with self.lock:
            if len(self.decisions) > MAX_DECISIONS:
                self.decisions.clear()
            self.decisions[key] = value

    def replay(self, sig: tuple):
        return self.replays.get(sig)

    def keep_replay(self, sig: tuple, replay) -> None:
        with self.lock:
            if len(self.replays) >= MAX_REPLAYS:
                self.replays.clear()
            self.replays[sig] = replay

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the workspaces and drop every cache (the context is closing). Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.clear()
        with self.lock:
            self.decisions.clear()
            self.replays.clear()
            self._limits.clear()
        self.ctx.owned.forget(self)


def engine_of(ctx) -> Engine:
    """The Engine of context ``ctx`` (made on first use, closed with the context)."""
    return ctx.owned.extension("engine", Engine)


def current() -> Engine:
    """The Engine of the process's open context (made, with the context, if need be)."""
    from .runtime import get_context

    return engine_of(get_context())


def clear(ctx=None) -> None:
    """Close the workspaces (their buffers and recorded sequences) of ``ctx``, default the open
    context's, and forget its support decisions and kept replays; a call after records anew."""
    from .runtime import current_context

    ctx = current_context() if ctx is None else ctx
    engine = None if ctx is None else ctx.owned.extension("engine")
    if engine is not None:
        engine.clear()
        with engine.lock:
            engine.decisions.clear()
            engine.replays.clear()
