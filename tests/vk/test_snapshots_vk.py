"""ssm_vk's K state snapshots (docs/SPEC.md section 3.1: ``ssm_scan(snapshots=K)``,
``ssm_scan_back(g_snapshots=...)``) against the float64 oracle: drawn K, T (0, below K, K, above
K), S, ids, both Mamba variants, host and device arrays; the shapes whose K = 1 call takes the
chunked kernels, the time chunks or the Mamba-1 kernels with time in threads; token windows; a
decode step; update_cache; the packed g_y with K slots; prepared calls; lanes and the validator's
shortcut keyed by K; the CPU fallback; K = 1's snapshots a view of states."""

from __future__ import annotations

import numpy as np
import plans
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from problems import make_problem, problems
from registry import F32_TOL, Backend, assert_close, oracle_back, oracle_scan

import ssm_vk
from ssm_ref import GRAD_NAMES, check_forward
from ssm_ref.tolerance import scaled
from ssm_vk import config, engine, registry
from ssm_vk import runtime as rt
from ssm_vk.sizing import Limits

pytestmark = pytest.mark.vulkan


def vk(T: int) -> Backend:
    # the float32 bounds, grown for long scans as every vk test grows them (ssm_ref.tolerance)
    return Backend(name="ssm_vk", module=ssm_vk, where=r"Vulkan\d+", tol=scaled(F32_TOL, T))


def host(a):
    return a.numpy() if isinstance(a, ssm_vk.DeviceArray) else np.asarray(a)


def on_device(args: dict) -> dict:
    return {k: v if k == "ids" or v is None else ssm_vk.to_device(v) for k, v in args.items()}


def assert_snapshots(got, want, T: int, label: str) -> None:
    """Slots k <= T (the states after T - k tokens, slot T the start state) within the states'
    bound of the oracle's; every slot k > T NaN, as the oracle's."""
    got = host(got)
    assert got.shape == want.shape, f"{label}: snapshots {got.shape}, oracle {want.shape}"
    m = min(T + 1, want.shape[0])
    assert_close(vk(T), "states", got[:m], want[:m], label=f"{label} snapshots")
    assert np.isnan(want[m:]).all() and np.isnan(got[m:]).all(), f"{label}: slots past T must be NaN"


def g_snapshots_for(case, K: int, seed: int = 0) -> np.ndarray:
    d = case.dims
    return np.random.default_rng(seed).uniform(-1, 1, (K, d["S"], d["H"], d["P"], d["N"])).astype(np.float32)


def check_case(case, K: int, resident: bool = False, label: str = "") -> None:
    """Forward with K snapshots and backward with g_snapshots, against the oracle."""
    T = case.dims["T"]
    args = on_device(case.args()) if resident else case.args()
    r = ssm_vk.ssm_scan(**args, snapshots=K)
    assert r.where.startswith("Vulkan") and r.backend == "ssm_vk", r.where
    assert isinstance(r.snapshots, ssm_vk.DeviceArray) == resident
    o = oracle_scan(**case.args(), snapshots=K)
    assert_close(vk(T), "y", host(r.y), o.y, label=label)
    assert_close(vk(T), "states", host(r.states), o.states, label=label)
    assert_snapshots(r.snapshots, o.snapshots, T, label)
    gsn = g_snapshots_for(case, K)
    grads = (case.g_y, case.g_states, gsn)
    if resident:
        grads = tuple(ssm_vk.to_device(a) for a in grads)
    g = ssm_vk.ssm_scan_back(**args, g_y=grads[0], g_states=grads[1], g_snapshots=grads[2])
    assert g.where.startswith("Vulkan"), g.where
    og = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states, g_snapshots=gsn)
    for k in GRAD_NAMES:
        assert_close(vk(T), k, host(getattr(g, k)), getattr(og, k), label=label)


@settings(max_examples=20, deadline=None)
@given(problems(min_T=0, max_T=12, max_N=20), st.integers(1, 6), st.booleans())
def test_drawn_problems_with_snapshots_match_the_oracle(case, K, resident):
    check_case(case, K, resident, label=f"{case!r} K={K}")


@pytest.mark.parametrize("variant", ["mamba2", "mamba1"])
@pytest.mark.parametrize("T", [0, 2, 3, 4, 9])
def test_every_edge_of_T_against_K(variant, T):
    # K = 3: T == 0 (slot 0 the start state), T < K (slot T the start state, NaN above), T == K,
    # T > K; the g_snapshots slots at and past T likewise.
    case = make_problem(np.random.default_rng(T), S=3, T=T, H=2, P=3, N=8, G=1, variant=variant,
                        ids="duplicates")
    check_case(case, 3, label=f"{variant} T={T}")
    check_case(case, 3, resident=True, label=f"{variant} T={T} device")


@pytest.mark.parametrize("variant", ["mamba2", "mamba1"])
def test_host_arrays_through_staging_copies(ctx, variant):
    # A discrete GPU's path (staging forced): the snapshots come back through the call's own
    # staging slots and g_snapshots goes in through one; twice, the second reusing the workspace.
    case = make_problem(np.random.default_rng(5), S=2, T=7, H=4, P=3, N=16, G=1, variant=variant,
                        ids="permutation")
    ctx.seams.force_staging = True
    try:
        for rep in range(2):
            check_case(case, 4, label=f"{variant} staged, call {rep}")
    finally:
        for c in {ctx, rt.current_context()} - {None}:
            c.seams.force_staging = False


def k1_plan(case, backward: bool, tune: dict):
    lim = Limits.of(rt.get_context().info)
    with config.configure(tune=tune):
        return registry.plan(check_forward(**case.args()).dims, lim, backward)


@pytest.mark.parametrize("family", ["chunked", "time_chunks", "m1"])
def test_shapes_of_the_other_families(family):
    # Where a call without snapshots takes the chunked kernels, time chunks or the Mamba-1 kernels
    # with time in threads (forced by their knobs), the snapshots run token by token and still match.
    tune = {"chunked": {"CHUNK": 16, "CHUNK_MIN_T": 1, "TCHUNK": 0, "M1": 0},
            "time_chunks": {"TCHUNK": 8, "CHUNK": 0, "M1": 0},
            "m1": {"M1": 1, "TCHUNK": 0}}[family]
    if family == "m1":   # (its kernels take channels of whole subgroups, P = 1)
        H = 2 * Limits.of(rt.get_context().info).subgroup_size
        case = make_problem(np.random.default_rng(3), S=1, T=48, H=H, P=1, N=8, G=1, variant="mamba1")
    else:
        case = make_problem(np.random.default_rng(3), S=2, T=48, H=2, P=4, N=8, G=1, ids="unused")
    for backward in (False, True):
        pl = k1_plan(case, backward, tune)
        assert {"chunked": pl.family.name == "chunked", "time_chunks": plans.tchunk(pl) > 0,
                "m1": pl.family.name == "m1"}[family]
    engine.clear()
    try:
        with config.configure(tune=tune):
            check_case(case, 5, label=family)
            check_case(case, 5, resident=True, label=f"{family} device")
            # the same shape without snapshots still takes that family's plan
            r = ssm_vk.ssm_scan(**case.args())
            assert_close(vk(48), "y", r.y, oracle_scan(**case.args()).y, label=f"{family} K=1")
    finally:
        engine.clear()


def test_token_windows():
    # A storage range that one sequence's tokens do not fit: token windows, each writing (and
    # reading back) the slots from its own end.
    case = make_problem(np.random.default_rng(14), S=3, T=150, H=2, P=2, N=8, G=1, ids="duplicates", R=2)
    ctx = rt.get_context()
    with ctx.seams.override_limits(max_storage_buffer_range=2048):
        d = check_forward(**case.args(), snapshots=4).dims
        for backward in (False, True):
            pl = registry.plan(d, Limits.of(ctx.info), backward, snap=True)
            assert pl.plan.time_split and len(pl.plan.windows) > 3 and pl.plan.snap, backward
        check_case(case, 4, label="token windows")


def test_sequence_windows():
    # A storage range that two sequences' tokens fit but not five: windows of sequences, each
    # binding its rows of the K slots.
    case = make_problem(np.random.default_rng(15), S=5, T=32, H=2, P=2, N=4, G=1, ids="permutation")
    ctx = rt.get_context()
    with ctx.seams.override_limits(max_storage_buffer_range=2048):
        d = check_forward(**case.args(), snapshots=2).dims
        for backward in (False, True):
            pl = registry.plan(d, Limits.of(ctx.info), backward, snap=True)
            assert not pl.plan.time_split and len(pl.plan.windows) > 1 and pl.plan.snap, backward
        check_case(case, 2, label="sequence windows")


@pytest.mark.parametrize("resident", [False, True])
def test_a_decode_step_and_update_cache(resident):
    # T = 1 (the decode kernel writes no snapshots: the ordinary kernel runs K > 1), the cache
    # updated in place: states None, snapshots the K slots (None for K = 1).
    case = make_problem(np.random.default_rng(5), S=3, T=1, H=2, P=8, N=16, G=1, ids="permutation", R=4)
    want = oracle_scan(**case.args(), snapshots=3)
    for K in (1, 3):
        args = case.args()
        cache = args["s"].copy()
        args["s"] = ssm_vk.to_device(cache) if resident else cache
        if resident:
            args = {k: v if k in ("ids", "s") else ssm_vk.to_device(v) for k, v in args.items()}
        r = ssm_vk.ssm_scan(**args, update_cache=True, snapshots=K)
        assert r.states is None
        assert_close(vk(1), "y", host(r.y), want.y, label=f"K={K}")
        rows = host(args["s"])[case.args()["ids"]]
        assert_close(vk(1), "states", rows, want.states, label=f"K={K} cache rows")
        if K == 1:
            assert r.snapshots is None
        else:
            assert_snapshots(r.snapshots, want.snapshots, 1, f"K={K} update_cache")


def test_packed_g_y_with_k_slots():
    case = make_problem(np.random.default_rng(6), S=2, T=5, H=2, P=3, N=8, G=1)
    K = 3
    gsn = g_snapshots_for(case, K)
    packed = np.concatenate([case.g_y.ravel(), gsn.ravel()])
    og = oracle_back(**case.args(), g_y=packed)
    for resident in (False, True):
        args = on_device(case.args()) if resident else case.args()
        gy = ssm_vk.to_device(packed) if resident else packed
        for _ in range(2):   # the second call through the validator's shortcut
            g = ssm_vk.ssm_scan_back(**args, g_y=gy, g_states=None)
            for k in GRAD_NAMES:
                assert_close(vk(5), k, host(getattr(g, k)), getattr(og, k), label=f"packed resident={resident}")


def test_repeats_take_their_lane_and_another_k_is_keyed_apart():
    # Device-resident repeats (lanes, the validator's shortcut): a call with another K on the same
    # arrays gets its own K, never a cached Dims of the first.
    case = make_problem(np.random.default_rng(7), S=2, T=6, H=2, P=3, N=8, G=1)
    args = on_device(case.args())
    eng = engine.current()
    for K in (3, 3, 2, 1, 2, 4):
        r = ssm_vk.ssm_scan(**args, snapshots=K)
        o = oracle_scan(**case.args(), snapshots=K)
        assert r.snapshots.shape == (K, 2, 2, 3, 8)
        assert_snapshots(r.snapshots, o.snapshots, 6, f"K={K}")
    assert any(len(sig) and sig[-1] == 3 for sig in eng.replays)   # K = 3 kept its lane
    gs = {K: g_snapshots_for(case, K, K) for K in (2, 3)}
    for K in (2, 3, 2):
        g = ssm_vk.ssm_scan_back(**args, g_y=ssm_vk.to_device(case.g_y), g_states=ssm_vk.to_device(case.g_states),
                                 g_snapshots=ssm_vk.to_device(gs[K]))
        og = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states, g_snapshots=gs[K])
        for k in GRAD_NAMES:
            assert_close(vk(6), k, host(getattr(g, k)), getattr(og, k), label=f"K={K}")


def test_prepared_calls():
    case = make_problem(np.random.default_rng(8), S=2, T=5, H=2, P=3, N=8, G=1)
    K = 4
    args = on_device(case.args())
    gsn = g_snapshots_for(case, K)
    h = case.args()
    with ssm_vk.prepare_scan(**args, snapshots=K) as fwd:
        for step in range(2):
            if step:   # the inputs as they are at each run
                h["x"] = h["x"] * np.float32(0.5)
                args["x"].write(h["x"])
            r = fwd.run()
            o = oracle_scan(**h, snapshots=K)
            assert_close(vk(5), "y", host(r.y), o.y, label=f"step {step}")
            assert_snapshots(r.snapshots, o.snapshots, 5, f"prepared step {step}")
    with ssm_vk.prepare_scan(**args) as fwd1:
        r = fwd1.run()
        assert r.snapshots.shape == (1, *r.states.shape) and r.snapshots.buffer is r.states.buffer
    dev = (ssm_vk.to_device(case.g_y), ssm_vk.to_device(case.g_states), ssm_vk.to_device(gsn))
    og = oracle_back(**h, g_y=case.g_y, g_states=case.g_states, g_snapshots=gsn)
    packed = ssm_vk.to_device(np.concatenate([case.g_y.ravel(), gsn.ravel()]))
    ogp = oracle_back(**h, g_y=np.concatenate([case.g_y.ravel(), gsn.ravel()]))
    for prep, want in ((ssm_vk.prepare_scan_back(**args, g_y=dev[0], g_states=dev[1], g_snapshots=dev[2]), og),
                       (ssm_vk.prepare_scan_back(**args, g_y=packed), ogp)):
        with prep:
            g = prep.run()
            for k in GRAD_NAMES:
                assert_close(vk(5), k, host(getattr(g, k)), getattr(want, k), label="prepared backward")


def test_k1_snapshots_are_a_view_of_states():
    case = make_problem(np.random.default_rng(9), S=2, T=4, H=2, P=3, N=8, G=1)
    r = ssm_vk.ssm_scan(**case.args())
    assert r.snapshots.shape == (1, *r.states.shape) and np.shares_memory(r.snapshots, r.states)
    rd = ssm_vk.ssm_scan(**on_device(case.args()))
    assert rd.snapshots.buffer is rd.states.buffer and rd.snapshots.offset == rd.states.offset
    assert np.array_equal(rd.snapshots.numpy()[0], rd.states.numpy())


def test_supports_and_bad_k():
    case = make_problem(np.random.default_rng(10), S=2, T=4, H=2, P=3, N=8, G=1)
    for op in ("ssm_scan", "ssm_scan_back"):
        assert ssm_vk.supports(op, **case.args(), snapshots=3)
    for bad, exc in ((0, ValueError), (True, TypeError), (2.0, TypeError)):
        with pytest.raises(exc, match="snapshots"):
            ssm_vk.ssm_scan(**case.args(), snapshots=bad)
        with pytest.raises(exc, match="snapshots"):
            ssm_vk.supports("ssm_scan", **case.args(), snapshots=bad)


@pytest.mark.parametrize("variant", ["mamba2", "mamba1"])
def test_a_wheel_without_glslc_runs_the_snapshots_on_the_device(packaged_only, variant):
    # The packaged matrix holds the SNAP variants the planner picks: with only a wheel's SPIR-V
    # (no glslc, no cache) K > 1 runs on the device, a decode-shaped step (T = 1, which takes
    # the ordinary kernel with K > 1) too, and so does the invariant mode with snapshots.
    packaged_only([16])   # (the modes' variants are packaged for the d_state of Mamba models: registry.MODES_N)
    for T in (1, 6):
        case = make_problem(np.random.default_rng(20 + T), S=3, T=T, H=2, P=4, N=16, G=1, variant=variant,
                            ids="duplicates")
        for op in ("ssm_scan", "ssm_scan_back"):
            sup = ssm_vk.supports(op, **case.args(), snapshots=3)
            assert sup and "Vulkan" in sup.reason, (op, T, sup)
        check_case(case, 3, label=f"packaged {variant} T={T}")
        r = ssm_vk.ssm_scan(**case.args(), snapshots=3, invariant=True)
        gsn = g_snapshots_for(case, 3)
        g = ssm_vk.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states, g_snapshots=gsn,
                                 invariant=True)
        assert r.where.startswith("Vulkan") and g.where.startswith("Vulkan"), (r.where, g.where)
        o = oracle_scan(**case.args(), snapshots=3)
        assert_close(vk(T), "y", r.y, o.y, label=f"packaged invariant {variant} T={T}")
        assert_snapshots(r.snapshots, o.snapshots, T, f"packaged invariant {variant} T={T}")
        og = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states, g_snapshots=gsn)
        for k in GRAD_NAMES:
            assert_close(vk(T), k, getattr(g, k), getattr(og, k), label=f"packaged invariant {variant} T={T}")


def test_the_cpu_fallback_computes_the_snapshots():
    # K slots beyond one binding: refused with a reason naming snapshots, computed on the CPU.
    case = make_problem(np.random.default_rng(11), S=2, T=5, H=2, P=2, N=8, G=1)
    K = 6
    ctx = rt.get_context()
    align = ctx.info.min_storage_buffer_offset_alignment
    with ctx.seams.override_limits(max_storage_buffer_range=align + 5 * 2 * 2 * 2 * 8 * 4):
        engine.clear()
        sup = ssm_vk.supports("ssm_scan", **case.args(), snapshots=K)
        assert not sup and "snapshots" in sup.reason
        r = ssm_vk.ssm_scan(**case.args(), snapshots=K)
        assert r.where == "CPU"
        o = oracle_scan(**case.args(), snapshots=K)
        assert_snapshots(r.snapshots, o.snapshots, 5, "fallback")
        gsn = g_snapshots_for(case, K)
        g = ssm_vk.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states, g_snapshots=gsn)
        assert g.where == "CPU"
        og = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states, g_snapshots=gsn)
        for k in GRAD_NAMES:
            assert_close(vk(5), k, getattr(g, k), getattr(og, k), label="fallback")
    engine.clear()


def test_k1_dispatches_the_kernels_of_before():
    # K = 1 without g_snapshots: no SNAP variant is planned or dispatched (the same SPIR-V as
    # before snapshots existed); K > 1 and g_snapshots: only the SNAP variants of the scan.
    case = make_problem(np.random.default_rng(12), S=2, T=9, H=2, P=3, N=8, G=1)
    lim = Limits.of(rt.get_context().info)
    d1 = check_forward(**case.args()).dims
    dk = check_forward(**case.args(), snapshots=3).dims
    for backward in (False, True):
        k1 = registry.kernels_needed(d1, registry.plan(d1, lim, backward), backward)
        assert not any(dict(s.defines).get("SNAP") for s in k1)
        pk = registry.plan(dk if not backward else d1, lim, backward, snap=True)
        kk = registry.kernels_needed(dk, pk, backward)
        assert any(dict(s.defines).get("SNAP") for s in kk)
