"""The R test of ggmlR's backward (test-ssm-scan-back-cpu-gpu.R, from the R package ggmlR,
https://github.com/Zabis13/ggmlR) translated to this API: its shapes, inputs and tolerances.

The R test builds its inputs as flat vectors in ggml's ne order (fastest axis first) and hands
them to 4-D tensors; the same vectors reshaped to the numpy shapes (reverse order) hold the same
numbers at the same places. Its A tensor is ne = (1, n_head), numpy (H, 1): Mamba-2, one group.
R's set.seed stream cannot be reproduced here; the draws use numpy with the R test's seeds and
uniform ranges. ids are 0..S-1, and the backward takes the packed gradient, as in the R test.

Its comparisons use testthat's expect_equal(tolerance = ...), the mean relative difference
mean|got - want| / mean|want| (absolute when mean|want| is below the tolerance):
``expect_equal_r``. Where the R test compared ggmlR's Vulkan kernel with its CPU kernel, every
backend of the registry is compared here with the float64 oracle, at the R test's tolerance and
at the registry's much tighter bound per output.
"""

import re

import numpy as np
import pytest
from oracles import fd_grad
from registry import BACKENDS, assert_close, oracle_back, oracle_scan

import ssm_ref


def sb_dims(d_state=128, head_dim=4, n_head=2, n_tok=3, n_seqs=1):
    """The R test's defaults: the sizes ggmlR's Vulkan shader accepts (d_state 128 or 256, Mamba-2)."""
    return dict(N=d_state, P=head_dim, H=n_head, T=n_tok, S=n_seqs)


# The R test's "agree across shapes" list.
SHAPES = [
    sb_dims(d_state=128, head_dim=1, n_head=1, n_tok=1, n_seqs=1),
    sb_dims(d_state=128, head_dim=8, n_head=4, n_tok=7, n_seqs=1),
    sb_dims(d_state=256, head_dim=4, n_head=2, n_tok=5, n_seqs=1),
    sb_dims(d_state=128, head_dim=4, n_head=2, n_tok=3, n_seqs=3),
    sb_dims(d_state=128, head_dim=64, n_head=8, n_tok=16, n_seqs=1),
]


def sb_inputs(d, seed=5):
    """The R test's inputs: flat uniform vectors (as float32, ggml's storage) shaped numpy-style."""
    rng = np.random.default_rng(seed)
    N, P, H, T, S = d["N"], d["P"], d["H"], d["T"], d["S"]

    def runif(n, lo, hi):
        return rng.uniform(lo, hi, n).astype(np.float32)

    return dict(
        s=runif(N * P * H * S, -0.5, 0.5).reshape(S, H, P, N),
        x=runif(P * H * T * S, -1, 1).reshape(S, T, H, P),
        dt=runif(H * T * S, -0.5, 0.5).reshape(S, T, H),
        A=-runif(H, 0.2, 1.0).reshape(H, 1),
        B=runif(N * T * S, -0.5, 0.5).reshape(S, T, 1, N),
        C=runif(N * T * S, -0.5, 0.5).reshape(S, T, 1, N),
        ids=np.arange(S, dtype=np.int32),
        # Gradient w.r.t. the packed forward result: outputs then final states.
        g=runif(P * H * T * S + N * P * H * S, -1, 1),
    )


def split_g(d, g):
    n_y = d["S"] * d["T"] * d["H"] * d["P"]
    return (g[:n_y].reshape(d["S"], d["T"], d["H"], d["P"]),
            g[n_y:].reshape(d["S"], d["H"], d["P"], d["N"]))


def expect_equal_r(got, want, tolerance):
    """testthat's expect_equal: mean relative difference (absolute if mean|want| < tolerance)."""
    got = np.asarray(got, dtype=np.float64).ravel()
    want = np.asarray(want, dtype=np.float64).ravel()
    assert got.shape == want.shape
    diff = float(np.mean(np.abs(got - want)))
    scale = float(np.mean(np.abs(want)))
    err = diff / scale if scale > tolerance else diff
    return err <= tolerance, err


def sample_idx(n):
    """unique(round(seq(1, n, length.out = min(6, n)))) as 0-based indices (R rounds half to even)."""
    return np.unique(np.round(np.linspace(1, n, min(6, n)))).astype(np.int64) - 1


def label(d):
    return "d_state={N} head_dim={P} n_head={H} n_tok={T} n_seqs={S}".format(**d)


def scan_back(backend, inp):
    args = {k: v for k, v in inp.items() if k != "g"}
    return backend.module.ssm_scan_back(**args, g_y=inp["g"], g_states=None)


def loss32(backend, inp, name, value):
    """sum(forward_result * g) with the backend's float32 forward; ``value`` replaces input ``name``
    (a float64 vector, rounded to float32 on the way in, as the R test's tensor_set_data does)."""
    args = {k: v for k, v in inp.items() if k != "g"}
    args[name] = value.reshape(inp[name].shape)
    out = backend.module.ssm_scan(**args).packed()
    return float(np.sum(out.astype(np.float64) * inp["g"].astype(np.float64)))


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_scan_back_matches_a_numeric_gradient_float32(backend):
    # The R test's first test: h = 1e-3 central differences of the float32 forward, six sampled
    # entries per input, tolerance 1e-2. Its loop skips s; the cache gradient is checked too here.
    d = sb_dims()
    inp = sb_inputs(d)
    got = scan_back(backend, inp)
    h = 1e-3
    for name, key in (("dt", "d_dt"), ("A", "d_A"), ("B", "d_B"), ("C", "d_C"), ("x", "d_x"), ("s", "d_s")):
        base = inp[name].astype(np.float64).ravel()
        idx = sample_idx(base.size)
        num = []
        for i in idx:
            up, dn = base.copy(), base.copy()
            up[i] += h
            dn[i] -= h
            num.append((loss32(backend, inp, name, up) - loss32(backend, inp, name, dn)) / (2 * h))
        ok, err = expect_equal_r(getattr(got, key).ravel()[idx], num, 1e-2)
        assert ok, f"gradient w.r.t. {name}: mean relative difference {err:.2e}"


def test_scan_back_matches_a_numeric_gradient_float64():
    # The same check on the oracle, tightly: every entry of every input, 4th-order differences.
    d = sb_dims()
    inp = sb_inputs(d)
    g_y, g_states = split_g(d, inp["g"])
    args = {k: (v.astype(np.float64) if k != "ids" else v) for k, v in inp.items() if k != "g"}
    g = oracle_back(**args, g_y=inp["g"], g_states=None)
    for name in ("s", "x", "dt", "A", "B", "C"):
        fd = fd_grad(args, name, g_y, g_states)
        got = getattr(g, "d_" + name)
        assert np.linalg.norm(got - fd) <= 1e-7 * np.linalg.norm(fd), name


def check_against_oracle(backend, d, inp, r_tol):
    args = {k: v for k, v in inp.items() if k != "g"}
    g_y, g_states = split_g(d, inp["g"])
    res = backend.module.ssm_scan(**args)
    grads = backend.module.ssm_scan_back(**args, g_y=inp["g"], g_states=None)
    want_r = oracle_scan(**args)
    want_g = oracle_back(**args, g_y=g_y, g_states=g_states)
    # The R test's packed comparison at its tolerance ...
    for got, want, what in ((res.packed(), want_r.packed(), "forward"),
                            (grads.packed(), want_g.packed(), "backward")):
        assert got.shape == want.shape
        ok, err = expect_equal_r(got, want, r_tol)
        assert ok, f"{label(d)} packed {what}: mean relative difference {err:.2e}"
    # ... and the registry's bound for every output, which is much tighter.
    assert_close(backend, "y", res.y, want_r.y, label=label(d))
    assert_close(backend, "states", res.states, want_r.states, label=label(d))
    for name, want in want_g.as_dict().items():
        assert_close(backend, name, getattr(grads, name), want, label=label(d))
    return res, grads


def expect_where(backend, support, result):
    """Where a result ran, as docs/API.md says: on the backend's device when supports() is ok,
    else on the CPU through ssm_fast, and the fallback says so."""
    if support:
        assert re.fullmatch(backend.where, result.where), result.where
        assert result.backend == backend.name
    else:
        assert result.where == "CPU" and result.backend == "ssm_fast", (result.where, support.reason)


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_backend_matches_the_oracle_on_the_r_test_defaults(backend):
    d = sb_dims()
    inp = sb_inputs(d)
    res, grads = check_against_oracle(backend, d, inp, 1e-4)
    args = {k: v for k, v in inp.items() if k != "g"}
    # Without this the comparison could pass while the op quietly ran elsewhere.
    for result in (res, grads):
        expect_where(backend, backend.module.supports("ssm_scan_back", **args), result)


@pytest.mark.parametrize("d", SHAPES, ids=label)
@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_backend_matches_the_oracle_across_the_r_test_shapes(backend, d):
    inp = sb_inputs(d, seed=d["P"] * 31 + d["T"])
    res, grads = check_against_oracle(backend, d, inp, 1e-4)
    args = {k: v for k, v in inp.items() if k != "g"}
    expect_where(backend, backend.module.supports("ssm_scan", **args), res)
    expect_where(backend, backend.module.supports("ssm_scan_back", **args), grads)


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_d_state_16(backend):
    # The R test: Mamba-1's d_state = 16 is outside ggmlR's shader, so it must fall back to the CPU
    # and still be right. Here the answer must be right wherever it ran, and where it ran must be
    # what supports() said (the reference: the CPU, always).
    d = sb_dims(d_state=16)
    inp = sb_inputs(d)
    args = {k: v for k, v in inp.items() if k != "g"}
    res, grads = check_against_oracle(backend, d, inp, 1e-5)
    expect_where(backend, backend.module.supports("ssm_scan", **args), res)
    expect_where(backend, backend.module.supports("ssm_scan_back", **args), grads)
    if backend.name == "ssm_ref":
        assert ssm_ref.supports("ssm_scan_back", **args) and grads.where == "CPU"
