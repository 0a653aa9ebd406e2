"""A one-line note on stderr when ssm_fast's kernels are compiled, and where numba caches them.

numba compiles a kernel the first time a process needs it and no usable copy is in its on-disk
cache; that takes seconds (all kernels: about :data:`FIRST_COMPILE_S` s on two cores), during which
a first call looks like a hang. numba announces every compilation that is not a cache hit through its event API
(``numba:compile``); :func:`install` listens, and on the first such event of an ssm_fast function
in the process prints one line to stderr. Set ``SSM_FAST_QUIET=1`` to silence it; call
``ssm_fast.warmup()`` to compile everything at a time of your choosing.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from numba.core import event

__all__ = ["FIRST_COMPILE_S", "cache_dir", "install"]

# Seconds to compile every kernel in a cold process on two cores, as measured by
# benchmarks/compile_time.py: docs/FAST.md, "Compile cost". The message below and the docs quote this figure
# (tests/docs/test_docs_figures.py holds them to it); measure again and change it here when the kernels change.
FIRST_COMPILE_S = 15

_said = False


def cache_dir() -> str:
    """Where numba keeps ssm_fast's compiled kernels: NUMBA_CACHE_DIR when set, else the
    package's __pycache__ when writable, else numba's per-user fallback."""
    env = os.environ.get("NUMBA_CACHE_DIR")
    if env:
        return env
    here = Path(__file__).resolve().parent / "__pycache__"
    try:
        here.mkdir(exist_ok=True)
        with tempfile.TemporaryFile(dir=here):
            pass
        return str(here)
    except OSError:
        from numba.misc.appdirs import AppDirs
        return str(Path(AppDirs(appname="numba", appauthor=False).user_cache_dir))


def writable(path: str) -> bool:
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
        return True
    except OSError:
        return False


class _Listener(event.Listener):
    def on_start(self, ev):
        global _said
        if _said:
            return
        disp = (ev.data or {}).get("dispatcher")
        module = getattr(getattr(disp, "py_func", None), "__module__", "") or ""
        if not module.startswith("ssm_fast.") or os.environ.get("SSM_FAST_QUIET"):
            return
        _said = True
        where = cache_dir()
        note = f"cached in {where}" if writable(where) else f"NOT cached: {where} is not writable, set NUMBA_CACHE_DIR"
        print(f"compiling ssm_fast kernels (first use, about {FIRST_COMPILE_S} s; {note}) ...",
              file=sys.stderr, flush=True)

    def on_end(self, ev):
        pass


def install() -> None:
    event.register("numba:compile", _Listener())
