"""ssm_ref.mamba3_scan against mamba_ssm's own Mamba-3 reference functions, in float64.

mamba_ssm's functions take its layer's raw projections; the op takes what they become outside it
(docs/SPEC.md, "Mamba-3"): here the parts outside are composed in torch float64 as the layer does
-- dtheta = pi*tanh(Angles)*DT, lam = sigmoid(Trap), no D, no Z -- and MIMO's output projection
MIMO_O is applied to our per-rank y for the step reference (its output is contracted over ranks).

The references are loaded from SSM_MAMBA_REPO (tests/ref/mamba_refs.py; skipped without it) and
run with float64 throughout. Their angle sums are not reduced mod 2*pi everywhere (the MIMO step
reference never reduces), so angles are compared on the circle. mamba3_MIMO_chunk_ref returns its
final SSM state rounded to float32 (``.float()``): that one is compared to half a float32 ulp.

The agreement measured (max |difference| over each case's outputs) is docs/SPEC.md's table
"Agreement with mamba_ssm's reference functions"; AGREE is the bound the test holds every case to.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from mamba_refs import load_mimo, load_siso

import ssm_ref

torch = pytest.importorskip("torch")

AGREE = 1e-12   # relative to the largest magnitude of the compared output (at least 1)


def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def _np(t):
    return t.detach().cpu().numpy()


def draw(seed, *, S, T, H, P, N, G, F, M=None, states=True):
    """mamba_ssm's inputs (torch float64, its layouts) and ours (numpy float64) for one problem.
    DT on a grid of 1/1024 and pi*tanh(Angles) on a grid of 1/64, so the one cast mamba3_siso_fwd_ref
    makes by method (``Angles.float()``) is exact."""
    rng = np.random.default_rng(seed)
    r = rng.standard_normal
    rank = () if M is None else (M,)
    m = {
        "Q": r((S, T, *rank, G, N)), "K": r((S, T, *rank, G, N)), "V": r((S, T, H, P)),
        "DT": rng.integers(50, 800, (S, H, T)) / 1024.0,
        "Trap": r((S, H, T)),
        "Q_bias": r((H, *rank, N)), "K_bias": r((H, *rank, N)),
        "Angles": np.arctanh(rng.integers(-200, 201, (S, T, H, F)) / 64.0 / math.pi),
    }
    m["ADT"] = -m["DT"] * rng.uniform(0.2, 1.5, (S, H, T))
    if M is not None:
        m["MIMO_V"] = r((H, M, P)) / M
        m["MIMO_O"] = r((H, M, P)) / M
    if states:
        m["states"] = (rng.uniform(0, 2 * math.pi, (S, H, F)), r((S, H, P, N)), r((S, H, *rank, N)),
                       r((S, H, *rank, P)))
    mt = {k: (tuple(_t(a) for a in v) if k == "states" else _t(v)) for k, v in m.items()}
    # the parts outside the op, as the layer computes them
    DT = mt["DT"].transpose(1, 2)                                                  # (S, T, H)
    ours = dict(x=m["V"], dt=_np(DT), dA=_np(mt["ADT"].transpose(1, 2)),
                lam=_np(torch.sigmoid(mt["Trap"]).transpose(1, 2)),
                B=m["K"], C=m["Q"], B_bias=m["K_bias"], C_bias=m["Q_bias"],
                dtheta=_np(torch.tanh(mt["Angles"]) * math.pi * DT[..., None]),
                psi=m.get("MIMO_V"))
    if states:
        ours.update(zip(("s_theta", "s_h", "s_k", "s_v"), m["states"], strict=True))
    return mt, ours


def diff(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got - want).max(initial=0.0))


def angle_diff(got, want) -> float:
    d = np.asarray(got) - np.asarray(want)
    return float(np.abs((d + math.pi) % (2 * math.pi) - math.pi).max(initial=0.0))


def check(measured: dict, refs: dict):
    """Each measured difference within AGREE of its reference's scale; returns the worst."""
    print("[agreement]", {k: f"{v:.1e}" for k, v in measured.items()})   # (pytest -s shows them)
    for name, d in measured.items():
        scale = max(1.0, float(np.abs(refs[name]).max(initial=0.0)))
        assert d <= AGREE * scale, f"{name}: differs by {d:.3e} (scale {scale:.3g})"
    return max(measured.values())


def _siso_states(out):
    return out.theta, out.h, out.k, out.v


@pytest.mark.parametrize("states", [False, True], ids=["zero-start", "Input_States"])
@pytest.mark.parametrize("G,F", [(1, 2), (2, 3), (4, 1)])
def test_siso_step_ref(states, G, F):
    siso = load_siso()
    mt, ours = draw(11 + G + 3 * F, S=2, T=7, H=4, P=3, N=8, G=G, F=F, states=states)
    want_y, want_st = siso.mamba3_siso_step_ref(
        mt["Q"], mt["K"], mt["V"], mt["ADT"], mt["DT"], mt["Trap"], mt["Q_bias"], mt["K_bias"], mt["Angles"],
        Input_States=mt["states"] if states else None)
    got = ssm_ref.mamba3_scan(**ours, dtype=np.float64)   # rotation "interleaved", SISO's
    want_st = [_np(t) for t in want_st]
    check({"y": diff(got.y, _np(want_y)), "theta": angle_diff(got.theta, want_st[0]),
           **{n: diff(g, w) for n, g, w in zip("hkv", _siso_states(got)[1:], want_st[1:], strict=True)}},
          {"y": _np(want_y), "theta": 1.0, "h": want_st[1], "k": want_st[2], "v": want_st[3]})


@pytest.mark.parametrize("states", [False, True], ids=["zero-start", "Initial_States"])
def test_siso_fwd_ref(states):
    siso = load_siso()
    mt, ours = draw(5, S=3, T=9, H=4, P=2, N=6, G=2, F=3, states=states)
    want_y, want_st = siso.mamba3_siso_fwd_ref(
        mt["Q"], mt["K"], mt["V"], mt["ADT"], mt["DT"], mt["Trap"], mt["Q_bias"], mt["K_bias"], mt["Angles"],
        Initial_States=mt["states"] if states else None, dtype=torch.float64)
    got = ssm_ref.mamba3_scan(**ours, dtype=np.float64)
    want_st = [_np(t) for t in want_st]
    check({"y": diff(got.y, _np(want_y)), "theta": angle_diff(got.theta, want_st[0]),
           **{n: diff(g, w) for n, g, w in zip("hkv", _siso_states(got)[1:], want_st[1:], strict=True)}},
          {"y": _np(want_y), "theta": 1.0, "h": want_st[1], "k": want_st[2], "v": want_st[3]})


@pytest.mark.parametrize("states", [False, True], ids=["zero-start", "Initial_States"])
def test_siso_fwd_ref_varlen_packed_sequences_are_our_sequences(states):
    # cu_seqlens packs S sequences of T tokens into one batch row; ours takes them as S sequences.
    siso = load_siso()
    S, T = 3, 5
    mt, ours = draw(8, S=S, T=T, H=2, P=2, N=4, G=1, F=2, states=states)

    def packed(a, axis):   # (S, ..., T, ...) -> (1, ..., S*T, ...)
        return torch.cat(list(a), dim=axis - 1).unsqueeze(0)

    want_y, want_st = siso.mamba3_siso_fwd_ref(
        packed(mt["Q"], 1), packed(mt["K"], 1), packed(mt["V"], 1), packed(mt["ADT"], 2), packed(mt["DT"], 2),
        packed(mt["Trap"], 2), mt["Q_bias"], mt["K_bias"], packed(mt["Angles"], 1),
        Initial_States=mt["states"] if states else None, dtype=torch.float64,
        cu_seqlens=torch.arange(0, S * T + 1, T))
    got = ssm_ref.mamba3_scan(**ours, dtype=np.float64)
    want_st = [_np(t) for t in want_st]
    check({"y": diff(got.y.reshape(1, S * T, *got.y.shape[2:]), _np(want_y)),
           "theta": angle_diff(got.theta, want_st[0]),
           **{n: diff(g, w) for n, g, w in zip("hkv", _siso_states(got)[1:], want_st[1:], strict=True)}},
          {"y": _np(want_y), "theta": 1.0, "h": want_st[1], "k": want_st[2], "v": want_st[3]})


def test_siso_fwd_ref_varlen_of_unequal_lengths():
    # Unequal lengths: each packed sequence against a call of ours with that sequence alone.
    siso = load_siso()
    lengths = [4, 1, 6]
    mts, ourss = zip(*(draw(20 + i, S=1, T=L, H=2, P=3, N=4, G=2, F=1, states=True)
                       for i, L in enumerate(lengths)), strict=True)
    cat = {k: torch.cat([mt[k] for mt in mts], dim=2 if k in ("ADT", "DT", "Trap") else 1)
           for k in ("Q", "K", "V", "ADT", "DT", "Trap", "Angles")}
    st0 = tuple(torch.cat([mt["states"][i] for mt in mts]) for i in range(4))
    want_y, want_st = siso.mamba3_siso_fwd_ref(
        cat["Q"], cat["K"], cat["V"], cat["ADT"], cat["DT"], cat["Trap"], mts[0]["Q_bias"], mts[0]["K_bias"],
        cat["Angles"], Initial_States=st0, dtype=torch.float64,
        cu_seqlens=torch.tensor(np.concatenate([[0], np.cumsum(lengths)])))
    bias = {"B_bias": ourss[0]["B_bias"], "C_bias": ourss[0]["C_bias"]}
    outs = [ssm_ref.mamba3_scan(**{**o, **bias}, dtype=np.float64) for o in ourss]
    y = np.concatenate([o.y[0] for o in outs])[None]
    got_st = [np.concatenate(parts) for parts in zip(*(_siso_states(o) for o in outs), strict=True)]
    want_st = [_np(t) for t in want_st]
    check({"y": diff(y, _np(want_y)), "theta": angle_diff(got_st[0], want_st[0]),
           **{n: diff(g, w) for n, g, w in zip("hkv", got_st[1:], want_st[1:], strict=True)}},
          {"y": _np(want_y), "theta": 1.0, "h": want_st[1], "k": want_st[2], "v": want_st[3]})


@pytest.mark.parametrize("states", [False, True], ids=["zero-start", "Input_States"])
@pytest.mark.parametrize("M,G,F", [(2, 1, 2), (3, 2, 4), (1, 2, 1)])
def test_mimo_step_ref_interleaved(states, M, G, F):
    mimo = load_mimo()
    mt, ours = draw(31 + M + G + F, S=2, T=6, H=4, P=3, N=8, G=G, F=F, M=M, states=states)
    want_y, want_st = mimo.mamba3_MIMO_step_ref(
        mt["Q"], mt["K"], mt["V"], mt["ADT"], mt["DT"], mt["Trap"], mt["Q_bias"], mt["K_bias"], mt["Angles"],
        mt["MIMO_V"], mt["MIMO_O"], Input_States=mt["states"] if states else None)
    got = ssm_ref.mamba3_scan(**ours, rotation="interleaved", dtype=np.float64)
    # its output is contracted over the ranks by MIMO_O, outside our op
    y = _np(torch.einsum("stmhp,hmp->sthp", _t(got.y), mt["MIMO_O"]))
    want_st = [_np(t) for t in want_st]
    check({"y": diff(y, _np(want_y)), "theta": angle_diff(got.theta, want_st[0]),
           "h": diff(got.h, want_st[1]), "k": diff(got.k, want_st[2]), "v": diff(got.v, want_st[3])},
          {"y": _np(want_y), "theta": 1.0, "h": want_st[1], "k": want_st[2], "v": want_st[3]})


def _chunk_inputs(mt, dA, chunk):
    """mamba3_MIMO_chunk_ref's dA_cs (the sum of dA within the chunk up to each token) and dA_cs_rev
    (the sum after each token to the chunk's end), (S, H, T) with T a multiple of ``chunk``."""
    S, H, T = dA.shape
    c = dA.reshape(S, H, T // chunk, chunk)
    cs = torch.cumsum(c, dim=-1)
    rev = torch.flip(torch.cumsum(torch.flip(c, dims=[-1]), dim=-1), dims=[-1]) - c
    return cs.reshape(S, H, T), rev.reshape(S, H, T)


@pytest.mark.parametrize("divisor", [2, 4])
@pytest.mark.parametrize("T,chunk", [(8, 4), (6, 6), (7, 4)])
def test_mimo_chunk_ref_halved(divisor, T, chunk):
    # rotary_dim_divisor 2 rotates the pairs (j, j + N/2) for j < N/2, 4 for j < N/4: "halved".
    mimo = load_mimo()
    S, H, P, N, G, M = 2, 4, 3, 8, 2, 2
    F = N // divisor
    mt, ours = draw(40 + divisor + T, S=S, T=T, H=H, P=P, N=N, G=G, F=F, M=M, states=False)
    Tp = -(-T // chunk) * chunk   # the reference pads to whole chunks; its dA_cs cover them
    dA = torch.nn.functional.pad(mt["ADT"], (0, Tp - T))
    dA_cs, dA_cs_rev = _chunk_inputs(mt, dA, chunk)
    angles = torch.cumsum(torch.tanh(mt["Angles"]) * mt["DT"].transpose(1, 2)[..., None] * math.pi, dim=1)
    want_y, want_h, want_k = mimo.mamba3_MIMO_chunk_ref(
        mt["Q"], mt["K"], mt["V"], mt["Q_bias"], mt["K_bias"], mt["MIMO_V"], None, None, None, angles,
        dA_cs[..., :T], dA_cs_rev[..., :T], mt["DT"], mt["Trap"], None, chunk_size=chunk,
        rotary_dim_divisor=divisor, return_final_state=True, dtype=torch.float64, rotate_pairwise=False,
        contract_mimo_out=False)
    got = ssm_ref.mamba3_scan(**ours, rotation="halved", dtype=np.float64)
    measured = {"y": diff(got.y, _np(want_y))}
    refs = {"y": _np(want_y)}
    if T == Tp:   # padding tokens change the reference's final state (its dA_cs pad with zeros)
        measured["k"] = diff(got.k, _np(want_k).transpose(0, 2, 1, 3))   # (S, M, H, N) -> (S, H, M, N)
        refs["k"] = _np(want_k)
        # the final SSM state comes back as float32 (N, P): within half a float32 ulp of ours
        h32 = _np(want_h).transpose(0, 1, 3, 2).astype(np.float64)
        assert np.all(np.abs(got.h - h32) <= np.spacing(np.abs(got.h).astype(np.float32)) / 2 + 1e-12)
    check(measured, refs)
