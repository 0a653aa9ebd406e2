"""Host arrays move with the call: on the staging path (a discrete GPU's; the ``force_staging``
seam here) a call's host inputs are copied in and its host outputs out by its own recorded
sequence, one submission per call; a backward binds the buffers its forward filled with the same
host bytes instead of staging them again, and an array written in place between the two is
staged again. Every result against the float64 oracle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from problems import make_problem, problems
from registry import F32_TOL, Backend, assert_close, oracle_back, oracle_scan

import ssm_ref
import ssm_vk
from ssm_vk import engine as vk_engine
from ssm_vk import runtime as rt

pytestmark = pytest.mark.vulkan

VK = Backend(name="ssm_vk", module=ssm_vk, where=r"Vulkan\d+", tol=F32_TOL)
GRADS = ssm_ref.GRAD_NAMES
FWD = ("s", "x", "dt", "A", "B", "C")


@pytest.fixture(params=["staged", "mapped"])
def transfers(request, ctx):
    """Host transfers through staging copies (forced: what a discrete GPU does), and straight
    through the mapping (lavapipe's own)."""
    ctx.seams.force_staging = request.param == "staged"
    yield request.param
    for c in {ctx, rt.current_context()} - {None}:
        c.seams.force_staging = False


@pytest.fixture
def staged(ctx):
    ctx.seams.force_staging = True
    yield ctx
    for c in {ctx, rt.current_context()} - {None}:
        c.seams.force_staging = False


def _demo(seed=0):
    """The demo shape of benchmarks/vk_speed.py: (S, T, H, P, N, G) = (1, 64, 16, 64, 128, 1)."""
    return make_problem(np.random.default_rng(seed), S=1, T=64, H=16, P=64, N=128, G=1, ids="identity")


def _check(case, r, g, label=""):
    o = oracle_scan(**case.args())
    assert_close(VK, "y", r.y, o.y, label=label)
    assert_close(VK, "states", r.states, o.states, label=label)
    og = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    for k in GRADS:
        assert_close(VK, k, getattr(g, k), getattr(og, k), label=label)


def _fwd_bwd(case):
    args = case.args()
    r = ssm_vk.ssm_scan(**args)
    g = ssm_vk.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states)
    return r, g


def _nbytes(args, names) -> int:
    return sum(np.asarray(args[k], np.float32).nbytes for k in names if args[k] is not None)


def test_a_forward_and_backward_on_host_arrays_submit_at_most_four_times(ctx, transfers):
    case = _demo()
    _fwd_bwd(case)                       # plans, compiles and records
    submits = ctx.stats.submits
    r, g = _fwd_bwd(case)
    assert ctx.stats.submits - submits <= 4
    assert ctx.stats.submits - submits == 2   # one per call: the staged copies ride with the compute
    assert r.where.startswith("Vulkan") and g.where == r.where
    _check(case, r, g, label=transfers)


def test_the_backward_stages_nothing_its_forward_staged(staged):
    ctx = staged
    case = _demo(1)
    args = case.args()
    _fwd_bwd(case)
    before = ctx.stats.uploads, ctx.stats.uploaded_bytes
    r = ssm_vk.ssm_scan(**args)
    fwd = ctx.stats.uploads - before[0], ctx.stats.uploaded_bytes - before[1]
    assert fwd == (len(FWD), _nbytes(args, FWD))
    before = ctx.stats.uploads, ctx.stats.uploaded_bytes
    g = ssm_vk.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states)
    bwd = ctx.stats.uploads - before[0], ctx.stats.uploaded_bytes - before[1]
    assert bwd == (2, case.g_y.nbytes + case.g_states.nbytes)   # g_y and g_states only
    _check(case, r, g)


@pytest.mark.parametrize("what", ["x: one element", "s: every element", "A", "dt: a copy of another array"])
def test_an_input_written_in_place_after_the_forward_gives_the_new_gradient(staged, what):
    ctx = staged
    name = what.split(":")[0]
    for _ in range(2):   # the first records the sequences (ids included); the second counts what it stages
        case = make_problem(np.random.default_rng(7), S=2, T=9, H=4, P=3, N=8, G=2, ids="permutation")
        args = case.args()
        r = ssm_vk.ssm_scan(**args)
        o = oracle_scan(**args)
        a = args[name]
        if what.startswith("x"):
            a.reshape(-1)[-1] += 0.25        # the last bytes of the array: no sample would see them
        elif what.startswith("s"):
            a *= 0.5
        elif name == "A":
            a[0] -= 0.125
        else:                            # the same bytes in another array: bound as staged, still right
            args[name] = a.copy()
        before = ctx.stats.uploaded_bytes
        g = ssm_vk.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states)
        staged = ctx.stats.uploaded_bytes - before
        og = oracle_back(**args, g_y=case.g_y, g_states=case.g_states)
        for k in GRADS:
            assert_close(VK, k, getattr(g, k), getattr(og, k), label=what)
        assert_close(VK, "y", r.y, o.y, label=what)   # the forward's result, of the inputs as they were
    changed = 0 if name == "dt" else a.nbytes
    assert staged == case.g_y.nbytes + case.g_states.nbytes + changed


def test_a_backward_that_timed_out_keeps_the_forwards_buffers_until_it_ends(staged):
    ctx = staged
    case = make_problem(np.random.default_rng(3), S=1, T=12, H=2, P=4, N=16, G=1)
    args = case.args()
    _fwd_bwd(case)
    ssm_vk.ssm_scan(**args)
    ctx.seams.fail_next_submit(rt.VulkanTimeout)
    with pytest.raises(rt.VulkanTimeout):
        ssm_vk.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states)
    other = make_problem(np.random.default_rng(4), S=1, T=12, H=2, P=4, N=16, G=1)
    r, g = _fwd_bwd(other)
    _check(other, r, g)


def test_staging_larger_than_the_chunk_moves_one_array_at_a_time(staged):
    ctx = staged
    chunk = ctx.staging_chunk_bytes
    vk_engine.clear()
    ctx.staging_chunk_bytes = 4096       # below one workspace's slots: the per-array path
    try:
        case = make_problem(np.random.default_rng(5), S=2, T=16, H=4, P=8, N=16, G=2)
        _fwd_bwd(case)
        submits = ctx.stats.submits
        r, g = _fwd_bwd(case)
        assert ctx.stats.submits - submits > 4
        _check(case, r, g)
    finally:
        ctx.staging_chunk_bytes = chunk
        vk_engine.clear()


def test_host_inputs_beside_device_arrays(ctx, transfers):
    case = make_problem(np.random.default_rng(6), S=2, T=7, H=4, P=3, N=8, G=2)
    args = case.args()
    mixed = {**args, "x": ssm_vk.to_device(args["x"]), "B": ssm_vk.to_device(args["B"])}
    for _ in range(2):
        r = ssm_vk.ssm_scan(**mixed)
        g = ssm_vk.ssm_scan_back(**mixed, g_y=case.g_y, g_states=case.g_states)
        host_r = type("R", (), {"y": r.y.numpy(), "states": r.states.numpy()})
        host_g = type("G", (), {k: getattr(g, k).numpy() for k in GRADS})
        _check(case, host_r, host_g, label=transfers)


@settings(max_examples=15)
@given(problems(allow_empty=True))
def test_drawn_problems_through_the_staged_path_match_the_oracle(case):
    ctx = rt.get_context()
    ctx.seams.force_staging = True
    try:
        for _ in range(2):   # the second backward binds the forward's buffers
            r, g = _fwd_bwd(case)
            _check(case, r, g, label=repr(case))
    finally:
        ctx.seams.force_staging = False
