"""ssm_vk against the float64 oracle on lavapipe (or whatever Vulkan device the machine has),
under the validation layer (tests/vk/conftest.py): every shape family, both row-sum paths, the
windowing that device limits force, device-resident arrays, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from problems import make_problem, problems
from registry import F32_TOL, Backend, assert_close, oracle_back, oracle_scan

import ssm_ref
import ssm_vk
from ssm_vk import runtime as rt
from ssm_vk.sizing import Limits

pytestmark = pytest.mark.vulkan

VK = Backend(name="ssm_vk", module=ssm_vk, where=r"Vulkan\d+", tol=F32_TOL)
GRADS = ssm_ref.GRAD_NAMES


def check_case(case, label="", expect_gpu=True):
    """Forward and backward of ``case`` on ssm_vk against the oracle, every output."""
    args = case.args()
    r = ssm_vk.ssm_scan(**args)
    if expect_gpu:
        assert r.where.startswith("Vulkan") and r.backend == "ssm_vk", (r.where, r.backend)
    o = oracle_scan(**case.args())
    assert_close(VK, "y", r.y, o.y, label=label)
    assert_close(VK, "states", r.states, o.states, label=label)
    g = ssm_vk.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    if expect_gpu:
        assert g.where == r.where and g.backend == "ssm_vk"
    og = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    for k in GRADS:
        assert_close(VK, k, getattr(g, k), getattr(og, k), label=label)
        assert getattr(g, k).dtype == np.float32
    return r, g


@settings(max_examples=30)
@given(problems(allow_empty=True))
def test_drawn_problems_match_the_oracle(case):
    check_case(case, label=repr(case))


@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
@pytest.mark.parametrize("N", [1, 3, 8, 16, 33, 128])
def test_every_lane_layout(variant, N):
    # N picks LN (lanes per row) and NPL (values per lane); small N packs several rows per
    # subgroup and takes the xor-butterfly row sum on lavapipe, N >= 8 the full subgroupAdd.
    case = make_problem(np.random.default_rng(N), S=2, T=5, H=4, P=3, N=N, G=2, variant=variant)
    check_case(case, label=f"{variant} N={N}")


def test_large_d_state():
    case = make_problem(np.random.default_rng(3), S=1, T=3, H=1, P=2, N=1024, G=1, ids="identity")
    check_case(case, label="N=1024")


@pytest.mark.parametrize("T", [0, 1, 2, 15, 16, 17, 33])
def test_token_counts_around_the_checkpoint_interval(T):
    case = make_problem(np.random.default_rng(T), S=2, T=T, H=2, P=3, N=5, G=1, ids="duplicates")
    check_case(case, label=f"T={T}")


def test_shared_memory_row_sums(knobs):
    # The path for devices without subgroup operations, forced on this one.
    knobs.no_subgroup()
    for seed, (variant, N) in enumerate([("mamba2", 16), ("mamba1", 5), ("mamba2", 40)]):
        case = make_problem(np.random.default_rng(seed), S=2, T=9, H=4, P=3, N=N, G=2, variant=variant,
                            ids="duplicates")
        check_case(case, label=f"shared {variant} N={N}")


def test_ggmlr_default_and_shapes_run_on_vulkan0():
    # ggmlR's R test's CPU-vs-Vulkan checks: placement "Vulkan0" and agreement, on its default and its
    # five shapes (Mamba-2, one group), with the packed gradient as the R test passes it.
    shapes = [dict(N=128, P=4, H=2, T=3, S=1), dict(N=128, P=1, H=1, T=1, S=1), dict(N=128, P=8, H=4, T=7, S=1),
              dict(N=256, P=4, H=2, T=5, S=1), dict(N=128, P=4, H=2, T=3, S=3), dict(N=128, P=64, H=8, T=16, S=1)]
    for k, d in enumerate(shapes):
        case = make_problem(np.random.default_rng(5 + k), **d, G=1, ids="identity", a_form="h1")
        packed_g = np.concatenate([case.g_y.ravel(), case.g_states.ravel()])
        g = ssm_vk.ssm_scan_back(**case.args(), g_y=packed_g, g_states=None)
        assert g.where == "Vulkan0"
        cpu = ssm_ref.ssm_scan_back(**case.args(), g_y=packed_g, g_states=None)
        got, want = g.packed(), cpu.packed()
        # the R test's expect_equal(tolerance = 1e-4): mean relative difference
        assert np.mean(np.abs(got - want)) / np.mean(np.abs(want)) < 1e-4, d
        check_case(case, label=str(d))


def test_ggmlr_d_state_16_now_runs_on_vulkan0():
    # The R test's "unsupported d_state falls back to the CPU" case, inverted: it runs on the GPU.
    case = make_problem(np.random.default_rng(5), S=1, T=3, H=2, P=4, N=16, G=1, ids="identity", a_form="h1")
    assert ssm_vk.supports("ssm_scan_back", **case.args())
    _r, g = check_case(case, label="d_state=16")
    assert g.where == "Vulkan0"
    cpu = ssm_ref.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    np.testing.assert_allclose(g.packed(), cpu.packed(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ids, R", [
    ([0, 1, 2, 3, 4, 5, 6, 7, 8], 9),                   # identity: one copy, no fill
    ([5, 6, 7, 0, 1, 2, 8, 3, 4], 9),                   # a permutation in runs
    ([2, 3, 9, 10, 11, 20], 24),                        # runs with a few unread gaps between
    ([1, 3, 5, 7, 9, 11, 13, 15, 17, 19], 21),          # 11 unread gaps: one fill of all rows first
    ([4, 4, 1, 2, 4, 1, 0, 3, 30], 31),                 # repeated rows (added in sequence order)
])
def test_d_s_scatters_d_s0_into_cache_rows(ids, R):
    # d_s from d_s0 by ids: zeroed unread rows, copied first readers (runs as one copy), added
    # repeats; against the oracle (record._scatter_rows, shared by both kernel families).
    rng = np.random.default_rng(len(ids) * R)
    case = make_problem(rng, S=len(ids), T=5, H=2, P=3, N=4, G=1, ids=ids, R=R)
    _, g = check_case(case, label=f"ids={ids}")
    unread = sorted(set(range(R)) - set(ids))
    assert np.all(g.d_s[unread] == 0)
    first = {r: i for i, r in reversed(list(enumerate(ids)))}
    for r, i in first.items():
        if ids.count(r) == 1:
            assert np.array_equal(g.d_s[r], g.d_s0[i])


def test_bit_identical_reruns():
    case = make_problem(np.random.default_rng(9), S=3, T=20, H=4, P=5, N=12, G=2, ids="duplicates")
    a = ssm_vk.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    b = ssm_vk.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    for k in GRADS:
        assert np.array_equal(getattr(a, k), getattr(b, k)), k
    f1, f2 = ssm_vk.ssm_scan(**case.args()), ssm_vk.ssm_scan(**case.args())
    assert np.array_equal(f1.y, f2.y) and np.array_equal(f1.states, f2.states)


@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
def test_small_storage_range_splits_into_windows(variant):
    # A storage-buffer range of a few KiB forces windows of one sequence and a few tokens (the
    # checkpoints of every window kept until the walk back), and small grids force 2-D grids.
    case = make_problem(np.random.default_rng(11), S=3, T=45, H=4, P=3, N=16, G=2, variant=variant,
                        ids="duplicates")
    whole = check_case(case, label="whole")
    ctx = rt.get_context()
    with ctx.seams.override_limits(max_storage_buffer_range=2048, max_workgroup_count=(3, 65535, 65535)):
        lim = Limits.of(ctx.info)
        from ssm_vk.registry import plan
        pl = plan(ssm_ref.check_forward(**case.args()).dims, lim, backward=True)
        assert pl.plan.time_split and len(pl.plan.windows) > 3 * 2
        split = check_case(case, label="windows")
    np.testing.assert_allclose(split[0].y, whole[0].y, rtol=1e-6, atol=1e-7)
    for k in GRADS:
        np.testing.assert_allclose(getattr(split[1], k), getattr(whole[1], k), rtol=2e-6, atol=2e-7, err_msg=k)


@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
def test_token_windows_read_the_cache_rows_in_place(variant):
    # A storage range that the cache s fits but one sequence's tokens do not: token windows of
    # each sequence, the first reading its initial state from s[ids] in place, the later ones
    # carrying on from the states the previous window left.
    case = make_problem(np.random.default_rng(14), S=3, T=150, H=2, P=2, N=8, G=1, variant=variant,
                        ids="duplicates", R=2)
    ctx = rt.get_context()
    with ctx.seams.override_limits(max_storage_buffer_range=2048):
        from ssm_vk.registry import plan
        d = ssm_ref.check_forward(**case.args()).dims
        assert d.R * d.H * d.P * d.N * 4 < 2048 - 256
        for backward in (False, True):
            pl = plan(d, Limits.of(ctx.info), backward=backward)
            assert pl.plan.time_split and len(pl.plan.windows) > 3, backward
        check_case(case, label="token windows, rows in place")


@pytest.mark.parametrize("ids", ["permutation", "duplicates", "unused"])
def test_cache_rows_read_in_place_equal_the_copied_rows_bit_for_bit(monkeypatch, ids):
    # The scan reads each sequence's initial state from s[ids[i]] when s fits one binding, else
    # the rows are copied into the carried states first: the same arithmetic, the same bits.
    from ssm_vk import engine
    from ssm_vk.sequential import sequential_recording as sequential

    case = make_problem(np.random.default_rng(15), S=4, T=9, H=3, P=2, N=8, G=1, ids=ids)
    engine.clear()
    kept = {}

    def calls():
        r = ssm_vk.ssm_scan(**case.args())
        g = ssm_vk.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
        return [r.y, r.states] + [getattr(g, k) for k in GRADS]

    real = sequential.cache_rows
    monkeypatch.setattr(sequential, "cache_rows", lambda *a: kept.setdefault("in place", real(*a)))
    in_place = calls()
    assert kept["in place"] is not None
    engine.clear()
    monkeypatch.setattr(sequential, "cache_rows", lambda *a: None)
    copied = calls()
    engine.clear()
    for a, b in zip(in_place, copied, strict=True):
        assert a.tobytes() == b.tobytes()
    check_case(case, label=ids)


def test_sequence_windows():
    # A range that holds two sequences but not three: windows of whole sequences.
    case = make_problem(np.random.default_rng(12), S=5, T=4, H=2, P=2, N=8, G=1, ids="permutation")
    ctx = rt.get_context()
    with ctx.seams.override_limits(max_storage_buffer_range=1024):
        from ssm_vk.registry import plan
        pl = plan(ssm_ref.check_forward(**case.args()).dims, Limits.of(ctx.info), backward=True)
        assert not pl.plan.time_split and 1 < len(pl.plan.windows) < 5
        check_case(case, label="sequence windows")


def test_device_resident_round_trip():
    case = make_problem(np.random.default_rng(13), S=2, T=6, H=4, P=3, N=8, G=2, ids="unused")
    host = ssm_vk.ssm_scan(**case.args())
    dev_args = {k: (v if k == "ids" or v is None else ssm_vk.to_device(v)) for k, v in case.args().items()}
    r = ssm_vk.ssm_scan(**dev_args)
    assert isinstance(r.y, ssm_vk.DeviceArray) and isinstance(r.states, ssm_vk.DeviceArray)
    assert r.y.shape == host.y.shape and r.y.where == r.where
    assert np.array_equal(r.y.numpy(), host.y) and np.array_equal(r.states.numpy(), host.states)
    # the backward takes device gradients, packed or structured, and keeps its results there
    gy, gs = ssm_vk.to_device(case.g_y), ssm_vk.to_device(case.g_states)
    g = ssm_vk.ssm_scan_back(**dev_args, g_y=gy, g_states=gs)
    packed = ssm_vk.to_device(np.concatenate([case.g_y.ravel(), case.g_states.ravel()]))
    g2 = ssm_vk.ssm_scan_back(**dev_args, g_y=packed, g_states=None)
    gh = ssm_vk.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    for k in GRADS:
        assert isinstance(getattr(g, k), ssm_vk.DeviceArray)
        assert np.array_equal(getattr(g, k).numpy(), getattr(gh, k)), k
        assert np.array_equal(getattr(g2, k).numpy(), getattr(gh, k)), k
    assert np.array_equal(g.packed(), gh.packed())


def test_device_arrays_are_returned_to_the_pool():
    ctx = rt.get_context()
    case = make_problem(np.random.default_rng(14), S=1, T=4, H=2, P=2, N=4, G=1)
    for _ in range(3):  # warm the pool with the very calls measured below (run alone, the first
        # to_device of x's size would otherwise be the pool's first block of that size)
        ssm_vk.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
        ssm_vk.to_device(case.inputs["x"]).release()
    before = ctx.live_allocations
    for _ in range(20):
        ssm_vk.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
        dev = ssm_vk.to_device(case.inputs["x"])
        dev.release()
    assert ctx.live_allocations == before


def test_supports_says_where_it_runs():
    case = make_problem(np.random.default_rng(15), S=1, T=2, H=2, P=2, N=3, G=1)
    s = ssm_vk.supports("ssm_scan", **case.args())
    assert s and "Vulkan" in s.reason
    with pytest.raises(ValueError, match="op"):
        ssm_vk.supports("nope", **case.args())
