"""ggmlR's own CPU SSM_SCAN_BACK kernel, as benchmarks/cpu_targets.py times it, against the float64
oracle: the check that the benchmark times the right function with the right layouts. Run it
beside the benchmark, where its library is built (not part of the test suite, which has no ggmlR
source to build it from):

    SSM_GGMLR_BACK_LIB=build/ggmlr python -m pytest benchmarks/check_ggmlr_back.py

The library is built from ggmlR's src/ggml-cpu/ops-ssm.cpp by tools/build_ggmlr_back.sh and
named by SSM_GGMLR_BACK_LIB; without it the checks fail, saying so. Each gradient
block of its packed output is held to the float32 bound every backend of the registry meets
(ssm_ref.tolerance.F32_TOL), output by output.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import ssm_ref
from ssm_ref.checks import check_forward
from ssm_ref.testing.cases import make_problem

_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT / "benchmarks"), str(_ROOT / "tests")]
import ggmlr_back  # noqa: E402
from registry import F32_TOL, Backend, assert_close, oracle_back  # noqa: E402


@pytest.fixture(scope="module")
def lib():
    try:
        return ggmlr_back.load()
    except (FileNotFoundError, OSError) as e:
        pytest.fail(f"ggmlR's backward is not built (tools/build_ggmlr_back.sh): {e}")


GGMLR = Backend(name="ggmlR", module=None, where="CPU", tol=F32_TOL)

# Mamba-2 with groups and a permuted cache, A as (H, 1), d_state 128 (the models' size), several
# sequences; Mamba-1 with cache rows no sequence reads.
CASES = {
    "mamba2-groups-permuted": dict(S=2, T=5, H=4, P=3, N=8, G=2, ids="permutation"),
    "mamba2-h1-n128": dict(S=1, T=9, H=4, P=4, N=128, G=1, ids="identity", a_form="h1"),
    "mamba2-batch": dict(S=3, T=4, H=6, P=2, N=16, G=3, ids="identity"),
    "mamba1-unused-rows": dict(S=3, T=6, H=5, P=1, N=16, G=1, ids="unused", R=5, variant="mamba1"),
}


def problem(name, seed=11):
    args = make_problem(seed, **CASES[name]).args()
    dims = check_forward(**args).dims
    g = np.random.default_rng(seed).uniform(-1, 1, dims.forward_size).astype(np.float32)
    return args, dims, g


@pytest.mark.parametrize("name", CASES)
def test_every_gradient_block_matches_the_float64_oracle(lib, name):
    args, dims, g = problem(name)
    packed, _ = lib.scan_back(**args, g_packed=g, threads=2)
    got = ssm_ref.unpack_backward(packed, dims)
    want = oracle_back(**args, g_y=g, g_states=None)
    for block, value in got.items():
        assert np.all(np.isfinite(value)), f"{name} {block}: non-finite entries"
        assert_close(GGMLR, block, value, getattr(want, block), label=name)


def test_its_first_block_is_per_sequence_not_the_cache_gradient(lib):
    # docs/SPEC.md section 6: ggmlR returns d_s0 (indexed by sequence); with two sequences
    # reading one cache row the cache's gradient d_s is their sum, which ggmlR does not form.
    args = make_problem(5, S=3, T=4, H=2, P=2, N=8, G=1, ids=[1, 1, 0]).args()
    dims = check_forward(**args).dims
    g = np.random.default_rng(5).uniform(-1, 1, dims.forward_size).astype(np.float32)
    got = ssm_ref.unpack_backward(lib.scan_back(**args, g_packed=g)[0], dims)["d_s0"]
    want = oracle_back(**args, g_y=g, g_states=None)
    assert_close(GGMLR, "d_s0", got, want.d_s0)
    assert not np.allclose(got[:2], want.d_s[:2], atol=1e-3)


def test_thread_count_changes_no_bit(lib):
    # Its backward runs on thread 0 alone (the others return at its first barrier), so the
    # benchmark's 2-thread time is a 1-thread time; the results must not depend on it either.
    args, _, g = problem("mamba2-batch")
    one, _ = lib.scan_back(**args, g_packed=g, threads=1)
    two, _ = lib.scan_back(**args, g_packed=g, threads=2)
    assert np.array_equal(one, two)


def test_shapes_it_cannot_take_raise_before_running(lib):
    args, _, g = problem("mamba2-groups-permuted")
    bad = dict(args, B=args["B"][:, :, :1].repeat(3, axis=2), C=args["C"][:, :, :1].repeat(3, axis=2))  # G=3, H=4
    with pytest.raises(ValueError, match="cannot take"):
        lib.scan_back(**bad, g_packed=g)
    with pytest.raises(ValueError, match="g_packed"):
        lib.scan_back(**args, g_packed=g[:-1])
