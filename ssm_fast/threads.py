"""How many threads a call of ssm_fast uses (pool.py runs them).

A call with more than one thread wakes helper threads and, at its end, waits for the task each
helper is running. On a quiet machine that costs tens of microseconds; on a machine whose cores
are shared with other busy processes (a CI runner, a laptop, a notebook server) a helper may not
be scheduled for milliseconds. A call whose work is a fraction of a millisecond therefore runs on
the calling thread alone: :func:`count` gives 1 when the call's estimated single-thread time is
below config.SERIAL_BELOW_S (measured: docs/FAST.md, "Threads"). Either way the same task
functions run over the same fixed partition of the work, so the thread count never changes the
bits.

The thread count of the others is :func:`get_num_threads`: ``set_num_threads(n)`` when called,
else ``NUMBA_NUM_THREADS`` (numba's setting, the number of cores by default).
"""

from __future__ import annotations

import numba

from . import config

__all__ = ["count", "estimate_seconds", "get_num_threads", "set_num_threads"]

_threads: int | None = None


def get_num_threads() -> int:
    """The most threads a call uses: set_num_threads's value, else numba's NUMBA_NUM_THREADS."""
    return _threads if _threads is not None else int(numba.config.NUMBA_NUM_THREADS)


def set_num_threads(n: int | None) -> None:
    """Use at most ``n`` threads per call from now on (the calling thread and n - 1 helpers), for
    every thread of the process; None goes back to NUMBA_NUM_THREADS. Results do not depend on it."""
    global _threads
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n: expected an integer >= 1 or None, got {n!r}")
    _threads = n


def estimate_seconds(d, op: str) -> float:
    """The single-thread time of a call, estimated from its state updates S*T*H*P*N (T counted as
    at least 1) and its state elements S*H*P*N, with the measured costs of config."""
    key = ("mamba1" if d.mamba1 else "mamba2", op)
    states = d.S * d.H * d.P * d.N
    return config.SECONDS_PER_UPDATE[key] * states * max(d.T, 1) + config.SECONDS_PER_STATE[key] * states


def count(d, op: str, n_tasks: int) -> int:
    """Threads for one call: 1 below the work threshold, else get_num_threads() (at most one per
    task)."""
    if n_tasks < 2 or estimate_seconds(d, op) < config.SERIAL_BELOW_S:
        return 1
    return max(1, min(n_tasks, get_num_threads()))
