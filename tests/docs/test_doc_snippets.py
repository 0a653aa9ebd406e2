"""Every ```python block of README.md and docs/*.md runs as written.

Each block runs in a fresh interpreter of its own whose working directory is an empty temporary one,
as a user would paste it: it may import the installed packages (the checkout, through PYTHONPATH)
but not read files of the repository. A block that defines ``test_...`` functions is a test a user
pastes into a test file: it is written to ``test_snippet.py`` and run with pytest, and its tests
must pass (none skipped). Blocks assert what they claim, so a block that runs but computes
something else fails too. docs/archive/ is history and is not run. Blocks that import torch or jax
are skipped where it is not installed, unless SSM_REQUIRE_TORCH=1 / SSM_REQUIRE_JAX=1.

The blocks of one doc that are scripts run one after the other in one interpreter, each in a
fresh namespace and its own empty directory (snippets.run_blocks: torch and the rest imported once,
not once per block); one that fails there is run again alone in a fresh interpreter, and that
result counts. The interpreters are started together, as many at once as there are CPUs (each test
then waits for its own block): the test process would otherwise sit idle while one block runs on
one core.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from children import REPO, child_env
from snippets import DEFINES_TESTS, python_blocks, run_block, run_blocks

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]  # not docs/archive/
TIMEOUT_S = 240  # a cold numba cache compiles ssm_fast's kernels first (ssm_fast.compiling.FIRST_COMPILE_S)


BLOCKS = [(p, line, code) for p in DOCS for line, code in python_blocks(p)]

# Blocks that use PyTorch (docs/TORCH.md) or JAX (docs/JAX.md) run where it is installed; elsewhere
# they are skipped, unless SSM_REQUIRE_TORCH=1 / SSM_REQUIRE_JAX=1 (CI) says they must run.
_OPTIONAL = {name: (re.compile(rf"^\s*(import|from) (ssm_)?{name}\b", re.MULTILINE), f"SSM_REQUIRE_{name.upper()}")
             for name in ("torch", "jax")}


def _missing_optional(code: str) -> str | None:
    for name, (uses, require) in _OPTIONAL.items():
        if uses.search(code) and importlib.util.find_spec(name) is None and os.environ.get(require, "").strip() != "1":
            return name
    return None


def test_the_extractor_finds_the_blocks(tmp_path):
    md = tmp_path / "x.md"
    md.write_text("text\n```python\na = 1\n```\n\n```sh\nls\n```\n  ```python\n  b = 2\n  ```\n```\nplain\n```\n")
    assert python_blocks(md) == [(2, "a = 1\n"), (9, "b = 2\n")]
    assert len([b for b in BLOCKS if b[0].name == "README.md"]) >= 4
    assert {p.name for p, _, _ in BLOCKS} >= {"README.md", "API.md", "PORTING.md", "VULKAN.md"}


def _shared_dir(tmp_path_factory) -> Path:
    """A folder all of the session's processes see: under pytest-xdist, the parent of the
    workers' own base folders (each worker has one of them)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _run_and_save(run, folder: Path, *args) -> None:
    """Run a unit's blocks and publish (what failed, output) of each, atomically, in folder."""
    results = run(*args)
    (folder / "results.part").write_text(json.dumps(results if run is run_blocks else [results]))
    (folder / "results.part").rename(folder / "results.json")


def _wait_for(folder: Path, i: int, timeout_s: float) -> tuple[str, str]:
    end = time.monotonic() + timeout_s
    while not (folder / "results.json").exists():
        if time.monotonic() > end:
            return f"no result within {timeout_s:.0f} s from the process that started the block", ""
        time.sleep(0.05)
    return tuple(json.loads((folder / "results.json").read_text())[i])


@pytest.fixture(scope="module")
def started(request, tmp_path_factory):
    """The selected blocks that can run here, each in its own empty directory: a doc's scripts
    together in one interpreter (run_blocks), each block of tests alone under pytest (run_block).
    Each of these units runs once in the session: under pytest-xdist every worker collects all the
    tests, and the first worker to claim a unit (a folder made in the workers' shared folder) starts
    it on its pool of one thread per CPU, in the order of the tests; any worker's test of a block
    waits for the result file. (path, line) -> a function that waits for run_block's result."""
    env = child_env()
    env.pop("SSM_VK_VALIDATION", None)  # as a user runs it: no validation layer
    chosen = [item.callspec.params for item in request.session.items
              if item.module is request.module and item.originalname == "test_the_python_block_runs"]
    chosen = [p for p in chosen if not _missing_optional(p["code"])]
    units = []  # (folder name, run, blocks)
    for p in chosen:
        where = f"{p['path'].relative_to(REPO)}-{p['line']}".replace("/", "-")
        if DEFINES_TESTS.search(p["code"]):
            units.append((where, run_block, [p]))
        elif not any(p in blocks for _, run, blocks in units if run is run_blocks):  # its doc's scripts
            units.append((where, run_blocks, [q for q in chosen if q["path"] == p["path"]
                                              and not DEFINES_TESTS.search(q["code"])]))
    shared = _shared_dir(tmp_path_factory) / "doc-blocks"
    shared.mkdir(exist_ok=True)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    pool = ThreadPoolExecutor(max_workers=max(1, cpus or 1))
    waits = {}
    for name, run, blocks in units:
        folder = shared / name
        try:
            folder.mkdir()  # the claim: whoever makes it runs the unit
        except FileExistsError:
            pass
        else:
            cwds = [tmp_path_factory.mktemp("block") for _ in blocks]
            args = ([b["code"] for b in blocks], sys.executable, cwds) if run is run_blocks else (
                blocks[0]["code"], sys.executable, cwds[0])
            pool.submit(_run_and_save, run, folder, *args, env, TIMEOUT_S)
        budget_s = 2 * len(blocks) * TIMEOUT_S
        for i, b in enumerate(blocks):
            waits[b["path"], b["line"]] = lambda folder=folder, i=i, budget_s=budget_s: _wait_for(folder, i, budget_s)
    yield waits
    pool.shutdown(wait=True)  # other workers may wait for the units started here


@pytest.mark.parametrize(("path", "line", "code"), BLOCKS,
                         ids=[f"{p.relative_to(REPO)}:{line}" for p, line, _ in BLOCKS])
def test_the_python_block_runs(path, line, code, started):
    where = f"{path.relative_to(REPO)}:{line}"
    missing = _missing_optional(code)
    if missing:
        pytest.skip(f"{where} uses {missing}, which is not installed (docs/{missing.upper()}.md, 'Install')")
    failed, out = started[path, line]()
    if failed:
        pytest.fail(f"{where}: {failed}\n{out}", pytrace=False)
