"""The properties of the Mamba-3 scan (``mamba3_scan``, ssm_ref.ops.MAMBA3): the op-generic ones
(ssm_ref.testing.properties.generic: the float64 oracle forward and backward, token splits and
decoding steps carrying all four state parts, permuted sequences, determinism) and Mamba-3's own,
each a relation a correct port satisfies whatever its arithmetic:

    mimo_rank1_is_siso     MIMO of rank 1 with psi None, and with psi ones, is SISO
    rank_permutation       permuting MIMO's ranks permutes y, k, v and their gradients; h stays
    rotation_conventions   "halved" on inputs whose state axis is permuted (pair j's members moved
                           from 2j, 2j+1 to j, j + N/2) is "interleaved", the states permuted alike
                           (F = 0: the two conventions are the same op)
    lam_one_is_mamba2      lam = 1 (beta = 0, gamma = dt), no rotation, dA = A*dt with A per head,
                           one rank: Mamba-2's scan (ssm_ref.ssm_scan, dt_softplus=None) with the
                           biased keys and queries per head, forward and backward
    decode_in_place        a prefill, then T = 1 steps with update_cache=True writing the four
                           state parts into cache rows ids, equals one call; other rows untouched
    no_writes              neither the forward nor the backward writes into the caller's arrays

    from ssm_ref.testing.properties.mamba3 import PROPERTIES
    PROPERTIES["lam_one_is_mamba2"].check(my_port, case, ssm_ref.ops.MAMBA3.tol())

``case``: an OpCase of op "mamba3_scan" (ssm_ref.testing.mamba3_cases); ``check`` returns False
where a property does not apply (rank_permutation on SISO), raises PropertyFailed otherwise.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np

from ssm_ref import ops
from ssm_ref.tolerance import compare

from .. import ports
from ._common import Property, combo
from .generic import GENERIC, _compare, _fail, _rng, keywords_of, port_outputs

__all__ = ["OWN", "PROPERTIES", "decode_in_place", "lam_one_is_mamba2", "mimo_rank1_is_siso", "no_writes",
           "rank_permutation", "rotation_conventions"]

OP = ops.MAMBA3
STATES = tuple(i for i, _ in OP.state)          # s_theta, s_h, s_k, s_v
FINALS = tuple(o for _, o in OP.state)          # theta, h, k, v
# the rank axis of each array that has one (MIMO layout), inputs, outputs and gradients alike
RANK_AXIS = {"B": 2, "C": 2, "B_bias": 1, "C_bias": 1, "psi": 1, "s_k": 2, "s_v": 2,
             "y": 2, "k": 2, "v": 2, "g_y": 2, "g_k": 2, "g_v": 2,
             "d_B": 2, "d_C": 2, "d_B_bias": 1, "d_C_bias": 1, "d_psi": 1, "d_s_k": 2, "d_s_v": 2}
# the arrays with the state axis N last (what the rotation acts on)
N_LAST = ("B", "C", "B_bias", "C_bias", "s_h", "s_k", "h", "k", "g_h", "g_k",
          "d_B", "d_C", "d_B_bias", "d_C_bias", "d_s_h", "d_s_k")


def _mimo(case) -> bool:
    return "M" in case.dims


def _both(module, args: dict, cot: dict, kw: dict) -> dict:
    """Forward and backward (the forward alone when the port has none)."""
    return port_outputs(module, OP, args, cot, kw) or port_outputs(module, OP, args, None, kw)


def _relabel(d: dict, fn) -> dict:
    return {k: (None if v is None else fn(k, v)) for k, v in d.items()}


def mimo_rank1_is_siso(module, case, tol: dict) -> bool:
    """SISO and MIMO of rank 1 are one op: a SISO case run with a rank axis of 1 added (psi None,
    then psi ones), or a MIMO case of rank 1 run without it (psi ones), gives the same outputs and
    gradients with that axis added (d_psi left out: SISO has none)."""
    if _mimo(case) and case.dims["M"] != 1:
        return False
    kw = keywords_of(case)
    args, cot = case.args(), case.cotangents
    if _mimo(case):          # rank 1 -> SISO: psi must be ones for v = x
        siso_args = _relabel(args, lambda k, v: np.take(v, 0, RANK_AXIS[k]) if k in RANK_AXIS else v)
        siso_args["psi"] = None
        siso_cot = _relabel(cot, lambda k, v: np.take(v, 0, RANK_AXIS[k]) if k in RANK_AXIS else v)
    else:
        siso_args, siso_cot = args, cot
    siso = _both(module, siso_args, siso_cot, kw)
    lift = _relabel(siso_args, lambda k, v: np.expand_dims(v, RANK_AXIS[k]) if k in RANK_AXIS else v)
    lift_cot = _relabel(siso_cot, lambda k, v: np.expand_dims(v, RANK_AXIS[k]) if k in RANK_AXIS else v)
    want = _relabel(siso, lambda k, v: np.expand_dims(v, RANK_AXIS[k]) if k in RANK_AXIS else v)
    H, P = case.dims["H"], case.dims["P"]
    bad = []
    for psi_what, psi in (("psi None", None), ("psi ones", np.ones((H, 1, P), np.float32))):
        got = _both(module, {**lift, "psi": psi}, lift_cot, kw)
        names = [k for k in got if k != "d_psi" and k in want]
        bad += _compare(names, got, want, {k: v.times(2) for k, v in tol.items()},
                        f"{case.label}: rank 1 with {psi_what} against SISO")
    _fail("mimo_rank1_is_siso", case, bad)
    return True


def rank_permutation(module, case, tol: dict) -> bool:
    """Permuting the MIMO ranks (the rank axis of B, C, the biases, psi, s_k, s_v and the
    cotangents of y, k, v) permutes y, k, v and the gradients of the permuted inputs; h, theta
    and the other gradients stay (up to the order of the sum over ranks)."""
    if not _mimo(case) or case.dims["M"] < 2:
        return False
    M = case.dims["M"]
    perm = _rng(case, "rank_permutation").permutation(M)
    if (perm == np.arange(M)).all():
        perm = np.roll(perm, 1)
    kw = keywords_of(case)
    args, cot = case.args(), case.cotangents
    base = _both(module, args, cot, kw)

    def move(k, v):
        return np.take(v, perm, RANK_AXIS[k]) if k in RANK_AXIS else v

    got = _both(module, _relabel(args, move), _relabel(cot, move), kw)
    want = _relabel(base, move)
    _fail("rank_permutation", case, _compare(list(got), got, want, {k: v.times(2) for k, v in tol.items()},
                                             f"{case.label} ranks permuted {perm.tolist()}"))
    return True


def _halved_from_interleaved(N: int, F: int) -> np.ndarray:
    """src (N,): the halved problem's state entry n is the interleaved problem's entry src[n]
    (pair j's members 2j, 2j+1 go to j, j + N/2; the unrotated entries keep their order)."""
    src = np.full(N, -1, dtype=np.int64)
    j = np.arange(F)
    src[j], src[j + N // 2] = 2 * j, 2 * j + 1
    src[src < 0] = np.arange(2 * F, N)
    return src


def rotation_conventions(module, case, tol: dict) -> bool:
    """The two pairings are one op up to the order of the state axis N: running the case's
    problem in the other convention, its state axis permuted (:func:`_halved_from_interleaved`)
    in B, C, the biases, s_h, s_k and the cotangents of h and k, gives the case's outputs with h
    and k permuted alike, and its gradients permuted back. With F = 0 nothing rotates and the
    permutation is the identity: both conventions give the same results."""
    N, F = case.dims["N"], case.dims["F"]
    kw = keywords_of(case)
    rotation = kw.get("rotation", "interleaved")
    src = _halved_from_interleaved(N, F)
    idx = src if rotation == "interleaved" else np.argsort(src)   # the other problem's entry n is ours idx[n]
    other = {**kw, "rotation": "halved" if rotation == "interleaved" else "interleaved"}

    def move(k, v):
        return v[..., idx] if k in N_LAST else v

    args, cot = case.args(), case.cotangents
    base = _both(module, args, cot, kw)
    got = _both(module, _relabel(args, move), _relabel(cot, move), other)
    want = _relabel(base, move)
    _fail("rotation_conventions", case,
          _compare(list(got), got, want, {k: v.times(2) for k, v in tol.items()},
                   f"{case.label} as {other['rotation']} with N permuted {idx.tolist()}"))
    return True


def lam_one_is_mamba2(module, case, tol: dict) -> bool:
    """With lam = 1 (beta = 0, gamma = dt), no rotation (F = 0), one rank (SISO, or MIMO's rank 0
    alone with psi None) and dA = A*dt for an A per head (drawn from the case, in [-16, -1]),
    the recurrence is Mamba-2's: h_t = exp(dt A) h_{t-1} + dt x_t kᵀ_t, y_t = h_t q_t, with k, q
    the biased keys and queries of each head. The port's y and h are held to ssm_ref.ssm_scan in
    float64 (dt_softplus=None; B, C per head, G = H; s = s_h at ids), its k and v to the last
    token's biased key and value, and its gradients to ssm_scan_back's: d_x; d_dt + A*d_dA
    against the scan's d_dt; d_B and d_B_bias (d_C, d_C_bias) against the scan's per-head d_B
    summed over each group's heads and over tokens; d_s_h against d_s."""
    import ssm_ref

    d = case.dims
    S, T, H, G = d["S"], d["T"], d["H"], d["G"]
    mimo = _mimo(case)

    def flat(v, axis):       # the one rank's array without a rank axis (SISO's have none)
        return np.take(v, 0, axis) if mimo else v

    def ranked(v, axis):     # and back
        return np.expand_dims(v, axis) if mimo else v

    A = -_rng(case, "lam_one_is_mamba2").uniform(1.0, 16.0, H).astype(np.float32)   # (H,)
    args, cot = case.args(), dict(case.cotangents)
    if mimo:                 # rank 0 alone, psi None
        args = _relabel(args, lambda k, v: np.take(v, [0], RANK_AXIS[k]) if k in RANK_AXIS else v)
        cot = _relabel(cot, lambda k, v: np.take(v, [0], RANK_AXIS[k]) if k in RANK_AXIS else v)
        args["psi"] = None
    args["lam"] = np.ones_like(args["lam"])
    args["dA"] = (A * args["dt"]).astype(np.float32)                   # (S, T, H)
    args["dtheta"] = np.zeros((S, T, H, 0), np.float32)
    if args["s_theta"] is not None:
        args["s_theta"] = np.zeros((args["s_theta"].shape[0], H, 0), np.float32)
    cot["g_theta"] = np.zeros((S, H, 0), np.float32)
    cot["g_k"], cot["g_v"] = np.zeros_like(cot["g_k"]), np.zeros_like(cot["g_v"])   # Mamba-2 has no k, v
    got = _both(module, args, cot, {**keywords_of(case), "rotation": "interleaved"})

    # Mamba-2's problem, per head (G = H): k = B[group] + B_bias[h], q likewise
    group = np.arange(H) // (H // G)
    Bh = flat(args["B"], 2)[:, :, group].astype(np.float64) + flat(args["B_bias"], 1)    # (S, T, H, N)
    Ch = flat(args["C"], 2)[:, :, group].astype(np.float64) + flat(args["C_bias"], 1)
    m2 = dict(s=args["s_h"], x=args["x"], dt=args["dt"], A=A, B=Bh, C=Ch, ids=args["ids"])
    r = ssm_ref.ssm_scan(**m2, dtype=np.float64, dt_softplus=None)
    label = f"{case.label} with lam = 1, F = 0, one rank, dA = A*dt: Mamba-2's scan"
    checks = [compare("y", got["y"], ranked(r.y, 2), tol["y"]), compare("h", got["h"], r.states, tol["h"])]
    if T:
        checks += [compare("k", got["k"], ranked(Bh[:, -1], 2), tol["k"]),
                   compare("v", got["v"], ranked(args["x"][:, -1], 2), tol["v"])]
    if "d_x" in got:
        g = ssm_ref.ssm_scan_back(**m2, g_y=flat(cot["g_y"], 2), g_states=cot["g_h"], dtype=np.float64,
                                  dt_softplus=None)
        dB_g, dC_g = np.zeros((S, T, G, Bh.shape[-1])), np.zeros((S, T, G, Bh.shape[-1]))   # summed per group
        np.add.at(dB_g, (slice(None), slice(None), group), g.d_B)
        np.add.at(dC_g, (slice(None), slice(None), group), g.d_C)
        checks += [
            compare("d_x", got["d_x"], g.d_x, tol["d_x"]),
            combo("d_dt", g.d_dt, [(1.0, got["d_dt"]), (1.0, A * np.asarray(got["d_dA"], np.float64))],
                  tol["d_dt"]),
            compare("d_B", flat(got["d_B"], 2), dB_g, tol["d_B"]),
            compare("d_C", flat(got["d_C"], 2), dC_g, tol["d_C"]),
            compare("d_B_bias", flat(got["d_B_bias"], 1), g.d_B.sum(axis=(0, 1)), tol["d_B_bias"]),
            compare("d_C_bias", flat(got["d_C_bias"], 1), g.d_C.sum(axis=(0, 1)), tol["d_C_bias"]),
            compare("d_s_h", got["d_s_h"], g.d_s, tol["d_s_h"]),
        ]
    _fail("lam_one_is_mamba2", case, [c.message(label) for c in checks if not c.ok])
    return True


def _y_of(result):
    """y of a forward's result in any form call_op reads (its states may be None here)."""
    if isinstance(result, tuple | list):
        return ports.host(result[0])
    return ports.host(result["y"] if isinstance(result, Mapping) else result.y)


def decode_in_place(module, case, tol: dict) -> bool:
    """The decoding path of a layer: a prefill of tokens [0, t) and then one call per token,
    each with update_cache=True on the same four caches (copies of the case's, zeros without
    start states) at the case's ids, gives one call's y, its final states in rows ids of the
    caches, and leaves the other rows' bits alone. Not applicable with repeated ids (two
    sequences would write one row) or T = 0."""
    d = case.dims
    S, T = d["S"], d["T"]
    args = case.args()
    ids = args["ids"] if args["ids"] is not None else np.arange(S, dtype=np.int64)
    if T == 0 or len(set(ids.tolist())) < S:
        return False
    kw = keywords_of(case)
    whole = port_outputs(module, OP, args, None, kw)
    if args["s_h"] is None:      # zero start states, one row per sequence
        for name, out in zip(STATES, FINALS, strict=True):
            args[name] = np.zeros_like(whole[out])
    caches = {name: args[name].copy() for name in STATES}
    before = {name: v.copy() for name, v in caches.items()}
    t = int(_rng(case, "decode_in_place").integers(0, T))
    bounds = [0, *range(max(t, 1), T + 1)]
    fn = getattr(module, OP.name)
    ys = []
    for lo, hi in itertools.pairwise(bounds):
        part = {k: (v[:, lo:hi] if k in ("x", "dt", "dA", "lam", "B", "C", "dtheta") else v) for k, v in args.items()}
        part.update(caches, ids=ids)
        ys.append(_y_of(fn(*(part.get(n) for n in OP.input_names), update_cache=True, **kw)))
    label = f"{case.label}: prefill of {bounds[1]} tokens, then steps of one, update_cache=True"
    t2 = {k: v.times(2) for k, v in tol.items()}
    bad = _compare(["y"], {"y": np.concatenate(ys, axis=1)}, whole, t2, label)
    bad += _compare(FINALS, {o: caches[n][ids] for n, o in zip(STATES, FINALS, strict=True)}, whole, t2, label)
    others = np.setdiff1d(np.arange(caches["s_h"].shape[0]), ids)
    bad += [f"{n}: rows {others.tolist()}, read by no sequence, were written ({label})"
            for n in STATES if caches[n][others].tobytes() != before[n][others].tobytes()]
    _fail("decode_in_place", case, bad)
    return True


def no_writes(module, case, tol: dict) -> bool:
    """The forward and the backward leave every input and cotangent array as they found it
    (update_cache is False): the bits of each are compared before and after."""
    kw = keywords_of(case)
    args, cot = case.args(), case.cotangents
    cot = {k: v.copy() for k, v in cot.items()}
    before = {k: v.copy() for k, v in {**args, **cot}.items() if v is not None}
    _both(module, args, cot, kw)
    after = {**args, **cot}
    _fail("no_writes", case, [f"{k}: the call wrote into it" for k, v in before.items()
                              if after[k].tobytes() != v.tobytes()])
    return True


_ALL = ("typical", "long_decay", "small_dA", "large_dt", "tiny", "large")

OWN: dict[str, Property] = {p.name: p for p in (
    Property("mimo_rank1_is_siso", mimo_rank1_is_siso, _ALL,
             "MIMO of rank 1 (psi None, psi ones) equals SISO, forward and backward"),
    Property("rank_permutation", rank_permutation, _ALL,
             "permuting MIMO's ranks permutes y, k, v and their gradients"),
    Property("rotation_conventions", rotation_conventions, _ALL,
             "halved on a permuted state axis equals interleaved (F = 0: the same op)"),
    Property("lam_one_is_mamba2", lam_one_is_mamba2, _ALL,
             "lam = 1, F = 0, one rank, dA = A*dt: Mamba-2's scan, forward and backward"),
    Property("decode_in_place", decode_in_place, _ALL,
             "a prefill and T = 1 steps with update_cache=True equal one call; unread rows untouched"),
    Property("no_writes", no_writes, _ALL, "no call writes into the caller's arrays"),
)}

# The generic properties hold in every regime of Mamba-3's problems.
PROPERTIES: dict[str, Property] = {
    **{name: Property(p.name, p.check, _ALL, p.summary) for name, p in GENERIC.items()},
    **OWN,
}
