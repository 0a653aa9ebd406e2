"""The documentation stands alone: every relative link of README.md and docs/ points at a file or
folder of the repository, and no file of the package, its tests or its docs refers to notes that
live outside it. docs/archive/ and docs/results/ are records and are left as they are."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from children import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Names of notes kept outside the repository; a reference to one is a dangling one for a user.
# (Spelled in pieces so that this file does not match itself.)
_NAMES = ["INTERFACE" + ".md", "SCAN" + ".md", "GPU" + ".md", "VULKAN" + "-NOTES", "../" + "shared", "shared" + "/spec"]
_OUTSIDE = re.compile("|".join(map(re.escape, _NAMES)))
_SOURCES = ("*.py", "*.md", "*.glsl", "*.comp", "*.sh", "*.toml", "Makefile")
_SKIP = {".git", ".venv", ".gl", ".whl", "build", "dist", "out", ".hypothesis", ".pytest_cache", "__pycache__"}


def _sources():
    for pattern in _SOURCES:
        for p in REPO.rglob(pattern):
            rel = p.relative_to(REPO)
            hidden = any(part.startswith(".") for part in rel.parts)   # .git, .venv, local folders
            if _SKIP & set(rel.parts) or hidden or rel.parts[:2] in {("docs", "archive"), ("docs", "results")}:
                continue
            if p.is_file():
                yield p


def relative_links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link that is not a URL or an anchor."""
    out = []
    for no, line in enumerate(path.read_text().splitlines(), 1):
        for target in _LINK.findall(line):
            if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
                out.append((no, target.split("#")[0]))
    return out


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path):
    missing = [f"{path.relative_to(REPO)}:{no}: {t}" for no, t in relative_links(path)
               if not (path.parent / t).exists()]
    assert not missing, "links to nothing:\n" + "\n".join(missing)


def test_nothing_refers_to_notes_outside_the_repository(tmp_path):
    (tmp_path / "x.md").write_text("see " + _NAMES[4] + "/" + _NAMES[2] + "\n")  # the pattern catches it
    assert _OUTSIDE.search((tmp_path / "x.md").read_text())
    hits = []
    for p in _sources():
        for no, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if _OUTSIDE.search(line):
                hits.append(f"{p.relative_to(REPO)}:{no}: {line.strip()}")
    assert not hits, "references to notes outside the repository:\n" + "\n".join(hits)
