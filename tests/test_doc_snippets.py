"""Every ```python block of README.md and docs/*.md runs as written.

Each block runs alone in a fresh interpreter whose working directory is an empty temporary one,
as a user would paste it: it may import the installed packages (the checkout, through PYTHONPATH)
but not read files of the repository. A block that defines ``test_...`` functions is a test a user
pastes into a test file: it is written to ``test_snippet.py`` and run with pytest, and its tests
must pass (none skipped). Blocks assert what they claim, so a block that runs but computes
something else fails too. docs/archive/ is history and is not run. Blocks that import torch or jax
are skipped where it is not installed, unless SSM_REQUIRE_TORCH=1 / SSM_REQUIRE_JAX=1.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys

import pytest
from children import REPO, child_env
from snippets import python_blocks, run_block

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]  # not docs/archive/
TIMEOUT_S = 240  # a cold numba cache compiles ssm_fast's kernels (~40 s on 2 cores) in the first block


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


@pytest.mark.parametrize(("path", "line", "code"), BLOCKS,
                         ids=[f"{p.relative_to(REPO)}:{line}" for p, line, _ in BLOCKS])
def test_the_python_block_runs(path, line, code, tmp_path):
    where = f"{path.relative_to(REPO)}:{line}"
    missing = _missing_optional(code)
    if missing:
        pytest.skip(f"{where} uses {missing}, which is not installed (docs/{missing.upper()}.md, 'Install')")
    env = child_env()
    env.pop("SSM_VK_VALIDATION", None)  # as a user runs it: no validation layer
    failed, out = run_block(code, sys.executable, tmp_path, env, TIMEOUT_S)
    if failed:
        pytest.fail(f"{where}: {failed}\n{out}", pytrace=False)
