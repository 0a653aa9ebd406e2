"""The one table of sizes: the arrays a call binds (inputs, outputs) and the scratch its
recording requests, in float32 elements. The workspace allocates by it, the memory budget counts
by it, and the recordings ask for exactly these."""

from __future__ import annotations

from ssm_ref import Dims

from .chunked import NOT_SCRATCH, scratch_elems
from .m1 import M1Plan
from .sequential import Plan, chunk_dims

__all__ = ["input_shapes", "output_shapes", "chunked_scratch", "sequential_scratch", "time_chunk_scratch", "m1_scratch",
           "FLAG_ELEMS", "DUMMY_BYTES"]

FLAG_ELEMS = 4      # the chunked kernels' non-finite flag
DUMMY_BYTES = 16    # the stand-in binding of an empty array


def input_shapes(d: Dims, backward: bool) -> dict[str, tuple]:
    """The float inputs of a call, by name (A in the shape the planner binds: (H,) or (H, N))."""
    shapes = {"s": (d.R, d.H, d.P, d.N), "x": (d.S, d.T, d.H, d.P), "dt": (d.S, d.T, d.H),
              "A": (d.H, d.N) if d.mamba1 else (d.H,), "B": (d.S, d.T, d.G, d.N), "C": (d.S, d.T, d.G, d.N)}
    if backward:
        shapes.update(g_y=(d.S, d.T, d.H, d.P), g_states=(d.S, d.H, d.P, d.N))
    return shapes


def output_shapes(d: Dims, backward: bool) -> dict[str, tuple]:
    """The outputs of a call, by name, in the order the results list them."""
    if not backward:
        return {"y": (d.S, d.T, d.H, d.P), "states": (d.S, d.H, d.P, d.N)}
    return {"d_s": (d.R, d.H, d.P, d.N), "d_s0": (d.S, d.H, d.P, d.N), "d_x": (d.S, d.T, d.H, d.P),
            "d_dt": (d.S, d.T, d.H), "d_A": tuple(d.a_shape), "d_B": (d.S, d.T, d.G, d.N),
            "d_C": (d.S, d.T, d.G, d.N)}


def chunked_scratch(d: Dims, pl: Plan, backward: bool) -> dict[str, int]:
    """The chunked kernels' scratch, as their recording requests it."""
    cp = pl.chunked
    e = scratch_elems(d, cp.CL, cp.Sw, backward, cp.headloop)
    out = {k: v for k, v in e.items() if k not in NOT_SCRATCH}
    if backward:
        out.update(st=d.S * d.H * d.P * d.N, dAp=d.S * d.H * cp.NCH)
    return out


def sequential_scratch(d: Dims, pl: Plan) -> dict[str, int]:
    """The token-sequential backward's scratch, as its recording requests it."""
    if not (pl.windows and d.H * d.P > 0):
        return {}
    lay = pl.layout
    row = d.H * d.P * d.N
    wmax = max(pl.windows, key=lambda w: w.S * w.T)
    nc_max = max(-(-w.T // lay.K) for w in pl.windows)
    sw_max = max(w.S for w in pl.windows)
    out = {"st": d.S * row, "dAp": d.S * d.H * d.P * (d.N if d.mamba1 else 1),
           "part_B": wmax.S * wmax.T * lay.partial_heads(d.H) * lay.NPB * d.N,
           "part_C": wmax.S * wmax.T * lay.partial_heads(d.H) * lay.NPB * d.N,
           "part_dt": wmax.S * wmax.T * d.H * lay.NPB}
    n_ck = sum(1 for w in pl.windows if w.i0 == 0) if pl.time_split else 1
    for k in range(n_ck):
        out[f"ck{k}"] = sw_max * row * nc_max
    return out


def time_chunk_scratch(d: Dims, pl: Plan, backward: bool = False) -> dict[str, int]:
    """The scratch of the forward parallel over time, in the order its recording requests it:
    every chunk's contribution (then its initial state), every chunk's decay, the non-finite flag.
    The backward's: the chunks' initial states (b: also the running states of the checkpoint
    pass), their decays, their adjoint contributions (then the adjoint each starts from), the
    sequences' initial states, the flag, and then the token-sequential backward's of the chunks
    as sequences (but its running states, which are b)."""
    nch = d.T // pl.tchunk
    chunks = d.S * nch * d.H * d.P * d.N
    out = {"b": chunks, "dec": d.S * nch * d.H * (d.N if d.mamba1 else 1)}
    if backward:
        out.update(lam=chunks, st=d.S * d.H * d.P * d.N)
    out["flag"] = FLAG_ELEMS
    if backward:
        seq = sequential_scratch(chunk_dims(d, pl.tchunk), pl)
        out.update({f"seq:{k}": v for k, v in seq.items() if k != "st"})
    return out


def m1_scratch(d: Dims, mp: M1Plan, backward: bool, softplus: int = 0) -> dict[str, int]:
    """The scratch of the Mamba-1 kernels with time in threads (record/m1.py), in the order its
    recording requests it. Forward: the flag, over time chunks the slices' parts (agg) and each
    chunk's contribution and decay (one chunk, one pass: none of them), and with the accurate step
    (``softplus`` 1) the steps the first walk keeps for the second. Backward: the flag, the
    sequences' initial states (when the cache rows are copied), over time chunks each chunk's
    contribution, decay and adjoint contribution, then the d_B / d_C partials per channel block
    and d_A's per chunk."""
    chunks = d.S * mp.NCH * d.H * d.N
    out = {"flag": FLAG_ELEMS}
    if not backward:
        if mp.NCH > 1:
            out.update(agg=mp.agg_elems(d), cb=chunks, cdec=chunks)
        if softplus == 1:
            out["step"] = d.S * d.T * d.H
        return out
    out["st"] = d.S * d.H * d.N
    if mp.NCH > 1:
        out.update(cb=chunks, cdec=chunks, cbl=chunks)
    part = d.S * d.T * mp.NRB * d.N
    out.update(part_B=part, part_C=part, dAp=chunks)
    return out
