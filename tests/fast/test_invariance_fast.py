"""ssm_fast's batch and split invariance, exactly as docs/SPEC.md section 3.2's table states it:

* batch: y and states bit for bit (the drawn states stay far below the decode path's
  config.DECODE_DIRECT_BYTES); of the backward d_s0, d_x and d_s (the ordered scatter of d_s0)
  in any batch, and every own gradient between batches with S*G >= config.TASKS_BWD, where the
  rows of a group are one chunk whatever S is;
* split: states always, y when no part of a Mamba-2 call is one token long (the decode path
  rounds y's sum over n differently); backward chained through d_s0 -> g_states: d_s, d_s0, d_x
  and d_B always, every gradient for Mamba-1 (Mamba-2's d_dt and d_C read states the backward
  recomputes in pairs of rows, which may differ in the last bit from the forward's).

Expected values are ssm_fast's own runs on the same sequences: the claim is equality of bits.
Small shapes, 20 examples each: the kernels compile once (numba's cache)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import ssm_fast
import ssm_fast.config
from ssm_ref.testing.cases import REGIMES
from ssm_ref.testing.properties.invariance import batch_report, differences, split_report
from ssm_ref.testing.strategies import problems

SIZES = dict(max_elements=1500, max_S=4, max_T=12, max_T_long=40, max_G=2, max_H_per_G=3, max_P=5, max_N=6)
ALWAYS_BATCH = ("y", "states", "d_s", "d_s0", "d_x")
OWN = ("d_s0", "d_x", "d_dt", "d_B", "d_C")


def _assert_same(rep, outputs):
    assert set(outputs) <= set(rep.compared), (rep.compared, rep.not_compared)
    bad = [k for k in outputs if not rep.compared[k].same]
    assert not bad, f"{rep.arrangement}: " + "; ".join(rep.compared[k].message() for k in bad)


@settings(max_examples=20)
@given(case=problems(regimes=REGIMES, **SIZES), data=st.data())
def test_forward_and_d_s0_d_x_are_the_same_bits_alone_and_in_any_batch(case, data):
    S = case.dims["S"]
    i0 = data.draw(st.integers(0, S - 1), label="target")
    companions = data.draw(st.lists(st.integers(0, S - 1), max_size=6), label="companions")
    members = data.draw(st.permutations([i0] * data.draw(st.integers(1, 3)) + companions), label="batch")
    _assert_same(batch_report(ssm_fast, case, target=i0, members=members), ALWAYS_BATCH)


@settings(max_examples=20)
@given(case=problems(regimes=REGIMES, **SIZES), data=st.data())
def test_every_own_gradient_is_the_same_bits_in_batches_of_one_chunk(case, data):
    """Two batches with S*G >= TASKS_BWD (one chunk of rows per sequence and group): the
    sequence's own gradients are the same bits at each of its positions in both."""
    S, G = case.dims["S"], case.dims["G"]
    least = -(-ssm_fast.config.TASKS_BWD // max(G, 1))
    i0 = data.draw(st.integers(0, S - 1), label="target")
    first = data.draw(st.lists(st.integers(0, S - 1), min_size=least, max_size=least + 4), label="first batch")
    second = data.draw(st.permutations([i0, *first]), label="second batch")
    a = batch_report(ssm_fast, case, target=i0, members=[i0, *first])
    b = batch_report(ssm_fast, case, target=i0, members=second)
    _assert_same(a, ("y", "states", "d_s"))
    _assert_same(b, ("y", "states", "d_s"))
    # against each other (not alone, where S*G is 1 or 2): the two runs' own gradients
    ga, gb = _back(case, [i0, *first]), _back(case, second)
    for j in (j for j, m in enumerate(second) if m == i0):
        for k in OWN:
            d = differences(k, gb[k][j], ga[k][0])
            assert d.same, d.message()


def _back(case, rows):
    """ssm_fast's gradients of the case's sequences ``rows``, in that order (the whole cache)."""
    a, rows = case.args(), np.asarray(rows)
    kw = {**a, "ids": np.asarray(case.ids)[rows], **{k: a[k][rows] for k in ("x", "dt", "B", "C")}}
    return ssm_fast.ssm_scan_back(**kw, g_y=case.g_y[rows], g_states=case.g_states[rows])


@settings(max_examples=20)
@given(case=problems(regimes=REGIMES, **SIZES), data=st.data())
def test_one_call_is_the_same_bits_as_a_split_carrying_the_state(case, data):
    T = case.dims["T"]
    mamba1 = case.variant == "mamba1" and case.dims["N"] > 1
    cuts = sorted(set(data.draw(st.lists(st.integers(0, T), max_size=4), label="cuts")) - {T})
    if mamba1:   # Mamba-1 has no separate decode path: the last tokens one call each as well
        steps = data.draw(st.integers(0, min(T, 3)), label="decode steps")
        cuts = sorted({*cuts, *range(T - steps, T)} - {T})
    parts = list(zip([0, *cuts], [*cuts, T], strict=True))
    distinct = len(set(np.asarray(case.ids).tolist())) == case.dims["S"]
    in_cache = data.draw(st.booleans(), label="through the cache") and distinct
    rep = split_report(ssm_fast, case, cuts=cuts, in_cache=in_cache)
    want = ["states", "d_s", "d_s0", "d_x", "d_B"]
    if mamba1:
        want += ["y", "d_dt", "d_C"]
    elif all(hi - lo != 1 for lo, hi in parts):
        want.append("y")
    _assert_same(rep, want)
