"""What a Mamba-3 call of one shape holds on the device, for its support decision
(mamba3_api.decide) and the figures the docs quote (tests/docs/test_docs_figures.py): every buffer
it acquires or hands out, an upper bound (:func:`sizes`); where the arrays of tokens beyond one
allocation are cut into pieces, at the chunked kernels' windows (:func:`pieces`); and the memory
budget over both (:func:`memory`). Pure functions of the dims, the plan and the limits."""

from __future__ import annotations

from . import budget
from .mamba3_workspace import COPIED, STATE_PARTS
from .sizing import F32, piece_cap, window_cuts

__all__ = ["memory", "pieces", "sizes"]


def _elems(d, backward: bool, scratch: dict) -> dict:
    """Float32 elements of every buffer a call of dims ``d`` acquires in its workspace or hands out
    (``scratch``: its family's, the backward's joint outputs included), by name, an upper bound:
    every input uploaded, update_cache's copies of the final state counted."""
    S, T, H, P, N, G, M, F, R = d.S, d.T, d.H, d.P, d.N, d.G, d.M, d.F, d.R
    th, bn = S * T * H, S * T * M * G * N
    rows = dict(zip(STATE_PARTS, (H * F, H * P * N, H * M * N, H * M * P), strict=True))
    n = {"in:x": th * P, "in:dt": th, "in:dA": th, "in:lam": th, "in:B": bn, "in:C": bn, "in:B_bias": H * M * N,
         "in:C_bias": H * M * N, "in:dtheta": th * F, "in:psi": H * M * P, "ids": S,
         **{f"in:s_{k}": R * row for k, row in rows.items()}}
    if backward:
        n.update({"in:g_y": S * T * M * H * P, "g_state": S * sum(rows.values()), "out:d_x": th * P, "out:d_dt": th,
                  "out:d_dA": th, "out:d_lam": th, "out:d_B": bn, "out:d_C": bn, "out:d_B_bias": H * M * N,
                  "out:d_C_bias": H * M * N, "out:d_dtheta": th * F, "out:d_psi": H * M * P,
                  **{f"out:d_s_{k}": R * row for k, row in rows.items()},
                  **{f"d0:{k}": S * row for k, row in rows.items()}})
    else:
        n.update({"out:y": S * T * M * H * P, **{f"out:{k}": S * row for k, row in rows.items()},
                  **{f"fin:{k}": S * row for k, row in rows.items()}})
    n.update(scratch)
    return n


def sizes(d, backward: bool, fp) -> dict:
    """Bytes of every buffer a call holds, by name (the memory budget's input): its workspace's
    and, where a flagged call is computed again on the device, the recompute's workspace's (each
    buffer its own allocation: the budget checks the largest against maxMemoryAllocationSize)."""
    n = _elems(d, backward, fp.family.scratch(d, fp.plan, backward))
    rerun = fp.device_rerun   # (a flagged call is computed again on the recompute's plan, in its own workspace)
    if rerun is not None:
        n.update({"rerun:" + k: v for k, v in _elems(d, backward, rerun.family.scratch(d, rerun.plan,
                                                                                        backward)).items()})
    return {k: 4 * v for k, v in n.items() if v}


def pieces(d, fp, lim, sizes: dict) -> tuple[dict, str]:
    """({workspace buffer name ("in:x", "out:y", ...): byte offsets of its pieces} of the buffers of
    ``sizes`` beyond one allocation, ""), or ({}, why the call cannot hold one so): only arrays of
    tokens that the chunked kernels bind window by window are held in pieces, cut at their windows
    (mamba3_chunked_planner.piece_cuts)."""
    cap = piece_cap(lim)
    big = [k for k, n in sizes.items() if n > cap]
    if not big:
        return {}, ""
    per = dict(getattr(fp.plan, "per_token", ()))
    per.update({k: d.H for k in COPIED} if per else {})   # (written by copies: cut at the windows too)
    out = {}
    for key in big:
        where, _, name = key.rpartition(":")
        what = (f"{name} needs a buffer of {sizes[key]} bytes, above one allocation (maxMemoryAllocationSize "
                f"{lim.max_memory_allocation_size} bytes)")
        if where not in ("in", "out") or name not in per or not fp.plan.windowed:
            return {}, f"{what}, and only the arrays of tokens of the chunked kernels' windows are held in pieces"
        row = per[name] * F32   # (the windows cover the array in order: sequences, or each one's tokens)
        starts, why = window_cuts([((w.s0 * d.T + w.t0) * row, (w.s0 * d.T + w.t0 + w.n * w.nt) * row)
                                   for w in fp.plan.windows], cap)
        if why:
            return {}, f"{what}, and a window of it {why}"
        out[key] = starts
    return out, ""


def memory(d, backward: bool, fp, lim, info, live_allocations: int = 0) -> tuple[dict, str]:
    """(where the buffers beyond one allocation are cut: {name: byte offsets}, "") when the buffers
    of a call of dims ``d`` under plan ``fp`` fit device ``info`` (budget.check: each allocation,
    the heap, the count besides ``live_allocations``), else ({}, why not)."""
    held = sizes(d, backward, fp)
    cuts, why = pieces(d, fp, lim, held)
    if why:
        return {}, why
    why = budget.check(info, held, live_allocations, {False: {k.rpartition(":")[2]: v for k, v in cuts.items()}})
    return ({}, why) if why else (cuts, "")
