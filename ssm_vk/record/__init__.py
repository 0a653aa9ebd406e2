"""Recording a call's commands into a runtime Sequence: the token-sequential kernels
(:mod:`.sequential`, which hands the passes over time chunks to :mod:`.time_chunks`), the
Mamba-1 kernels with time in threads (:mod:`.m1`) or the chunked Mamba-2 kernels
(:mod:`.chunked`), as the workspace's plan says; :mod:`.common` holds
what they share."""

from __future__ import annotations

from ssm_ref import Problem

from . import chunked, m1, sequential
from .sequential import scatters_in_place

__all__ = ["record_forward", "record_backward", "scatters_in_place"]


def record_forward(seq, ws, p: Problem, bufs: dict, kept=None, scatter: bool = False) -> None:
    """Record the forward of ``p`` in workspace ``ws``; ``bufs`` maps s, x, dt, A, B, C, y, states
    to (buffer or None, element offset). ``scatter``: the final states into s[ids] instead
    (sequential.scatters_in_place)."""
    if ws.plan.chunked is not None:
        return chunked.record_forward(seq, ws, p, bufs)
    if ws.plan.m1 is not None:
        return m1.record_forward(seq, ws, p, bufs)
    return sequential.record_forward(seq, ws, p, bufs, scatter)


def record_backward(seq, ws, p: Problem, bufs: dict, kept=None) -> None:
    """Record the backward; ``bufs`` maps the inputs (s .. g_states) and the outputs (d_s .. d_C).
    ``kept``: the tables its chunked forward left (engine.KeptForward), bound instead of a
    recompute; None to recompute them."""
    if ws.plan.chunked is not None:
        return chunked.record_backward(seq, ws, p, bufs, kept)
    if ws.plan.m1 is not None:
        return m1.record_backward(seq, ws, p, bufs)
    return sequential.record_backward(seq, ws, p, bufs)
