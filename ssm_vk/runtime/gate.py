"""A call's queue submissions ordered on the GPU against another API's work, without the host
waiting in between: the submissions made on this thread and context inside ``with gated(gate)``
wait for a value of the gate's timeline semaphore (which the other API signals once its writes are
done) and each signal a new value of it, which :meth:`Gate.submitted` hands to the other side at
once, before the host waits for anything -- so the other API queues its reads after the work
while the GPU still runs it.

ssm_torch/cuda.py holds the gate around an ssm_vk call on CUDA tensors (CUDA signals the entry
value on torch's stream after its copies into the shared memory, and waits on the stream for each
value signalled before copying the outputs out). One gate per call; the values come from the
semaphore's owner (``next_value``), which makes them grow in the order they are signalled.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

__all__ = ["Gate", "current", "gated"]

_local = threading.local()


class Gate:
    """``semaphore`` (an external.TimelineSemaphore of ``ctx``): each gated submission waits until
    it reaches ``entry``, then signals ``next_value()`` when its commands are done, and
    ``submitted(value, internal)`` is called with that value right after the submission is queued
    (on the submitting thread, before any wait for it); ``internal``: the runtime's own transfer
    (commands.oneshot: an upload, a copy), not one of the call's recorded sequences."""

    __slots__ = ("ctx", "entry", "next_value", "semaphore", "submitted")

    def __init__(self, ctx, semaphore, entry: int, next_value: Callable[[], int],
                 submitted: Callable[[int, bool], None]):
        self.ctx, self.semaphore, self.entry = ctx, semaphore, entry
        self.next_value, self.submitted = next_value, submitted


@contextlib.contextmanager
def gated(gate: Gate) -> Iterator[Gate]:
    """Gate this thread's submissions to ``gate.ctx`` for the block (blocks nest: the inner wins)."""
    outer = getattr(_local, "gate", None)
    _local.gate = gate
    try:
        yield gate
    finally:
        _local.gate = outer


def current(ctx) -> Gate | None:
    """The gate of this thread's submissions to ``ctx``, if any."""
    gate = getattr(_local, "gate", None)
    return gate if gate is not None and gate.ctx is ctx else None
