"""Properties of the scan's structure, each comparing a backend with itself on two equivalent
problems: splitting the tokens, repeating groups, Mamba-2 as Mamba-1, permuting sequences, and
d_s as the scatter-add of d_s0. For a port without a backward (its ssm_scan_back raises
NotImplementedError) each checks the forward's half. With K > 1 (a port that declares SNAPSHOTS)
each compares the snapshot slots as well (ssm_ref.testing.properties._common.snapshot_args).

Two float32 runs are each within the tolerance of the exact value, so they are within twice the
tolerance of each other: every comparison here uses the table times 2 (scaled for long T)."""

from __future__ import annotations

import numpy as np

from ssm_ref.tolerance import compare

from .. import ports
from ..cases import Case
from ._common import case_rng, close, combo, expect, run, snapshot_args, tol_for

__all__ = ["group_broadcast", "mamba2_as_mamba1", "permute_sequences", "scatter_of_d_s0", "split_tokens"]

PER_TOKEN = ("x", "dt", "B", "C")
PER_SEQ_OUT = ("y", "states", "d_s0", "d_x", "d_dt", "d_B", "d_C")
SAME = ("y", "states", "snapshots", "d_s", "d_s0", "d_x", "d_dt")


def split_tokens(module, case: Case, tol: dict) -> bool:
    """Scanning tokens [0, t) then [t, T) from the first part's final states equals one scan;
    backward: the second part's d_s0 is the first part's g_states, and the gradients of the two
    parts, concatenated over tokens (d_A: added), equal the one scan's. t is drawn in 0..T.
    K > 1 (a port that declares SNAPSHOTS): the one scan's snapshot slots k <= T - t are the
    second part's (k == T - t: its start state, the first part's states; a "ggml" port: k < T - t);
    the backward is that of the loss without the snapshots."""
    a = case.args()
    T = case.dims["T"]
    t = int(case_rng(case, "split").integers(0, T + 1))
    head = {**a, **{k: a[k][:, :t] for k in PER_TOKEN}}
    snap = snapshot_args(module, case)
    kind = ports.snapshot_kind(module)
    k_tail = min(snap["K"], T - t + 1) if kind == "all" else min(snap["K"], T - t)
    whole = run(module, a, case.g_y, case.g_states, K=snap["K"], slots=k_tail)
    r1 = run(module, head, None, None, backward=False)
    tail = {"s": r1["states"], "A": a["A"], "ids": None, **{k: a[k][:, t:] for k in PER_TOKEN}}
    second = run(module, tail, case.g_y[:, t:], case.g_states, backward=not whole.no_backward, K=snap["K"],
                 slots=k_tail)
    tt = tol_for(tol, case, 2.0)
    snaps = {"snapshots": second["snapshots"]} if "snapshots" in whole and snap["K"] > 1 else {}
    if whole.no_backward:  # a port without a backward: the forward's half of the property
        got = {"y": np.concatenate([r1["y"], second["y"]], axis=1), "states": second["states"], **snaps}
        expect("split_tokens", [close(k, got[k], whole[k], tt) for k in got], case, f"split at t = {t}")
        return True
    first = run(module, head, case.g_y[:, :t], second["d_s0"])
    got = {"y": np.concatenate([r1["y"], second["y"]], axis=1), "states": second["states"], **snaps,
           "d_s": first["d_s"], "d_s0": first["d_s0"],
           **{k: np.concatenate([first[k], second[k]], axis=1) for k in ("d_x", "d_dt", "d_B", "d_C")}}
    checks = [close(k, got[k], whole[k], tt) for k in got]
    checks.append(combo("d_A", whole["d_A"], [(1.0, first["d_A"]), (1.0, second["d_A"])], tt["d_A"]))
    expect("split_tokens", checks, case, f"split at t = {t}")
    return True


def group_broadcast(module, case: Case, tol: dict) -> bool:
    """G groups equal G*k groups with B and C repeated k times (k > 1 divides H/G; not
    applicable when H/G has no such divisor); d_B and d_C of the repeated groups, summed back
    over each block of k, equal the G-group gradients."""
    d = case.dims
    hpg = d["H"] // d["G"] if d["G"] else 0
    ks = [k for k in range(2, hpg + 1) if hpg % k == 0]
    if not ks:
        return False
    k = ks[int(case_rng(case, "groups").integers(0, len(ks)))]
    a = case.args()
    wide = {**a, "B": np.repeat(a["B"], k, axis=2), "C": np.repeat(a["C"], k, axis=2)}
    snap = snapshot_args(module, case)
    base = run(module, a, case.g_y, case.g_states, **snap)
    rep = run(module, wide, case.g_y, case.g_states, **snap)
    tt = tol_for(tol, case, 2.0)
    S, T, G, N = d["S"], d["T"], d["G"], d["N"]
    checks = [close(n, rep[n], base[n], tt) for n in base.having((*SAME, "d_A"))]
    for n in base.having(("d_B", "d_C")):
        blocks = rep[n].reshape(S, T, G, k, N)
        checks.append(combo(n, base[n], [(1.0, blocks[:, :, :, j]) for j in range(k)], tt[n]))
    expect("group_broadcast", checks, case, f"G = {G} vs {G * k}")
    return True


def mamba2_as_mamba1(module, case: Case, tol: dict) -> bool:
    """Mamba-2 with A (H,) equals Mamba-1 with that A repeated over N (needs N >= 2: with N == 1
    the shapes coincide); d_A of the Mamba-1 run summed over N equals the Mamba-2 d_A. A Mamba-1
    case uses the first column of its A. K > 1: the snapshots too, on a port that declares
    SNAPSHOTS "all" (ggml defines no Mamba-1 K > 1: a "ggml" port runs K = 1 here)."""
    d = case.dims
    if d["N"] < 2:
        return False
    a = case.args()
    H, N = d["H"], d["N"]
    A2 = a["A"].reshape(H, -1)[:, 0].copy()                  # (H,)
    snap = snapshot_args(module, case) if ports.snapshot_kind(module) == "all" else {}
    m2 = run(module, {**a, "A": A2}, case.g_y, case.g_states, **snap)
    m1 = run(module, {**a, "A": np.repeat(A2[:, None], N, axis=1)}, case.g_y, case.g_states, **snap)
    tt = tol_for(tol, case, 2.0)
    checks = [close(n, m1[n], m2[n], tt) for n in m2.having((*SAME, "d_B", "d_C"))]
    if "d_A" in m2:
        checks.append(combo("d_A", m2["d_A"], [(1.0, m1["d_A"][:, j]) for j in range(N)], tt["d_A"]))
    expect("mamba2_as_mamba1", checks, case)
    return True


def permute_sequences(module, case: Case, tol: dict) -> bool:
    """Permuting the sequences together with their ids (and g_y, g_states) permutes y, states,
    d_s0, d_x, d_dt, d_B, d_C the same way and leaves d_s and d_A unchanged."""
    S = case.dims["S"]
    perm = case_rng(case, "permute").permutation(S)
    a = case.args()
    moved = {**a, "ids": np.asarray(case.ids)[perm], **{k: a[k][perm] for k in PER_TOKEN}}
    snap = snapshot_args(module, case)
    g_moved = None if snap["g_snapshots"] is None else snap["g_snapshots"][:, perm]
    base = run(module, a, case.g_y, case.g_states, **snap)
    got = run(module, moved, case.g_y[perm], case.g_states[perm], **{**snap, "g_snapshots": g_moved})
    tt = tol_for(tol, case, 2.0)
    checks = [close(n, got[n], base[n][perm], tt) for n in base.having(PER_SEQ_OUT)]
    checks += [close(n, got[n], base[n][:, perm], tt) for n in base.having(("snapshots",))]
    checks += [close(n, got[n], base[n], tt) for n in base.having(("d_s", "d_A"))]
    expect("permute_sequences", checks, case, f"permutation {perm.tolist()}")
    return True


def scatter_of_d_s0(module, case: Case, tol: dict) -> bool:
    """d_s equals the scatter-add of the backend's own d_s0: row r holds the sum of d_s0[i] over
    the i with ids[i] == r (summed here in float64, in order i = 0..S-1), rows no sequence reads
    are exactly 0. Not applicable to a backend whose backward returns no d_s."""
    g = run(module, case.args(), case.g_y, case.g_states)
    if "d_s" in g.derived or g.no_backward:
        return False
    ids = np.asarray(case.ids).tolist()
    want = np.zeros(g["d_s"].shape, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        for i, r in enumerate(ids):
            want[r] += g["d_s0"][i]
    unread = sorted(set(range(case.dims["R"])) - set(ids))
    checks = [compare("d_s", g["d_s"], want, tol_for(tol, case)["d_s"])]
    if unread and np.any(g["d_s"][unread] != 0):
        checks.append(compare("d_s (rows nobody reads)", g["d_s"][unread], np.zeros_like(want[unread]),
                              tol["d_s"].times(0.0)))
    expect("scatter_of_d_s0", checks, case)
    return True
