"""The Python blocks of the Markdown docs, and how one is run as a user pastes it: shared by
tests/docs/test_doc_snippets.py (the checkout) and tests/install/smoke.py (an installed package).
Standard library only: the smoke suite imports it beside an installed ssm-scan."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

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


def run_block(code: str, python: str, cwd: Path, env: dict | None, timeout_s: float) -> tuple[str, str]:
    """Run one block in a fresh interpreter ``python`` in the empty directory ``cwd``: a block
    that defines ``test_...`` functions as a test file under pytest (its tests must pass, none
    skipped), any other as a script. Returns ("", output) on success, (what failed, output)."""
    if _DEFINES_TESTS.search(code):
        f = cwd / "test_snippet.py"
        cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", f.name]
    else:
        f = cwd / "snippet.py"
        cmd = [python, f.name]
    f.write_text(code)
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        return f"the block ran past {timeout_s} s", f"{e.stdout or ''}{e.stderr or ''}"
    out = p.stdout + p.stderr
    if p.returncode != 0:
        return f"the block exited with status {p.returncode}", out
    if f.name.startswith("test_"):
        if not re.search(r"\b\d+ passed\b", p.stdout):
            return "no test of the block passed", out
        if "skipped" in p.stdout:
            return "a test of the block was skipped", out
    return "", out
