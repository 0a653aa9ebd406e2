"""The Python blocks of the Markdown docs, and how one is run as a user pastes it: shared by
tests/docs/test_doc_snippets.py (the checkout) and tests/install/smoke.py (an installed package).
Standard library only: the smoke suite imports it beside an installed ssm-scan."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
DEFINES_TESTS = re.compile(r"^def test_\w*\(", re.MULTILINE)


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
    if DEFINES_TESTS.search(code):
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


# What the interpreter of run_blocks runs: each block in its own directory (its working directory
# and sys.path[0], as ``python snippet.py`` there has), in a fresh namespace, its output captured;
# one JSON line per block on the results file, written as it ends: [what failed or "", output].
_RUNNER = """
import contextlib, io, json, os, sys, traceback
blocks, results = json.load(open(sys.argv[1])), open(sys.argv[2], "a")
for where, code in blocks:
    os.chdir(where)
    sys.path[0] = where
    f = os.path.join(where, "snippet.py")
    out, failed = io.StringIO(), ""
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            exec(compile(code, f, "exec"), {"__name__": "__main__", "__file__": f, "__builtins__": __builtins__})
        except SystemExit as e:
            if e.code not in (None, 0):
                failed = f"the block exited with status {e.code}"
        except BaseException:
            failed = "the block raised"
            traceback.print_exc()
    results.write(json.dumps([failed, out.getvalue()]) + "\\n")
    results.flush()
"""


def run_blocks(codes: list[str], python: str, cwds: list[Path], env: dict | None, timeout_s: float
               ) -> list[tuple[str, str]]:
    """Run script blocks (none defines ``test_...`` functions) one after the other in one fresh
    interpreter, each in its own empty directory ``cwds[i]`` and a fresh namespace: an interpreter
    start and the imports (torch: some 3 s) paid once instead of once per block. A block that does
    not pass there (or that the interpreter never reached) is run again by run_block, alone in a
    fresh interpreter, and that result counts: a block passes only if it passes as a user pastes it
    after the doc's blocks before it, or alone. Returns run_block's (what failed, output) per block."""
    assert not any(DEFINES_TESTS.search(c) for c in codes), "blocks of tests run under pytest: run_block"
    for code, cwd in zip(codes, cwds, strict=True):
        (cwd / "snippet.py").write_text(code)
    listing, results = cwds[0].parent / f"{cwds[0].name}.blocks.json", cwds[0].parent / f"{cwds[0].name}.results"
    listing.write_text(json.dumps([[str(cwd), code] for code, cwd in zip(codes, cwds, strict=True)]))
    try:
        subprocess.run([python, "-c", _RUNNER, listing, results], cwd=cwds[0], env=env, capture_output=True,
                       timeout=timeout_s * len(codes), check=False)
    except subprocess.TimeoutExpired:
        pass
    done = [tuple(json.loads(line)) for line in results.read_text().splitlines()] if results.exists() else []
    return [r if i < len(done) and not (r := done[i])[0] else run_block(code, python, cwd, env, timeout_s)
            for i, (code, cwd) in enumerate(zip(codes, cwds, strict=True))]
