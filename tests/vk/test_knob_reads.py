"""Nothing after planning reads a knob, read from the code (no module is run).

The planner (each family's <family>_planner.py, combined by ssm_vk.registry.plan) reads the knobs
(ssm_vk.config) once, when the support decision plans a shape, and resolves into the plan what
its kernels and their recording need of them (for the chunked kernels: ChunkPlan's GEMM tiles and
threads, 16-byte loads and stores, the pass's batch).
Held here, for the kernel table, the decision and every module that runs a call:

1. no ``<anything>.knob(...)`` call (Settings.knob, the one way a knob is read);
2. no use of the plan-time resolvers of ssm_vk.chunked.chunked_planner (gemm_tile, gemm_threads, vec_in,
   vec_out, slice_len, pass_batch of the knobs);
3. a Settings object (a name or attribute called ``knobs``) is only passed on, or read for its
   ``key`` (what caches are keyed by) and ``no_subgroup`` (the subgroup switch that makes the
   planner's Limits, an input of planning); the functions that plan (ssm_vk.registry.plan, and
   the packaged matrix, which plans every variant ``ssm-scan build-shaders`` packages, its modes'
   part included) aside;
4. ``config.settings()`` -- the settings a call is decided and planned with -- is taken by the
   entry points only (api.py, prepared.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "ssm_vk"
FAMILIES = ("sequential", "chunked", "m1", "mamba3")
# Each family's kernel specs and recording (not its planners, *_planner.py), what the families share
# after planning, and what runs a call.
AFTER_PLANNING = sorted([PKG / "recording.py",
                         *(p for f in FAMILIES for p in PKG.glob(f"{f}/*.py") if not p.name.endswith("_planner.py")),
                         *(PKG / f"{m}.py" for m in ("kernel_specs", "registry", "decision", "workspace", "run",
                                                      "engine", "replay", "replay_cache", "prepared", "api"))])
# The functions that plan, inside modules of AFTER_PLANNING: ssm_vk.registry.plan (a call's plan,
# which the decision makes) and the packaged matrix, which plans every variant it packages (its
# modes' part, modes_matrix, through registry.plan).
PLANNING = {"registry.py": {"plan", "matrix", "modes_matrix"}, **{f"{f}/{f}_specs.py": {"matrix"}
                                                                     for f in FAMILIES}}
RESOLVERS = {"gemm_tile", "gemm_threads", "vec_in", "vec_out", "slice_len", "pass_batch"}
SETTINGS_READS = {"key", "no_subgroup"}
ENTRY_POINTS = {"api.py", "prepared.py"}


def _planning_functions(tree: ast.Module, name: str) -> set[int]:
    """The ids of the nodes inside the functions that plan (PLANNING)."""
    inside: set[int] = set()
    if name in PLANNING:
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in PLANNING[name]:
                inside |= {id(n) for n in ast.walk(node)}
    return inside


def _is_knobs(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "knobs") or (isinstance(node, ast.Attribute)
                                                                   and node.attr == "knobs")


def knob_reads(source: str, name: str) -> list[str]:
    """Every read of rules 1-4 in ``source`` (the module file ``name``, relative to ssm_vk/)."""
    tree = ast.parse(source)
    planning = _planning_functions(tree, name)
    bad = []
    for node in ast.walk(tree):
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "knob":
                bad.append(f"{where}: reads a knob (.knob(...))")
            called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if called == "settings" and Path(name).name not in ENTRY_POINTS and id(node) not in planning:
                bad.append(f"{where}: takes the settings of now (config.settings())")
            if isinstance(f, ast.Attribute) and f.attr in RESOLVERS:   # (a plan's resolved fields share names)
                bad.append(f"{where}: resolves from the knobs (.{f.attr}(...))")
        if isinstance(node, ast.Name) and node.id in RESOLVERS:
            bad.append(f"{where}: resolves from the knobs ({node.id})")
        if isinstance(node, ast.alias) and node.name in RESOLVERS:
            bad.append(f"{where}: imports a resolver of the knobs ({node.name})")
        if (isinstance(node, ast.Attribute) and _is_knobs(node.value) and node.attr not in SETTINGS_READS
                and id(node) not in planning):
            bad.append(f"{where}: reads the settings' .{node.attr}")
    return bad


@pytest.mark.parametrize("path", AFTER_PLANNING, ids=lambda p: str(p.relative_to(PKG)))
def test_nothing_after_planning_reads_a_knob(path):
    bad = knob_reads(path.read_text(), str(path.relative_to(PKG)))
    assert not bad, "\n".join(bad)


def test_the_check_finds_each_kind_of_read():
    sample = ("from .chunked_planner import gemm_tile\n"
              "def f(cp, knobs):\n"
              "    a = cp.knobs.knob('GWG')\n"
              "    b = knobs.with_knobs(KS=8)\n"
              "    return chunked.vec_in('Y', 4, 4, 16, 8, cp.knobs), config.settings(), knobs.key\n")
    bad = knob_reads(sample, "chunked/chunked_recording.py")
    kinds = ["imports a resolver of the knobs (gemm_tile)", "reads a knob (.knob(...))",
             "reads the settings' .knob", "reads the settings' .with_knobs", "resolves from the knobs (.vec_in(...))",
             "takes the settings of now"]
    for kind in kinds:
        assert any(kind in b for b in bad), (kind, bad)
    assert not any(".key" in b for b in bad)
    assert not any("settings of now" in b for b in knob_reads(sample, "api.py"))   # an entry point
    assert not knob_reads("def g(cp):\n    return cp.vec_in, cp.vec_out, cp.tile('Y')\n", "kernels.py")
    assert any("resolves from the knobs (.pass_batch(...))" in b
               for b in knob_reads("n = plan.pass_batch(cp.NCH, cp.knobs)\n", "chunked/chunked_recording.py"))


def test_the_resolvers_are_those_of_the_chunked_planner():
    """RESOLVERS (rule 2) is every public function of ssm_vk/chunked/chunked_planner.py that takes the knobs
    (``knobs: Settings | None = None``), its two planners (why_not, chunk_plan) aside."""
    tree = ast.parse((PKG / "chunked" / "chunked_planner.py").read_text())
    takes_knobs = {f.name for f in tree.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")
                   and any(a.arg == "knobs" for a in f.args.args + f.args.kwonlyargs)}
    assert takes_knobs - {"why_not", "chunk_plan"} == RESOLVERS
