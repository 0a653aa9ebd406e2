"""The shape of the code, read from its imports (no module is run). ssm_vk: one-way layers, no
import cycles, and no private name of one module used by another -- docs/ARCHITECTURE.md draws them.
ssm_ref: the spec never imports its testing kit, ssm_ref.testing.

Every import counts, also those inside functions (they once hid three cycles)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "ssm_vk"

# Lowest first; a module may import modules of its own layer or below, never above.
LAYERS = (
    ("ssm_vk.config",),
    # runtime/, from the binding up to the package's __init__
    ("ssm_vk.runtime.binding", "ssm_vk.runtime.checks", "ssm_vk.runtime.hostcopy", "ssm_vk.runtime.spirv",
     "ssm_vk.runtime.spirv_cache", "ssm_vk.runtime.shaders"),
    ("ssm_vk.runtime.device", "ssm_vk.runtime.introspect"),
    ("ssm_vk.runtime.owned", "ssm_vk.runtime.seams", "ssm_vk.runtime.instance"),
    ("ssm_vk.runtime.context",),
    ("ssm_vk.runtime.memory", "ssm_vk.runtime.pieces"),
    ("ssm_vk.runtime.pool", "ssm_vk.runtime.pipelines"),
    ("ssm_vk.runtime.commands",),
    ("ssm_vk.runtime.transfer",),
    ("ssm_vk.runtime",),
    # what the kernel families share: the planners' limits and sizes, the kernel table, the
    # interface each declares itself by, the recordings' helpers
    ("ssm_vk.arrays", "ssm_vk.sizing"),
    ("ssm_vk.validate", "ssm_vk.outputs"),
    ("ssm_vk.kernel_specs", "ssm_vk.family"),
    ("ssm_vk.recording",),
    # the kernel families, side by side: each its planner, kernel specs, recording (and shaders);
    # none imports another
    ("ssm_vk.sequential", "ssm_vk.chunked", "ssm_vk.m1", "ssm_vk.mamba3"),
    # what lists them (the registry: plan, kernels needed, packaged matrix); the budget (a plan's
    # memory, asked of its family)
    ("ssm_vk.registry", "ssm_vk.budget"),
    ("ssm_vk.decision",),
    ("ssm_vk.hostdata", "ssm_vk.mamba3_windows"),
    ("ssm_vk.workspace", "ssm_vk.mamba3_workspace"),
    # the engine; beside it what a Mamba-3 call of one shape holds (its buffers, pieces and budget)
    ("ssm_vk.engine", "ssm_vk.mamba3_memory"),
    # a call: run (workspace, bindings, the recorded sequence, submit), support (the context and
    # the cached decision); neither imports the other
    ("ssm_vk.run", "ssm_vk.support"),
    # a call bound once and replayed (Replay; the scan's OpCalls), then side by side: Mamba-3's call
    # in its workspace (and its OpCalls), and the two that hold a Replay: prepare_scan's prepared
    # calls and the plain calls' repeats, kept by signature
    ("ssm_vk.replay",),
    ("ssm_vk.mamba3_run", "ssm_vk.prepared", "ssm_vk.replay_cache"),
    # the plain calls
    ("ssm_vk.mamba3_api", "ssm_vk.mamba3_prepared"),
    ("ssm_vk.api",),
    ("ssm_vk",),            # the package's __init__: the public names
)


def _name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _layer(module: str) -> int:
    best = None
    for i, group in enumerate(LAYERS):
        for prefix in group:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (i, len(prefix))
    assert best is not None, f"{module} is in no layer of LAYERS: add it"
    return best[0]


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[:-(level - 1)]
    return ".".join([*base, *([target] if target else [])])


def _imports(module: str) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import in ``module``, resolved to
    the project's modules (a name that is a submodule counts as an import of it)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("ssm_vk")]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node.level, node.module) if node.level else (node.module or "")
            if not target.startswith("ssm_vk"):
                continue
            names = [a.name for a in node.names]
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
            plain = [n for n in names if f"{target}.{n}" not in MODULES]
            out += [(s, [], node.lineno) for s in subs]
            if plain or not subs:
                out.append((target, plain, node.lineno))
    return out


EDGES = {m: _imports(m) for m in MODULES}


def test_every_module_is_placed_in_a_layer():
    for m in MODULES:
        _layer(m)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_one_way_down(module):
    here = _layer(module)
    for target, _, line in EDGES[module]:
        assert _layer(target) <= here, (f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}, "
                                        f"a layer above it")


FAMILIES = ("ssm_vk.sequential", "ssm_vk.chunked", "ssm_vk.m1", "ssm_vk.mamba3")
REGISTRY = "ssm_vk.registry"


def _family(module: str) -> str | None:
    return next((f for f in FAMILIES if module == f or module.startswith(f + ".")), None)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _family(m)))
def test_a_family_imports_no_other_family(module):
    # the families share a layer; what they share lies below them, what composes them above
    for target, _, line in EDGES[module]:
        assert _family(target) in (None, _family(module)), (
            f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}, of another kernel family")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not _family(m) and m != REGISTRY))
def test_only_the_registry_imports_a_family(module):
    # Everything else reaches a family through the interface (ssm_vk.family: the plan's family,
    # a workspace's), so that a family is added in its folder and the registry alone.
    for target, _, line in EDGES[module]:
        assert not _family(target), (f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}: only "
                                     f"{REGISTRY} names a kernel family")


def test_no_import_cycles():
    graph = {m: {t for t, _, _ in EDGES[m] if t in MODULES and t != m} for m in MODULES}
    # a package's __init__ re-exports its submodules: an edge from a submodule to its own package
    # __init__ that comes back is a cycle as well, so nothing is exempt
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycle = [*stack[stack.index(t):], t]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_name_crosses_a_module(module):
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    for target, names, line in EDGES[module]:
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        assert not private, f"{path.relative_to(ROOT)}:{line} imports {private} from {target}"
    # module aliases bound by imports, used as ``alias._private``
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("ssm_vk"):
                    aliases[a.asname or a.name.split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom):
            is_package = path.name == "__init__.py"
            target = _resolve(module, is_package, node.level, node.module) if node.level else (node.module or "")
            for a in node.names:
                if f"{target}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{target}.{a.name}"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno} uses {node.value.id}.{node.attr}, a "
                                 f"private name of {aliases[node.value.id]}")


def _context_privates(tree) -> list[tuple[int, str]]:
    """``ctx._x`` / ``self.ctx._x`` / ``buffer.ctx._x``: a private attribute read through a name
    or attribute called ``ctx``."""
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        v = node.value
        if (isinstance(v, ast.Name) and v.id == "ctx") or (isinstance(v, ast.Attribute) and v.attr == "ctx"):
            out.append((node.lineno, node.attr))
    return out


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "ssm_vk.runtime.context"))
def test_no_module_reaches_into_a_context(module):
    # The context's state is its own: other modules keep theirs through ctx.owned.extension and
    # use its public methods, never a private slot of it.
    path = MODULES[module]
    found = _context_privates(ast.parse(path.read_text()))
    assert not found, f"{path.relative_to(ROOT)}: " + ", ".join(f"line {n}: ctx.{a}" for n, a in found)


def test_the_checker_sees_what_it_must(tmp_path):
    assert _context_privates(ast.parse("a = ctx._kernels\nb = self.ctx._staging\nc = ctx.lock\n")) == [
        (1, "_kernels"), (2, "_staging")]
    # The three checks above fail on code that breaks them (the checker is not vacuous).
    assert _layer("ssm_vk.sizing.limits") < _layer("ssm_vk.chunked.chunked_planner") < _layer("ssm_vk.registry") \
        < _layer("ssm_vk.engine")
    assert _layer("ssm_vk.runtime.seams") < _layer("ssm_vk.runtime.context") < _layer("ssm_vk.runtime") \
        < _layer("ssm_vk.arrays")
    edges = _imports("ssm_vk.run")
    assert any(t == "ssm_vk.workspace" for t, _, _ in edges) and any(t == "ssm_vk.recording" for t, _, _ in edges)
    assert any(t == "ssm_vk.m1" for t, _, _ in _imports(REGISTRY)) and _family("ssm_vk.m1.m1_specs") == "ssm_vk.m1"
    assert _resolve("ssm_vk.chunked.chunked_planner", False, 2, "config") == "ssm_vk.config"
    assert _resolve("ssm_vk.runtime", True, 1, "context") == "ssm_vk.runtime.context"


# --- ssm_ref: the spec never imports its testing kit ---------------------------------------------
# The kit (ssm_ref.testing) imports the spec; an import the other way, even one inside a function,
# would tie the spec to the kit again. The spec imports statically only, so that this check sees
# every import: importlib.import_module or __import__ in it counts as an import of the kit.

KIT = "ssm_ref.testing"
SPEC = {m: p for m, p in ((_name(p), p) for p in sorted((ROOT / "ssm_ref").rglob("*.py")))
        if m != KIT and not m.startswith(KIT + ".")}


def _is_kit(target: str) -> bool:
    return target == KIT or target.startswith(KIT + ".")


def _kit_imports(module: str, source: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, what) for every import of the kit in ``source``, the text of spec module ``module``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if _is_kit(a.name)]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node.level, node.module) if node.level else (node.module or "")
            if _is_kit(target):
                out.append((node.lineno, target))
            else:
                out += [(node.lineno, f"{target}.{a.name}") for a in node.names if _is_kit(f"{target}.{a.name}")]
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in ("import_module", "__import__"):
                out.append((node.lineno, f"a dynamic import ({name})"))
    return out


def test_the_spec_is_found():
    assert {"ssm_ref", "ssm_ref.scan", "ssm_ref.checks", "ssm_ref.tolerance"} <= set(SPEC)
    assert not any(_is_kit(m) for m in SPEC)


@pytest.mark.parametrize("module", sorted(SPEC))
def test_the_spec_never_imports_the_testing_kit(module):
    path = SPEC[module]
    found = _kit_imports(module, path.read_text(), path.name == "__init__.py")
    assert not found, f"{path.relative_to(ROOT)} imports the testing kit: " + ", ".join(
        f"line {n}: {what}" for n, what in found)


def test_the_kit_checker_sees_what_it_must():
    # Every spelling of an import of the kit is caught, at module level or inside a function.
    for source, is_package in (("from .testing import verify\n", False),
                               ("from . import testing\n", True),
                               ("import ssm_ref.testing.cases\n", False),
                               ("def f():\n    from ssm_ref.testing.vectors import GOLDEN\n", False),
                               ("from ssm_ref import testing\n", False),
                               ("import importlib\nm = importlib.import_module('ssm_ref.' + 'testing')\n", False)):
        module = "ssm_ref" if is_package else "ssm_ref.scan"
        assert _kit_imports(module, source, is_package), source
    # ... and the spec's own imports are not.
    assert not _kit_imports("ssm_ref", "from . import jvp, packing\nfrom .checks import Dims\n", True)
    assert not _kit_imports("ssm_ref.scan", "from .checks import Problem\nimport numpy as np\n", False)


def test_long_library_modules_say_why_they_are_one_module():
    # A module of a library package above 400 lines says in its docstring why it stays one module
    # ("... on purpose: ..."); anything else is split along a seam.
    long = []
    for path in sorted(ROOT.glob("ssm_*/**/*.py")):
        text = path.read_text()
        if text.count("\n") > 400:
            doc = ast.get_docstring(ast.parse(text)) or ""
            if "on purpose" not in doc:
                long.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert not long, "long modules whose header does not say why they stay one: " + ", ".join(long)
