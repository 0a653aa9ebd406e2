"""ssm_vk's invariant mode (``invariant=True``; docs/SPEC.md section 3.2): batch invariance and split
invariance bit for bit, forward and backward, Mamba-1 and Mamba-2, through ``states`` and through
the cache (update_cache decode steps), on shapes whose default plan is the chunked matrix form, the
time chunks or the Mamba-1 kernels with time in threads (forced by knobs, which the mode ignores);
d_A the float32 sum of the sequences' own d_A in sequence order; token windows carrying the state
and the adjoint bit for bit; the mode a part of every plan key; the results against the float64
oracle. The default's non-guarantee (SPEC 3.2's table) is shown on the shape it was measured on."""

from __future__ import annotations

import functools

import numpy as np
import plans
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optional import need
from problems import make_problem
from registry import F32_TOL, Backend, assert_close, oracle_back, oracle_scan

import ssm_vk
from ssm_ref import GRAD_NAMES, check_backward, check_forward
from ssm_ref.testing.properties.invariance import batch_report, invariant_port, split_report
from ssm_vk import config, registry
from ssm_vk import runtime as rt
from ssm_vk.sizing import Limits

pytestmark = pytest.mark.vulkan

VK = Backend(name="ssm_vk", module=ssm_vk, where=r"Vulkan\d+", tol=F32_TOL)

# Knobs that put the default's plans on every other family where they apply (the chunked Mamba-2
# kernels from 16 tokens, time chunks of 4 tokens, the Mamba-1 kernels with time in threads on
# this CPU device too): the invariant mode must not take any of them.
FORCED = {"CHUNK": 16, "CHUNK_MIN_T": 16, "M1": 1}


PORT = invariant_port(ssm_vk)


class OnDevice:
    """PORT, recording where each of its calls ran: a drawn report must have run every call on
    the Vulkan device (a fallback to the CPU would hold the properties without testing ssm_vk's
    kernels). The functions keep PORT's signatures (functools.wraps), so the reports see the
    keywords they take."""

    def __init__(self, port):
        self.where: list[str] = []
        self.NAME = port.NAME
        for name in ("ssm_scan", "ssm_scan_back"):
            setattr(self, name, self._recording(getattr(port, name)))
        self.supports = port.supports

    def _recording(self, fn):
        @functools.wraps(fn)
        def call(*args, **kw):
            out = fn(*args, **kw)
            self.where.append(out.where)
            return out
        return call

    def all_on_the_device(self) -> None:
        device = rt.get_context().info.where
        assert self.where and set(self.where) == {device}, f"calls ran on {sorted(set(self.where))}, not {device}"


def _lim():
    return Limits.of(rt.get_context().info)


def _holds(rep) -> None:
    assert rep.holds, f"{rep.kind} ({rep.arrangement}): " + "; ".join(
        rep.compared[k].message() for k in rep.differing())


shapes = st.fixed_dictionaries(dict(
    S=st.integers(1, 4), T=st.integers(1, 40), H=st.integers(1, 4), P=st.integers(1, 6),
    N=st.integers(1, 18), G=st.sampled_from((1, 2)), variant=st.sampled_from(("mamba1", "mamba2")),
    ids=st.sampled_from(("none", "permutation", "duplicates"))))


def _case(seed: int, dims: dict):
    dims = dict(dims)
    if dims["H"] % dims["G"]:
        dims["G"] = 1
    if dims["variant"] == "mamba1":
        dims["G"] = 1
    if dims["S"] < 2 and dims["ids"] == "duplicates":
        dims["ids"] = "permutation"
    return make_problem(np.random.default_rng(seed), **dims)


@settings(max_examples=20, deadline=None)
@given(shapes, st.integers(0, 2**31 - 1), st.booleans())
def test_drawn_batches_are_invariant(dims, seed, forced):
    """A sequence alone, in the case and repeated at drawn positions of a shuffled batch among
    drawn companions: its y, states and own gradients the same bits; d_s the ordered scatter."""
    case = _case(seed, dims)
    port = OnDevice(PORT)
    with config.configure(tune=FORCED if forced else {}):
        _holds(batch_report(port, case))
    port.all_on_the_device()


@settings(max_examples=20, deadline=None)
@given(shapes, st.integers(0, 2**31 - 1), st.booleans(), st.booleans())
def test_drawn_splits_are_invariant(dims, seed, forced, in_cache):
    """Tokens in one call against drawn split points and a decode loop of one-token calls, through
    states or the cache: y, states and the backward chained last first (d_s, d_s0, d_x, d_dt,
    d_B, d_C) the same bits."""
    case = _case(seed, dims)
    in_cache = in_cache and len(set(np.asarray(case.ids).tolist())) == case.dims["S"]
    port = OnDevice(PORT)
    with config.configure(tune=FORCED if forced else {}):
        _holds(split_report(port, case, in_cache=in_cache))
    port.all_on_the_device()


@pytest.mark.parametrize("variant,T,S", [("mamba2", 64, 4), ("mamba2", 300, 4), ("mamba1", 64, 4),
                                         ("mamba1", 48, 2)])
def test_shapes_the_default_plans_otherwise(variant, T, S):
    """Shapes whose default plan is the chunked form (Mamba-2, 64 and 300 tokens), time chunks
    (forced: TCHUNK) or the Mamba-1 kernels with time in threads (forced: M1): the invariant mode
    plans the token-sequential kernels, and both properties hold, cut at drawn points and in a
    decode loop of the last three tokens."""
    H, P, N = (4, 16, 16) if variant == "mamba2" else (8, 1, 16)
    case = make_problem(np.random.default_rng(T), S=S, T=T, H=H, P=P, N=N, G=1, variant=variant, ids="permutation")
    tune = {**FORCED, "TCHUNK": 8}
    lim = _lim()
    with config.configure(tune=tune):
        knobs = config.settings()
        for backward in (False, True):
            p = (check_backward(**case.args(), g_y=case.g_y, g_states=case.g_states) if backward
                 else check_forward(**case.args()))
            default = registry.plan(p.dims, lim, backward, knobs)
            inv = registry.plan(p.dims, lim, backward, knobs.invariant_twin())
            assert default.rerun is not None, "the default plan is another family's here"
            assert inv.family.name == "sequential" and not inv.plan.tchunk and inv.plan.layout.EXACT
        _holds(batch_report(PORT, case))
        _holds(split_report(PORT, case, cuts=[T // 3, T - 3, T - 2, T - 1], in_cache=True))
        _holds(split_report(PORT, case, cuts=[T // 2], in_cache=False))


@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
def test_the_layout_is_that_of_the_sequence(variant):
    """The plan's layout depends on (H, P, N, G, variant) only: the same for every S and T (a
    decode step included), and forward as backward in lanes per row."""
    lim = _lim()
    knobs = config.settings().invariant_twin()
    base = check_forward(**make_problem(np.random.default_rng(0), S=1, T=2, H=4, P=8, N=16, G=1,
                                        variant=variant).args()).dims
    from dataclasses import replace
    for backward in (False, True):
        lays = {plans.sequential(registry.plan(replace(base, S=S, T=T, R=S), lim, backward, knobs)).layout
                for S in (1, 2, 7, 64) for T in (1, 2, 9, 64, 300, 4096)}
        assert len(lays) == 1, lays
    assert registry.plan(base, lim, False, knobs).plan.layout.LN == registry.plan(base, lim, True, knobs).plan.layout.LN


@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
def test_d_A_is_the_ordered_sum_of_the_sequences_own(variant):
    """d_A of a batch is ((d_A_0 + d_A_1) + d_A_2) + ... in float32, d_A_i that of sequence i alone
    (its own call), whatever the order of the batch."""
    case = make_problem(np.random.default_rng(5), S=4, T=21, H=3, P=5, N=6, G=1, variant=variant,
                        ids="duplicates")
    a = case.args()
    members = [2, 0, 3, 2, 1]

    def pick(rows):
        sub = {**a, "ids": np.asarray(case.ids)[rows], **{k: a[k][rows] for k in ("x", "dt", "B", "C")}}
        return ssm_vk.ssm_scan_back(**sub, g_y=case.g_y[rows], g_states=case.g_states[rows], invariant=True)

    own = [np.asarray(pick([m]).d_A) for m in members]
    want = own[0].copy()
    for d in own[1:]:
        want = (want + d).astype(np.float32)
    got = np.asarray(pick(members).d_A)
    assert got.dtype == np.float32 and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
def test_token_windows_carry_bit_for_bit(ctx, variant):
    """A binding too small for one sequence cuts it into token windows (state and adjoint carried
    in float32 buffers between dispatches): every output but d_A the same bits as whole
    sequences."""
    case = make_problem(np.random.default_rng(9), S=2, T=40, H=2, P=3, N=8, G=1, variant=variant, ids="permutation")
    kw = dict(**case.args(), invariant=True)
    whole = ssm_vk.ssm_scan(**kw)
    gw = ssm_vk.ssm_scan_back(**kw, g_y=case.g_y, g_states=case.g_states)
    # 200 floats a binding: a sequence's B (40 tokens x 8) does not fit, a few tokens do
    with ctx.seams.override_limits(max_storage_buffer_range=ctx.info.min_storage_buffer_offset_alignment + 4 * 200):
        d = check_backward(**case.args(), g_y=case.g_y, g_states=case.g_states).dims
        lim = Limits.of(ctx.info)
        knobs = config.settings().invariant_twin()
        assert all(registry.plan(d, lim, backward, knobs).plan.time_split for backward in (True, False))
        cut = ssm_vk.ssm_scan(**kw)
        gc = ssm_vk.ssm_scan_back(**kw, g_y=case.g_y, g_states=case.g_states)
    for k in ("y", "states"):
        assert np.asarray(getattr(cut, k)).tobytes() == np.asarray(getattr(whole, k)).tobytes(), k
    for k in GRAD_NAMES:
        if k != "d_A":
            assert np.asarray(gc[k]).tobytes() == np.asarray(gw[k]).tobytes(), k


def test_the_backward_token_windows_are_those_of_the_sequence():
    """The invariant backward's token windows are a function of the per-sequence problem and the
    device only: for every S each sequence is cut at the same tokens as alone. The partials
    budget is a sixteenth of the device's memory (at least SCRATCH_BUDGET): on a device of 80 GiB
    whole sequences of the training shape share windows (its 8 sequences in fewer than 8 walks),
    never in more walks than on a device of 2 GiB."""
    from dataclasses import replace

    from ssm_vk.sequential.sequential_planner import SCRATCH_BUDGET, partials_budget

    knobs = config.settings().invariant_twin()
    base = check_forward(**make_problem(np.random.default_rng(0), S=1, T=2, H=24, P=64, N=128, G=1).args()).dims
    walks = {}
    for gib in (2, 80):
        lim = replace(_lim(), device_local_bytes=gib << 30, max_storage_buffer_range=(4 << 30) - 1,
                      max_memory_allocation_size=gib << 30, max_workgroup_count=((1 << 31) - 1, 65535, 65535))
        alone = registry.plan(replace(base, T=2048), lim, True, knobs)
        cuts = [(w.t0, w.t1) for w in plans.sequential(alone).windows]
        for S in (1, 3, 8):
            pl = registry.plan(replace(base, S=S, R=S, T=2048), lim, True, knobs)
            for i in range(S):
                assert [(w.t0, w.t1) for w in plans.sequential(pl).windows if w.i0 <= i < w.i1] == cuts, (gib, S, i)
        walks[gib] = len({w.i0 for w in plans.sequential(pl).windows})
        assert partials_budget(plans.sequential(alone).layout, lim) == max(SCRATCH_BUDGET, (gib << 30) // 16)
        default = plans.sequential(registry.plan(base, lim, True, config.settings()))
        assert partials_budget(default.layout, lim) == SCRATCH_BUDGET
    assert walks[80] < 8 and walks[80] <= walks[2], walks


def test_the_mode_is_part_of_every_plan_key():
    """A default call that ran first (its lane kept: device-resident inputs, twice) is never the
    plan of an invariant call of the same arrays: the invariant call gives the bits of the
    sequence alone, where the default's chunked plan does not (SPEC 3.2's table: T = 64)."""
    case = make_problem(np.random.default_rng(3), S=4, T=64, H=4, P=16, N=16, G=1, variant="mamba2", ids="none")
    dev = {k: (ssm_vk.to_device(v) if k != "ids" and v is not None else v) for k, v in case.args().items()}
    try:
        for _ in range(2):
            ssm_vk.ssm_scan(**dev)
        r = ssm_vk.ssm_scan(**dev, invariant=True)
        alone = ssm_vk.ssm_scan(**{k: (v[:1] if k in ("s", "x", "dt", "B", "C") else v)
                                   for k, v in case.args().items()}, invariant=True)
        assert r.y.numpy()[:1].tobytes() == alone.y.tobytes()
        assert r.states.numpy()[:1].tobytes() == alone.states.tobytes()
        default_dec = ssm_vk.supports("ssm_scan", **case.args())
        inv_dec = ssm_vk.supports("ssm_scan", **case.args(), invariant=True)
        assert default_dec and inv_dec
    finally:
        for v in dev.values():
            if isinstance(v, ssm_vk.DeviceArray):
                v.release()


def test_prepared_calls_take_the_mode():
    """prepare_scan / prepare_scan_back with invariant=True run the invariant plan: their results
    the bits of the unprepared invariant calls."""
    case = make_problem(np.random.default_rng(4), S=3, T=64, H=4, P=16, N=16, G=1, variant="mamba2", ids="none")
    args = case.args()
    dev = {k: (ssm_vk.to_device(v) if k != "ids" and v is not None else v) for k, v in args.items()}
    gy, gs = ssm_vk.to_device(case.g_y), ssm_vk.to_device(case.g_states)
    try:
        with ssm_vk.prepare_scan(**dev, invariant=True) as pc:
            r = pc.run()
            y, states = r.y.numpy(), r.states.numpy()
        with ssm_vk.prepare_scan_back(**dev, g_y=gy, g_states=gs, invariant=True) as pb:
            g = {k: pb.run()[k].numpy() for k in GRAD_NAMES}
    finally:
        for v in (*dev.values(), gy, gs):
            if isinstance(v, ssm_vk.DeviceArray):
                v.release()
    want = ssm_vk.ssm_scan(**args, invariant=True)
    gw = ssm_vk.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states, invariant=True)
    assert y.tobytes() == want.y.tobytes() and states.tobytes() == want.states.tobytes()
    for k in GRAD_NAMES:
        assert g[k].tobytes() == np.asarray(gw[k]).tobytes(), k


@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
def test_invariant_results_match_the_oracle(variant):
    case = make_problem(np.random.default_rng(8), S=3, T=70, H=4, P=8, N=16, G=2 if variant == "mamba2" else 1,
                        variant=variant, ids="duplicates")
    r = ssm_vk.ssm_scan(**case.args(), invariant=True)
    g = ssm_vk.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states, invariant=True)
    assert r.where.startswith("Vulkan") and g.where.startswith("Vulkan")
    o = oracle_scan(**case.args())
    og = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    assert_close(VK, "y", r.y, o.y, label=variant)
    assert_close(VK, "states", r.states, o.states, label=variant)
    for k in GRAD_NAMES:
        assert_close(VK, k, g[k], og[k], label=variant)


@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
def test_a_wheel_without_glslc_runs_the_mode_on_the_device(packaged_only, variant):
    # The packaged matrix holds the invariant mode's variants (EXACT, the per-sequence sum of
    # d_A): with only a wheel's SPIR-V (no glslc, no cache) the mode runs on the device, a
    # decode step too.
    packaged_only([16])
    for T in (1, 40):
        case = make_problem(np.random.default_rng(9 + T), S=3, T=T, H=4, P=8, N=16,
                            G=2 if variant == "mamba2" else 1, variant=variant, ids="duplicates")
        for op in ("ssm_scan", "ssm_scan_back"):
            sup = ssm_vk.supports(op, **case.args(), invariant=True)
            assert sup and "Vulkan" in sup.reason, (op, T, sup)
        r = ssm_vk.ssm_scan(**case.args(), invariant=True)
        g = ssm_vk.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states, invariant=True)
        assert r.where.startswith("Vulkan") and g.where.startswith("Vulkan"), (r.where, g.where)
        o = oracle_scan(**case.args())
        og = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
        assert_close(VK, "y", r.y, o.y, label=f"packaged {variant} T={T}")
        assert_close(VK, "states", r.states, o.states, label=f"packaged {variant} T={T}")
        for k in GRAD_NAMES:
            assert_close(VK, k, g[k], og[k], label=f"packaged {variant} T={T}")


def test_invariant_takes_only_booleans():
    case = make_problem(np.random.default_rng(1), S=1, T=3, H=2, P=2, N=4, G=1)
    for bad in (1, "yes", None):
        for fn in (ssm_vk.ssm_scan, ssm_vk.ssm_scan_back, ssm_vk.prepare_scan):
            with pytest.raises(ValueError, match="invariant"):
                fn(**case.args(), invariant=bad)
        with pytest.raises(ValueError, match="invariant"):
            ssm_vk.supports("ssm_scan", **case.args(), invariant=bad)


def test_the_default_is_not_batch_invariant_where_spec_says():
    """SPEC 3.2's table: the default (Mamba-2, T = 64, H = 4, P = 16, N = 16) gives sequence 0
    other y bits in a batch of 4 than alone (the chunked plan against the token-sequential one)."""
    case = make_problem(np.random.default_rng(0), S=4, T=64, H=4, P=16, N=16, G=1, variant="mamba2", ids="none")
    rep = batch_report(ssm_vk, case, members=[0, 1, 2, 3], target=0, backward=False, snapshots=1)
    assert "y" in rep.differing()


def test_the_bridges_pass_the_mode_through():
    """ssm_torch.ssm_scan and ssm_jax.ssm_scan (forward and gradient) with invariant=True give
    ssm_vk's invariant bits; ssm_ref takes the keyword (invariant anyway), ssm_fast refuses it; the
    mamba drop-ins take it."""
    torch = need("torch")
    jax = need("jax")
    import ssm_jax
    import ssm_torch
    from ssm_torch.mamba import mamba_chunk_scan_combined

    case = make_problem(np.random.default_rng(6), S=3, T=64, H=4, P=16, N=16, G=1, variant="mamba2", ids="none")
    a = case.args()
    want = ssm_vk.ssm_scan(**a, invariant=True)
    g1 = ssm_vk.ssm_scan_back(**a, g_y=np.ones_like(a["x"]), g_states=np.zeros_like(a["s"]), invariant=True)
    names = ("s", "x", "dt", "A", "B", "C")
    t = [torch.tensor(a[k], requires_grad=True) for k in names]
    y, _ = ssm_torch.ssm_scan(*t, backend="ssm_vk", invariant=True)
    y.sum().backward()
    assert y.detach().numpy().tobytes() == want.y.tobytes()
    assert t[1].grad.numpy().tobytes() == g1.d_x.tobytes()
    j = [jax.numpy.asarray(a[k]) for k in names]
    yj, _ = ssm_jax.ssm_scan(*j, backend="ssm_vk", invariant=True)
    assert np.asarray(yj).tobytes() == want.y.tobytes()
    gx = jax.grad(lambda x: ssm_jax.ssm_scan(j[0], x, *j[2:], backend="ssm_vk", invariant=True)[0].sum())(j[1])
    assert np.asarray(gx).tobytes() == g1.d_x.tobytes()
    ssm_torch.ssm_scan(*(v.detach() for v in t), backend="ssm_ref", invariant=True)
    ssm_jax.ssm_scan(*j, backend="ssm_ref", invariant=True)
    for fn, arrs in ((ssm_torch.ssm_scan, [v.detach() for v in t]), (ssm_jax.ssm_scan, j)):
        with pytest.raises(ValueError, match="invariant"):
            fn(*arrs, backend="ssm_fast", invariant=True)
        with pytest.raises(ValueError, match="invariant"):
            fn(*arrs, backend="ssm_vk", invariant=1)
    x = torch.tensor(a["x"][:1]).float()
    dt = torch.tensor(a["dt"][:1]).float()
    B, C = (torch.tensor(a[k][:1]) for k in ("B", "C"))
    A = torch.tensor(a["A"]).reshape(-1)
    out = mamba_chunk_scan_combined(x, dt, A, B, C, 16, backend="ssm_vk", invariant=True)
    batch = mamba_chunk_scan_combined(torch.tensor(a["x"]), torch.tensor(a["dt"]), A, torch.tensor(a["B"]),
                                      torch.tensor(a["C"]), 16, backend="ssm_vk", invariant=True)
    assert out.numpy().tobytes() == batch[:1].numpy().tobytes()
