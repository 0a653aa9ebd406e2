"""What a kernel family declares, what a call's plan is and what a decided shape keeps of its
plans: the one interface between a family's folder (``ssm_vk/<family>/``) and the rest of ssm_vk.

A family computes one op (``Family.op``: "ssm_scan" for the three of today, forward and backward)
with kernels of its own. Its folder declares it once (``<family>/__init__.py``: ``FAMILY``) and
ssm_vk.registry lists the families of each op in the order the planner asks them. Nothing outside
the folders and the registry names a family: the planner asks each in turn (:class:`Request`), the
support decision checks the kernels it names, the memory budget counts the scratch it names, the
workspace and the call record and run what it records -- all through the fields below.

A call's plan is a :class:`FamilyPlan`: the family, that family's own plan object (each family's
planner makes its own kind: a token-sequential plan, a ChunkPlan, an M1Plan) and, where the
family's results are flagged when non-finite, the plan of the op's fallback family that recomputes
them (or, for a family that allows it, :class:`OnHost`: the fallback cannot plan that recompute on
the device, so a flagged call is computed on the host). The support decision plans a shape once
and keeps its plans in a :class:`Planned`, which the workspace, the engine and a call read (and
nothing plans again).

Pure Python, no Vulkan; the annotations' types are only named (``TYPE_CHECKING``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ssm_ref import Dims

    from .config import Settings
    from .sizing import Limits

__all__ = ["Family", "FamilyPlan", "OnHost", "Planned", "RecomputeOnHost", "Request", "always", "no_tables", "never"]


@dataclass(frozen=True)
class Request:
    """What the planner asks a family: the plan of a call of ``dims`` (``backward``: its backward)
    on a device of limits ``lim`` under the planner's knobs ``knobs`` (their invariant mode
    included), with the step's form ``softplus`` (kernel_specs.SOFTPLUS); ``snap``: the call
    writes K > 1 state snapshots (a forward) or adds g_snapshots (a backward); ``rerun``: the
    recompute of a result another plan flagged as non-finite, which must flag nothing."""

    dims: Dims
    lim: Limits
    backward: bool
    knobs: Settings
    softplus: int = 0
    snap: bool = False
    rerun: bool = False


def always(plan) -> bool:
    """``Family.flags`` of a family whose every plan flags its non-finite results."""
    return True


def no_tables(plan, backward: bool) -> None:
    """``Family.tables`` of a family whose forward leaves nothing for its backward."""
    return None


def never(ws, p, s_at) -> bool:
    """``Family.scatters`` of a family whose forward never writes the cache rows itself."""
    return False


@dataclass(frozen=True, eq=False, repr=False)
class Family:
    """One kernel family, as the registry, the decision, the budget and a call see it. ``plan``
    objects below are the family's own (what its ``plan`` returns)."""

    name: str      # its folder's name
    op: str        # the op it computes ("ssm_scan": forward and backward)
    title: str     # in words, as a call's reason names it ("the chunked kernels")
    # (Request) -> its plan of the call, or None where it does not take the call; raises
    # limits.TooLarge where not even its smallest window fits the device
    plan: Callable[[Request], Any]
    # (dims, plan, backward) -> every KernelSpec its recording may dispatch: what the support
    # decision checks (SPIR-V to be had, the device's limits) before any work
    kernels: Callable[[Dims, Any, bool], list]
    # (dims, plan, backward) -> the float32 elements of every scratch buffer its recording
    # requests, by a name that no other family's scratch takes (the memory budget's keys)
    scratch: Callable[[Dims, Any, bool], dict]
    # (plan) -> whether the plan's kernels raise a flag on inf or nan, whose call is then computed
    # again on the op's fallback family (the spec's non-finite results: docs/SPEC.md)
    flags: Callable[[Any], bool]
    # (seq, ws, p, bufs, scatter) and (seq, ws, p, bufs, kept): the recording of a forward and of
    # a backward into a runtime Sequence, in workspace ``ws`` (ws.plan: the family's plan)
    record_forward: Callable[..., None]
    record_backward: Callable[..., None]
    # (limits_list, n_values, p_values, pn_values, knobs) -> its part of what ``ssm-scan
    # build-shaders`` packages: the kernels its plans request on devices of those limits for
    # these d_state values (and, for kernels compiled per head_dim, the head_dims p_values x the
    # d_states pn_values), in a stable order
    matrix: Callable[..., list]
    # (plan, backward) -> the tag of the tables a forward of the plan leaves for the backward of
    # the same inputs, or that a backward of the plan takes from a forward of the same tag; None:
    # neither (engine.KeptForward)
    tables: Callable[[Any, bool], Any] = no_tables
    # (ws, p, s_at) -> whether its forward writes the final states straight into the cache rows
    # s[ids] (update_cache), else they are copied there after the call
    scatters: Callable[..., bool] = never
    # (n_values) -> the problems the packaged matrix plans in the modes only the op's fallback
    # runs (K > 1 snapshots, the invariant mode): the fallback family's
    samples: Callable[..., list] | None = None
    # Where its kernels cannot be had (no SPIR-V, or the device does not take them): False, the
    # families after it plan the call; True, the plan that recomputes its flagged results runs it,
    # and the memory budget counts that plan's scratch beside its own (the chunked kernels: their
    # plan was made on top of that one before a plan named its family)
    rerun_stands_in: bool = False
    # Where the op's fallback cannot plan the recompute of its flagged results on the device
    # (TooLarge): False, the call does not fit; True, its plan stands and a flagged call is
    # computed on the host (OnHost; the Mamba-3 chunked backward, whose scratch fits where the
    # token-sequential backward's work buffer does not: mamba3_api.mamba3_scan_back catches
    # RecomputeOnHost. Its forward never needs it: the token-sequential forward fits wherever the
    # chunked one does)
    host_rerun: bool = False

    def __repr__(self) -> str:
        return f"<{self.op} family {self.name}>"


class OnHost(NamedTuple):
    """The recompute of a flagged result that the op's fallback family cannot plan on the device:
    the call is computed on the host, for ``reason`` (FamilyPlan.rerun; Family.host_rerun)."""

    reason: str


class RecomputeOnHost(Exception):
    """A call's kernels flagged a non-finite result whose recompute is :class:`OnHost`: raised by
    ``Planned.plan(rerun=True)`` before any work of the recompute, for the op's API to compute the
    call on the host (ssm_vk.mamba3_api). Its message is the reason."""


class FamilyPlan(NamedTuple):
    """A call's plan: the ``family`` that runs it, that family's own ``plan`` and, where the
    family flags non-finite results (``family.flags(plan)``), the FamilyPlan of the op's fallback
    family that recomputes them (``rerun``, which flags nothing), or OnHost where that cannot be
    planned on the device; None otherwise."""

    family: Family
    plan: Any
    rerun: FamilyPlan | OnHost | None = None

    @property
    def device_rerun(self) -> FamilyPlan | None:
        """``rerun`` where it runs on the device (a FamilyPlan), else None."""
        return self.rerun if isinstance(self.rerun, FamilyPlan) else None


class Planned:
    """The plans of one decided problem shape, made by the support decision (ssm_vk.decision) and
    only read after it: the plan a call runs (``first``, whose kernels the decision checked, and
    with it the plan that recomputes a result it flags as non-finite: :meth:`plan`) -- so no call
    plans. Also what the
    plans were made for: ``dims``, ``backward``, the planner's ``lim`` and ``knobs``, the step's
    form ``softplus``, ``snap`` (the K state snapshots: registry.plan); ``key`` (all of them;
    ``snap`` only when set) keys the workspace of the shape (engine.Engine.workspace); ``dropped``:
    which family's kernels could not be had, and why ("" when none); ``cuts``: where the host
    arrays beyond one allocation are cut into pieces (budget.pieces: {rerun: {name: byte offsets}},
    empty when none is)."""

    __slots__ = ("backward", "cuts", "dims", "dropped", "first", "key", "knobs", "lim", "snap", "softplus")

    def __init__(self, first: FamilyPlan, dims, lim: Limits, backward: bool, knobs: Settings, softplus: int = 0,
                 snap: bool = False, dropped: str = "", cuts: dict | None = None):
        self.first, self.dims, self.lim, self.backward = first, dims, lim, backward
        self.knobs, self.softplus, self.snap, self.dropped = knobs, softplus, snap, dropped
        self.cuts = cuts or {}
        # (a backward given g_snapshots of one slot has the Dims of one without: ``snap`` tells them apart)
        self.key = (dims, backward, lim, knobs.key, softplus, "snap") if snap else (dims, backward, lim, knobs.key,
                                                                                    softplus)

    def plan(self, rerun: bool = False) -> FamilyPlan:
        """``first``; with ``rerun`` the plan that recomputes a result ``first`` flagged as
        non-finite (``first`` itself where it flags nothing). Raises RecomputeOnHost where that
        recompute is OnHost."""
        if rerun and self.first.rerun is not None:
            if isinstance(self.first.rerun, OnHost):
                raise RecomputeOnHost(self.first.rerun.reason)
            return self.first.rerun
        return self.first
