"""Every ```python block of README.md and docs/*.md runs as written.

Each block runs alone in a fresh interpreter whose working directory is an empty temporary one,
as a user would paste it: it may import the installed packages (the checkout, through PYTHONPATH)
but not read files of the repository. A block that defines ``test_...`` functions is a test a user
pastes into a test file: it is written to ``test_snippet.py`` and run with pytest, and its tests
must pass (none skipped). Blocks assert what they claim, so a block that runs but computes
something else fails too. docs/archive/ is history and is not run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from children import REPO, child_env

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]  # not docs/archive/
TIMEOUT_S = 240  # a cold numba cache compiles ssm_fast's kernels (~40 s on 2 cores) in the first block
_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_DEFINES_TESTS = re.compile(r"^def test_\w*\(", re.MULTILINE)


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """(line of the opening fence, code) for each ```python block of a Markdown file, in order."""
    blocks, start, lang, lines, indent = [], None, None, [], ""
    for no, line in enumerate(path.read_text().splitlines(), 1):
        m = _FENCE.match(line)
        if start is None:
            if m:
                start, indent, lang, lines = no, m.group(1), m.group(2), []
        elif m and not m.group(2):
            if lang == "python":
                blocks.append((start, "\n".join(lines) + "\n"))
            start = None
        else:
            lines.append(line[len(indent):] if line.startswith(indent) else line)
    assert start is None, f"{path.name}:{start}: a code block is never closed"
    return blocks


BLOCKS = [(p, line, code) for p in DOCS for line, code in python_blocks(p)]


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
    env = child_env()
    env.pop("SSM_VK_VALIDATION", None)  # as a user runs it: no validation layer
    if _DEFINES_TESTS.search(code):
        f = tmp_path / "test_snippet.py"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", f.name]
    else:
        f = tmp_path / "snippet.py"
        cmd = [sys.executable, f.name]
    f.write_text(code)
    try:
        p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                           check=False)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{where}: the block ran past {TIMEOUT_S} s\n{e.stdout or ''}{e.stderr or ''}", pytrace=False)
    out = p.stdout + p.stderr
    if p.returncode != 0:
        pytest.fail(f"{where}: the block exited with status {p.returncode}\n{out}", pytrace=False)
    if f.name.startswith("test_"):
        if not re.search(r"\b\d+ passed\b", p.stdout):
            pytest.fail(f"{where}: no test of the block passed\n{out}", pytrace=False)
        if "skipped" in p.stdout:
            pytest.fail(f"{where}: a test of the block was skipped\n{out}", pytrace=False)
