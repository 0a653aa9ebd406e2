"""The docs' account of the golden vectors is the one `ssm-scan vectors` writes: docs/PORTING.md's
table of the cases names every case the command writes, in its order, and no sentence of README.md
or docs/ about the golden vectors gives a count of cases other than the number written (the docs
said "ten fixed cases" while the command wrote fourteen). docs/archive/ and docs/results/ are
records and are left as they are."""

from __future__ import annotations

import json
import re

from children import REPO

from ssm_cli.main import main

DOCS = [REPO / "README.md", *sorted(p for p in (REPO / "docs").rglob("*.md")
                                    if not {"archive", "results"} & set(p.relative_to(REPO / "docs").parts))]
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"]
# "<count> [fixed|golden|stored] cases|points|vectors": a count of the golden cases where the
# paragraph (or table row) speaks of the golden vectors, verify or `ssm-scan vectors`
_COUNT = re.compile(r"\b(\d+|" + "|".join(WORDS) + r")\s+(?:(?:fixed|golden|stored)\s+)*(?:cases|points|vectors)\b",
                    re.IGNORECASE)
_ABOUT = re.compile(r"golden|ssm-scan vectors|verify\(", re.IGNORECASE)


def written(tmp_path) -> list[str]:
    """The cases `ssm-scan vectors` writes, by name, from its manifest."""
    assert main(["vectors", "--out", str(tmp_path)]) == 0
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    return [c["name"] for c in manifest["cases"]]


def counts(text: str) -> list[tuple[int, str]]:
    """(count, phrase) for every count of cases in the paragraphs and table rows of ``text`` that
    are about the golden vectors."""
    found = []
    for block in re.split(r"\n\s*\n|\n(?=\|)", text):
        if _ABOUT.search(block):
            for m in _COUNT.finditer(block):
                n = m.group(1).lower()
                found.append((int(n) if n.isdigit() else WORDS.index(n), " ".join(m.group(0).split())))
    return found


def test_the_count_finder_sees_what_it_must():
    assert counts("`ssm-scan vectors` writes ten fixed cases\n(T = 0, ...)") == [(10, "ten fixed cases")]
    assert counts("| golden vectors | any | 14 cases |\n| fuzz | x | eleven properties |") == [(14, "14 cases")]
    assert counts("Golden vectors are fourteen points; bugs hide") == [(14, "fourteen points")]
    assert counts("100,000 points per range") == []     # not about the golden vectors


def test_the_docs_name_no_other_count_of_golden_cases(tmp_path):
    n = len(written(tmp_path))
    stale = [f"{p.relative_to(REPO)}: '{phrase}'" for p in DOCS for count, phrase in counts(p.read_text())
             if count != n]
    assert not stale, f"`ssm-scan vectors` writes {n} cases; the docs say otherwise: " + "; ".join(stale)


def test_porting_lists_every_case_written(tmp_path):
    text = (REPO / "docs" / "PORTING.md").read_text()
    table = text.split("### The cases", 1)[1].split("\n\n", 2)[1]
    listed = re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE)
    assert listed == written(tmp_path)
