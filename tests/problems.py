"""Sample problems for the scan tests: a plain builder and a hypothesis strategy.

Glossary (SCAN.md): N d_state · P head_dim · H n_head · G n_group (H % G == 0) · T tokens ·
S sequences · R rows of the state cache s (every id < R).

Values follow the seed test (seed/test-ssm-scan-back-cpu-gpu.R): s, B, C ~ U(-0.5, 0.5),
x ~ U(-1, 1), dt ~ U(-0.5, 0.5), A ~ -U(0.2, 1.0), the loss gradients g_y, g_states ~ U(-1, 1).
Every float input is stored as float32 (as ggml holds it), so a float32 backend and the float64
oracle see exactly the same numbers and their difference is arithmetic error only.

``make_problem(rng, **dims)`` builds one :class:`Case`; ``problems()`` is a ``@composite``
strategy that draws the dimensions, the ids pattern and the variant, then a seed for the values
(drawing every float through hypothesis would be slow and would not shrink to anything useful).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

__all__ = ["IDS_PATTERNS", "INPUT_NAMES", "Case", "make_problem", "problems"]

INPUT_NAMES = ("s", "x", "dt", "A", "B", "C")

# How ids map sequences to cache rows:
#   none         ids=None (the default, arange(S)); R may exceed S, the extra rows are unused
#   identity     ids = arange(S) given explicitly, R = S
#   permutation  S distinct rows of R in shuffled order (R >= S; rows left over are unused)
#   duplicates   some sequences share a row (needs S >= 2; one row is forced to repeat)
#   unused       S distinct sorted rows of R > S, so at least one row is read by nobody
IDS_PATTERNS = ("none", "identity", "permutation", "duplicates", "unused")


@dataclass
class Case:
    """One problem: dims, float32 inputs (ids int64 or None) and the loss gradients."""

    dims: dict                      # S T H P N G R
    variant: str                    # "mamba1" (A (H, N)) or "mamba2" (A (H,) or (H, 1))
    ids_pattern: str
    inputs: dict = field(repr=False)     # s x dt A B C ids
    g_y: np.ndarray = field(repr=False)      # (S, T, H, P)
    g_states: np.ndarray = field(repr=False)  # (S, H, P, N)

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
        return (f"S={d['S']} T={d['T']} H={d['H']} P={d['P']} N={d['N']} G={d['G']} R={d['R']} "
                f"{self.variant} A{self.inputs['A'].shape} ids={self.ids_pattern}")


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
    raise ValueError(f"unknown ids pattern {pattern!r}")


def _default_R(pattern: str, S: int) -> int:
    return {"identity": S, "none": S, "duplicates": S, "permutation": S + 1, "unused": S + 2}[pattern]


def make_problem(rng, *, S=2, T=3, H=4, P=2, N=3, G=2, R=None, ids="permutation",
                 variant="mamba2", a_form="h", dt_range=(-0.5, 0.5)) -> Case:
    """Build one Case with the seed's value ranges.

    ``ids`` is a pattern name from IDS_PATTERNS or an explicit sequence of ints (then R must be
    given). ``a_form`` picks Mamba-2's A shape: "h" -> (H,), "h1" -> (H, 1); Mamba-1 is (H, N).
    """
    if isinstance(ids, str):
        R = _default_R(ids, S) if R is None else R
        if ids == "duplicates" and S < 2:
            raise ValueError("the duplicates pattern needs S >= 2")
        if ids == "unused" and R <= S:
            raise ValueError("the unused pattern needs R > S")
        pattern, ids_arr = ids, _ids(rng, ids, S, R)
    else:
        pattern, ids_arr = "explicit", np.asarray(ids, dtype=np.int64)
        R = int(ids_arr.max()) + 1 if R is None else R

    def u(lo, hi, shape):
        return rng.uniform(lo, hi, shape).astype(np.float32)

    if variant == "mamba1":
        a_shape = (H, N)
    elif variant == "mamba2":
        a_shape = (H,) if a_form == "h" else (H, 1)
    else:
        raise ValueError(f"unknown variant {variant!r}")
    inputs = dict(
        s=u(-0.5, 0.5, (R, H, P, N)),
        x=u(-1.0, 1.0, (S, T, H, P)),
        dt=u(*dt_range, (S, T, H)),
        A=-u(0.2, 1.0, a_shape),
        B=u(-0.5, 0.5, (S, T, G, N)),
        C=u(-0.5, 0.5, (S, T, G, N)),
        ids=ids_arr,
    )
    return Case(dims=dict(S=S, T=T, H=H, P=P, N=N, G=G, R=R), variant=variant, ids_pattern=pattern,
                inputs=inputs, g_y=u(-1.0, 1.0, (S, T, H, P)), g_states=u(-1.0, 1.0, (S, H, P, N)))


@st.composite
def problems(draw, *, max_S=3, max_T=6, max_H_per_G=3, max_G=3, max_P=4, max_N=9, max_extra_R=3,
             variants=("mamba1", "mamba2"), ids_patterns=IDS_PATTERNS, allow_empty=False) -> Case:
    """A hypothesis strategy for Cases.

    T is drawn from 0..max_T with 0 and 1 favoured (hypothesis shrinks toward them); N ranges over
    values that are not powers of two. With ``allow_empty`` N, P and H may also be 0. The defaults
    bound every array to a few thousand elements so a property test stays fast.
    """
    lo = 0 if allow_empty else 1
    S = draw(st.integers(1, max_S))
    T = draw(st.one_of(st.sampled_from((0, 1)), st.integers(0, max_T)))
    G = draw(st.integers(1, max_G))
    H = G * draw(st.integers(lo, max_H_per_G))
    P = draw(st.integers(lo, max_P))
    N = draw(st.integers(lo, max_N))
    variant = draw(st.sampled_from(variants))
    a_form = draw(st.sampled_from(("h", "h1")))
    patterns = [p for p in ids_patterns if not (p == "duplicates" and S < 2)]
    pattern = draw(st.sampled_from(patterns))
    if pattern == "identity":
        R = S
    elif pattern == "unused":
        R = S + draw(st.integers(1, max_extra_R))
    else:
        R = S + draw(st.integers(0, max_extra_R))
    seed = draw(st.integers(0, 2**32 - 1))
    return make_problem(np.random.default_rng(seed), S=S, T=T, H=H, P=P, N=N, G=G, R=R, ids=pattern,
                        variant=variant, a_form=a_form)
