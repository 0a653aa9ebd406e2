"""A small op of the tests' own, declared and registered the way docs/ARCHITECTURE.md ("Adding an
op") says, so that the seam an op goes through cannot quietly rot: a decayed cumulative sum,

    y[t] = a[t] * y[t-1] + x[t],   y[-1] = s,   last = y[T-1]

per sequence and channel; s (S, H), x and a (S, T, H). Its numpy reference (float32 or float64)
and its declaration are here, and this module is also a port of it: ``decayed_cumsum`` and
``decayed_cumsum_back`` as numba kernels (float32), what an ssm_fast kernel file would hold. The
testing kit's op-generic properties and ``ssm-scan check --op decayed_cumsum --backend
tests/kit/toy_op.py`` run on it (tests/kit/test_toy_op.py)."""

from __future__ import annotations

import numba
import numpy as np

from ssm_ref import ops
from ssm_ref.results import Support
from ssm_ref.testing.cases import OpCase
from ssm_ref.tolerance import Tol

NAME = "toy_fast"


# -- the reference (numpy) ---------------------------------------------------------------------------

def check(s, x, a, g_y=None, g_last=None, dtype=np.float32):
    """The validator: shapes agree, floats; a TypeError / ValueError naming the argument."""
    x = np.asarray(x)
    if x.ndim != 3:
        raise ValueError(f"x: expected shape (S, T, H), got {x.shape}")
    S, T, H = x.shape
    out = {"x": x.astype(dtype), "a": np.asarray(a).astype(dtype)}
    if out["a"].shape != (S, T, H):
        raise ValueError(f"a: expected shape (S, T, H) = {(S, T, H)}, got {out['a'].shape}")
    out["s"] = np.zeros((S, H), dtype) if s is None else np.asarray(s).astype(dtype)
    if out["s"].shape != (S, H):
        raise ValueError(f"s: expected shape (S, H) = {(S, H)}, got {out['s'].shape}")
    for name, v, shape in (("g_y", g_y, (S, T, H)), ("g_last", g_last, (S, H))):
        out[name] = np.zeros(shape, dtype) if v is None else np.asarray(v).astype(dtype)
        if out[name].shape != shape:
            raise ValueError(f"{name}: expected shape {shape}, got {out[name].shape}")
    return out


def reference(s, x, a, dtype=np.float32) -> dict:
    p = check(s, x, a, dtype=dtype)
    y = np.empty_like(p["x"])
    h = p["s"].copy()
    for t in range(y.shape[1]):
        h = p["a"][:, t] * h + p["x"][:, t]
        y[:, t] = h
    return {"y": y, "last": h}


def reference_back(s, x, a, g_y=None, g_last=None, dtype=np.float32) -> dict:
    p = check(s, x, a, g_y, g_last, dtype=dtype)
    y = reference(p["s"], p["x"], p["a"], dtype=dtype)["y"]
    lam = p["g_last"].copy()
    d_x, d_a = np.empty_like(p["x"]), np.empty_like(p["a"])
    for t in range(y.shape[1] - 1, -1, -1):
        lam = lam + p["g_y"][:, t]
        d_x[:, t] = lam
        d_a[:, t] = lam * (y[:, t - 1] if t else p["s"])
        lam = lam * p["a"][:, t]
    return {"d_s": lam, "d_x": d_x, "d_a": d_a}


# -- the problems the kit draws ----------------------------------------------------------------------

def make_case(seed: int, S: int = 2, T: int = 5, H: int = 3, regime: str = "typical") -> OpCase:
    rng = np.random.default_rng(seed)

    def u(lo, hi, *shape):
        return rng.uniform(lo, hi, shape).astype(np.float32)

    inputs = {"s": u(-1, 1, S, H), "x": u(-1, 1, S, T, H), "a": u(0.5, 1.0, S, T, H)}
    cot = {"g_y": u(-1, 1, S, T, H), "g_last": u(-1, 1, S, H)}
    return OpCase("decayed_cumsum", dict(S=S, T=T, H=H), inputs, cot, regime,
                  dict(seed=seed, S=S, T=T, H=H))


def strategy():
    """The hypothesis strategy of the kit's fuzzer: sizes and a seed, the values from the seed."""
    from hypothesis import strategies as st

    return st.builds(make_case, st.integers(0, 2**31), S=st.integers(1, 4), T=st.integers(1, 40),
                     H=st.integers(1, 5))


def cases(quick: bool = True, seed: int = 0) -> list:
    dims = [(2, 5, 3), (1, 1, 4), (3, 17, 2)] + ([] if quick else [(4, 200, 8)])
    return [make_case(seed + k, S=S, T=T, H=H) for k, (S, T, H) in enumerate(dims)]


# -- the declaration and its registration ------------------------------------------------------------

OP = ops.register(ops.Op(
    name="decayed_cumsum",
    summary="y[t] = a[t] y[t-1] + x[t]: a test's own op",
    inputs=(ops.Arg("s", "SH", "the start state; None: zeros", optional=True),
            ops.Arg("x", "STH", "the input"), ops.Arg("a", "STH", "the decay")),
    outputs=(ops.Output("y", "STH", "the running sum"), ops.Output("last", "SH", "the final state")),
    grads=(ops.Grad("d_s", "s", "SH", "of s"), ops.Grad("d_x", "x", "STH", "of x"),
           ops.Grad("d_a", "a", "STH", "of a")),
    forward=reference, backward=reference_back, check_forward=check, check_backward=check,
    # float32 arithmetic on sums of at most a few hundred terms of order one
    tolerance={k: Tol(1e-5, 1e-6) for k in ("y", "last", "d_s", "d_x", "d_a")},
    state=(("s", "last"),), make_case=make_case, cases=cases, strategy=strategy,
    properties="ssm_ref.testing.properties.generic:GENERIC",
    letters={"S": "sequences", "T": "tokens", "H": "channels"},
))


# -- the port: numba kernels, float32 ----------------------------------------------------------------

@numba.njit(cache=False)
def _forward(s, x, a, y, last):
    S, T, H = x.shape
    for i in range(S):
        for h in range(H):
            acc = s[i, h]
            for t in range(T):
                acc = a[i, t, h] * acc + x[i, t, h]
                y[i, t, h] = acc
            last[i, h] = acc


@numba.njit(cache=False)
def _backward(s, x, a, y, g_y, g_last, d_s, d_x, d_a):
    S, T, H = x.shape
    for i in range(S):
        for h in range(H):
            lam = g_last[i, h]
            for t in range(T - 1, -1, -1):
                lam += g_y[i, t, h]
                d_x[i, t, h] = lam
                d_a[i, t, h] = lam * (y[i, t - 1, h] if t > 0 else s[i, h])
                lam *= a[i, t, h]
            d_s[i, h] = lam


def decayed_cumsum(s, x, a) -> dict:
    p = check(s, x, a)
    y, last = np.empty_like(p["x"]), np.empty_like(p["s"])
    _forward(p["s"], p["x"], p["a"], y, last)
    return {"y": y, "last": last}


def decayed_cumsum_back(s, x, a, g_y=None, g_last=None) -> dict:
    p = check(s, x, a, g_y, g_last)
    y = decayed_cumsum(p["s"], p["x"], p["a"])["y"]
    d_s, d_x, d_a = np.empty_like(p["s"]), np.empty_like(p["x"]), np.empty_like(p["a"])
    _backward(p["s"], p["x"], p["a"], y, p["g_y"], p["g_last"], d_s, d_x, d_a)
    return {"d_s": d_s, "d_x": d_x, "d_a": d_a}


def supports(op, *args) -> Support:
    return Support(True, "CPU")
