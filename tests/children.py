"""Environments for the Python subprocesses the reliability tests start."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child_env(*first: str, **variables: str) -> dict:
    """This process's environment for a child interpreter that imports the checkout: ``first``
    dirs, then this process's PYTHONPATH (a GPU host puts the ``vulkan`` binding there), then the
    checkout; plus ``variables``."""
    inherited = os.environ.get("PYTHONPATH", "")
    path = os.pathsep.join(p for p in (*first, inherited, str(REPO)) if p)
    return {**os.environ, "PYTHONPATH": path, **variables}
