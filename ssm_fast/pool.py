"""ssm_fast's threads: the calling thread and helper threads take tasks from a shared counter.

Every kernel has one driver, compiled with ``nogil=True``: it takes the next task number from a
counter (an atomic fetch-and-add on a one-element int64 array) and runs that task, until none are
left. A call runs the driver on the calling thread; when it is worth it (threads.serial) it first
hands the same counter to up to ``threads - 1`` helper threads, which run the driver too. Which
thread runs a task never changes what the task computes, so the results are the same bits for any
number of threads.

Why not numba's ``parallel=True``: on a machine whose cores are shared with other busy processes
a parallel region waits for its slowest thread, and GNU OpenMP's spinning wait keeps descheduled
partners off the cores (docs/FAST.md, "Threads"); here an idle helper sleeps, the caller always
works, and a helper that is not scheduled simply takes fewer tasks. A ``prange`` kernel also
takes several times as long to compile as its serial twin (docs/FAST.md, "Compile cost"). Helpers are plain Python
threads (daemon), started on first use and started again in a forked child.
"""

from __future__ import annotations

import os
import threading
from collections import deque

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["fetch_add", "helper_runs", "run"]


@intrinsic
def fetch_add(typingctx, counter, value):
    """counter[0] += value, atomically; returns the old counter[0]. counter: 1-D int64 array."""
    if not (isinstance(counter, types.Array) and counter.dtype == types.int64 and counter.ndim == 1):
        return None
    sig = types.int64(counter, types.int64)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, signature.args[0], ary, [ir.Constant(ir.IntType(64), 0)])
        return builder.atomic_rmw("add", ptr, args[1], "monotonic")

    return sig, codegen


class _Job:
    __slots__ = ("args", "done", "error", "fn", "state")

    def __init__(self, fn, args):
        self.fn, self.args = fn, args
        self.state = "queued"          # -> "running" (a helper took it) or "dropped" (the caller did)
        self.error: BaseException | None = None
        self.done = threading.Event()


class _Pool:
    def __init__(self):
        self.lock = threading.Lock()
        self.ready = threading.Condition(self.lock)
        self.jobs: deque[_Job] = deque()
        self.helpers: list[threading.Thread] = []
        self.runs = 0                      # jobs helpers took (what the tests look at)

    def _helper(self):
        while True:
            with self.lock:
                while not self.jobs:
                    self.ready.wait()
                job = self.jobs.popleft()
                if job.state != "queued":
                    continue
                job.state = "running"
                self.runs += 1
            try:
                job.fn(*job.args)
            except BaseException as exc:  # handed to the caller
                job.error = exc
            job.done.set()

    def run(self, fn, args, helpers: int):
        with self.lock:
            while len(self.helpers) < helpers:
                t = threading.Thread(target=self._helper, name=f"ssm_fast-{len(self.helpers) + 1}", daemon=True)
                t.start()
                self.helpers.append(t)
            jobs = [_Job(fn, args) for _ in range(helpers)]
            self.jobs.extend(jobs)
            self.ready.notify(helpers)
        error = None
        try:
            fn(*args)
        except BaseException as exc:
            error = exc
        for job in jobs:
            with self.lock:
                if job.state == "queued":   # no helper came: the tasks are done without it
                    job.state = "dropped"
                    continue
            job.done.wait()
            error = error or job.error
        if error is not None:
            raise error


_pool = _Pool()


def run(fn, args, threads: int) -> None:
    """fn(*args) on the calling thread and on ``threads - 1`` helpers; fn's first argument is the
    task counter they share. Returns when every task is done; re-raises the first error."""
    if threads < 2:
        fn(*args)
    else:
        _pool.run(fn, args, threads - 1)


def helper_runs() -> int:
    """How many times a helper thread joined a call in this process (since the last fork)."""
    return _pool.runs


def _reset_after_fork():
    global _pool
    _pool = _Pool()  # the parent's helper threads do not exist in the child


os.register_at_fork(after_in_child=_reset_after_fork)
