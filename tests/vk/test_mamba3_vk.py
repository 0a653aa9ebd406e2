"""The Mamba-3 scan on the Vulkan device (ssm_vk.mamba3_scan, mamba3_scan_back; the kernels of
ssm_vk/mamba3/) against the float64 reference ssm_ref.mamba3_scan: drawn problems of the testing
kit's strategy (ssm_ref.testing.mamba3_cases.strategy) held to the op's declared float32
tolerance (ssm_ref.ops.get("mamba3_scan").tol()) by the kit's own comparisons; the decode step in
place on the four caches; bit-identical reruns; the errors ssm_ref raises, before any Vulkan
call; the support decision; and every property of the kit on the ssm_vk port.

Every test runs under the validation layer (tests/conftest.py fails a test on any message).
The shapes are small: lavapipe is slow, and each state size and rank is a kernel variant of its
own (compiled once per process)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import ssm_ref
import ssm_vk
from ssm_ref import ops
from ssm_ref.testing import mamba3_cases
from ssm_ref.testing.properties.generic import GENERIC
from ssm_ref.testing.properties.mamba3 import PROPERTIES
from ssm_vk import mamba3_api
from ssm_vk import runtime as rt

pytestmark = pytest.mark.vulkan

OP = ops.get("mamba3_scan")
TOL = OP.tol()
WHERE = re.compile(r"Vulkan\d+")
STATES = ("s_theta", "s_h", "s_k", "s_v")
# The drawn problems: the kit's strategy within sizes lavapipe runs quickly (N <= 8, M <= 2,
# T <= 6, long_decay up to 24 tokens); every regime, ids pattern and both rotations.
SMALL = mamba3_cases.strategy(max_S=2, max_T=6, max_T_long=24, max_P=4, max_N=8, max_M=2)
FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _args(case) -> dict:
    return {**case.args(), **case.keywords}


@given(case=SMALL)
@FEW
def test_drawn_problems_meet_the_float64_reference(case):
    """Forward and backward of drawn problems within the op's tolerance of the float64 reference
    (the kit's oracle_forward, oracle_backward), computed on the device."""
    assert GENERIC["oracle_forward"].check(ssm_vk, case, TOL)
    assert GENERIC["oracle_backward"].check(ssm_vk, case, TOL)
    r = ssm_vk.mamba3_scan(**_args(case))
    g = ssm_vk.mamba3_scan_back(**_args(case), **case.cotangents)
    assert WHERE.fullmatch(r.where) and WHERE.fullmatch(g.where), (r.where, g.where)


@pytest.mark.parametrize("name", sorted(mamba3_cases.GOLDEN))
def test_golden_cases_meet_the_float64_reference(name):
    """The kit's fixed cases (no tokens, shared rows, MIMO with psi None, F = 0, a wide state, ...)."""
    case = mamba3_cases.make_case(**mamba3_cases.GOLDEN[name][1])
    assert GENERIC["oracle_forward"].check(ssm_vk, case, TOL)
    assert GENERIC["oracle_backward"].check(ssm_vk, case, TOL)


def test_more_channels_than_one_workgroup_forward_and_backward():
    """P above the forward's workgroup (several channel blocks per head) and a head of many
    channels in the backward's one workgroup: still the reference's."""
    case = mamba3_cases.make_case(5, S=1, T=3, H=2, P=130, N=4, G=1, M=2, F=1)
    assert GENERIC["oracle_forward"].check(ssm_vk, case, TOL)
    assert GENERIC["oracle_backward"].check(ssm_vk, case, TOL)


@pytest.mark.parametrize("kw", [dict(P=70, N=64, F=16), dict(P=45, N=200, M=2, F=50, rotation="halved"),
                                dict(P=3, N=5, F=0), dict(P=130, N=4, F=2)], ids=["blocks", "mimo", "odd", "wide"])
def test_a_decode_step_on_the_one_token_kernel_meets_the_float64_reference(kw):
    """T = 1 on mamba3_step.comp (M3_STEP = 1; several blocks of rows per head where P exceeds
    its tile: the first two): y and the final state within the op's tolerance of float64, as the
    token-sequential kernel's (the default, M3_STEP = 0); reruns bit-identical."""
    from ssm_ref.mamba3_checks import check_mamba3_forward
    from ssm_vk import config

    case = mamba3_cases.make_case(61, S=3, T=1, H=2, G=1, R=4, ids="permutation", **kw)
    a = _args(case)
    dims = check_mamba3_forward(*(a[k] for k in OP.float_inputs), a["ids"], rotation=a["rotation"]).dims
    assert not mamba3_api.decide("mamba3_scan", dims).planned.first.plan.step
    assert GENERIC["oracle_forward"].check(ssm_vk, case, TOL)
    with config.configure(tune={"M3_STEP": 1}):
        plan = mamba3_api.decide("mamba3_scan", dims).planned.first.plan
        assert plan.step and (plan.npb > 1) == (kw["N"] > 8)
        assert GENERIC["oracle_forward"].check(ssm_vk, case, TOL)
        first, again = ssm_vk.mamba3_scan(**a), ssm_vk.mamba3_scan(**a)
    assert all(x.tobytes() == y.tobytes() for x, y in zip(first, again, strict=True))


@pytest.mark.parametrize("mimo", [False, True])
def test_decode_steps_in_place_equal_one_call(mimo):
    """A prefill, then T = 1 steps with update_cache=True writing the four state parts into the
    cache rows ids in place: y and the rows equal one call over every token; rows nobody reads
    keep their bits."""
    case = mamba3_cases.make_case(11, S=2, T=4, H=2, P=3, N=6, G=1, M=2 if mimo else None, F=2, R=4,
                                  ids="permutation")
    a = _args(case)
    whole = ssm_ref.mamba3_scan(**{k: v for k, v in a.items()}, dtype=np.float64)
    caches = {k: a[k].copy() for k in STATES}
    before = {k: v.copy() for k, v in caches.items()}
    ids = a["ids"]
    ys = []
    for t in range(4):
        step = {k: (v[:, t:t + 1] if k in ("x", "dt", "dA", "lam", "B", "C", "dtheta") else v) for k, v in a.items()}
        r = ssm_vk.mamba3_scan(**{**step, **caches}, update_cache=True)
        assert r.theta is None and r.h is None and r.k is None and r.v is None
        assert WHERE.fullmatch(r.where)
        ys.append(r.y)
    y = np.concatenate(ys, axis=1)
    assert ssm_ref.tolerance.compare("y", y, whole.y, TOL["y"]).ok
    for k, final in zip(STATES, ("theta", "h", "k", "v"), strict=True):
        got = caches[k][ids]
        want = getattr(whole, final)
        if k == "s_theta":   # on the circle
            got, want = np.cos(got), np.cos(want)
        assert ssm_ref.tolerance.compare(final, got, want, TOL[final]).ok, k
        unread = np.setdiff1d(np.arange(caches[k].shape[0]), ids)
        assert caches[k][unread].tobytes() == before[k][unread].tobytes()


def test_the_rotation_is_accurate_on_every_device():
    """The kernels' own sin and cos (not the driver's, which on GPUs are often approximations):
    with B = (1, 0), no bias, the last key is (cos θ, sin θ) of the output angle θ -- within 2
    float32 ulps of 1 of numpy's, over 4,096 angles spread over [0, 2π)."""
    S = 4096
    rng = np.random.default_rng(3)
    z = np.zeros
    B = z((S, 1, 1, 2), np.float32)
    B[..., 0] = 1
    a = dict(x=z((S, 1, 1, 1), np.float32), dt=np.ones((S, 1, 1), np.float32), dA=z((S, 1, 1), np.float32),
             lam=np.ones((S, 1, 1), np.float32), B=B, C=B.copy(), B_bias=z((1, 2), np.float32),
             C_bias=z((1, 2), np.float32), dtheta=rng.uniform(0, 2 * np.pi, (S, 1, 1, 1)).astype(np.float32))
    r = ssm_vk.mamba3_scan(**a)
    assert WHERE.fullmatch(r.where)
    theta = r.theta[:, 0, 0].astype(np.float64)
    ulp = float(np.spacing(np.float32(1)))
    assert np.max(np.abs(r.k[:, 0, 0] - np.cos(theta))) <= 2 * ulp
    assert np.max(np.abs(r.k[:, 0, 1] - np.sin(theta))) <= 2 * ulp


def test_reruns_are_bit_identical():
    """Forward and backward twice: the same bits, also the sums over heads (d_B, d_C of groups of
    two heads), sequences (d_B_bias, d_C_bias, d_psi) and repeated cache rows (d_s_*)."""
    case = mamba3_cases.make_case(21, S=3, T=5, H=4, P=5, N=8, G=2, M=2, F=3, R=3, ids="duplicates")
    a, cot = _args(case), case.cotangents
    f1, f2 = ssm_vk.mamba3_scan(**a), ssm_vk.mamba3_scan(**a)
    for one, two in zip(f1, f2, strict=True):
        assert one.tobytes() == two.tobytes()
    g1, g2 = ssm_vk.mamba3_scan_back(**a, **cot), ssm_vk.mamba3_scan_back(**a, **cot)
    for k in OP.grad_names:
        assert g1[k].tobytes() == g2[k].tobytes(), k


def test_inputs_are_not_written():
    case = mamba3_cases.make_case(31, S=2, T=3, H=2, P=3, N=4, G=1, M=2, F=2, R=3, ids="permutation")
    a, cot = _args(case), case.cotangents
    before = {k: None if v is None or isinstance(v, str) else v.copy() for k, v in {**a, **cot}.items()}
    ssm_vk.mamba3_scan(**a)
    ssm_vk.mamba3_scan_back(**a, **cot)
    for k, v in {**a, **cot}.items():
        if before[k] is not None:
            assert v.tobytes() == before[k].tobytes(), k


def _raised(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except (TypeError, ValueError) as e:
        return type(e), str(e)
    raise AssertionError("no error raised")


def _bad_inputs():
    case = mamba3_cases.make_case(41, S=2, T=3, H=2, P=3, N=4, G=1, F=1, R=3, ids="permutation")
    a = _args(case)
    mimo = _args(mamba3_cases.make_case(42, S=2, T=3, H=2, P=3, N=4, G=1, M=2, F=1))
    return {
        "x rank": {**a, "x": a["x"][0]},
        "dt shape": {**a, "dt": a["dt"][:, :2]},
        "F above N/2": {**a, "dtheta": np.zeros((2, 3, 2, 3), np.float32)},
        "psi with SISO": {**a, "psi": np.ones((2, 1, 3), np.float32)},
        "three state parts": {**a, "s_v": None},
        "ids out of range": {**a, "ids": np.array([0, 7])},
        "ids float": {**a, "ids": np.array([0.0, 1.0])},
        "rotation": {**a, "rotation": "pairs"},
        "C rank": {**mimo, "C": mimo["C"][:, :, :1]},
        "B_bias kind": {**a, "B_bias": np.array([["a"] * 4] * 2)},
    }


@pytest.mark.parametrize("what", sorted(_bad_inputs()))
def test_bad_input_raises_what_ssm_ref_raises(what, monkeypatch):
    """The same exception type and message as ssm_ref, forward, backward and supports(), before
    any Vulkan call (the decision is never reached)."""
    a = _bad_inputs()[what]

    def no_device(*args, **kw):
        raise AssertionError("a Vulkan decision was taken for bad input")

    monkeypatch.setattr(mamba3_api, "decide", no_device)
    want = _raised(ssm_ref.mamba3_scan, **a)
    assert _raised(ssm_vk.mamba3_scan, **a) == want
    assert _raised(ssm_vk.mamba3_scan_back, **a) == _raised(ssm_ref.mamba3_scan_back, **a)
    assert _raised(ssm_vk.supports, "mamba3_scan", **a) == want


def test_update_cache_errors_are_ssm_refs():
    case = mamba3_cases.make_case(43, S=2, T=1, H=2, P=3, N=4, G=1, F=1, R=3, ids="duplicates")
    a = _args(case)
    assert _raised(ssm_vk.mamba3_scan, **a, update_cache=True) == _raised(ssm_ref.mamba3_scan, **a,
                                                                          update_cache=True)
    b = _args(mamba3_cases.make_case(44, S=2, T=1, H=2, P=3, N=4, G=1, F=1, states=False))
    assert _raised(ssm_vk.mamba3_scan, **b, update_cache=True) == _raised(ssm_ref.mamba3_scan, **b,
                                                                          update_cache=True)


def test_float32_only():
    case = mamba3_cases.make_case(45, S=1, T=2, H=2, P=2, N=4, G=1, F=1)
    with pytest.raises(ValueError, match="dtype: ssm_vk computes in float32 only"):
        ssm_vk.mamba3_scan(**_args(case), dtype=np.float64)
    with pytest.raises(TypeError):
        ssm_vk.mamba3_scan(**_args(case), dtype=np.int32)


def test_supports_answers_for_the_op():
    """True on the device for the forward and the backward; a head of more channels than one
    workgroup of the device holds: the backward says no and why, and its call runs on the CPU
    (ssm_fast) with the reference's results; an unknown op names the ops."""
    info = rt.get_context().info
    case = mamba3_cases.make_case(51, S=1, T=2, H=2, P=3, N=4, G=1, M=2, F=1)
    a = _args(case)
    for op in ("mamba3_scan", "mamba3_scan_back"):
        sup = ssm_vk.supports(op, **a)
        assert sup.ok and info.name in sup.reason, sup
    most = min(info.max_workgroup_invocations, info.max_workgroup_size[0])
    wide = mamba3_cases.make_case(52, S=1, T=1, H=1, P=most + 1, N=2, G=1, F=0)
    sup = ssm_vk.supports("mamba3_scan_back", **_args(wide))
    assert not sup.ok and "one workgroup" in sup.reason
    assert ssm_vk.supports("mamba3_scan", **_args(wide)).ok   # the forward takes channel blocks
    g = ssm_vk.mamba3_scan_back(**_args(wide), **wide.cotangents)
    assert g.where == "CPU"
    assert GENERIC["oracle_backward"].check(ssm_vk, wide, TOL)
    with pytest.raises(ValueError, match=r"^op: expected "):
        ssm_vk.supports("mamba3_scan_fwd", *a.values())


def test_the_ops_matrix_takes_ssm_vk_for_mamba3():
    """tests/kit/test_ops_matrix.py runs every backend that has an op's two functions."""
    from ssm_ref.testing import ports

    assert ports.interface_problems(ssm_vk, OP) == []


@pytest.mark.parametrize("name", sorted(PROPERTIES))
def test_every_property_of_the_kit(name):
    """The kit's properties of the op (ssm_ref.testing.properties.mamba3: the generic ones, token
    splits and decode steps carrying the four parts, permuted sequences, determinism; MIMO of rank
    1 is SISO, rank permutation, the two rotations, lam = 1 is Mamba-2, decode in place, no
    writes) on the ssm_vk port, on a SISO and a MIMO case; each applies to one at least."""
    prop = PROPERTIES[name]
    cases = [mamba3_cases.make_case(61, S=2, T=4, H=2, P=3, N=6, G=1, F=2, R=3, ids="permutation"),
             mamba3_cases.make_case(62, S=2, T=4, H=2, P=3, N=6, G=1, M=2, F=3, R=3, ids="permutation",
                                    rotation="halved")]
    applied = [prop.check(ssm_vk, case, TOL) for case in cases]
    assert any(applied), f"{name} applied to neither case"


def test_the_plan_reads_the_device_limits():
    """The planner's workgroup sizes come from the device's limits (its subgroup size, workgroup
    limits), never a constant: planned here on made-up devices of subgroup 8 and 32."""
    from ssm_ref.mamba3_checks import M3Dims
    from ssm_vk import config, registry
    from ssm_vk.mamba3.mamba3_planner import segment, work_elems
    from ssm_vk.sizing import Limits

    def lim(sg, most=1024):
        return Limits(subgroup_size=sg, subgroup_ops=frozenset(), max_workgroup_invocations=most,
                      max_shared_memory=32 << 10, max_workgroup_count=(65535, 65535, 65535),
                      max_storage_buffer_range=1 << 27, max_memory_allocation_size=1 << 30,
                      min_storage_buffer_offset_alignment=256, max_workgroup_size=(most, most, 64))

    d = M3Dims(S=2, T=10, H=3, P=3, N=4, G=1, M=1, F=1, R=2, mimo=False)
    knobs = config.settings()
    for sg in (8, 32):
        fwd = registry.plan(d, lim(sg), False, knobs, op="mamba3_scan").plan
        bwd = registry.plan(d, lim(sg), True, knobs, op="mamba3_scan").plan
        assert fwd.wg == bwd.wg == sg and fwd.npb == 1 and fwd.groups == bwd.groups == d.S * d.H
    wide = M3Dims(S=1, T=10, H=1, P=300, N=4, G=1, M=1, F=1, R=1, mimo=False)
    fwd = registry.plan(wide, lim(32), False, knobs, op="mamba3_scan").plan
    assert fwd.wg * fwd.npb >= 300 and fwd.npb > 1
    assert registry.plan(wide, lim(32), True, knobs, op="mamba3_scan").plan.wg == 512
    with pytest.raises(ValueError, match="one workgroup"):   # (sizing.TooLarge)
        registry.plan(wide, lim(32, most=256), True, knobs, op="mamba3_scan")
    assert [segment(T) for T in (0, 1, 2, 4, 5, 16, 17, 1000)] == [1, 1, 2, 2, 3, 4, 5, 32]
    long = M3Dims(S=1, T=4096, H=1, P=64, N=128, G=1, M=1, F=32, R=1, mimo=False)
    assert work_elems(long) < work_elems(long, seg=long.T) / 10   # checkpoints: ~2 sqrt(T) states, not T


def test_the_forward_stages_deeper_from_enough_workgroups():
    """The token-sequential forward keeps 8 loads in flight below STAGE_DEEP_GROUPS workgroups and
    16 from there (M3_STAGE overrides both), and the packaged matrix holds both variants of every
    packaged state size, so that a call without glslc never meets a module it lacks; so is the
    one-token kernel's, which a decode step runs with M3_STEP = 1 (two tokens here: the walk)."""
    from ssm_ref.mamba3_checks import M3Dims
    from ssm_vk import config, registry
    from ssm_vk.mamba3 import mamba3_specs
    from ssm_vk.mamba3.mamba3_planner import STAGE_DEEP_GROUPS
    from ssm_vk.sizing import Limits

    lim = Limits.of(rt.get_context().info)

    def stage(S, **tune):
        d = M3Dims(S=S, T=2, H=16, P=64, N=128, G=1, M=1, F=0, R=S, mimo=False)
        with config.configure(tune=tune):
            p = registry.plan(d, lim, False, config.settings(), op="mamba3_scan").plan
        assert not p.step
        return p.groups, p.stage, mamba3_specs.scan_spec(d, p)

    seen = set()
    for S in (1, 16, STAGE_DEEP_GROUPS // 16 - 1, STAGE_DEEP_GROUPS // 16, 160):
        groups, st, _ = stage(S)
        assert st == (16 if groups >= STAGE_DEEP_GROUPS else 8), (S, groups, st)
        seen.add(st)
    assert seen == {8, 16}
    assert stage(160, M3_STAGE=8)[1] == 8 and stage(1, M3_STAGE=32)[1] == 32
    packaged = {(s.name, s.defines) for s in mamba3_specs.packaged([lim], [128], (), (), config.settings())}
    for S in (1, 160):
        spec = stage(S)[2]
        assert (spec.name, spec.defines) in packaged, S
    one = M3Dims(S=4, T=1, H=16, P=64, N=128, G=1, M=1, F=0, R=4, mimo=False)
    for step in (0, 1):
        with config.configure(tune={"M3_STEP": step}):
            p = registry.plan(one, lim, False, config.settings(), op="mamba3_scan").plan
        assert p.step == bool(step)
        spec = mamba3_specs.forward_spec(one, p)
        assert spec.name == ("mamba3_step" if step else "mamba3_scan") and (spec.name, spec.defines) in packaged


def test_repeats_reuse_the_workspace_and_the_kept_replay():
    """A repeat of a host call records nothing new (its workspace's sequence is resubmitted); a
    repeat of a call of DeviceArrays runs through the Replay kept for its signature
    (replay_cache.py, the scan's mechanism), with the same bits."""
    from ssm_vk import engine as vk_engine
    from ssm_vk.mamba3_workspace import M3Workspace

    eng = vk_engine.current()
    case = mamba3_cases.make_case(71, S=1, T=2, H=2, P=3, N=4, G=1, F=1)
    first = ssm_vk.mamba3_scan(**_args(case))
    spaces = [w for w in eng.workspaces.values() if isinstance(w, M3Workspace) and w.dims.T == 2]
    recorded = {id(seq) for w in spaces for seq, _ in w.sequences.values()}
    again = ssm_vk.mamba3_scan(**_args(case))
    assert {id(seq) for w in spaces for seq, _ in w.sequences.values()} == recorded
    assert again.y.tobytes() == first.y.tobytes()
    dev = {k: ssm_vk.to_device(v) if isinstance(v, np.ndarray) and k != "ids" else v for k, v in _args(case).items()}
    kept = len(eng.replays)
    one = ssm_vk.mamba3_scan(**dev)
    assert len(eng.replays) == kept + 1
    replay = next(r for r in eng.replays.values() if r.calls.op.name == "mamba3_scan" and r.dims.T == 2)
    runs = []
    real = replay.run
    replay.__class__.run, saved = (lambda self, *a: runs.append(1) or real(*a)), replay.__class__.run
    try:
        two = ssm_vk.mamba3_scan(**dev)
    finally:
        replay.__class__.run = saved
    assert runs == [1]
    assert one.y.numpy().tobytes() == two.y.numpy().tobytes() == first.y.tobytes()


@pytest.mark.parametrize("sizes", [dict(N=0, F=0), dict(P=0), dict(H=0)], ids=str)
def test_empty_axes(sizes):
    """N = 0 runs on the CPU (supports() says why); no channels or no heads run on the device;
    all as the reference."""
    case = mamba3_cases.make_case(81, S=2, T=2, **{**dict(H=2, P=2, N=4, G=1, F=1), **sizes})
    a = _args(case)
    sup = ssm_vk.supports("mamba3_scan", **a)
    assert sup.ok == (sizes.get("N") != 0), sup
    if not sup.ok:
        assert "N >= 1" in sup.reason
    assert GENERIC["oracle_forward"].check(ssm_vk, case, TOL)
    assert GENERIC["oracle_backward"].check(ssm_vk, case, TOL)


@pytest.mark.parametrize("what,value", [("dtheta", np.nan), ("x", np.inf), ("dA", np.nan), ("B", -np.inf)])
def test_non_finite_inputs_flow_as_the_reference(what, value):
    """inf and nan flow through the forward and the backward where the reference's do (the
    comparisons require the same non-finite entries: docs/SPEC.md section 8)."""
    case = mamba3_cases.make_case(91, S=2, T=3, H=2, P=2, N=4, G=1, M=2, F=2)
    case.inputs[what].reshape(-1)[1] = value
    assert GENERIC["oracle_forward"].check(ssm_vk, case, TOL)
    assert GENERIC["oracle_backward"].check(ssm_vk, case, TOL)
