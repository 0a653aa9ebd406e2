"""Every ```python block of README.md and docs/*.md runs as written.

Each block runs in a fresh interpreter of its own whose working directory is an empty temporary one,
as a user would paste it: it may import the installed packages (the checkout, through PYTHONPATH)
but not read files of the repository. A block that defines ``test_...`` functions is a test a user
pastes into a test file: it is written to ``test_snippet.py`` and run with pytest, and its tests
must pass (none skipped). Blocks assert what they claim, so a block that runs but computes
something else fails too. docs/archive/ is history and is not run. Blocks that import torch or jax
are skipped where it is not installed, unless SSM_REQUIRE_TORCH=1 / SSM_REQUIRE_JAX=1.

The interpreters are started together, as many at once as there are CPUs (each test then waits for
its own block): the test process would otherwise sit idle while one block runs on one core.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from children import REPO, child_env
from snippets import python_blocks, run_block

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


@pytest.fixture(scope="module")
def started(request, tmp_path_factory):
    """The selected blocks that can run here, each started in its own empty directory on a pool of
    one worker per CPU, in the order of the tests: (path, line) -> future of run_block's result."""
    env = child_env()
    env.pop("SSM_VK_VALIDATION", None)  # as a user runs it: no validation layer
    chosen = [item.callspec.params for item in request.session.items
              if item.module is request.module and item.originalname == "test_the_python_block_runs"]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    pool = ThreadPoolExecutor(max_workers=max(1, cpus or 1))
    futures = {(p["path"], p["line"]): pool.submit(run_block, p["code"], sys.executable,
                                                   tmp_path_factory.mktemp("block"), env, TIMEOUT_S)
               for p in chosen if not _missing_optional(p["code"])}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize(("path", "line", "code"), BLOCKS,
                         ids=[f"{p.relative_to(REPO)}:{line}" for p, line, _ in BLOCKS])
def test_the_python_block_runs(path, line, code, started):
    where = f"{path.relative_to(REPO)}:{line}"
    missing = _missing_optional(code)
    if missing:
        pytest.skip(f"{where} uses {missing}, which is not installed (docs/{missing.upper()}.md, 'Install')")
    failed, out = started[path, line].result()
    if failed:
        pytest.fail(f"{where}: {failed}\n{out}", pytrace=False)
