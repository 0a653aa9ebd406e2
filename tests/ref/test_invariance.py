"""ssm_ref's batch and split invariance (docs/SPEC.md section 3.2), in float32 and float64: a
sequence's outputs, snapshots and own gradients are the same bits alone and anywhere in any batch
(repeated at drawn positions among drawn companions, ids in any order), and one call over [0, T)
is the same bits as the tokens cut at drawn points into calls that carry the state (through
``states`` or through the cache with update_cache=True, decode steps of one token included).
d_A, a sum over sequences and tokens, is held to the tolerance of the sum of its parts instead.

Expected values here are the reference's own runs on the same sequences (the claim is equality
of bits); ssm_ref's agreement with the oracle is tests/ref/test_precision.py's."""

from __future__ import annotations

import dataclasses
import functools
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ssm_ref
from ssm_ref.testing.cases import REGIMES, make_problem
from ssm_ref.testing.properties import INVARIANCES, PROPERTIES
from ssm_ref.testing.properties._common import combo, tol_for
from ssm_ref.testing.properties.invariance import batch_report, split_report
from ssm_ref.testing.strategies import problems
from ssm_ref.tolerance import F32_TOL

SIZES = dict(max_elements=1500, max_S=4, max_T=12, max_T_long=40, max_G=2, max_H_per_G=3, max_P=4, max_N=6)
FORWARD = ("y", "states", "snapshots")
GRADS = ("d_s", "d_s0", "d_x", "d_dt", "d_B", "d_C")


def _port(dtype):
    """ssm_ref in ``dtype`` behind the port interface (NAME, ssm_scan, ssm_scan_back, supports)."""
    if dtype == np.float32:
        return ssm_ref
    return types.SimpleNamespace(NAME="ssm_ref float64", supports=ssm_ref.supports,
                                 ssm_scan=functools.partial(ssm_ref.ssm_scan, dtype=dtype),
                                 ssm_scan_back=functools.partial(ssm_ref.ssm_scan_back, dtype=dtype))


def _widen(case, dtype):
    """The case with its inputs and loss gradients in ``dtype`` (a float64 cache for update_cache)."""
    if dtype == np.float32:
        return case
    inputs = {k: (v if v is None or k == "ids" else v.astype(dtype)) for k, v in case.inputs.items()}
    return dataclasses.replace(case, inputs=inputs, g_y=case.g_y.astype(dtype), g_states=case.g_states.astype(dtype))


def _assert_holds(rep, outputs):
    assert set(outputs) <= set(rep.compared), (rep.compared, rep.not_compared)
    assert rep.holds, f"{rep.arrangement}: " + "; ".join(rep.compared[k].message() for k in rep.differing())


DTYPES = st.sampled_from([np.float32, np.float64])


@settings(max_examples=20)
@given(case=problems(regimes=REGIMES, **SIZES), dtype=DTYPES, data=st.data())
def test_a_sequence_is_the_same_bits_alone_and_anywhere_in_a_batch(case, dtype, data):
    S = case.dims["S"]
    i0 = data.draw(st.integers(0, S - 1), label="target")
    companions = data.draw(st.lists(st.integers(0, S - 1), max_size=6), label="companions")
    copies = data.draw(st.integers(1, 3), label="copies")
    members = data.draw(st.permutations([i0] * copies + companions), label="batch")
    k = data.draw(st.integers(1, case.dims["T"] + 2), label="snapshots")
    rep = batch_report(_port(dtype), _widen(case, dtype), target=i0, members=members, snapshots=k)
    _assert_holds(rep, (*FORWARD, *GRADS))


@settings(max_examples=20)
@given(case=problems(regimes=REGIMES, **SIZES), dtype=DTYPES, data=st.data())
def test_one_call_is_the_same_bits_as_any_split_carrying_the_state(case, dtype, data):
    T = case.dims["T"]
    cuts = sorted(data.draw(st.lists(st.integers(0, T), max_size=4), label="cuts"))
    steps = data.draw(st.integers(0, min(T, 3)), label="decode steps")  # the last tokens one call each
    cuts = sorted({*cuts, *range(T - steps, T)} - {T})
    distinct = len(set(np.asarray(case.ids).tolist())) == case.dims["S"]
    in_cache = data.draw(st.booleans(), label="through the cache") and distinct
    k = data.draw(st.integers(1, T + 2), label="snapshots")
    rep = split_report(_port(dtype), _widen(case, dtype), cuts=cuts, in_cache=in_cache, snapshots=k)
    _assert_holds(rep, (*FORWARD, *GRADS))


@settings(max_examples=20)
@given(case=problems(**SIZES), data=st.data())
def test_d_A_of_a_batch_is_the_sum_of_its_sequences_within_the_tolerance(case, data):
    """d_A is summed over sequences, channels and tokens in numpy's order (section 3.2): not the
    bits of a sum of per-sequence d_A, but within the tolerance of each term."""
    S = case.dims["S"]
    members = data.draw(st.lists(st.integers(0, S - 1), min_size=1, max_size=5), label="batch")
    a = case.args()
    ids = np.asarray(case.ids)

    def back(rows):
        rows = np.asarray(rows)
        kw = {**a, "ids": ids[rows], **{k: a[k][rows] for k in ("x", "dt", "B", "C")}}
        return ssm_ref.ssm_scan_back(**kw, g_y=case.g_y[rows], g_states=case.g_states[rows]).d_A

    whole = back(members)
    parts = [(1.0, back([m])) for m in members]
    c = combo("d_A", whole, parts, tol_for(F32_TOL, case, 2.0)["d_A"])
    assert c.ok, c.message()


def test_the_measured_cases_of_the_spec():
    """docs/SPEC.md section 3.2's ssm_ref row at T = 300: sequence 0 alone equals sequence 0 at
    position 7 of 16; a 300-token prefill equals 300 one-token update_cache steps and a 200-token
    prefill then 100 steps, bit for bit, forward and backward."""
    case = make_problem(3, S=16, T=300, H=2, P=4, N=8, G=1, ids="permutation")
    members = [*range(1, 8), 0, *range(8, 16)]
    _assert_holds(batch_report(ssm_ref, case, target=0, members=members, snapshots=4), (*FORWARD, *GRADS))
    for cuts in (range(1, 300), [200, *range(201, 300)]):
        _assert_holds(split_report(ssm_ref, case, cuts=list(cuts), in_cache=True, snapshots=1), (*FORWARD, *GRADS))


def test_the_invariances_are_kept_apart_from_the_contract():
    """Every port must have PROPERTIES; INVARIANCES are claimed by a backend or not (section 3.2)."""
    assert set(INVARIANCES) == {"batch_invariant", "split_invariant"}
    assert not set(INVARIANCES) & set(PROPERTIES)
    case = make_problem(5, S=3, T=4, H=2, P=2, N=3, G=1)
    for prop in INVARIANCES.values():
        assert prop.check(ssm_ref, case, F32_TOL)


def test_a_port_that_is_not_invariant_fails_with_the_outputs_and_the_difference():
    """A port whose y depends on the batch size fails batch_invariant, naming y, the number of
    entries that differ and the largest difference."""
    from ssm_ref.testing.properties import PropertyFailed

    def scan(s, x, dt, A, B, C, ids=None):
        r = ssm_ref.ssm_scan(s, x, dt, A, B, C, ids)
        bump = np.float32(1) + np.float32(2.0 ** -20) * np.float32(x.shape[0] > 1)
        return ssm_ref.ScanResult(r.y * bump, r.states, where="CPU", backend="bumped")

    port = types.SimpleNamespace(NAME="bumped", ssm_scan=scan, ssm_scan_back=ssm_ref.ssm_scan_back,
                                 supports=ssm_ref.supports)
    case = make_problem(2, S=3, T=3, H=2, P=2, N=3, G=1)
    with pytest.raises(PropertyFailed, match=r"batch_invariant fails .*\n  y: \d+ of 36 entries differ, largest"):
        INVARIANCES["batch_invariant"].check(port, case, F32_TOL)
    assert INVARIANCES["split_invariant"].check(port, case, F32_TOL)


def test_the_fuzzer_runs_the_invariances_only_when_named():
    from ssm_ref.testing.fuzzing import fuzz

    report = fuzz([ssm_ref], minutes=0.01, properties=list(INVARIANCES), seed=0, max_elements=400)
    assert report.ok and {p for (_, p), n in report.checked.items() if n} == set(INVARIANCES)
    default = fuzz([ssm_ref], minutes=0.001, seed=0, max_elements=100)
    assert not {p for _, p in default.examples} & set(INVARIANCES)
