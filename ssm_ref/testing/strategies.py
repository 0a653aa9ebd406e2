"""Hypothesis strategies that draw whole scan problems, for testing any implementation against
ssm_ref (public API; needs the optional dependency ``hypothesis``: ``pip install hypothesis``, or
ssm-scan's ``test`` extra: :func:`ssm_ref.extras.install_hint`).

    from hypothesis import given
    import ssm_ref, ssm_ref.testing.strategies as sst

    @given(sst.problems(max_elements=20_000, regimes=sst.ORACLE_REGIMES))
    def test_my_port(case):
        want = ssm_ref.ssm_scan(**case.args(), dtype=np.float64)      # the oracle
        got = my_port.ssm_scan(**case.args())
        ...                                                           # see ssm_ref.testing.properties

A drawn value is a :class:`ssm_ref.testing.cases.Case`: ``case.dims`` (S T H P N G R), ``case.args()``
(s, x, dt, A, B, C, ids as keyword arguments, float32), ``case.g_y`` / ``case.g_states`` (the
loss gradients), ``case.K`` / ``case.g_snapshots`` (the state snapshots, drawn with ``max_K`` > 1),
``case.variant``, ``case.ids_pattern``, ``case.regime`` and ``case.recipe`` (the
arguments of :func:`ssm_ref.testing.cases.make_problem` that rebuild it, seed included: a reproducer).

Hypothesis draws the dimensions, variant, A form, ids pattern, regime and a seed; the values come
from the seed (drawing every float through hypothesis is slow and shrinks to nothing useful), so
a failure shrinks to small shapes and prints its recipe.
"""

from __future__ import annotations

from ssm_ref.extras import install_hint

try:
    from hypothesis import strategies as st
except ImportError as e:  # exercised without hypothesis installed (tests/kit/test_strategies.py)
    raise ImportError(
        "ssm_ref.testing.strategies needs hypothesis, an optional dependency of ssm-scan: "
        f"{install_hint('test', 'hypothesis')}. The rest of ssm_ref works without it."
    ) from e

from .cases import IDS_PATTERNS, ORACLE_REGIMES, REGIMES, Case, make_problem

__all__ = ["IDS_PATTERNS", "ORACLE_REGIMES", "REGIMES", "Case", "dims", "elements", "problems"]

VARIANTS = ("mamba1", "mamba2")


def elements(S: int, T: int, H: int, P: int, N: int, G: int, R: int, mamba1: bool = True, K: int = 1) -> int:
    """Elements of all inputs and loss gradients of a problem of these sizes (A counted as (H, N)
    for Mamba-1, (H,) otherwise; g_snapshots when K > 1): R*H*P*N + 2*S*T*H*P + S*T*H + |A|
    + 2*S*T*G*N + S*H*P*N (+ K*S*H*P*N)."""
    a = H * N if mamba1 else H
    snaps = K * S * H * P * N if K > 1 else 0
    return R * H * P * N + 2 * S * T * H * P + S * T * H + a + 2 * S * T * G * N + S * H * P * N + snaps


def _check_args(max_elements, regimes, variants, ids_patterns) -> None:
    if max_elements < 16:
        raise ValueError(f"max_elements: expected at least 16, got {max_elements}")
    for name, got, allowed in (("regimes", regimes, REGIMES), ("variants", variants, VARIANTS),
                               ("ids_patterns", ids_patterns, IDS_PATTERNS)):
        bad = [v for v in got if v not in allowed]
        if bad or not got:
            raise ValueError(f"{name}: expected a non-empty selection of {allowed}, got {tuple(got)}")


def dims(*, max_elements=4096, max_S=3, max_T=6, max_T_long=256, max_G=3, max_H_per_G=3,
         max_P=4, max_N=9, max_extra_R=3, min_P=None, min_N=None, min_T=0, variants=VARIANTS,
         ids_patterns=IDS_PATTERNS, regimes=("typical",), allow_empty=False, max_K=1, snapshots_mamba1=True):
    """A strategy for the recipe of a problem (the keyword arguments of make_problem, seed included).

    Sizes: S in 1..max_S, G in 1..max_G, H = G * (1..max_H_per_G), P in 1..max_P, N in 1..max_N
    (0 allowed for H/G, P and N with ``allow_empty``; at least ``min_P`` / ``min_N`` when given,
    e.g. to reach the multi-block layouts of a GPU kernel), R = S + 0..max_extra_R (R = S for the
    identity pattern, R > S for unused). T in min_T..max_T with 0 and 1 favoured (``min_T`` > 0
    leaves out the empty scan, e.g. to look past a known T = 0 defect); for the
    long_decay regime T in max_T_long/4..max_T_long. Then, while the problem would hold more than
    ``max_elements`` elements (:func:`elements`) with its fewest tokens (0, or max_T_long/4 for
    long_decay), the largest of N, P, H/G, S, G is halved (never below its minimum: min_P, min_N,
    2 for S with duplicate ids, else 1); then T is capped to what is left (so only minimums that
    alone exceed ``max_elements`` can exceed it).
    K (the state snapshots, docs/SPEC.md section 3.1): 1 when ``max_K`` is 1 (the default: no
    draw, so the draws of earlier versions are unchanged), else in 1..max_K, T < K included (T
    favours 0 and 1); ``snapshots_mamba1=False`` keeps K = 1 for Mamba-1 (ggml asserts K == 1
    there). The sizes are shrunk with g_snapshots counted.
    Raises ValueError (when called) for arguments outside these sets.
    """
    _check_args(max_elements, regimes, variants, ids_patterns)
    if isinstance(max_K, bool) or not isinstance(max_K, int) or max_K < 1:
        raise ValueError(f"max_K: expected an integer >= 1, got {max_K!r}")
    for name, lo, hi in (("min_P", min_P, max_P), ("min_N", min_N, max_N), ("min_T", min_T, max_T)):
        if lo is not None and not 0 <= lo <= hi:
            raise ValueError(f"{name}: expected 0 <= {name} <= max_{name[-1]} = {hi}, got {lo}")
    return _dims(max_elements=max_elements, max_S=max_S, max_T=max_T, max_T_long=max_T_long, max_G=max_G,
                 max_H_per_G=max_H_per_G, max_P=max_P, max_N=max_N, max_extra_R=max_extra_R,
                 min_P=min_P, min_N=min_N, min_T=min_T,
                 variants=tuple(variants), ids_patterns=tuple(ids_patterns), regimes=tuple(regimes),
                 allow_empty=allow_empty, max_K=max_K, snapshots_mamba1=bool(snapshots_mamba1))


@st.composite
def _dims(draw, *, max_elements, max_S, max_T, max_T_long, max_G, max_H_per_G, max_P, max_N, max_extra_R,
          min_P, min_N, min_T, variants, ids_patterns, regimes, allow_empty, max_K, snapshots_mamba1) -> dict:
    lo = 0 if allow_empty else 1
    regime = draw(st.sampled_from(tuple(regimes)))
    variant = draw(st.sampled_from(tuple(variants)))
    a_form = draw(st.sampled_from(("h", "h1")))
    S = draw(st.integers(1, max_S))
    G = draw(st.integers(1, max_G))
    k = draw(st.integers(lo, max_H_per_G))
    P = draw(st.integers(lo if min_P is None else min_P, max_P))
    N = draw(st.integers(lo if min_N is None else min_N, max_N))
    patterns = [p for p in ids_patterns if not (p == "duplicates" and S < 2)] or ["none"]
    pattern = draw(st.sampled_from(patterns))
    extra = draw(st.integers(1 if pattern == "unused" else 0, max(max_extra_R, 1)))
    if regime == "long_decay":
        T = draw(st.integers(max(1, max_T_long // 4), max(1, max_T_long)))
    else:
        T = draw(st.one_of(st.sampled_from(tuple(v for v in (0, 1) if v >= min_T) or (min_T,)),
                           st.integers(min_T, max_T)))
    K = 1
    if max_K > 1 and (snapshots_mamba1 or variant != "mamba1"):
        K = draw(st.integers(1, max_K))

    def size(T_):
        R_ = S if pattern == "identity" else S + extra
        return elements(S, T_, G * k, P, N, G, R_, variant == "mamba1", K)

    T_floor = max(1, max_T_long // 4) if regime == "long_decay" else min_T
    while size(T_floor) > max_elements:    # too big even with the fewest tokens: halve the largest size
        sizes = {"N": N, "P": P, "k": k, "S": S, "G": G}
        floors = {"N": max(1, min_N or 1), "P": max(1, min_P or 1), "k": 1, "G": 1,
                  "S": 2 if pattern == "duplicates" else 1}
        shrinkable = {n: v for n, v in sizes.items() if v > floors[n]}
        if not shrinkable:
            break
        name = max(shrinkable, key=shrinkable.get)
        N, P, k, S, G = (max(v // 2, floors[n]) if n == name else v for n, v in sizes.items())
    per_token = max(1, size(1) - size(0))
    T = max(0 if regime == "long_decay" else min_T, min(T, (max_elements - size(0)) // per_token))
    R = S if pattern == "identity" else S + extra
    seed = draw(st.integers(0, 2**32 - 1))
    out = dict(seed=seed, S=S, T=T, H=G * k, P=P, N=N, G=G, R=R, ids=pattern, variant=variant,
               a_form=a_form, regime=regime)
    if K > 1:
        out["K"] = K
    return out


def problems(**kw):
    """A strategy for a whole :class:`Case` (inputs and loss gradients); keyword arguments as :func:`dims`.

    Defaults keep every array to a few thousand elements (``max_elements=4096``) and the seed
    test's value ranges (``regimes=("typical",)``); pass ``regimes=ORACLE_REGIMES`` for every
    regime a float32 result is held to the float64 oracle in, or ``REGIMES`` to add non-finite
    inputs (compare those with the float32 reference's non-finite pattern, not the oracle).
    Raises ValueError (when called) for bad arguments.
    """
    return dims(**kw).map(_build)


def _build(recipe: dict) -> Case:
    kw = dict(recipe)
    return make_problem(kw.pop("seed"), **kw)
