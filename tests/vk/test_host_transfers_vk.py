"""Host arrays move with the call: on the staging path (a discrete GPU's; the ``force_staging``
seam here) a call's host inputs are copied in and its host outputs out by its own recorded
sequence, one submission per call; a backward binds the buffers its forward filled with the same
host bytes instead of staging them again, and an array written in place between the two is
staged again; the zeros of an absent input (s=None, g_y / g_states None) are filled by the call's
sequence, never uploaded, while a user's array of zeros is. Every result against the float64
oracle."""

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


@pytest.fixture(params=["staged", "own"])
def transfers(request, ctx):
    """Host transfers through staging copies (forced: what a discrete GPU does), and the device's
    own way: straight through the mapping where its memory is host-visible (lavapipe, integrated
    GPUs), by staging copies where it is not (a discrete GPU). :func:`_staging` tells which."""
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


def _staging(ctx, transfers: str) -> bool:
    """Whether the calls of this ``transfers`` variant move host data by staging copies."""
    if transfers == "staged":
        return True
    with rt.Buffer(ctx, 16) as probe:
        return not rt.direct(probe)


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


def test_a_call_larger_than_the_staging_chunk_still_moves_its_data_in_its_own_submission(staged):
    """The staging slots of a workspace are bounded by the context's budget, not by the 64-MiB
    chunk of one-off transfers (a training step's host data is several hundred MB)."""
    ctx = staged
    chunk = ctx.staging_chunk_bytes
    vk_engine.clear()
    ctx.staging_chunk_bytes = 4096       # below one workspace's slots
    try:
        case = make_problem(np.random.default_rng(5), S=2, T=16, H=4, P=8, N=16, G=2)
        _fwd_bwd(case)
        submits = ctx.stats.submits
        r, g = _fwd_bwd(case)
        assert ctx.stats.submits - submits == 2
        _check(case, r, g)
    finally:
        ctx.staging_chunk_bytes = chunk
        vk_engine.clear()


@pytest.fixture
def budget(staged):
    """The context's budget for staging slots, its limit restored after the test."""
    from ssm_vk.runtime.transfer import stage_budget
    vk_engine.clear()
    b = stage_budget(staged)
    limit = b.limit
    yield b
    b.limit = limit
    vk_engine.clear()


def test_the_staging_budget_is_at_least_a_chunk_and_within_the_host_heap(budget, staged):
    heaps = [size for size, _ in staged.memory_heaps]
    assert staged.staging_chunk_bytes <= budget.limit <= max(max(heaps), staged.staging_chunk_bytes)
    assert budget.held == 0                    # nothing staged after engine.clear()


def test_a_workspace_beyond_the_staging_budget_moves_one_array_at_a_time(budget, staged):
    ctx = staged
    budget.limit = 4096                  # below one workspace's slots: the per-array path
    case = make_problem(np.random.default_rng(5), S=2, T=16, H=4, P=8, N=16, G=2)
    _fwd_bwd(case)
    submits = ctx.stats.submits
    r, g = _fwd_bwd(case)
    assert ctx.stats.submits - submits > 4
    assert budget.held == 0
    _check(case, r, g)


def test_workspaces_share_the_staging_budget_and_give_it_back(budget, staged):
    ctx = staged
    first = make_problem(np.random.default_rng(7), S=2, T=16, H=4, P=8, N=16, G=2)
    ssm_vk.ssm_scan(**first.args())
    one = budget.held                            # the forward workspace's slots
    assert one > 0
    budget.limit = one + one // 2                # room for one such workspace, not two
    second = make_problem(np.random.default_rng(8), S=2, T=17, H=4, P=8, N=16, G=2)   # a shape of its own
    before = ctx.stats.submits
    r2 = ssm_vk.ssm_scan(**second.args())        # beyond the budget: the per-array path
    assert ctx.stats.submits - before > 2
    assert budget.held == one
    _check_fwd(r2, second.args(), "second, per array")
    vk_engine.clear()                            # the workspaces close: their slots are given back
    assert budget.held == 0
    r2 = ssm_vk.ssm_scan(**second.args())
    before = ctx.stats.submits
    r2 = ssm_vk.ssm_scan(**second.args())        # now within the budget: one submission
    assert ctx.stats.submits - before == 1
    _check_fwd(r2, second.args(), "second, staged")


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


# -- absent inputs: zeros the device makes --------------------------------------------------------

def _bytes(case, *names) -> int:
    """The float32 bytes of inputs ``names`` of ``case``, from its shapes (docs/SPEC.md section 1)."""
    d = case.dims
    S, T, H, P, N, G = d["S"], d["T"], d["H"], d["P"], d["N"], d["G"]
    elems = {"s": S * H * P * N, "x": S * T * H * P, "dt": S * T * H, "A": case.inputs["A"].size,
             "B": S * T * G * N, "C": S * T * G * N, "g_y": S * T * H * P, "g_states": S * H * P * N}
    return 4 * sum(elems[k] for k in names)


def _counted(ctx, call):
    """(the result of ``call()``, the bytes it uploaded, its submissions)."""
    before, submits = ctx.stats.uploaded_bytes, ctx.stats.submits
    out = call()
    return out, ctx.stats.uploaded_bytes - before, ctx.stats.submits - submits


def _sequence_case(seed=8):
    """The demo shape's inputs with ids None (what ``s=None`` asks for)."""
    return make_problem(np.random.default_rng(seed), S=1, T=64, H=16, P=64, N=128, G=1, ids="none")


def _check_fwd(r, args, label):
    o = oracle_scan(**args)
    assert_close(VK, "y", r.y, o.y, label=label)
    assert_close(VK, "states", r.states, o.states, label=label)


def _check_bwd(g, args, g_y, g_states, label):
    og = oracle_back(**args, g_y=g_y, g_states=g_states)
    for k in GRADS:
        assert_close(VK, k, getattr(g, k), getattr(og, k), label=label)


def test_absent_inputs_are_filled_on_the_device_not_uploaded(ctx, transfers):
    case = _sequence_case()
    args = {**case.args(), "s": None}
    for _ in range(2):   # the first records the sequences; the second counts
        r, up_f, sub_f = _counted(ctx, lambda: ssm_vk.ssm_scan(**args))
        g, up_b, sub_b = _counted(ctx, lambda: ssm_vk.ssm_scan_back(**args, g_y=case.g_y, g_states=None))
        g0, up_0, _ = _counted(ctx, lambda: ssm_vk.ssm_scan_back(**args, g_y=None, g_states=None))
    assert r.where.startswith("Vulkan") and g.where == r.where
    fwd = _bytes(case, "x", "dt", "A", "B", "C")   # s: zeros the call's sequence fills
    assert up_f == fwd
    # the staged backward binds the forward's x, dt, A, B, C; the mapped one writes them again
    bound = 0 if _staging(ctx, transfers) else fwd
    assert up_b == bound + _bytes(case, "g_y")           # g_states and s: filled
    assert up_0 == bound                                  # every gradient zero: g_y filled as well
    assert (sub_f, sub_b) == (1, 1)
    _check_fwd(r, args, transfers)
    _check_bwd(g, args, case.g_y, None, transfers)
    _check_bwd(g0, args, None, None, transfers + ", no gradients")


def test_absent_and_given_start_states_alternate_on_one_workspace(ctx, transfers):
    """The key: each call's sequence fills the inputs it was given as zeros and copies the others,
    whatever the calls before it did -- and a backward never binds a buffer its forward filled."""
    case = _sequence_case(9)
    base = case.args()
    given = {**base, "s": case.inputs["s"] + np.float32(0.5)}
    absent = {**base, "s": None}
    # forward, then backward with its s: None, given, None, given; then the crossed pairs
    plan = [(absent, absent), (given, given), (absent, absent), (given, given),
            (absent, given), (given, absent), (absent, given)]
    for round_, (i, (f, b)) in [(r, c) for r in range(2) for c in enumerate(plan)]:
        label = f"{transfers} call {i}, round {round_}"
        r, up_f, _ = _counted(ctx, lambda f=f: ssm_vk.ssm_scan(**f))
        _check_fwd(r, f, label)
        g_states = None if i % 2 else case.g_states
        g, up_b, _ = _counted(ctx, lambda b=b, g_states=g_states: ssm_vk.ssm_scan_back(**b, g_y=case.g_y,
                                                                                        g_states=g_states))
        _check_bwd(g, b, case.g_y, g_states, label)
        if not round_:
            continue   # the first round records each sequence (a recording uploads its constants)
        s_f = ("s",) if f["s"] is not None else ()
        assert up_f == _bytes(case, "x", "dt", "A", "B", "C", *s_f), label
        grads = ("g_y", "g_states") if g_states is not None else ("g_y",)
        s_b = ("s",) if b["s"] is not None else ()
        if _staging(ctx, transfers):   # bound: what the forward staged and the backward passes again
            restaged = s_b if b["s"] is not None and f["s"] is None else ()
            assert up_b == _bytes(case, *grads, *restaged), label
        else:
            assert up_b == _bytes(case, "x", "dt", "A", "B", "C", *s_b, *grads), label


def test_a_users_array_of_zeros_is_uploaded(ctx, transfers):
    case = _sequence_case(10)
    d = case.dims
    zeros = np.zeros((d["S"], d["H"], d["P"], d["N"]), np.float32)
    args = {**case.args(), "s": zeros}
    for _ in range(2):
        r, up_f, _ = _counted(ctx, lambda: ssm_vk.ssm_scan(**args))
        g, up_b, _ = _counted(ctx, lambda: ssm_vk.ssm_scan_back(**args, g_y=case.g_y,
                                                               g_states=np.zeros_like(case.g_states)))
    assert up_f == _bytes(case, "s", "x", "dt", "A", "B", "C")
    bound = 0 if _staging(ctx, transfers) else up_f
    assert up_b == bound + _bytes(case, "g_y", "g_states")
    _check_fwd(r, args, transfers)
    _check_bwd(g, args, case.g_y, np.zeros_like(case.g_states), transfers)


def test_absent_start_states_beside_device_arrays(ctx, transfers):
    case = make_problem(np.random.default_rng(11), S=2, T=7, H=4, P=3, N=8, G=2, ids="none")
    args = case.args()
    for s in (None, case.inputs["s"], None):
        call = {**args, "s": s, "x": ssm_vk.to_device(args["x"]), "B": ssm_vk.to_device(args["B"])}
        r = ssm_vk.ssm_scan(**call)
        g = ssm_vk.ssm_scan_back(**call, g_y=case.g_y, g_states=None)
        host = {**args, "s": s}
        label = f"{transfers}, s {'None' if s is None else 'given'}"
        _check_fwd(type("R", (), {"y": r.y.numpy(), "states": r.states.numpy()}), host, label)
        _check_bwd(type("G", (), {k: getattr(g, k).numpy() for k in GRADS}), host, case.g_y, None, label)


def test_only_zero_stride_zeros_stand_in():
    from ssm_ref.checks import zero_stand_in

    shape = (2, 3, 4)
    assert zero_stand_in(np.broadcast_to(np.zeros((), np.float32), shape))
    assert zero_stand_in(np.broadcast_to(np.zeros((), np.float64), shape))
    assert not zero_stand_in(np.zeros(shape, np.float32))                     # a user's array: uploaded
    assert not zero_stand_in(np.broadcast_to(np.float32(-0.0), shape))        # not all-zero bytes
    assert not zero_stand_in(np.broadcast_to(np.float32(1.0), shape))
    assert not zero_stand_in(np.broadcast_to(np.zeros((), np.float32), (2, 0)))
    assert not zero_stand_in(np.zeros((), np.float32))
    case = make_problem(np.random.default_rng(12), S=2, T=3, H=4, P=2, N=3, G=2, ids="none")
    args = {**case.args(), "s": None}
    assert zero_stand_in(ssm_ref.check_forward(**args, keep_device=True).s)
    p = ssm_ref.check_forward(**args)
    assert p.s.flags.c_contiguous and not p.s.any()                       # host backends: a real array
    gp = ssm_ref.check_backward(**args, keep_device=True)
    assert zero_stand_in(gp.g_y) and zero_stand_in(gp.g_states)


def test_staging_slots_the_driver_cannot_allocate_leave_the_call_to_the_per_array_path(budget, staged, monkeypatch):
    ctx = staged
    case = make_problem(np.random.default_rng(9), S=2, T=16, H=4, P=8, N=16, G=2)
    args = case.args()
    ssm_vk.ssm_scan(**args)                      # compiled and planned
    vk_engine.clear()

    def no_memory(self, ctx, sizes):
        raise rt.OutOfDeviceMemory("injected: the staging slots' allocation")
    monkeypatch.setattr(rt.Stage, "__init__", no_memory)
    before = ctx.stats.submits
    r = ssm_vk.ssm_scan(**args)
    assert ctx.stats.submits - before > 1        # moved array by array, not failed
    assert budget.held == 0                      # the reservation given back
    _check_fwd(r, args, "slots not allocated")
