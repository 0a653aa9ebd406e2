"""Odd but valid input: one table row per oddity, the documented result, never an error, never a
write to the caller's arrays. The companion of test_errors.py (whose valid problem, argument
names and snapshot helpers it reuses): that table holds what must raise, this one what must work.

The documented results (docs/API.md, docs/SPEC.md):
- NaN or +-inf in any float input: no error and no warning; the results follow docs/SPEC.md's
  numerics, so every backend's non-finite entries (where, and which of nan/+inf/-inf) equal those
  of the float32 reference, and its finite entries are within the backend's tolerance of the
  float64 oracle there.
- Other float dtypes, Python lists, read-only, Fortran-ordered, sliced, negatively strided,
  zero-stride (broadcast) and overlapping (as_strided) views, inputs that alias each other: the
  same result, bit for bit, as the same numbers in plain C-contiguous float32 arrays.
- Zero-size T, N, P or H: the shapes of docs/SPEC.md, values as test_edge_shapes.py spells out.

Every row runs against every registered backend, forward and backward.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided
from registry import BACKENDS, OUTPUTS, assert_close, oracle_back, oracle_scan
from test_errors import FWD_ARGS, G, H, N, P, R, S, T, valid
from test_inputs import assert_untouched, snapshot

import ssm_ref

FLOAT_ARGS = ("s", "x", "dt", "A", "B", "C", "g_y", "g_states")


@dataclass(frozen=True)
class Odd:
    id: str
    change: object        # callable: valid inputs -> the inputs of this row (may reuse arrays)

    def args(self):
        return self.change(valid())


def _poke(name, value, at=1):
    """One element of ``name`` (flat index ``at``) set to ``value``."""
    def change(a):
        arr = a[name].copy()
        arr.reshape(-1)[at] = value
        return {**a, name: arr}
    return change


def _each(fn):
    """Every float argument through ``fn``."""
    return lambda a: {k: (fn(v) if k in FLOAT_ARGS else v) for k, v in a.items()}


def _read_only(v):
    v = v.copy()
    v.flags.writeable = False
    return v


def _sliced(v):
    """The same values in every other element of a buffer twice as long along the last axis."""
    big = np.zeros((*v.shape[:-1], 2 * v.shape[-1]), v.dtype)
    big[..., ::2] = v
    return big[..., ::2]


def _reversed(v):
    """The same values through a view with negative strides."""
    return np.ascontiguousarray(v[..., ::-1])[..., ::-1]


def _overlapping_x(a):
    """x as an as_strided view whose tokens overlap in memory: token t+1 starts half a token after
    token t, so x[i, t, h + H/2] and x[i, t + 1, h] are the same float."""
    row = H * P
    half = row // 2
    buf = np.random.default_rng(52).uniform(-1, 1, S * (T * half + half)).astype(np.float32)
    it = buf.itemsize
    x = as_strided(buf, shape=(S, T, H, P), strides=((T * half + half) * it, half * it, P * it, it),
                   writeable=False)
    return {**a, "x": x}


def _overlapping_s_and_B(a):
    """s and B as views into one buffer that overlap each other."""
    buf = np.random.default_rng(53).uniform(-0.5, 0.5, R * H * P * N + 64).astype(np.float32)
    s = buf[: R * H * P * N].reshape(R, H, P, N)
    B = as_strided(buf[8:], shape=(S, T, G, N), strides=(4 * T * G * N, 4 * G * N, 4 * N, 4), writeable=False)
    return {**a, "s": s, "B": B}


def _broadcast_C(a):
    """C as a zero-stride view: the same (N,) row for every (i, t, g)."""
    return {**a, "C": np.broadcast_to(a["C"][0, 0, 0], (S, T, G, N))}


def _resized(**dims):
    """A valid problem of other sizes (zero-size dimensions), built like test_errors.valid()."""
    def change(_a):
        d = dict(S=S, T=T, H=H, P=P, N=N, G=G, R=R)
        d.update(dims)
        rng = np.random.default_rng(54)
        f = np.float32

        def u(lo, hi, shape):
            return rng.uniform(lo, hi, shape).astype(f)
        return dict(s=u(-0.5, 0.5, (d["R"], d["H"], d["P"], d["N"])), x=u(-1, 1, (d["S"], d["T"], d["H"], d["P"])),
                    dt=u(-0.5, 0.5, (d["S"], d["T"], d["H"])), A=-u(0.2, 1, (d["H"],)),
                    B=u(-0.5, 0.5, (d["S"], d["T"], d["G"], d["N"])), C=u(-0.5, 0.5, (d["S"], d["T"], d["G"], d["N"])),
                    ids=np.array([2, 0]), g_y=u(-1, 1, (d["S"], d["T"], d["H"], d["P"])),
                    g_states=u(-1, 1, (d["S"], d["H"], d["P"], d["N"])))
    return change


NONFINITE = [Odd(f"{name}-{label}", _poke(name, value))
             for name in FLOAT_ARGS
             for label, value in (("nan", np.nan), ("inf", np.inf), ("-inf", -np.inf))]

ODD = [
    *NONFINITE,
    # A > 0 with a large step: exp(d * A) overflows to inf inside the scan (docs/SPEC.md section 8).
    Odd("A-positive-overflow", lambda a: {**a, "A": np.full(H, 50.0, np.float32),
                                          "dt": np.full((S, T, H), 10.0, np.float32)}),
    Odd("dt-float64-beyond-float32", lambda a: _poke("dt", 1e300)({**a, "dt": a["dt"].astype(np.float64)})),
    # --- forms ------------------------------------------------------------------------------
    Odd("all-float16", _each(lambda v: v.astype(np.float16))),
    Odd("all-float64", _each(lambda v: v.astype(np.float64))),
    Odd("all-lists", lambda a: {k: (v.tolist() if v is not None else v) for k, v in a.items()}),
    Odd("all-read-only", lambda a: {k: _read_only(v) for k, v in a.items()}),
    Odd("all-fortran-order", _each(np.asfortranarray)),
    Odd("all-sliced", _each(_sliced)),
    Odd("all-negative-strides", _each(_reversed)),
    Odd("x-overlapping-as_strided", _overlapping_x),
    Odd("s-and-B-overlap", _overlapping_s_and_B),
    Odd("C-zero-stride-broadcast", _broadcast_C),
    Odd("B-is-C", lambda a: {**a, "C": a["B"]}),
    Odd("A-(H,1)-read-only-float16", lambda a: {**a, "A": _read_only(a["A"].reshape(H, 1).astype(np.float16))}),
    Odd("ids-uint8-read-only", lambda a: {**a, "ids": _read_only(a["ids"].astype(np.uint8))}),
    Odd("ids-tuple", lambda a: {**a, "ids": (2, 0)}),
    Odd("g-packed-sliced", lambda a: {**a, "g_y": _sliced(np.concatenate([a["g_y"].ravel(), a["g_states"].ravel()])),
                                      "g_states": None}),
    # --- zero-size dimensions (S, R, G = 0 are errors: test_errors.py) --------------------------
    Odd("T-zero", _resized(T=0)),
    Odd("N-zero", _resized(N=0)),
    Odd("P-zero", _resized(P=0)),
    Odd("H-zero", _resized(H=0)),
]


def _plain(a):
    """The same numbers as plain C-contiguous float32 arrays (ids int64 or None)."""
    out = {}
    for k, v in a.items():
        if v is None or k == "ids":
            out[k] = None if v is None else np.asarray(v).astype(np.int64)
        else:
            with np.errstate(over="ignore"):
                out[k] = np.ascontiguousarray(np.asarray(v), dtype=np.float32)
    if out["g_states"] is None:  # packed gradient: split it as the checks do
        n_y = out["x"].size
        out["g_states"] = out["g_y"][n_y:].reshape(out["x"].shape[0], *out["s"].shape[1:])
        out["g_y"] = out["g_y"][:n_y].reshape(out["x"].shape)
    return out


def _run(module, a, **kw):
    fwd = {k: a[k] for k in FWD_ARGS}
    r = module.ssm_scan(**fwd, **kw)
    g = module.ssm_scan_back(**fwd, g_y=a["g_y"], g_states=a["g_states"], **kw)
    return {"y": r.y, "states": r.states, **g.as_dict()}


def _arrays(a):
    return {k: v for k, v in a.items() if isinstance(v, np.ndarray)}


def same_nonfinite(got, want) -> bool:
    """nan, +inf and -inf at the same places."""
    return all(np.array_equal(f(got), f(want)) for f in (np.isnan, np.isposinf, np.isneginf))


def test_the_table_is_broad():
    assert len(ODD) >= 40
    assert len({o.id for o in ODD}) == len(ODD)
    for name in FLOAT_ARGS:
        assert {f"{name}-nan", f"{name}-inf", f"{name}-" + "-inf"} <= {o.id for o in ODD}


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@pytest.mark.parametrize("odd", ODD, ids=lambda o: o.id)
def test_odd_input_gives_the_documented_result(backend, odd):
    a = odd.args()
    snap = snapshot(_arrays(a))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning may escape the library either
        got = _run(backend.module, a)
    assert_untouched(_arrays(a), snap)

    plain = _plain(a)
    same_numbers = _run(backend.module, plain)
    ref = _run(ssm_ref, plain)
    fwd = {k: plain[k] for k in FWD_ARGS}
    o, og = oracle_scan(**fwd), oracle_back(**fwd, g_y=plain["g_y"], g_states=plain["g_states"])
    oracle = {"y": o.y, "states": o.states, **og.as_dict()}
    for name in OUTPUTS:
        assert got[name].dtype == np.float32, name
        assert got[name].shape == ref[name].shape, name
        # The odd form changes nothing: bit for bit the result of the plain arrays.
        assert np.array_equal(got[name], same_numbers[name], equal_nan=True), f"{odd.id}: {name} differs"
        # nan / inf exactly where the float32 reference has them ...
        assert same_nonfinite(got[name], ref[name]), (
            f"{odd.id}: {name} non-finite pattern differs from ssm_ref: "
            f"nan {int(np.isnan(got[name]).sum())} vs {int(np.isnan(ref[name]).sum())}, "
            f"inf {int(np.isinf(got[name]).sum())} vs {int(np.isinf(ref[name]).sum())}")
        # ... and the finite entries within tolerance of the oracle.
        fin = np.isfinite(ref[name]) & np.isfinite(oracle[name])
        assert_close(backend, name, got[name][fin], oracle[name][fin], label=odd.id)
