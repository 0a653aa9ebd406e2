"""Work a test module starts ahead that runs once per session, however many pytest-xdist workers
run the tests that read it: every worker collects every test, so a module fixture that starts work
for the module's tests would otherwise start it in each worker that runs one of them. The first
process to claim a unit (a folder made in the folder all workers share) runs it and publishes its
result as JSON in that folder; every test waits for the file."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def shared_dir(tmp_path_factory, name: str) -> Path:
    """``name`` in the folder all of the session's processes see: under pytest-xdist, the parent
    of the workers' own base folders; otherwise the base folder."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    folder.mkdir(exist_ok=True)
    return folder


def claim(folder: Path) -> bool:
    """Make ``folder``: True for the one process that made it (it runs the unit), False for the rest."""
    try:
        folder.mkdir()
    except FileExistsError:
        return False
    return True


def publish(folder: Path, result) -> None:
    """Write ``result`` (JSON-ready) for wait(), atomically."""
    (folder / "result.part").write_text(json.dumps(result))
    (folder / "result.part").rename(folder / "result.json")


def wait(folder: Path, timeout_s: float):
    """The result published in ``folder``; TimeoutError after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while not (folder / "result.json").exists():
        if time.monotonic() > end:
            raise TimeoutError(f"no result in {folder} within {timeout_s:.0f} s from the process that claimed it")
        time.sleep(0.05)
    return json.loads((folder / "result.json").read_text())
