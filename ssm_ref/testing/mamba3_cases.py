"""Whole problems of the Mamba-3 scan (``mamba3_scan``, ssm_ref.ops.MAMBA3) for testing an
implementation: sizes, inputs, the rotation convention and loss gradients, from a seed.

Glossary (docs/SPEC.md, "Mamba-3"): S sequences · T tokens · H heads · P channels per head ·
N state size · G groups (H % G == 0) · M MIMO rank (SISO: no rank axis) · F rotated pairs
(0 <= F <= N/2) · R rows of the state cache.

``make_case(seed, **dims)`` builds one :class:`ssm_ref.testing.cases.OpCase` (its ``keywords``
hold the rotation, passed to every call); ``cases(quick, seed)`` lists the fixed problems of
``ssm-scan check --op mamba3_scan``; ``strategy()`` is the hypothesis strategy of the fuzzer and
the tests (dims first, values from a seed). Every float is stored as float32, so a float32 port
and the float64 oracle see the same numbers.

The values are those a Mamba-3 layer of mamba_ssm hands its scan
(https://github.com/state-spaces/mamba/blob/main/mamba_ssm/modules/mamba3.py): dt = softplus(-3 +
randn) (about 0.05), a data-dependent A = -U(1, 16) per token and dA = A*dt, lam = sigmoid(randn)
in (0, 1), B and C RMS-normalised over N (each vector's RMS is 1), the biases ~ N(0, 1), dtheta =
pi*tanh(randn)*dt, psi ~ (1 + N(0, 0.5^2))/M around the layer's 1/M init, x ~ N(0, 1); start states
theta ~ U(0, 2*pi), h ~ N(0, 0.5^2), k and v ~ N(0, 1); loss gradients ~ U(-1, 1).

Value regimes (``regime=``), each a different way for a port to go wrong:

===========  =====================================================================================
typical      the values above
long_decay   decay near 1 over many tokens: dA ~ -U(5e-4, 1e-2) (alpha in [0.99, 0.9995]); the
             strategy pairs it with a large T, where the state sums hundreds of terms
small_dA     alpha at and near 1: dA ~ -U(0, 1e-3) with about a quarter of it exactly 0, and lam
             at its ends (some entries exactly 0 or 1: the trapezoid's pure beta and pure gamma)
large_dt     steps of 1 to 8: alpha near 0 (dA down to -128) and angle increments of many turns,
             so the running angle wraps mod 2*pi at most tokens
tiny         x and the start states scaled by 1e-4 (y, h, v of order 1e-4 and below)
large        x and the start states scaled by 1e3 (y, h, v of order 1e3 and above)
===========  =====================================================================================
"""

from __future__ import annotations

import numpy as np

from ssm_ref.mamba3_checks import ROTATIONS
from ssm_ref.ops import MAMBA3

from .cases import IDS_PATTERNS, OpCase, _default_R, _ids

__all__ = ["GOLDEN", "IDS_PATTERNS", "REGIMES", "ROTATIONS", "cases", "make_case", "strategy"]

REGIMES = ("typical", "long_decay", "small_dA", "large_dt", "tiny", "large")


# The golden vectors (``ssm-scan vectors --op mamba3_scan``): name -> (what it exercises, the
# make_case arguments). Fixed seeds: the values never change.
GOLDEN = {
    "siso_tiny": ("the smallest interesting case: SISO, one group, one rotated pair, start states in rows 0..S-1",
                  dict(seed=301, S=1, T=3, H=2, P=2, N=4, G=1, F=1)),
    "siso_cache_rows": ("SISO, two groups of two heads, ids permuted into a cache of R = 3 > S = 2 rows",
                        dict(seed=302, S=2, T=4, H=4, P=3, N=6, G=2, F=2, R=3, ids="permutation")),
    "shared_rows": ("ids [2, 0, 2]: two sequences read one row, row 1 and 3 by none; d_s_* add the two",
                    dict(seed=303, S=3, T=4, H=2, P=2, N=4, G=1, F=2, R=4, ids=[2, 0, 2])),
    "no_states": ("no start states (all four None, ids None): zero start, the start gradients per sequence",
                  dict(seed=304, S=2, T=3, H=2, P=2, N=4, G=1, F=1, states=False)),
    "no_rotation": ("F = 0: nothing rotates (theta has no entries)", dict(seed=305, S=2, T=4, H=2, P=2, N=5, G=1, F=0)),
    "mimo_halved": ("MIMO rank 2, halved pairs (j, j + N/2) on N/4 pairs, psi given, ids permuted",
                    dict(seed=306, S=2, T=4, H=2, P=3, N=8, G=1, M=2, F=2, R=3, ids="permutation",
                         rotation="halved")),
    "mimo_psi_none": ("MIMO rank 4 with psi None (ones; no d_psi), halved pairs over the whole state (F = N/2)",
                      dict(seed=307, S=2, T=3, H=2, P=2, N=4, G=2, M=4, F=2, psi=False, rotation="halved")),
    "mimo_rank1": ("MIMO of rank 1: the rank axis of size 1 everywhere",
                   dict(seed=308, S=1, T=3, H=2, P=2, N=4, G=1, M=1, F=1)),
    "decode_step": ("T = 1 from cached states: one decoding step, MIMO rank 2",
                    dict(seed=309, S=3, T=1, H=2, P=2, N=4, G=1, M=2, F=1, R=4, ids="unused")),
    "no_tokens": ("T = 0: empty y, the outputs are the start states read at ids, the start gradients the "
                  "cotangents", dict(seed=310, S=2, T=0, H=2, P=2, N=4, G=1, F=2, R=3, ids="permutation")),
    "long_decay": ("T = 128 with alpha in [0.99, 0.9995]", dict(seed=311, S=1, T=128, H=2, P=2, N=4, G=1, F=1,
                                                                 regime="long_decay")),
    "large_dt": ("steps of 1 to 8: alpha near 0, the angles wrap mod 2*pi at most tokens",
                 dict(seed=312, S=2, T=5, H=2, P=2, N=4, G=1, M=2, F=2, regime="large_dt")),
    "wide_state": ("d_state 64, head_dim 16, 16 pairs (mamba_ssm's default rope_fraction 0.5)",
                   dict(seed=313, S=1, T=4, H=2, P=16, N=64, G=1, F=16)),
}


def _rms_normed(rng, shape) -> np.ndarray:
    """randn normalised to RMS 1 over the last axis (as the layer's RMSNorm of B and C, weight 1)."""
    v = rng.standard_normal(shape)
    if shape[-1] == 0:
        return v.astype(np.float32)
    return (v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + 1e-5)).astype(np.float32)


def _softplus(v: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, v)


def make_case(seed, *, S=2, T=5, H=2, P=3, N=4, G=1, M=None, F=None, R=None, ids="none", states=True,
              psi=True, rotation="interleaved", regime="typical") -> OpCase:
    """Build one Mamba-3 problem.

    seed: an int (the case then carries a ``recipe``: these keyword arguments, seed included, which
    rebuild it). M: None for SISO (no rank axis), else the MIMO rank >= 1. F: the rotated pairs
    (default N // 4: mamba_ssm's default rope_fraction 0.5 rotates half of the state, N/4 pairs);
    N must be even when F > 0. ids: a pattern of ssm_ref.testing.cases.IDS_PATTERNS or explicit
    ints (R defaults to max + 1); states False: zero start states, ids must then be "none". psi:
    MIMO only, False gives psi None (ones). rotation: "interleaved" or "halved" (the case's
    keyword). regime: one of :data:`REGIMES`.
    Returns an OpCase of op "mamba3_scan": dims S T H P N G F R (and M for MIMO), inputs by name
    (x dt dA lam B C B_bias C_bias dtheta psi s_theta s_h s_k s_v ids; float32, ids int64 or
    None), cotangents g_y g_theta g_h g_k g_v (float32), keywords {"rotation": rotation}.
    Raises ValueError for sizes, patterns, regimes or rotations outside these rules.
    """
    F = N // 4 if F is None else F
    recipe = None
    if isinstance(seed, (int, np.integer)):
        recipe = dict(seed=int(seed), S=S, T=T, H=H, P=P, N=N, G=G, M=M, F=F, R=R,
                      ids=ids if isinstance(ids, str) else [int(i) for i in ids], states=states, psi=psi,
                      rotation=rotation, regime=regime)
        rng = np.random.default_rng(int(seed))
    else:
        rng = seed
    for name, v in (("S", S), ("T", T), ("H", H), ("P", P), ("N", N), ("G", G), ("F", F)):
        if not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name}: expected an integer >= 0, got {v!r}")
    if G < 1 or H % G:
        raise ValueError(f"G: expected G >= 1 dividing H = {H}, got {G}")
    if M is not None and (not isinstance(M, (int, np.integer)) or M < 1):
        raise ValueError(f"M: expected None (SISO) or an integer >= 1, got {M!r}")
    if 2 * F > N or (F and N % 2):
        raise ValueError(f"F: expected 0 <= F <= N/2 with N even when F > 0, got F = {F}, N = {N}")
    if rotation not in ROTATIONS:
        raise ValueError(f"rotation: expected one of {ROTATIONS}, got {rotation!r}")
    if regime not in REGIMES:
        raise ValueError(f"regime: expected one of {REGIMES}, got {regime!r}")
    if not states and ids != "none":
        raise ValueError(f"ids: without start states the ids must be 'none', got {ids!r}")
    if isinstance(ids, str):
        R = _default_R(ids, S) if R is None else R
        if ids == "duplicates" and S < 2:
            raise ValueError("ids: the duplicates pattern needs S >= 2")
        if ids == "unused" and R <= S:
            raise ValueError("ids: the unused pattern needs R > S")
        ids_arr = _ids(rng, ids, S, R)
    else:
        ids_arr = np.asarray(ids, dtype=np.int64)
        R = int(ids_arr.max()) + 1 if R is None else R
    if recipe is not None:
        recipe["R"] = R
    mimo = M is not None
    rank = (M,) if mimo else ()                 # the rank axis, where MIMO has one
    f32 = np.float32

    def n(shape, scale=1.0):
        return (scale * rng.standard_normal(shape)).astype(f32)

    # The draw order is fixed: a seed's typical values never change with the regimes below.
    dt = _softplus(-3.0 + rng.standard_normal((S, T, H))).astype(f32)        # (S, T, H)
    A = -rng.uniform(1.0, 16.0, (S, T, H))                                    # (S, T, H) data-dependent A
    lam = (1.0 / (1.0 + np.exp(-rng.standard_normal((S, T, H))))).astype(f32)
    inputs = dict(
        x=n((S, T, H, P)),
        dt=dt,
        dA=(A * dt).astype(f32),
        lam=lam,
        B=_rms_normed(rng, (S, T, *rank, G, N)),
        C=_rms_normed(rng, (S, T, *rank, G, N)),
        B_bias=n((H, *rank, N)),
        C_bias=n((H, *rank, N)),
        dtheta=(np.pi * np.tanh(rng.standard_normal((S, T, H, F))) * dt[..., None]).astype(f32),
        psi=((1.0 + n((H, M, P), 0.5)) / M).astype(f32) if mimo else None,
        s_theta=rng.uniform(0.0, 2 * np.pi, (R, H, F)).astype(f32),
        s_h=n((R, H, P, N), 0.5),
        s_k=n((R, H, *rank, N)),
        s_v=n((R, H, *rank, P)),
        ids=ids_arr,
    )
    cot = {"g_y": rng.uniform(-1, 1, (S, T, *rank, H, P)).astype(f32),
           "g_theta": rng.uniform(-1, 1, (S, H, F)).astype(f32),
           "g_h": rng.uniform(-1, 1, (S, H, P, N)).astype(f32),
           "g_k": rng.uniform(-1, 1, (S, H, *rank, N)).astype(f32),
           "g_v": rng.uniform(-1, 1, (S, H, *rank, P)).astype(f32)}
    if regime == "long_decay":
        inputs["dA"] = -rng.uniform(5e-4, 1e-2, (S, T, H)).astype(f32)
    elif regime == "small_dA":
        dA = -rng.uniform(0.0, 1e-3, (S, T, H))
        inputs["dA"] = np.where(rng.random((S, T, H)) < 0.25, 0.0, dA).astype(f32)
        ends = rng.random((S, T, H))
        inputs["lam"] = np.where(ends < 0.2, 0.0, np.where(ends > 0.8, 1.0, lam)).astype(f32)
    elif regime == "large_dt":
        big = rng.uniform(1.0, 8.0, (S, T, H)).astype(f32)
        inputs["dt"], inputs["dA"] = big, (A * big).astype(f32)
        inputs["dtheta"] = (np.pi * np.tanh(rng.standard_normal((S, T, H, F))) * big[..., None]).astype(f32)
    elif regime in ("tiny", "large"):
        k = f32(1e-4 if regime == "tiny" else 1e3)
        for name in ("x", "s_h", "s_v"):
            inputs[name] = (inputs[name] * k).astype(f32)
    if mimo and not psi:
        inputs["psi"] = None
    if not states:
        for name in ("s_theta", "s_h", "s_k", "s_v"):
            inputs[name] = None
        inputs["ids"] = None
    dims = dict(S=S, T=T, H=H, P=P, N=N, G=G, **({"M": M} if mimo else {}), F=F, R=R if states else S)
    return OpCase(MAMBA3.name, dims, inputs, cot, regime, recipe, {"rotation": rotation})


def cases(quick: bool = True, seed: int = 0) -> list:
    """The fixed problems of ``ssm-scan check --op mamba3_scan``: SISO and MIMO, both rotations,
    cache rows read by permuted and repeated ids, no start states, psi None, one token, no tokens,
    a long decay; ``quick=False`` adds larger shapes (P = 16, N = 32, T = 64; MIMO rank 4). The
    first two are the ones ``check`` holds to finite differences."""
    specs = [
        dict(S=2, T=4, H=2, P=3, N=4, G=1, F=1, ids="permutation"),
        dict(S=2, T=3, H=4, P=2, N=6, G=2, M=2, F=2, ids="duplicates", rotation="halved"),
        dict(S=3, T=5, H=2, P=2, N=4, G=2, F=2, states=False),
        dict(S=2, T=3, H=2, P=2, N=4, G=1, M=3, F=1, ids="unused", psi=False),
        dict(S=2, T=1, H=2, P=3, N=8, G=1, M=2, F=4, ids="identity", rotation="halved"),
        dict(S=2, T=0, H=2, P=2, N=4, G=1, F=2, ids="permutation"),
        dict(S=1, T=96, H=2, P=2, N=4, G=1, M=2, F=1, regime="long_decay"),
        dict(S=2, T=6, H=2, P=2, N=4, G=1, F=2, ids="permutation", regime="large_dt"),
    ]
    if not quick:
        specs += [dict(S=2, T=64, H=4, P=16, N=32, G=2, F=8, ids="permutation"),
                  dict(S=2, T=64, H=4, P=16, N=32, G=1, M=4, F=16, ids="permutation", rotation="halved"),
                  dict(S=2, T=16, H=2, P=4, N=8, G=1, M=2, F=2, regime="small_dA"),
                  dict(S=2, T=16, H=2, P=4, N=8, G=1, F=2, regime="tiny"),
                  dict(S=2, T=16, H=2, P=4, N=8, G=1, M=2, F=2, regime="large")]
    return [make_case(seed + k, **spec) for k, spec in enumerate(specs)]


def strategy(*, regimes=REGIMES, max_S=3, max_T=8, max_T_long=64, max_G=2, max_H_per_G=2, max_P=4, max_N=8,
             max_M=3, ids_patterns=IDS_PATTERNS, rotations=ROTATIONS):
    """A hypothesis strategy of whole Mamba-3 cases (needs hypothesis): the regime, SISO or MIMO
    (M in 1..max_M), S, G, H = G*(1..max_H_per_G), P, N (1..max_N; even when any pair rotates),
    F in 0..N/2, T (0 and 1 favoured; max_T_long/4..max_T_long for long_decay), start states
    or none, the ids pattern, psi or None, the rotation and a seed are drawn; the values come from
    the seed (:func:`make_case`), so a failure shrinks to small sizes and prints its recipe.
    Raises ValueError (when called) for a regime, pattern or rotation outside the known ones."""
    from hypothesis import strategies as st

    for name, got, allowed in (("regimes", regimes, REGIMES), ("ids_patterns", ids_patterns, IDS_PATTERNS),
                               ("rotations", rotations, ROTATIONS)):
        if not got or any(v not in allowed for v in got):
            raise ValueError(f"{name}: expected a non-empty selection of {allowed}, got {tuple(got)}")

    @st.composite
    def draw_case(draw):
        regime = draw(st.sampled_from(tuple(regimes)))
        mimo = draw(st.booleans())
        M = draw(st.integers(1, max_M)) if mimo else None
        S = draw(st.integers(1, max_S))
        G = draw(st.integers(1, max_G))
        H = G * draw(st.integers(1, max_H_per_G))
        P = draw(st.integers(1, max_P))
        N = draw(st.integers(1, max_N))
        F = draw(st.integers(0, N // 2)) if N % 2 == 0 else 0
        if regime == "long_decay":
            T = draw(st.integers(max(1, max_T_long // 4), max(1, max_T_long)))
        else:
            T = draw(st.one_of(st.sampled_from((0, 1)), st.integers(0, max_T)))
        states = draw(st.booleans())
        patterns = [p for p in ids_patterns if not (p == "duplicates" and S < 2)] or ["none"]
        pattern = draw(st.sampled_from(patterns)) if states else "none"
        R = None
        if pattern in ("permutation", "unused", "none") and states:
            R = S + draw(st.integers(1 if pattern == "unused" else 0, 2))
        psi = draw(st.booleans()) if mimo else True
        rotation = draw(st.sampled_from(tuple(rotations)))
        seed = draw(st.integers(0, 2**32 - 1))
        return make_case(seed, S=S, T=T, H=H, P=P, N=N, G=G, M=M, F=F, R=R, ids=pattern, states=states,
                         psi=psi, rotation=rotation, regime=regime)

    return draw_case()
