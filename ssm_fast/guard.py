"""When ssm_fast cannot run its kernels in this process, and says why.

With ``NUMBA_DISABLE_JIT=1`` numba runs jitted functions as plain Python, and the kernels' LLVM
intrinsics (simd.task_function, pool.fetch_add) cannot run that way; a pure-Python scan would
also take minutes per call. :func:`unusable` then gives the reason, and ssm_fast's public
functions compute with ssm_ref instead (logged once on the ``ssm_fast`` logger; the result says
``backend == "ssm_ref"``).

Threads and fork need no guard: the kernels do not use numba's threading layer (pool.py), the
helper threads are started again in a forked child, and each call has its own task counter.
"""

from __future__ import annotations

import logging

import numba

__all__ = ["log", "unusable"]

log = logging.getLogger("ssm_fast")


def unusable() -> str:
    """Why this process must not launch ssm_fast's kernels, or "" when it may."""
    if numba.config.DISABLE_JIT:
        return ("NUMBA_DISABLE_JIT is set: numba runs the kernels as pure Python, which cannot run "
                "their LLVM intrinsics (and would take minutes per call)")
    return ""
