"""The one table of the arrays a call binds (inputs, outputs), in float32 elements, and the sizes
every family's scratch shares. The workspace allocates by it and the memory budget counts by it;
each family's scratch, as its recording requests it, is in its planner (``<family>/<family>_planner.py``)."""

from __future__ import annotations

from ssm_ref import Dims

__all__ = ["input_shapes", "output_shapes", "FLAG_ELEMS", "DUMMY_BYTES"]

FLAG_ELEMS = 4      # the non-finite flag of the kernels that raise one (family.Family.flags)
DUMMY_BYTES = 16    # the stand-in binding of an empty array


def input_shapes(d: Dims, backward: bool) -> dict[str, tuple]:
    """The float inputs of a call, by name (A in the shape the planner binds: (H,) or (H, N))."""
    shapes = {"s": (d.R, d.H, d.P, d.N), "x": (d.S, d.T, d.H, d.P), "dt": (d.S, d.T, d.H),
              "A": (d.H, d.N) if d.mamba1 else (d.H,), "B": (d.S, d.T, d.G, d.N), "C": (d.S, d.T, d.G, d.N)}
    if backward:
        shapes.update(g_y=(d.S, d.T, d.H, d.P), g_states=(d.S, d.H, d.P, d.N))
        if d.K > 1:   # (a backward's K is that of the g_snapshots it was given)
            shapes["g_snapshots"] = (d.K, d.S, d.H, d.P, d.N)
    return shapes


def output_shapes(d: Dims, backward: bool) -> dict[str, tuple]:
    """The outputs of a call, by name, in the order the results list them."""
    if not backward:
        if d.K > 1:   # ssm_scan(snapshots=K): the K state slots (K = 1: states is the one slot)
            return {"y": (d.S, d.T, d.H, d.P), "states": (d.S, d.H, d.P, d.N), "snapshots": (d.K, d.S, d.H, d.P, d.N)}
        return {"y": (d.S, d.T, d.H, d.P), "states": (d.S, d.H, d.P, d.N)}
    return {"d_s": (d.R, d.H, d.P, d.N), "d_s0": (d.S, d.H, d.P, d.N), "d_x": (d.S, d.T, d.H, d.P),
            "d_dt": (d.S, d.T, d.H), "d_A": tuple(d.a_shape), "d_B": (d.S, d.T, d.G, d.N),
            "d_C": (d.S, d.T, d.G, d.N)}
