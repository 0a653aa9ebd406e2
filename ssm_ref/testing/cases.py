"""Whole problems for testing a scan implementation: dimensions, inputs and loss gradients.

Glossary (docs/SPEC.md): N d_state · P head_dim · H n_head · G n_group (H % G == 0) · T tokens ·
S sequences · R rows of the state cache s (every id < R).

``make_problem(seed, **dims)`` builds one :class:`Case` from a seed (or a numpy Generator).
Every float is stored as float32 (as ggml holds it), so a float32 implementation and the float64
oracle see exactly the same numbers and their difference is arithmetic only. No hypothesis here:
the strategies that draw Cases are in :mod:`ssm_ref.testing.strategies`.

Value regimes (``regime=``), each a different way for a port to go wrong:

=============  ==================================================================================
typical        ggmlR's R test's ranges: s, B, C ~ U(-0.5, 0.5), x ~ U(-1, 1), dt ~ U(-0.5, 0.5),
               A ~ -U(0.2, 1.0); g_y, g_states ~ U(-1, 1)
wide_dt        dt beyond +-20: each dt is typical, exactly 20 (the log branch), in (20, 40]
               (identity branch) or in [-40, -20) (float32 softplus is exactly 0 there)
small_A        A near 0: U(-1e-3, 1e-3), about a quarter of the entries (at least one) exactly 0
long_decay     decay near 1 over many tokens: A ~ -U(1e-3, 1e-2), so a = exp(d*A) is in
               [0.99, 0.9995]; the strategies pair it with a large T
overflow       some heads have A ~ U(100, 300) > 0; on those heads each sequence is either hot
               (every dt in [10, 30]: exp(d*A) overflows to inf at every token, float32 and
               float64 alike) or frozen (every dt in [-45, -40]: d*A ~ 0). The other heads
               are typical. Designed so float32 and float64 give non-finite values at the same
               places (docs/SPEC.md section 8); the finite entries are judged by tolerance.
nonfinite      typical values with a few nan, +inf and -inf written into random entries of the
               inputs and the loss gradients. The float64 oracle may place non-finite values
               differently from float32 here (float32's softplus is exactly 0 where float64's
               is tiny, and inf * 0 is nan), so implementations are compared with the float32
               reference's non-finite pattern only.
=============  ==================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ssm_ref.ops import SCAN

__all__ = [
    "IDS_PATTERNS",
    "INPUT_NAMES",
    "ORACLE_REGIMES",
    "REGIMES",
    "CHECK_MORE",
    "CHECK_QUICK",
    "Case",
    "OpCase",
    "check_cases",
    "make_problem",
]

INPUT_NAMES = SCAN.float_inputs        # s, x, dt, A, B, C

# How ids map sequences to cache rows:
#   none         ids=None (the default, arange(S)); R may exceed S, the extra rows are unused
#   identity     ids = arange(S) given explicitly, R = S
#   permutation  S distinct rows of R in shuffled order (R >= S; rows left over are unused)
#   duplicates   some sequences share a row (needs S >= 2; one row is forced to repeat)
#   unused       S distinct sorted rows of R > S, so at least one row is read by nobody
IDS_PATTERNS = ("none", "identity", "permutation", "duplicates", "unused")

REGIMES = ("typical", "wide_dt", "small_A", "long_decay", "overflow", "nonfinite")
# The regimes whose float32 results are held to the float64 oracle within the tolerance table.
ORACLE_REGIMES = ("typical", "wide_dt", "small_A", "long_decay", "overflow")


@dataclass
class Case:
    """One problem: dims, float32 inputs (ids int64 or None) and the loss gradients.

    ``K``: the state snapshots the forward is asked for (``snapshots=K``, docs/SPEC.md section
    3.1; 1: the final states alone, as every port computes); ``g_snapshots`` (K, S, H, P, N)
    float32, the loss gradient of the K slots when K > 1, else None.
    ``recipe`` holds the keyword arguments that rebuild this Case with :func:`make_problem`
    (seed included) when it was made from an integer seed; None otherwise.
    """

    dims: dict                      # S T H P N G R
    variant: str                    # "mamba1" (A (H, N)) or "mamba2" (A (H,) or (H, 1))
    ids_pattern: str
    inputs: dict = field(repr=False)     # s x dt A B C ids
    g_y: np.ndarray = field(repr=False)      # (S, T, H, P) float32
    g_states: np.ndarray = field(repr=False)  # (S, H, P, N) float32
    regime: str = "typical"
    recipe: dict | None = None
    K: int = 1
    g_snapshots: np.ndarray | None = field(default=None, repr=False)
    name: str = ""                  # a short name for reports (check's problems); empty: the label
    what: str = ""                  # what the case exercises, for reports

    op = SCAN.name   # the op these are problems of (ssm_ref.ops); the op-generic properties read it

    @property
    def cotangents(self) -> dict:
        """The loss gradients by the op's names (g_y, g_states)."""
        return {"g_y": self.g_y, "g_states": self.g_states}

    def args(self, dtype=None) -> dict:
        """Fresh copies of the inputs (widened to ``dtype`` if given) as keyword arguments."""
        out = {}
        for k, v in self.inputs.items():
            if v is None or k == "ids":
                out[k] = None if v is None else v.copy()
            else:
                out[k] = v.astype(dtype) if dtype is not None else v.copy()
        return out

    @property
    def ids(self) -> np.ndarray:
        """The effective ids (arange(S) when the inputs say None)."""
        ids = self.inputs["ids"]
        return np.arange(self.dims["S"]) if ids is None else ids

    @property
    def label(self) -> str:
        d = self.dims
        seed = f" seed={self.recipe['seed']}" if self.recipe else ""
        return (f"S={d['S']} T={d['T']} H={d['H']} P={d['P']} N={d['N']} G={d['G']} R={d['R']} "
                f"{self.variant} A{self.inputs['A'].shape} ids={self.ids_pattern} "
                f"regime={self.regime}{f' K={self.K}' if self.K != 1 else ''}{seed}")

    def size(self) -> int:
        """Elements in all inputs and loss gradients together."""
        n = sum(v.size for k, v in self.inputs.items() if v is not None and k != "ids")
        return n + self.g_y.size + self.g_states.size + (0 if self.g_snapshots is None else self.g_snapshots.size)


@dataclass
class OpCase:
    """One problem of any declared op (ssm_ref.ops): its sizes by shape letter, its inputs and the
    loss gradients (``cotangents``, "g_" + each output's name) by name, float32 (index inputs
    int64 or None; an optional input may be None). ``keywords``: the keyword arguments of every
    call of the op on this problem, the forward's, the backward's and the reference's alike
    (Mamba-3's ``rotation``); empty for most ops. What the op-generic properties
    (ssm_ref.testing.properties.generic) and ``ssm-scan check --op`` run; the scan's own
    problems are :class:`Case`."""

    op: str
    dims: dict
    inputs: dict = field(repr=False)
    cotangents: dict = field(repr=False)
    regime: str = "typical"
    recipe: dict | None = None
    keywords: dict = field(default_factory=dict)
    name: str = ""                  # a short name for reports (check's problems); empty: the label
    what: str = ""                  # what the case exercises, for reports

    def args(self, dtype=None) -> dict:
        """Fresh copies of the inputs (the float ones widened to ``dtype`` if given) by name."""
        out = {}
        for k, v in self.inputs.items():
            if v is None or v.dtype.kind != "f":
                out[k] = None if v is None else v.copy()
            else:
                out[k] = v.astype(dtype) if dtype is not None else v.copy()
        return out

    @property
    def label(self) -> str:
        seed = f" seed={self.recipe['seed']}" if self.recipe else ""
        kw = "".join(f" {k}={v}" for k, v in self.keywords.items())
        return (f"{self.op} " + " ".join(f"{k}={v}" for k, v in self.dims.items())
                + f"{kw} regime={self.regime}{seed}")


def _ids(rng, pattern: str, S: int, R: int):
    if pattern == "none":
        return None
    if pattern == "identity":
        return np.arange(S, dtype=np.int64)
    if pattern == "permutation":
        return rng.permutation(R)[:S].astype(np.int64)
    if pattern == "duplicates":
        ids = rng.integers(0, R, S).astype(np.int64)
        ids[-1] = ids[0]
        return ids
    if pattern == "unused":
        return np.sort(rng.choice(R, S, replace=False)).astype(np.int64)
    raise ValueError(f"ids: unknown pattern {pattern!r}, expected one of {IDS_PATTERNS}")


def _default_R(pattern: str, S: int) -> int:
    return {"identity": S, "none": S, "duplicates": S, "permutation": S + 1, "unused": S + 2}[pattern]


def _u(rng, lo, hi, shape) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(np.float32)


def _pick(rng, choices: list[np.ndarray]) -> np.ndarray:
    """Element-wise choice among same-shaped arrays, uniformly."""
    k = rng.integers(0, len(choices), choices[0].shape)
    return np.choose(k, choices).astype(np.float32)


def _wide_dt(rng, shape) -> np.ndarray:
    return _pick(rng, [_u(rng, -0.5, 0.5, shape), np.full(shape, 20.0, np.float32),
                       _u(rng, 20.0, 40.0, shape) + np.float32(1e-3), _u(rng, -40.0, -20.0, shape)])


def _overflow(rng, inputs: dict, S: int, T: int, H: int) -> None:
    """Hot heads (A > 0): per sequence all tokens overflow exp, or all are frozen (d*A ~ 0)."""
    A = inputs["A"]                                           # (H,), (H, 1) or (H, N)
    hot_head = rng.random(H) < 0.5                            # (H,)
    if H:
        hot_head[rng.integers(0, H)] = True
    A[hot_head] = _u(rng, 100.0, 300.0, A[hot_head].shape)
    hot_seq = rng.random((S, H)) < 0.5                        # (S, H)
    dt = inputs["dt"]                                         # (S, T, H)
    for h in np.flatnonzero(hot_head):
        for i in range(S):
            lo, hi = (10.0, 30.0) if hot_seq[i, h] else (-45.0, -40.0)
            dt[i, :, h] = _u(rng, lo, hi, T)


def _poison(rng, arrays: dict) -> None:
    """Write a few nan / +inf / -inf into random entries of the non-empty arrays."""
    names = [k for k, v in arrays.items() if v is not None and v.size]
    if not names:
        return
    for _ in range(int(rng.integers(1, 4))):
        v = arrays[names[int(rng.integers(0, len(names)))]]
        v.flat[int(rng.integers(0, v.size))] = (np.nan, np.inf, -np.inf)[int(rng.integers(0, 3))]


def make_problem(rng, *, S=2, T=3, H=4, P=2, N=3, G=2, R=None, ids="permutation",
                 variant="mamba2", a_form="h", dt_range=(-0.5, 0.5), regime="typical", K=1) -> Case:
    """Build one Case.

    rng: an int seed (the Case then carries a ``recipe`` that rebuilds it) or a numpy Generator.
    ids: a pattern name from IDS_PATTERNS or an explicit sequence of ints (R defaults to
    max + 1). a_form picks Mamba-2's A shape: "h" -> (H,), "h1" -> (H, 1); Mamba-1's is (H, N).
    dt_range: the typical dt range (typical regime only). regime: one of REGIMES. K: the state
    snapshots (>= 1); K > 1 draws g_snapshots (K, S, H, P, N) ~ U(-1, 1) after every other
    array, so the inputs, g_y and g_states are those of the same seed with K = 1 (a recipe
    names K only when it is not 1).
    Raises ValueError for an unknown pattern, variant or regime, a pattern the sizes forbid, or
    K < 1.
    """
    if isinstance(K, (bool, np.bool_)) or not isinstance(K, (int, np.integer)) or K < 1:
        raise ValueError(f"K: expected an integer >= 1 (the state snapshots), got {K!r}")
    K = int(K)
    recipe = None
    if isinstance(rng, (int, np.integer)):
        recipe = dict(seed=int(rng), S=S, T=T, H=H, P=P, N=N, G=G, R=R, ids=ids, variant=variant,
                      a_form=a_form, regime=regime)
        if K != 1:
            recipe["K"] = K
        if not isinstance(ids, str):
            recipe["ids"] = [int(i) for i in ids]
        rng = np.random.default_rng(int(rng))
    if regime not in REGIMES:
        raise ValueError(f"regime: expected one of {REGIMES}, got {regime!r}")
    if isinstance(ids, str):
        R = _default_R(ids, S) if R is None else R
        if ids == "duplicates" and S < 2:
            raise ValueError("ids: the duplicates pattern needs S >= 2")
        if ids == "unused" and R <= S:
            raise ValueError("ids: the unused pattern needs R > S")
        pattern, ids_arr = ids, _ids(rng, ids, S, R)
    else:
        pattern, ids_arr = "explicit", np.asarray(ids, dtype=np.int64)
        R = int(ids_arr.max()) + 1 if R is None else R
    if recipe is not None:
        recipe["R"] = R

    if variant == "mamba1":
        a_shape = (H, N)
    elif variant == "mamba2":
        a_shape = (H,) if a_form == "h" else (H, 1)
    else:
        raise ValueError(f"variant: expected 'mamba1' or 'mamba2', got {variant!r}")
    # The draw order of the typical regime is fixed: seeds of existing tests keep their values.
    inputs = dict(
        s=_u(rng, -0.5, 0.5, (R, H, P, N)),
        x=_u(rng, -1.0, 1.0, (S, T, H, P)),
        dt=_u(rng, *dt_range, (S, T, H)),
        A=-_u(rng, 0.2, 1.0, a_shape),
        B=_u(rng, -0.5, 0.5, (S, T, G, N)),
        C=_u(rng, -0.5, 0.5, (S, T, G, N)),
        ids=ids_arr,
    )
    g_y, g_states = _u(rng, -1.0, 1.0, (S, T, H, P)), _u(rng, -1.0, 1.0, (S, H, P, N))
    if regime == "wide_dt":
        inputs["dt"] = _wide_dt(rng, (S, T, H))
    elif regime == "small_A":
        A = _u(rng, -1e-3, 1e-3, a_shape)
        A = np.where(rng.random(a_shape) < 0.25, np.float32(0), A).astype(np.float32)
        if A.size:
            A.flat[int(rng.integers(0, A.size))] = 0.0                # at least one exact 0
        inputs["A"] = A
    elif regime == "long_decay":
        inputs["A"] = -_u(rng, 1e-3, 1e-2, a_shape)
    elif regime == "overflow":
        _overflow(rng, inputs, S, T, H)
    elif regime == "nonfinite":
        _poison(rng, {**{k: inputs[k] for k in INPUT_NAMES}, "g_y": g_y, "g_states": g_states})
    g_snapshots = _u(rng, -1.0, 1.0, (K, S, H, P, N)) if K > 1 else None
    return Case(dims=dict(S=S, T=T, H=H, P=P, N=N, G=G, R=R), variant=variant, ids_pattern=pattern,
                inputs=inputs, g_y=g_y, g_states=g_states, regime=regime, recipe=recipe, K=K,
                g_snapshots=g_snapshots)


# The fixed problems of ``ssm-scan check`` (name, what it exercises, make_problem's arguments; the
# first two are the ones held to finite differences); ``quick=False`` adds the second group.
CHECK_QUICK = (
    ("mamba2", "Mamba-2, 2 groups, 2 of 3 cache rows in shuffled order",
     dict(N=16, P=8, H=4, G=2, T=16, S=2, R=3, ids="permutation")),
    ("mamba1", "Mamba-1: A (H, N)", dict(N=16, P=1, H=8, G=1, T=20, S=1, variant="mamba1")),
    ("shared-rows", "3 sequences on 2 cache rows, N = 5 (no power of two)",
     dict(N=5, P=3, H=2, G=1, T=17, S=3, R=2, ids="duplicates")),
    ("ggml", "a layout ggml's Vulkan kernels take: d_state 128, head_dim 16", dict(N=128, P=16, H=2, G=1, T=8, S=1)),
    ("snapshots", "K = 4 state snapshots over T = 3 tokens: slot 3 the start state, ggml writes slots 0-2",
     dict(N=16, P=8, H=4, G=2, T=3, S=2, R=3, ids="permutation", K=4)),
)
CHECK_MORE = (
    ("demo", "the demo shape (Mamba-2, d_state 128, head_dim 64)", dict(N=128, P=64, H=16, G=1, T=64, S=1)),
    ("n256", "d_state 256, 2 groups", dict(N=256, P=16, H=4, G=2, T=40, S=2)),
    ("n256-odd", "d_state 256 with H*P = 48, no multiple of 32 (a layout ggml's Vulkan kernel takes)",
     dict(N=256, P=16, H=3, G=1, T=9, S=1)),
    ("mamba1-long", "Mamba-1, T not a multiple of the checkpoint interval",
     dict(N=16, P=1, H=64, G=1, T=300, S=2, variant="mamba1")),
    ("many-groups", "4 groups, 3 of 5 cache rows", dict(N=64, P=32, H=8, G=4, T=33, S=3, R=5, ids="permutation")),
    ("no-tokens", "T = 0", dict(N=8, P=4, H=2, G=1, T=0, S=2)),
    ("snapshots-long", "K = 5 state snapshots of a 40-token scan, d_state 128",
     dict(N=128, P=16, H=4, G=2, T=40, S=2, K=5)),
)


def check_cases(quick: bool = True, seed: int = 0) -> list[Case]:
    """The fixed problems of ``ssm-scan check`` (the scan's declared ``cases``): Mamba-1 and
    Mamba-2, groups, permuted and shared cache rows, d_state that is no power of two, ggml's
    layouts, K state snapshots; ``quick=False`` adds larger ones, T = 0 and a long Mamba-1. Case k
    is drawn from ``seed + k``, ids "none" (R = S) unless given."""
    specs = CHECK_QUICK if quick else (*CHECK_QUICK, *CHECK_MORE)
    out = []
    for k, (name, what, dims) in enumerate(specs):
        c = make_problem(seed + k, **{"ids": "none", **dims})
        c.name, c.what = name, what
        out.append(c)
    return out
