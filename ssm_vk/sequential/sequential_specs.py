"""The token-sequential kernels' specs (glsl/ssm_scan.comp, ssm_scan_back.comp, ssm_decode.comp):
their push-constant layouts, the variant a layout dispatches, every kernel a token-sequential plan
dispatches (also over time chunks) and this family's part of the packaged matrix, with the problems
it is planned for (which ssm_vk.registry.matrix also plans in the modes only these kernels run)."""

from __future__ import annotations

from dataclasses import replace
from itertools import product
from typing import TYPE_CHECKING

from ssm_ref import Dims

from ..config import Settings
from ..kernel_specs import KernelSpec, carry_spec, defines_of, reduce_spec, rows_spec, softplus_constants
from .sequential_planner import TCHUNK_BELOW, Layout, SequentialPlan, layout_for, m1_forward_two_per_lane_from

if TYPE_CHECKING:
    from ..sizing import Limits

__all__ = ["FWD_PUSH", "BWD_PUSH", "SNAP_PUSH", "fwd_spec", "bwd_spec", "sequential_kernels", "samples",
           "sample_dims", "matrix", "packaged"]

# Push-constant fields, in the order of the PC block of each shader (all uint32).
FWD_PUSH = ("S", "T", "H", "P", "N", "G", "HB", "PB", "NHB", "NPB", "gx", "NC", "c0",
            "o_x", "o_dt", "o_B", "o_C", "o_y", "o_st", "o_ck", "gather", "o_s", "o_ids", "scatter", "o_A")
BWD_PUSH = ("S", "T", "H", "P", "N", "G", "HB", "PB", "NHB", "NPB", "gx", "NC", "c0",
            "o_x", "o_dt", "o_B", "o_C", "o_gy", "o_lam", "o_ck", "o_dx", "o_dA", "o_A")
# With SNAP (K state snapshots, K > 1, or a backward given g_snapshots) both kernels push three
# more after those: the slots the window covers, their offset and the slot stride in rows.
SNAP_PUSH = ("KS", "o_sn", "sst")


def _common(d: Dims, lay: Layout) -> dict:
    defs = dict(WG=lay.WG, LN=lay.LN, NPL=lay.NPL, ROW_SUM=lay.ROW_SUM, MAMBA1=int(d.mamba1))
    if lay.EXACT:   # the invariant mode's variants (the default's defines stay as they were)
        defs.update(EXACT=1)
    return defs


def fwd_spec(d: Dims, lay: Layout, checkpoint: bool, softplus: int = 0, summary: bool = False,
             snap: bool = False) -> KernelSpec:
    """ssm_scan.comp: the forward (y and final states), the backward's checkpoint pass
    (``checkpoint``) or the first pass of the forward parallel over time (``summary``);
    ssm_decode.comp for a layout of the decode kernel (``lay.DEC``: one token), same bindings and
    push constants. ``snap``: the forward that also writes the K state snapshots (SNAP: one
    binding and SNAP_PUSH more)."""
    defs = _common(d, lay)
    if lay.DEC and not checkpoint and not summary:   # one token: the decode kernel
        return KernelSpec("ssm_decode", defines_of(**defs), 10, FWD_PUSH, lay.WG, softplus_constants(softplus))
    defs.update(CKPT=int(checkpoint), K=lay.K, TB=lay.TB)
    if lay.SPREAD:
        defs.update(SPREAD=1)
    if summary:
        defs.update(SUMMARY=1)
    return _spec("ssm_scan", defs, 10, FWD_PUSH, lay, softplus, snap)


def bwd_spec(d: Dims, lay: Layout, softplus: int = 0, summary: bool = False, snap: bool = False) -> KernelSpec:
    """ssm_scan_back.comp: the backward pass, or (``summary``) the first backward pass over time
    chunks. ``snap``: the backward pass that adds g_snapshots (SNAP: one binding and SNAP_PUSH
    more)."""
    defs = _common(d, lay)
    defs.update(K=lay.K, TBR=lay.TBR)
    if lay.SPREAD:
        defs.update(SPREAD=1)
    if summary:
        defs.update(BSUM=1, TB=lay.TB)
    elif lay.HSUM:
        defs.update(HSUM=1)
    return _spec("ssm_scan_back", defs, 13, BWD_PUSH, lay, softplus, snap)


def _spec(name: str, defs: dict, bindings: int, push, lay: Layout, softplus: int, snap: bool) -> KernelSpec:
    """The spec of ``name``; ``snap``: with SNAP, the snapshots' binding and push constants more."""
    if snap:
        defs.update(SNAP=1)
        bindings, push = bindings + 1, push + SNAP_PUSH
    return KernelSpec(name, defines_of(**defs), bindings, push, lay.WG, softplus_constants(softplus))




def sequential_kernels(d: Dims, pl: SequentialPlan, backward: bool) -> list[KernelSpec]:
    """Every kernel the token-sequential recording of ``d`` under ``pl`` may dispatch, also over
    time chunks (``pl.tchunk``; the d_s scatter's counted whenever ids could repeat)."""
    if not (pl.windows and d.H * d.P > 0):
        kernels = []
    elif not backward and pl.tchunk:
        # the three passes over time chunks; the plain forward also recomputes a call with inf or nan
        return [fwd_spec(d, pl.layout, checkpoint=False, softplus=pl.softplus, summary=True), carry_spec(d),
                fwd_spec(d, pl.layout, checkpoint=False, softplus=pl.softplus)]
    elif not backward:
        return [fwd_spec(d, pl.layout, checkpoint=False, softplus=pl.softplus, snap=pl.snap)]
    else:
        kernels = [fwd_spec(d, pl.layout, checkpoint=True, softplus=pl.softplus),
                   bwd_spec(d, pl.layout, pl.softplus, snap=pl.snap), reduce_spec(0)]
        if pl.tchunk:
            # the summaries and carries over time chunks before the same walk back (which also
            # recomputes a call with inf or nan)
            kernels += [fwd_spec(d, pl.layout, checkpoint=False, softplus=pl.softplus, summary=True),
                        bwd_spec(d, pl.layout, pl.softplus, summary=True), carry_spec(d), carry_spec(d, reverse=True)]
        if d.H * d.P * (d.N if d.mamba1 else 1):
            kernels.append(reduce_spec(1, per_sequence=bool(pl.layout.EXACT)))
    if backward and d.R * d.H * d.P * d.N and (d.S > 1 or (pl.snap and d.T == 0)):
        kernels.append(rows_spec())  # ids may repeat: rows added by the scatter kernel (and g_snapshots[0] at T = 0)
    return kernels


def samples(N: int, T: int, mamba1: bool) -> tuple[Dims, list[Dims]]:
    """The problems the packaged matrix plans at d_state ``N``, ``T`` tokens and this Mamba variant:
    (the backward's, the forwards'). H and P mostly set how rows are spread over workgroups (push
    constants), not the defines; T whether it is a decode step (one token: TB = 1) or not. Beside
    the backward's problem the forwards' hold one of P = 1 at one token (where P is too small for
    the decode kernel), Mamba-1's of rows enough for its other forward layout on a GPU, and
    Mamba-2's of threads enough for its other load blocks."""
    d = Dims(S=1, T=T, H=8, P=1 if mamba1 else 64, N=N, G=1, R=1, mamba1=mamba1,
             a_shape=(8, N) if mamba1 else (8,))
    fwds = [d]
    if T == 1 and not mamba1:   # the ordinary kernel where P is too small for the decode kernel
        fwds.append(replace(d, P=1))
    if mamba1 and T > 1:        # Mamba-1's forward on a GPU takes one of two layouts by its rows
        H = max(8, m1_forward_two_per_lane_from(N))
        fwds.append(replace(d, H=H, a_shape=(H, N)))
    if not mamba1 and T > 1:    # Mamba-2 token by token: few threads (blocks of eight tokens) and many
        H = TCHUNK_BELOW // d.P     # (the fewest heads of many at one lane a row: a problem that fits)
        fwds.append(replace(d, H=H, a_shape=(H,)))
    return d, fwds


def sample_dims(n_values) -> list[Dims]:
    """Every problem :func:`samples` gives for these d_state values, one and 64 tokens, both Mamba
    variants, and for Mamba-1 also one of a group per head (its backward without the heads' shared
    partials, HSUM = 0): the shapes whose plans in the modes only the token-sequential kernels
    run (K > 1 snapshots, the invariant mode) the packaged matrix holds (ssm_vk.registry.matrix)."""
    out = []
    for N, T, mamba1 in product(n_values, (1, 64), (False, True)):
        d, fwds = samples(N, T, mamba1)   # (the backward's is the first of the forwards')
        out += fwds
        if mamba1:
            out.append(replace(d, G=d.H))
    return out


def matrix(lim: Limits, n_values, knobs: Settings) -> list[KernelSpec]:
    """The token-sequential variants the forward and backward request on a device of limits
    ``lim`` for these d_state values, both Mamba variants, in a stable order (the packaged
    matrix's part: ssm_vk.registry.matrix; the modes' variants, planned by registry.plan, are
    added there)."""
    out = []
    add = out.append
    for N, T, mamba1 in product(n_values, (1, 64), (False, True)):
        d, fwds = samples(N, T, mamba1)
        for df in fwds:
            fwd = layout_for(df, lim, False, knobs)
            add(fwd_spec(df, fwd, checkpoint=False))   # ssm_scan (or ssm_decode)
            if T == 1 and not mamba1:                  # the decode kernel of a step with more sequences
                add(fwd_spec(df, layout_for(df, lim, False, knobs.with_knobs(DEC=1)), checkpoint=False))
            if T > 1:                                  # parallel over time: first and middle pass
                add(fwd_spec(df, fwd, checkpoint=False, summary=True))
                add(carry_spec(df))
        bwd = layout_for(d, lim, True, knobs)
        add(fwd_spec(d, bwd, checkpoint=True))         # ssm_scan_back: checkpoint pass
        add(bwd_spec(d, bwd))                          # ssm_scan_back: backward pass
        if mamba1:   # with and without the heads' shared partials: which one depends on H and G
            add(bwd_spec(d, replace(bwd, HSUM=1 - bwd.HSUM)))
        if T > 1 and mamba1:                           # the backward parallel over time (Mamba-1's
            add(fwd_spec(d, bwd, checkpoint=False, summary=True))   # plans; TCHUNK forces it for both)
            add(bwd_spec(d, bwd, summary=True))
            add(carry_spec(d, reverse=True))
    return out


def packaged(limits_list, n_values, p_values, pn_values, knobs: Settings) -> list[KernelSpec]:
    """The family's part of the packaged matrix (family.Family.matrix): :func:`matrix` for each
    device profile of ``limits_list`` (the modes' variants, planned by registry.plan, are added by
    the registry)."""
    return [spec for lim in limits_list for spec in matrix(lim, n_values, knobs)]
