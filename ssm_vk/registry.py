"""The registry of the kernel families: which families compute each op, in the order the planner
asks them, and which of them is the op's fallback. Each family keeps its planner, kernel specs,
recording and shaders in one folder and declares itself there (family.Family); this module lists
them and holds what the rest of ssm_vk asks of them together:

- :func:`plan`: a call's plan (family.FamilyPlan), asking the op's families in turn;
- :func:`fallback_of`: the family that recomputes a family's flagged results;
- :func:`kernels_needed`: every kernel a plan's recording may dispatch (the support decision's
  list);
- :func:`matrix`: every variant ``ssm-scan build-shaders`` packages (:func:`modes_matrix`: those
  of K > 1 snapshots and of the invariant mode, which only the op's fallback runs).

Outside the family folders only this module names a family: a workspace records and runs a call
through its own (``ws.family``), the decision and the budget ask a plan's (``FamilyPlan.family``).

Adding a family for a new op (a Mamba-3 scan, say), file by file:

1. ``ssm_vk/<family>/glsl/``: its shaders (runtime/shaders.py searches every family's glsl/;
   the shared ``ssm_vk/glsl/`` holds the carry, the reductions and the row additions);
2. ``ssm_vk/<family>/<family>_planner.py``: its plan class; ``plan_call`` (a family.Request ->
   its plan, or None where it does not take the call; sizing.TooLarge where nothing fits); its
   scratch by name; which plans flag non-finite results. Pure Python, and the one place its
   knobs are read (tests/vk/test_knob_reads.py);
3. ``ssm_vk/<family>/<family>_specs.py``: its KernelSpecs (kernel_specs.py holds what they
   share), every kernel a plan dispatches, its part of the packaged matrix;
4. ``ssm_vk/<family>/<family>_recording.py``: record_forward and record_backward
   (ssm_vk.recording holds what recordings share);
5. ``ssm_vk/<family>/__init__.py``: ``FAMILY = Family(name=..., op="<op>", ...)``, the above
   tied together;
6. here: import its FAMILY and list it in :data:`OPS` under its op, in the planner's order, the
   op's fallback last (the family that takes every shape and recomputes flagged results: a new
   op's first family is its own);
7. ssm_vk.config: its knobs (KNOBS); tests/test_layers.py (LAYERS, FAMILIES) and
   tests/vk/test_knob_reads.py (FAMILIES): its folder.

What is the scan's own and not a family's -- its arrays (sizing/shapes.py), its validation
(validate.py), its entry points (api.py, prepared.py) -- a new op brings beside them; its entry
points take the support decision under the op's name (support.decision: "<op>", and "<op>_back"
for its backward), and the decision, the workspace and the call go through its families.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .chunked import FAMILY as CHUNKED
from .config import DEFAULTS, Settings, settings
from .family import Family, FamilyPlan, OnHost, Request
from .kernel_specs import KernelSpec, reduce_spec, rows_spec
from .m1 import FAMILY as M1
from .mamba3 import CHUNKED as MAMBA3_CHUNKED
from .mamba3 import FAMILY as MAMBA3
from .sequential import FAMILY as SEQUENTIAL
from .sizing import TooLarge

if TYPE_CHECKING:
    from ssm_ref import Dims

    from .sizing import Limits

__all__ = ["Op", "OPS", "plan", "fallback_of", "kernels_needed", "matrix", "matrix_all", "MODES", "MODES_N",
           "modes_matrix"]


@dataclass(frozen=True)
class Op:
    """The families that compute one op, in the order the planner asks them; ``fallback``: the
    one that takes every shape and mode and recomputes the others' flagged results (the last)."""

    name: str
    families: tuple[Family, ...]

    @property
    def fallback(self) -> Family:
        return self.families[-1]


# The chunked kernels first (where they take a shape they are the fastest), then Mamba-1 with time
# in threads, then the token-sequential kernels (over time chunks where those apply, else token by
# token). Every family declares the op it computes: an op lists its own. Mamba-3 (docs/SPEC.md
# section 14): its chunked forward where it takes the call, then its token-sequential kernels.
OPS = {"ssm_scan": Op("ssm_scan", (CHUNKED, M1, SEQUENTIAL)),
       "mamba3_scan": Op("mamba3_scan", (MAMBA3_CHUNKED, MAMBA3))}
assert all(f.op == op.name for op in OPS.values() for f in op.families)


def plan(d: Dims, lim: Limits, backward: bool, knobs: Settings | None = None, softplus: int = 0,
         snap: bool = False, rerun: bool = False, without: tuple = (), op: str = "ssm_scan") -> FamilyPlan:
    """The plan of a call of ``op`` (family.FamilyPlan): the first of the op's families, in their
    order, whose planner takes the call (family.Request), with the plan that recomputes its
    results where they are flagged non-finite (OnHost where the fallback cannot plan it and the
    family allows that: Family.host_rerun); TooLarge when even one token cannot fit.
    ``knobs``: ssm_vk.config's settings (default: those of now). ``softplus``: the step's form,
    which the plan hands to its kernels (it changes no size or window). ``snap``: the call writes
    K > 1 state snapshots (a forward) or adds g_snapshots (a backward). ``rerun``: the recompute
    of a flagged result, planned by the op's fallback alone, flagging nothing. ``without``:
    families not to ask (theirs cannot be had: decision.choose_plan_why)."""
    knobs = settings() if knobs is None else knobs
    scan = OPS[op]
    req = Request(d, lim, backward, knobs, softplus, bool(snap), rerun)
    if rerun:
        return FamilyPlan(scan.fallback, scan.fallback.plan(req))
    for fam in scan.families:
        if fam in without:
            continue
        own = fam.plan(req)
        if own is not None:
            if not fam.flags(own):
                return FamilyPlan(fam, own)
            # (the fallback's plan of the recompute, made with this one: no call plans)
            try:
                again = FamilyPlan(scan.fallback, scan.fallback.plan(replace(req, rerun=True)))
            except TooLarge as e:
                if not fam.host_rerun:
                    raise
                again = OnHost(f"{scan.fallback.title} cannot recompute a result holding inf or nan on this device "
                               f"({e})")
            return FamilyPlan(fam, own, again)
    raise AssertionError(f"no family of {op} planned the call (its fallback takes every call)")


def fallback_of(family: Family) -> Family:
    """The family that recomputes ``family``'s flagged results (its op's fallback; itself for the
    fallback)."""
    return OPS[family.op].fallback


def kernels_needed(d: Dims, fp: FamilyPlan, backward: bool) -> list[KernelSpec]:
    """The kernels the recording of a problem of dims ``d`` under plan ``fp`` may dispatch (the
    d_s scatter's counted whenever ids could repeat), so that the support decision can tell,
    before any work, whether their SPIR-V can be had and the device takes them: the family's,
    and where another family recomputes its flagged results, also that family's of the recompute's
    plan."""
    kernels = fp.family.kernels(d, fp.plan, backward)
    rerun = fp.device_rerun
    if rerun is None or rerun.family is fp.family:
        return kernels
    return [*kernels, *rerun.family.kernels(d, rerun.plan, backward)]


def matrix(limits_list: list[Limits], n_values, p_values=(), chunked_n=None, knobs: Settings = DEFAULTS,
           op: str = "ssm_scan") -> list[tuple[str, dict]]:
    """Every (shader, defines) the forward and backward of ``op`` request for these device
    profiles and d_state values, for both Mamba variants, and the kernels compiled per head_dim for
    every head_dim of ``p_values`` x d_state of ``chunked_n`` (default ``n_values``), in a stable
    order without duplicates: what ``ssm-scan build-shaders`` packages. Each family lists its part
    (family.Family.matrix); the shared kernels and the modes' variants are added here."""
    seen: dict = {}

    def add(specs) -> None:
        for spec in specs:
            seen.setdefault((spec.name, spec.defines), None)

    pn_values = n_values if chunked_n is None else chunked_n
    for fam in OPS[op].families:
        add(fam.matrix(limits_list, n_values, p_values, pn_values, knobs))
    if op == "ssm_scan":   # the scan's shared kernels and its modes (only its fallback takes them)
        add((reduce_spec(0), reduce_spec(1), reduce_spec(2), rows_spec()))
        modes_n = [n for n in n_values if n in MODES_N]
        for lim in limits_list:
            add(modes_matrix(lim, modes_n, knobs, op))
    return [(name, dict(defines)) for name, defines in seen]


def matrix_all(limits_list: list[Limits], n_values, p_values=(), chunked_n=None,
               knobs: Settings = DEFAULTS) -> list[tuple[str, dict]]:
    """:func:`matrix` of every op, the scan's first (its part the same, in the same order, as
    before any other op was added), without duplicates."""
    out, seen = [], set()
    for op in OPS:
        for name, defines in matrix(limits_list, n_values, p_values, chunked_n, knobs, op):
            key = (name, tuple(sorted(defines.items())))
            if key not in seen:
                seen.add(key)
                out.append((name, defines))
    return out


# The modes whose plans only the op's fallback runs (:func:`plan`), as (invariant, snap): K > 1
# snapshots (SNAP), the invariant mode (EXACT, the per-sequence sum of d_A) and both.
MODES = ((False, True), (True, False), (True, True))
# The d_state values whose MODES variants a wheel carries: those of Mamba models (Mamba-1 16;
# Mamba-2 64, 128, Falcon-H1 256; 32 between). Every N of the default's matrix would double the
# wheel (+1,680 variants, +29 MiB zipped) and a fresh build's compile time; another N compiles
# with glslc where it is installed, or its call falls back to the CPU (supports() says so).
MODES_N = (16, 32, 64, 128, 256)


def modes_matrix(lim: Limits, n_values, knobs: Settings, op: str = "ssm_scan") -> list[KernelSpec]:
    """The kernels :func:`plan` requests in :data:`MODES` on a device of limits ``lim``, forward
    and backward, for the op's fallback's sample problems at these d_state values
    (family.Family.samples; K = 2 where the mode writes snapshots): planned here by plan and
    kernels_needed themselves, so that the packaged matrix follows the planner."""
    out = []
    for d in OPS[op].fallback.samples(n_values):
        for invariant, snap in MODES:
            mode = knobs.invariant_twin() if invariant else knobs
            dm = replace(d, K=2) if snap else d
            for backward in (False, True):
                out += kernels_needed(dm, plan(dm, lim, backward, mode, snap=snap, op=op), backward)
    return out
