"""How ssm_fast's parallel kernels meet Python threads and fork (docs/RELIABILITY.md, "Threads").

numba runs ``parallel=True`` kernels on a threading layer it picks at the first parallel launch
(``NUMBA_THREADING_LAYER`` may choose it):

- ``workqueue`` aborts the whole process when two Python threads launch parallel kernels at the
  same time; ``omp`` and ``tbb`` are thread-safe. :func:`launching` therefore serialises launches
  unless the active layer is a thread-safe one (the first launch, which picks the layer, included).
- GNU OpenMP is not fork-safe: in a process forked after its ``omp`` layer started, numba
  terminates the process at the first parallel launch. :func:`unusable` says so in such a child,
  and ssm_fast's public functions then compute with ssm_ref instead (logged once; the result says
  ``backend == "ssm_ref"``). Use the ``spawn`` start method, or ``tbb`` / ``workqueue``, to keep
  the kernels in child processes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

import numba

__all__ = ["THREAD_SAFE_LAYERS", "launching", "unusable"]

THREAD_SAFE_LAYERS = frozenset({"omp", "tbb"})

log = logging.getLogger("ssm_fast")
_lock = threading.Lock()
_thread_safe = False
_forked_after_gnu_omp = False


def _layer() -> str | None:
    """The threading layer numba uses in this process; None before the first parallel launch."""
    try:
        return numba.threading_layer()
    except ValueError:
        return None


def launching():
    """The context one kernel launch runs in: the process-wide lock, unless the active threading
    layer is known to be thread-safe."""
    global _thread_safe
    if not _thread_safe and _layer() in THREAD_SAFE_LAYERS:
        _thread_safe = True
    return contextlib.nullcontext() if _thread_safe else _lock


def unusable() -> str:
    """Why this process must not launch ssm_fast's kernels, or "" when it may."""
    if _forked_after_gnu_omp:
        return ("this process was forked after numba's OpenMP layer (GNU OpenMP, not fork-safe) started in its "
                "parent; a parallel kernel would terminate it")
    return ""


def _gnu_omp_started() -> bool:
    if _layer() != "omp":
        return False
    try:
        from numba.np.ufunc import omppool
    except ImportError:
        return True  # cannot tell the vendor: assume the unsafe one
    return getattr(omppool, "openmp_vendor", "GNU") == "GNU"


def _after_fork_in_child() -> None:
    global _lock, _forked_after_gnu_omp
    _lock = threading.Lock()  # a parent thread may have held it at the fork
    _forked_after_gnu_omp = _gnu_omp_started()


os.register_at_fork(after_in_child=_after_fork_in_child)
