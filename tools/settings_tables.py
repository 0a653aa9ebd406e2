"""Writes the tables of ssm_vk's settings into the docs from their one declaration in
ssm_vk/config.py: the planner's knobs (``KNOBS``) into docs/KERNELS.md and the environment
variables (``ENV``) into docs/API.md, each between its two marker comments.

    python tools/settings_tables.py           rewrite the tables
    python tools/settings_tables.py --check   exit 1 if a table differs from what would be written

tests/docs/test_settings_tables.py runs the check.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ssm_vk import config  # noqa: E402

# (file, marker name, the table's text)
TABLES = (("docs/KERNELS.md", "knobs", config.knob_table_markdown),
          ("docs/API.md", "environment", config.env_table_markdown))


def markers(name: str) -> tuple[str, str]:
    return (f"<!-- {name} table: made from ssm_vk/config.py by tools/settings_tables.py -->\n",
            f"<!-- end of the {name} table -->\n")


def split(text: str, name: str, path: str) -> tuple[str, str, str]:
    """(before the table, the table, after it) of a doc's text."""
    start, end = markers(name)
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        raise SystemExit(f"{path}: the markers of the {name} table are missing")
    i += len(start)
    return text[:i], text[i:j], text[j:]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for path, name, make in TABLES:
        f = REPO / path
        before, table, after = split(f.read_text(), name, path)
        if table != make():
            stale.append(path)
            if not check:
                f.write_text(before + make() + after)
    if check and stale:
        print(f"out of date: {', '.join(stale)}; run: python tools/settings_tables.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
