"""The kernel families and what composes them: each family keeps its planner, its kernel specs,
its recording and its shaders in one folder (``ssm_vk/sequential/``, ``ssm_vk/chunked/``,
``ssm_vk/m1/``); this module lists them behind one small interface (:class:`Family`) and holds
what the rest of ssm_vk asks of them together:

- :func:`plan`: a call's plan, trying the families in the order of :data:`FAMILIES`;
- :func:`family_of`: the family whose kernels run a plan;
- :func:`kernels_needed`: every kernel a plan's recording may dispatch (the support decision's
  list);
- :func:`record_forward`, :func:`record_backward`: the recording of the family a plan names;
- :func:`matrix`: every variant ``ssm-scan build-shaders`` packages (:func:`modes_matrix`: those
  of K > 1 snapshots and of the invariant mode, which the planner gives the token-sequential
  kernels alone).

Adding a family: a folder like the three (``<family>_planner.py``, ``<family>_specs.py``,
``<family>_recording.py``, ``glsl/``), a :class:`Family` entry here and its place in :func:`plan`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ssm_ref import Dims, Problem

from .chunked import chunked_recording as chunked_record
from .chunked import chunked_specs as chunked_kernels
from .chunked.chunked_planner import chunk_plan
from .config import DEFAULTS, Settings, settings
from .kernel_specs import KernelSpec, reduce_spec, rows_spec
from .limits import Limits
from .m1 import m1_recording as m1_record
from .m1 import m1_specs as m1_kernels
from .m1.m1_planner import m1_plan
from .sequential import sequential_recording as sequential_record
from .sequential import sequential_specs as sequential_kernels
from .sequential.sequential_planner import Plan, sequential_plan, time_chunk_plan
from .sequential.sequential_recording import scatters_in_place

__all__ = ["Family", "FAMILIES", "SEQUENTIAL", "CHUNKED", "M1", "plan", "family_of", "kernels_needed",
           "record_forward", "record_backward", "scatters_in_place", "matrix", "MODES", "MODES_N", "modes_matrix"]


@dataclass(frozen=True)
class Family:
    """One kernel family, as the planner, the support decision and the recording see it."""
    name: str
    takes: Callable[[Plan], bool]                    # whether a plan runs on this family's kernels
    kernels: Callable[[Dims, Plan, bool], list]      # (d, plan, backward) -> the KernelSpecs it dispatches
    record_forward: Callable[..., None]              # (seq, ws, p, bufs, scatter)
    record_backward: Callable[..., None]             # (seq, ws, p, bufs, kept)


CHUNKED = Family(
    "chunked", lambda pl: pl.chunked is not None,
    lambda d, pl, backward: chunked_kernels.chunk_kernels(d, pl.chunked, backward),
    lambda seq, ws, p, bufs, scatter: chunked_record.record_forward(seq, ws, p, bufs),
    chunked_record.record_backward)
M1 = Family(
    "m1", lambda pl: pl.m1 is not None,
    lambda d, pl, backward: m1_kernels.m1_kernels(d, pl.m1, backward, pl.softplus),
    lambda seq, ws, p, bufs, scatter: m1_record.record_forward(seq, ws, p, bufs),
    lambda seq, ws, p, bufs, kept: m1_record.record_backward(seq, ws, p, bufs))
SEQUENTIAL = Family(
    "sequential", lambda pl: True,
    sequential_kernels.sequential_kernels,
    sequential_record.record_forward,
    lambda seq, ws, p, bufs, kept: sequential_record.record_backward(seq, ws, p, bufs))

# In the order the planner tries them; the token-sequential kernels take every shape (and
# recompute a call of another family that turns out inf or nan).
FAMILIES = (CHUNKED, M1, SEQUENTIAL)


def plan(d: Dims, lim: Limits, backward: bool, knobs: Settings | None = None, softplus: int = 0,
         time_chunks: bool = True, m1: bool = True, snap: bool = False) -> Plan:
    """Cut the problem into windows that fit; raise TooLarge when even one token cannot. The
    plan carries the chunked kernels' plan (chunked.chunked_planner) where they take the shape, else the
    Mamba-1 kernels' with time in threads (m1.m1_planner) where they take it, else, for a forward or
    backward that the token-sequential scan would leave the device mostly idle on, the plan
    parallel over time (plan.tchunk; not when ``time_chunks`` is False). ``knobs``: ssm_vk.config's
    settings (default: those of now). ``softplus``: the step's form, which the plan hands to its
    kernels (it changes no size or window). ``m1`` False: not the Mamba-1 kernels with time in
    threads (their SPIR-V cannot be had). ``snap``: the call writes K > 1 state snapshots (a
    forward) or adds g_snapshots (a backward): the token-sequential kernels run it, with SNAP
    (the other families keep the states of chunk ends only)."""
    knobs = settings() if knobs is None else knobs
    if snap or knobs.invariant:
        # K > 1 snapshots: the token-sequential kernels with SNAP. The invariant mode (docs/SPEC.md
        # section 3.2): the token-sequential kernels alone, in the layout of the per-sequence
        # problem -- no chunked matrix form, no Mamba-1 kernels with time in threads, no time
        # chunks: each rounds otherwise, and is chosen by S and T.
        return replace(sequential_plan(d, lim, backward, knobs), softplus=softplus, snap=bool(snap))
    cp = chunk_plan(d, lim, backward, knobs)
    if cp is not None and softplus:
        cp = replace(cp, softplus=softplus)
    mp = m1_plan(d, lim, backward, knobs) if time_chunks and m1 and cp is None else None
    if mp is not None:   # (the token-sequential plan beside it recomputes a call with inf or nan)
        return replace(sequential_plan(d, lim, backward, knobs), m1=mp, softplus=softplus)
    tp = time_chunk_plan(d, lim, backward, knobs) if time_chunks and cp is None else None
    if tp is not None:
        return replace(tp, softplus=softplus)
    return replace(sequential_plan(d, lim, backward, knobs), chunked=cp, softplus=softplus)


def family_of(pl: Plan) -> Family:
    """The family whose kernels run plan ``pl``."""
    return next(f for f in FAMILIES if f.takes(pl))


def kernels_needed(d: Dims, pl: Plan, backward: bool) -> list[KernelSpec]:
    """The kernels the recording of a problem of dims ``d`` under plan ``pl`` may dispatch (the
    d_s scatter's counted whenever ids could repeat), so that the support decision can tell,
    before any work, whether their SPIR-V can be had and the device takes them: the family's,
    and for another family than the token-sequential one also the token-sequential kernels that
    recompute a call with inf or nan."""
    fam = family_of(pl)
    if fam is SEQUENTIAL:
        return SEQUENTIAL.kernels(d, pl, backward)
    return fam.kernels(d, pl, backward) + SEQUENTIAL.kernels(d, pl, backward)


def record_forward(seq, ws, p: Problem, bufs: dict, kept=None, scatter: bool = False) -> None:
    """Record the forward of ``p`` in workspace ``ws``; ``bufs`` maps s, x, dt, A, B, C, y, states
    to (buffer or None, element offset). ``scatter``: the final states into s[ids] instead
    (sequential.sequential_recording.scatters_in_place)."""
    family_of(ws.plan).record_forward(seq, ws, p, bufs, scatter)


def record_backward(seq, ws, p: Problem, bufs: dict, kept=None) -> None:
    """Record the backward; ``bufs`` maps the inputs (s .. g_states) and the outputs (d_s .. d_C).
    ``kept``: the tables its chunked forward left (engine.KeptForward), bound instead of a
    recompute; None to recompute them."""
    family_of(ws.plan).record_backward(seq, ws, p, bufs, kept)


def matrix(limits_list: list[Limits], n_values, p_values=(), chunked_n=None,
           knobs: Settings = DEFAULTS) -> list[tuple[str, dict]]:
    """Every (shader, defines) the forward and backward request for these device profiles and
    d_state values, for both Mamba variants, and the chunked kernels for every head_dim of
    ``p_values`` x d_state of ``chunked_n`` (default ``n_values``) and chunk length, in a stable
    order without duplicates: what ``ssm-scan build-shaders`` packages. Each family lists its
    part (``<family>/<family>_specs.py``: matrix); the shared kernels are added here."""
    seen: dict = {}

    def add(specs) -> None:
        for spec in specs:
            seen.setdefault((spec.name, spec.defines), None)

    for lim in limits_list:
        add(sequential_kernels.matrix(lim, n_values, knobs))
        add(m1_kernels.matrix(lim, n_values, knobs))
    add((reduce_spec(0), reduce_spec(1), reduce_spec(2), rows_spec()))
    add(chunked_kernels.matrix(p_values, n_values if chunked_n is None else chunked_n, knobs))
    modes_n = [n for n in n_values if n in MODES_N]
    for lim in limits_list:   # (after the rest: the default's variants keep their order)
        add(modes_matrix(lim, modes_n, knobs))
    return [(name, dict(defines)) for name, defines in seen]


# The modes whose plans only the token-sequential kernels run (:func:`plan`), as (invariant, snap):
# K > 1 snapshots (SNAP), the invariant mode (EXACT, the per-sequence sum of d_A) and both.
MODES = ((False, True), (True, False), (True, True))
# The d_state values whose MODES variants a wheel carries: those of Mamba models (Mamba-1 16;
# Mamba-2 64, 128, Falcon-H1 256; 32 between). Every N of the default's matrix would double the
# wheel (+1,680 variants, +29 MiB zipped) and a fresh build's compile time; another N compiles
# with glslc where it is installed, or its call falls back to the CPU (supports() says so).
MODES_N = (16, 32, 64, 128, 256)


def modes_matrix(lim: Limits, n_values, knobs: Settings) -> list[KernelSpec]:
    """The kernels :func:`plan` requests in :data:`MODES` on a device of limits ``lim``, forward
    and backward, for the token-sequential part's problems at these d_state values
    (sequential.sequential_specs.sample_dims; K = 2 where the mode writes snapshots): planned here by
    plan and kernels_needed themselves, so that the packaged matrix follows the planner."""
    out = []
    for d in sequential_kernels.sample_dims(n_values):
        for invariant, snap in MODES:
            mode = knobs.invariant_twin() if invariant else knobs
            dm = replace(d, K=2) if snap else d
            for backward in (False, True):
                out += kernels_needed(dm, plan(dm, lim, backward, mode, snap=snap), backward)
    return out
