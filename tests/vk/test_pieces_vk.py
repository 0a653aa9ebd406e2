"""Arrays beyond one allocation, held in pieces (runtime.Pieces, sizing.pieces, budget.pieces).

The device's limits are lowered (``ctx.seams.override_limits``): ``maxStorageBufferRange`` to cut
the call into windows, and ``maxMemoryAllocationSize`` below the arrays of tokens, at or above the
range -- so the windows, hence the arithmetic, are those of the same call with only the range
lowered, and the pieced call must equal that one bit for bit (forward, snapshots, update_cache,
backward; Mamba-2 and Mamba-1; token windows and windows of whole sequences, whose cut points the
drawn limits move). ``supports()`` must agree with what runs: yes -> the call runs on the device,
no -> it runs on the CPU with the reason. The Pieces' own arithmetic (ranges, split copies) is
checked against a flat model.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from registry import F32_TOL, Backend, assert_close, oracle_back, oracle_scan

import ssm_vk
from ssm_ref.testing.cases import make_problem
from ssm_vk import engine as vk_engine
from ssm_vk import runtime as rt
from ssm_vk.arrays import pool
from ssm_vk.runtime.pieces import Pieces, split_copy

pytestmark = pytest.mark.vulkan
VK = Backend(name="ssm_vk", module=ssm_vk, where=r"Vulkan\d+", tol=F32_TOL)
SETTINGS = settings(max_examples=5, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


class _Buf:
    def __init__(self, size):
        self.size, self.ctx, self.serial, self.closed, self.mappable = size, None, id(self), False, True


@given(st.lists(st.integers(1, 40), min_size=1, max_size=5), st.data())
@settings(max_examples=40, deadline=None)
def test_pieces_locate_ranges_and_split_copies_like_one_flat_array(sizes, data):
    starts = tuple(int(s) for s in np.cumsum([0, *sizes[:-1]]))
    total = sum(sizes)
    p = Pieces([_Buf(n) for n in sizes], starts, total)
    off = data.draw(st.integers(0, total - 1))
    n = data.draw(st.integers(1, total - off))
    parts = list(p.parts(off, n))
    lengths = [k for *_, k in parts]
    assert sum(lengths) == n and [a for _, _, a, _ in parts] == list(np.cumsum([0, *lengths])[:-1])
    for b, o, a, k in parts:   # each part inside its buffer, at the flat position it stands for
        i = p.buffers.index(b)
        assert 0 <= o and o + k <= b.size and starts[i] + o == off + a
    inside = len(parts) == 1
    if inside:
        assert p.at(off, n) == (parts[0][0], parts[0][1])
    else:
        with pytest.raises(ValueError, match="cross a cut"):
            p.at(off, n)
    # a copy between two pieced arrays, cut differently: each byte lands where the flat copy puts it
    q = Pieces([_Buf(total)], (0,), total)
    d0 = data.draw(st.integers(0, total - n))
    flat = {}
    for s, d, k, so, do in split_copy(p, q, n, off, d0):
        si, di = p.buffers.index(s), 0
        assert d is q.buffers[di]
        for j in range(k):
            flat[do + j] = starts[si] + so + j
    assert flat == {d0 + j: off + j for j in range(n)}
    with pytest.raises(ValueError):
        list(p.parts(total - 1, 2))


@st.composite
def cases(draw, backward=False):
    variant = draw(st.sampled_from(["mamba2", "mamba1"]))
    S = draw(st.integers(1, 3))
    T = draw(st.sampled_from([128, 201, 300]))
    H, P = draw(st.integers(1, 3)), draw(st.sampled_from([4, 8]))
    N = 4
    K = draw(st.sampled_from([1, 1, 3]))
    kw = dict(S=S, T=T, H=H, P=P, N=N, G=1, variant=variant, K=K, seed=draw(st.integers(0, 2**31)))
    ways = draw(st.integers(2, 7))                 # windows: x over about this many bindings
    stretch = draw(st.sampled_from([1.0, 1.3, 2.0]))  # pieces of one window or more
    kw["invariant"] = draw(st.booleans())            # the invariant mode plans its own windows
    return kw, ways, stretch


def _drawn(drawn):
    """(the Case, invariant, ways, stretch) of a draw of :func:`cases`."""
    kw, ways, stretch = drawn
    kw = dict(kw)
    inv = kw.pop("invariant")
    return make_problem(kw.pop("seed"), **kw), inv, ways, stretch


def _limits(ctx, case, ways, stretch):
    x = case.args()["x"].nbytes
    align = ctx.info.min_storage_buffer_offset_alignment
    S, _, H, P = case.args()["x"].shape
    R, N = case.args()["s"].shape[0], case.args()["B"].shape[-1]
    rng = max(x // ways, 4 * H * P * N + 2 * align, 1024)   # at least one sequence's state row
    # x beyond one allocation, a piece at least a window; the cache and the states within one
    alloc = max(min(int(rng * stretch), x - 4), rng, 4 * max(R, S) * H * P * N + align)
    return rng, alloc


def _same(got, want, names):
    for k in names:
        a, b = getattr(got, k), getattr(want, k)
        if a is None and b is None:
            continue
        assert np.array_equal(np.asarray(a), np.asarray(b)), f"{k} differs from the unpieced call's"


def _pair(ctx, case, ways, stretch, call, sup):
    """(the call with the range lowered, (supports, the call) with the allocation lowered too), or
    None when the first does not run on the device (nothing to compare bit for bit)."""
    rng, alloc = _limits(ctx, case, ways, stretch)
    with ctx.seams.override_limits(max_storage_buffer_range=rng):
        want = call()
    if not want.where.startswith("Vulkan"):
        return None
    with ctx.seams.override_limits(max_storage_buffer_range=rng, max_memory_allocation_size=alloc):
        s = sup()
        got = call()
    assert got.where.startswith("Vulkan") == bool(s.ok), s.reason   # supports() agrees with what runs
    if not s.ok:
        assert "allocation" in s.reason or "maxMemoryAllocationSize" in s.reason, s.reason
    return want, got, s


@given(cases())
@SETTINGS
def test_a_pieced_forward_equals_the_unpieced_one_bit_for_bit(case):
    case, inv, ways, stretch = _drawn(case)
    ctx = rt.get_context()
    K = case.K
    a = case.args()
    out = _pair(ctx, case, ways, stretch, lambda: ssm_vk.ssm_scan(**a, snapshots=K, invariant=inv),
                lambda: ssm_vk.supports("ssm_scan", **a, snapshots=K, invariant=inv))
    if out is None:
        return
    want, got, _ = out
    _same(got, want, ["y", "states"] + (["snapshots"] if K > 1 else []))


@given(cases())
@SETTINGS
def test_a_pieced_update_cache_writes_the_rows_the_unpieced_one_writes(case):
    case, _, ways, stretch = _drawn(case)
    ctx = rt.get_context()
    a = case.args()
    caches = []

    def call():
        caches.append(np.array(a["s"], dtype=np.float32, copy=True))
        return ssm_vk.ssm_scan(**{**a, "s": caches[-1]}, update_cache=True)

    out = _pair(ctx, case, ways, stretch, call, lambda: ssm_vk.supports("ssm_scan", **a, update_cache=True))
    if out is None:
        return
    want, got, _ = out
    _same(got, want, ["y"])
    assert np.array_equal(caches[0], caches[-1])


@given(cases())
@SETTINGS
def test_a_pieced_backward_equals_the_unpieced_one_bit_for_bit(case):
    case, inv, ways, stretch = _drawn(case)
    ctx = rt.get_context()
    K = case.K
    a = case.args()
    extra = {"g_snapshots": case.g_snapshots} if K > 1 else {}
    out = _pair(ctx, case, ways, stretch,
                lambda: ssm_vk.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states, invariant=inv, **extra),
                lambda: ssm_vk.supports("ssm_scan_back", **a, snapshots=K, invariant=inv))
    if out is None:
        return
    want, got, _ = out
    _same(got, want, ["d_s", "d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C"])


def _heaps_of_each_kind(ctx, a, stretch: int) -> dict:
    """{kind: a device-local heap (bytes)} for the backward of arguments ``a`` under
    ``max_storage_buffer_range=stretch``, found by this device's own planning (its sizes and
    alignments differ): "one" where it keeps only the last window's checkpoints (the least heap
    the call is accepted in, found to 4 KiB: on an H100's planning that is a band of 128 KiB),
    "some" where the plan recomputes the checkpoints of some windows and keeps those of others
    (the first such heap above it, in 16 KiB steps)."""
    from ssm_vk import config
    from ssm_vk.support import decision
    from ssm_vk.validate import check_forward

    p = check_forward(a["s"], a["x"], a["dt"], a["A"], a["B"], a["C"], a["ids"], 1)
    knobs = config.settings()

    def plan_at(heap: int):
        with ctx.seams.override_limits(max_storage_buffer_range=stretch, device_local_bytes=heap):
            d = decision("ssm_scan_back", p, knobs)
            if not d.sup.ok:
                return None
            pl = d.planned.first.plan
            return pl.recompute, len(pl.windows)

    lo, hi = 1 << 20, 1 << 30      # refused at lo, accepted at hi
    assert plan_at(lo) is None and plan_at(hi) is not None
    while hi - lo > 4096:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if plan_at(mid) is not None else (mid, hi)
    out, heap = {}, hi
    while heap < 1 << 30:
        recomputed, n_win = plan_at(heap)
        if recomputed == n_win - 1:
            out.setdefault("one", heap)
        elif recomputed > 0:
            out.setdefault("some", heap)
            break
        else:
            break
        heap += 1 << 14
    return out


@pytest.mark.parametrize("kind", ["some", "one"])
def test_a_long_backward_recomputes_its_checkpoints_where_the_heap_needs_it(kind):
    # a backward over token windows keeps every window's checkpoints, T H P N / K floats: here 8 MiB
    # at K = 8, more than a lowered heap leaves them, so the plan keeps the checkpoints of its last
    # windows that fit and, for the first ones, their starting states, from which it recomputes
    # their checkpoints before their walk back (heaps where some windows are of each kind, and where
    # one keeps its checkpoints: found by this device's planning). The call runs on the device
    # (supports() says so), equal bit for bit to the same call on the whole heap (every checkpoint
    # kept, the same windows and K), and within the float32 tolerance of the float64 oracle
    ctx = rt.get_context()
    case = make_problem(7, S=1, T=4096, H=4, P=32, N=32, G=1, R=1, ids="identity")
    a = case.args()
    heaps = _heaps_of_each_kind(ctx, a, 1 << 16)
    assert set(heaps) == {"some", "one"}, heaps

    def call():
        return ssm_vk.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states)

    def plans() -> set:
        return {(ws.plan.recompute, len(ws.plan.windows)) for ws in vk_engine.engine_of(ctx).workspaces.values()}

    vk_engine.clear(ctx)
    with ctx.seams.override_limits(max_storage_buffer_range=1 << 16):
        want = call()
        kept = plans()
    vk_engine.clear(ctx)
    with ctx.seams.override_limits(max_storage_buffer_range=1 << 16, device_local_bytes=heaps[kind]):
        s = ssm_vk.supports("ssm_scan_back", **a)
        got = call()
        ((recomputed, n_win),) = plans()
    assert {r for r, _ in kept} == {0}, kept
    if kind == "some":
        assert 0 < recomputed < n_win - 1, (recomputed, n_win)
    else:
        assert recomputed == n_win - 1, (recomputed, n_win)
    assert s.ok, s.reason
    assert got.where.startswith("Vulkan") and want.where.startswith("Vulkan")
    _same(got, want, ["d_s", "d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C"])
    og = oracle_back(**a, g_y=case.g_y, g_states=case.g_states)
    for k in ("d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C"):
        assert_close(VK, k, getattr(got, k), getattr(og, k), label="recomputed checkpoints")


def _copied_into_own_pieces(ctx) -> set:
    """The inputs that the calls' workspaces copy into pieces of their own (HostData.rebind_pieces)."""
    return {k for ws in vk_engine.engine_of(ctx).workspaces.values() if hasattr(ws, "host")   # (the scan's)
            for k, b in ws.host.uploads.items() if isinstance(b, rt.Pieces)}


@pytest.fixture
def token_sequential():
    """The token-sequential kernels for every call of the test (knob CHUNK=0)."""
    from ssm_vk import config

    with config.configure(tune={"CHUNK": 0}):
        vk_engine.clear(rt.get_context())
        yield
    vk_engine.clear(rt.get_context())


def test_to_device_cuts_a_long_sequence_where_the_forward_cuts_it(token_sequential):
    # x of one sequence beyond one allocation: to_device cuts its tokens at the forward's windows
    # (one binding less the offset's slack, a multiple of the checkpoint interval), so the forward
    # binds every piece in place and copies nothing; the result is the host call's, bit for bit.
    # The token-sequential kernels (the chunked ones cut their windows where the pieces end: below)
    ctx = rt.get_context()
    case = make_problem(3, S=1, T=1024, H=2, P=8, N=4, G=1, R=1, ids="identity")
    a = case.args()
    with ctx.seams.override_limits(max_storage_buffer_range=1 << 14):
        want = ssm_vk.ssm_scan(**a)
    vk_engine.clear(ctx)
    with ctx.seams.override_limits(max_storage_buffer_range=1 << 14, max_memory_allocation_size=1 << 14):
        dev = {k: (ssm_vk.to_device(v) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
               for k, v in a.items()}
        assert len(dev["x"].buffer.starts) > 2   # (x is 64 KiB: in pieces)
        r = ssm_vk.ssm_scan(**dev)
        copied = _copied_into_own_pieces(ctx)
    assert r.where.startswith("Vulkan"), r.where
    assert "x" not in copied, copied
    _same(r, want, ["y", "states"])


def test_a_long_backward_binds_to_device_pieces_in_place(token_sequential):
    # x and g_y of one sequence beyond one allocation, cut by to_device at the forward's windows:
    # the backward's token windows (shorter: its partials' budget) never straddle those cuts, so it
    # binds every piece in place and copies nothing; its gradients are the host call's, bit for bit
    # (the token-sequential kernels; the chunked ones: the next test)
    ctx = rt.get_context()
    # (N = 16: the checkpoints of a window, 2 N floats per token, bound its windows to half of x's
    # pieces, 16 floats per token, and not to a divisor of them)
    case = make_problem(5, S=1, T=1024, H=2, P=8, N=16, G=1, R=1, ids="identity")
    a = case.args()
    kw = dict(g_y=case.g_y, g_states=case.g_states)
    lim = dict(max_storage_buffer_range=1 << 14, max_memory_allocation_size=1 << 14)
    vk_engine.clear(ctx)
    with ctx.seams.override_limits(**lim):
        want = ssm_vk.ssm_scan_back(**a, **kw)
    vk_engine.clear(ctx)
    with ctx.seams.override_limits(**lim):
        dev = {k: (ssm_vk.to_device(v) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
               for k, v in {**a, **kw}.items()}
        assert len(dev["x"].buffer.starts) > 2 and len(dev["g_y"].buffer.starts) > 2
        g = ssm_vk.ssm_scan_back(**dev)
        ((plan, n_win),) = {(ws.plan, len(ws.plan.windows)) for ws in vk_engine.engine_of(ctx).workspaces.values()}
        copied = _copied_into_own_pieces(ctx)
    assert g.where.startswith("Vulkan"), g.where
    assert not copied & {"x", "g_y"}, copied
    assert plan.time_split and n_win > len(dev["x"].buffer.starts), (plan.time_split, n_win)
    lens = {w.t1 - w.t0 for w in plan.windows}
    assert len(lens) > 2, lens   # (windows cut short where x's pieces end)
    _same(g, want, ["d_s", "d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C"])


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_chunked_token_windows_bind_to_device_pieces_in_place(backward):
    # one long sequence on the chunked kernels, x (and g_y) beyond one allocation, cut by to_device:
    # the chunked kernels' token windows end where those pieces end (a window's last chunk may be
    # short there), so the call binds every piece in place and copies nothing; the result is the
    # host call's, bit for bit, and the op's (float64, within float32's tolerance)
    from ssm_vk import config

    ctx = rt.get_context()
    case = make_problem(5, S=1, T=1024, H=2, P=8, N=16, G=1, R=1, ids="identity")
    a, kw = case.args(), dict(g_y=case.g_y, g_states=case.g_states)

    def call(args):
        return ssm_vk.ssm_scan_back(**args) if backward else ssm_vk.ssm_scan(**{k: args[k] for k in a})

    lim = dict(max_storage_buffer_range=1 << 14, max_memory_allocation_size=1 << 14)
    with config.configure(tune={"CHUNK": 16}):
        vk_engine.clear(ctx)
        with ctx.seams.override_limits(**lim):
            want = call({**a, **kw})
        vk_engine.clear(ctx)
        with ctx.seams.override_limits(**lim):
            dev = {k: (ssm_vk.to_device(v) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
                   for k, v in {**a, **kw}.items()}
            assert len(dev["x"].buffer.starts) > 2
            got = call(dev)
            plans = [ws.plan for ws in vk_engine.engine_of(ctx).workspaces.values() if ws.family.name == "chunked"]
            copied = _copied_into_own_pieces(ctx)
        vk_engine.clear(ctx)
    assert got.where.startswith("Vulkan"), got.where
    ((cp,),) = (plans,)
    assert cp.tokens and len(cp.windows) > 2, cp
    assert not copied & {"x", "g_y"}, copied
    names = ["d_s", "d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C"] if backward else ["y", "states"]
    _same(got, want, names)
    # (x's pieces hold 248 tokens: 15.5 chunks, so the windows after the first cut start mid-way
    # through the one-window call's chunks; the result is still the op's, within float32's tolerance)
    assert any(w.t0 % 16 for w in cp.windows), [(w.t0, w.t1) for w in cp.windows]
    if backward:
        og = oracle_back(**a, **kw)
        for k in ("d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C"):
            assert_close(VK, k, getattr(got, k), getattr(og, k), label="chunked token windows in pieces")
    else:
        o = oracle_scan(**a)
        for k in ("y", "states"):
            assert_close(VK, k, getattr(got, k), getattr(o, k), label="chunked token windows in pieces")
    # the prepared call (recorded once, replayed) on the same pieces: the same bits, run after run,
    # its input rewritten in place between runs
    with config.configure(tune={"CHUNK": 16}), ctx.seams.override_limits(**lim):
        dev = {k: (ssm_vk.to_device(v) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
               for k, v in {**a, **kw}.items()}
        prep = (ssm_vk.prepare_scan_back(**dev) if backward
                else ssm_vk.prepare_scan(**{k: dev[k] for k in a}))
        x2 = np.asarray(a["x"]) * np.float32(0.5)
        want2 = call({**a, **kw, "x": x2})
        for v, w in ((x2, want2), (a["x"], want)):
            dev["x"].write(v)
            _same(prep.run(), w, names)   # (before close: the prepared call owns its results)
        prep.close()
        vk_engine.clear(ctx)


def test_token_windows_and_sequence_windows_are_both_pieced_on_the_device():
    # one sequence cut into token ranges, and three sequences in windows of whole sequences: both
    # held in pieces (x beyond one allocation), both run on the device, forward and backward
    ctx = rt.get_context()
    for S, T in ((1, 256), (3, 96)):
        case = make_problem(7, S=S, T=T, H=2, P=4, N=8, G=1)
        a = case.args()
        x = a["x"].nbytes
        rng = x // 4 if S == 1 else x // 3 + 64
        calls = (("ssm_scan", lambda a=a: ssm_vk.ssm_scan(**a)),
                 ("ssm_scan_back", lambda a=a, c=case: ssm_vk.ssm_scan_back(**a, g_y=c.g_y, g_states=c.g_states)))
        for op, call in calls:
            with ctx.seams.override_limits(max_storage_buffer_range=rng):
                want = call()
            with ctx.seams.override_limits(max_storage_buffer_range=rng, max_memory_allocation_size=rng):
                s = ssm_vk.supports(op, **a)
                assert s.ok, s.reason
                got = call()
            assert got.where.startswith("Vulkan") and want.where.startswith("Vulkan")
            for k in got._fields if hasattr(got, "_fields") else vars(got):
                if k in ("where", "backend"):
                    continue
                if getattr(got, k) is not None:
                    assert np.array_equal(np.asarray(getattr(got, k)), np.asarray(getattr(want, k))), (S, op, k)


def test_arrays_that_are_not_of_tokens_are_refused_with_the_reason_and_nothing_allocated():
    # the states (S, H, P, N) beyond one allocation: bound whole by a kernel, so not pieced
    ctx = rt.get_context()
    case = make_problem(8, S=16, T=1, H=4, P=1, N=64, G=1, ids=[0] * 16, R=1)
    a = case.args()
    before = ctx.live_allocations.count
    with ctx.seams.override_limits(max_memory_allocation_size=4 * 4 * 64 * 4):
        s = ssm_vk.supports("ssm_scan", **a)
        assert not s and "states" in s.reason and "only arrays of tokens" in s.reason
        assert ctx.live_allocations.count == before
        assert ssm_vk.ssm_scan(**a).where == "CPU"


@given(cases(), st.booleans())
@SETTINGS
def test_device_arrays_in_pieces_in_out_and_given_equal_the_unpieced_call(case, given_out):
    # to_device cuts an array beyond one allocation where no call is known (whole sequences, else
    # token ranges): the call binds its pieces in place where its windows lie in them, else copies
    # them into pieces of its own; its results are DeviceArrays in pieces; out= arrays in pieces
    # take them (copied out where cut unlike the windows). Bit for bit the host call's, forward and
    # backward, and every piece goes back to the pool.
    case, _, ways, stretch = _drawn(case)
    ctx = rt.get_context()
    K = case.K
    a = case.args()
    rng, alloc = _limits(ctx, case, ways, stretch)
    with ctx.seams.override_limits(max_storage_buffer_range=rng):
        want = ssm_vk.ssm_scan(**a, snapshots=K)
        gwant = ssm_vk.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states,
                                     **({"g_snapshots": case.g_snapshots} if K > 1 else {}))
    if not (want.where.startswith("Vulkan") and gwant.where.startswith("Vulkan")):
        return
    vk_engine.clear(ctx)
    gc.collect()
    before = pool(ctx).in_use
    with ctx.seams.override_limits(max_storage_buffer_range=rng, max_memory_allocation_size=alloc):
        dev = {k: (ssm_vk.to_device(v) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
               for k, v in a.items()}
        s = ssm_vk.supports("ssm_scan", **dev, snapshots=K)
        out = None
        if given_out and K == 1:
            out = {k: ssm_vk.to_device(np.full_like(getattr(want, k), np.nan)) for k in ("y", "states")}
        r = ssm_vk.ssm_scan(**dev, snapshots=K, **({"out": out} if out else {}))
        assert r.where.startswith("Vulkan") == bool(s.ok), s.reason
        if s.ok:
            _same(r, want, ["y", "states"] + (["snapshots"] if K > 1 else []))
        gy = ssm_vk.to_device(case.g_y)
        g = ssm_vk.ssm_scan_back(**dev, g_y=gy, g_states=ssm_vk.to_device(case.g_states),
                                 **({"g_snapshots": ssm_vk.to_device(case.g_snapshots)} if K > 1 else {}))
        if g.where.startswith("Vulkan"):
            _same(g, gwant, ["d_s", "d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C"])
        del r, g, gy, dev, out
    vk_engine.clear(ctx)
    gc.collect()
    assert pool(ctx).in_use == before


def test_a_device_array_in_pieces_round_trips_and_views_read_across_cuts():
    ctx = rt.get_context()
    x = np.arange(3 * 50 * 4, dtype=np.float32).reshape(3, 50, 4)
    with ctx.seams.override_limits(max_memory_allocation_size=4 * 4 * 37):
        d = ssm_vk.to_device(x)
        assert isinstance(d.buffer, rt.Pieces) and len(d.buffer.buffers) > 3
        assert np.array_equal(d.numpy(), x)
        assert np.array_equal(d.view(130, (3, 100)).numpy(), x.reshape(-1)[130:430].reshape(3, 100))
        d.write(-x)
        assert np.array_equal(d.numpy(), -x)
        before = pool(ctx).in_use
        d.release()
        assert pool(ctx).in_use == before - len(d.buffer.buffers)


@pytest.mark.parametrize("cut", ["windows", "other"])
def test_a_prepared_call_of_device_arrays_in_pieces_replays_what_the_plain_call_computes(cut):
    # the prepared call binds the pieces once (or records their copy into its own pieces in its one
    # sequence): each run() reads the inputs as they are then -- written in place between runs
    ctx = rt.get_context()
    case = make_problem(11, S=1, T=256, H=2, P=4, N=8, G=1)
    a = case.args()
    x = a["x"].nbytes
    rng = x // 4
    alloc = rng if cut == "windows" else rng + 4 * 8 * 3   # pieces of even cuts: at the windows, or not
    x2 = np.asarray(a["x"]) * np.float32(0.5)
    with ctx.seams.override_limits(max_storage_buffer_range=rng):
        want = [ssm_vk.ssm_scan(**{**a, "x": v}) for v in (a["x"], x2)]
    with ctx.seams.override_limits(max_storage_buffer_range=rng, max_memory_allocation_size=alloc):
        dev = {k: (ssm_vk.to_device(v) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
               for k, v in a.items()}
        assert isinstance(dev["x"].buffer, rt.Pieces)
        call = ssm_vk.prepare_scan(**dev)
        for v, w in zip((a["x"], x2, a["x"]), (*want, want[0]), strict=True):
            dev["x"].write(v)
            r = call.run()
            assert isinstance(r.y.buffer, rt.Pieces)
            _same(r, w, ["y", "states"])
            _same(ssm_vk.ssm_scan(**dev), w, ["y", "states"])   # the plain call, kept for its repeats
        call.close()


def test_a_cache_that_is_a_view_across_a_cut_is_written_by_update_cache():
    # the cache s a view of a DeviceArray in pieces that crosses a cut: the call copies it into a
    # buffer of its own and back, so the rows update_cache writes land in the caller's array
    ctx = rt.get_context()
    case = make_problem(13, S=2, T=8, H=2, P=4, N=8, G=1, ids=[1, 0])
    a = case.args()
    host = np.array(a["s"], dtype=np.float32, copy=True)
    want = ssm_vk.ssm_scan(**{**a, "s": host}, update_cache=True)
    with ctx.seams.override_limits(max_memory_allocation_size=1024):
        big = ssm_vk.to_device(np.zeros(512, np.float32))
        assert isinstance(big.buffer, rt.Pieces) and 200 < big.buffer.starts[1] // 4 < 328
        s = big.view(200, a["s"].shape)                 # elements [200, 328): across the first cut
        s.write(a["s"])
        r = ssm_vk.ssm_scan(**{**a, "s": s}, update_cache=True)
        assert r.where.startswith("Vulkan")
        assert np.array_equal(r.y.numpy(), want.y) and np.array_equal(s.numpy(), host)
        assert not big.numpy()[:200].any() and not big.numpy()[328:].any()


@pytest.mark.parametrize("resident", [False, True], ids=["host", "device"])
def test_the_chunked_kernels_run_arrays_in_pieces(resident):
    # windows of whole sequences of the chunked Mamba-2 kernels (their scratch within one
    # allocation, x and y beyond it): bit for bit the unpieced call's, forward and backward (the
    # backward taking the forward's tables where its inputs are DeviceArrays)
    ctx = rt.get_context()
    case = make_problem(12, S=4, T=128, H=2, P=64, N=8, G=1)
    a = case.args()
    x = a["x"].nbytes
    rng, alloc = x // 4 + 64, x // 2
    with ctx.seams.override_limits(max_storage_buffer_range=rng):
        want = ssm_vk.ssm_scan(**a)
        gwant = ssm_vk.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states)
    with ctx.seams.override_limits(max_storage_buffer_range=rng, max_memory_allocation_size=alloc):
        up = ssm_vk.to_device if resident else (lambda v: v)
        dev = {k: (up(v) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v) for k, v in a.items()}
        r = ssm_vk.ssm_scan(**dev)
        g = ssm_vk.ssm_scan_back(**dev, g_y=up(case.g_y), g_states=up(case.g_states))
        assert r.where.startswith("Vulkan") and g.where.startswith("Vulkan")
        _same(r, want, ["y", "states"])
        _same(g, gwant, ["d_s", "d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C"])
        pieced = [ws for ws in vk_engine.engine_of(ctx).workspaces.values()
                  if hasattr(ws, "host") and ws.host.cuts and ws.dims.T == 128]   # (the scan's, not Mamba-3's)
        assert {ws.family.title for ws in pieced} == {"the chunked kernels"} and len(pieced) == 2


@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
def test_the_passes_over_time_chunks_run_arrays_in_pieces(variant, knobs):
    # the token-sequential kernels parallel over time (forced here: a GPU picks them for long
    # Mamba-1 sequences): their windows are those of the chunks as sequences, and so are the cuts
    ctx = rt.get_context()
    knobs(TCHUNK=32, CHUNK=0, M1=0)
    case = make_problem(14, S=2, T=256, H=2, P=4, N=8, G=1, variant=variant)
    a = case.args()
    x = a["x"].nbytes
    rng, alloc = x // 4 + 64, x // 3
    with ctx.seams.override_limits(max_storage_buffer_range=rng):
        want = ssm_vk.ssm_scan(**a)
        gwant = ssm_vk.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states)
    with ctx.seams.override_limits(max_storage_buffer_range=rng, max_memory_allocation_size=alloc):
        r = ssm_vk.ssm_scan(**a)
        g = ssm_vk.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states)
        assert r.where.startswith("Vulkan") and g.where.startswith("Vulkan")
        _same(r, want, ["y", "states"])
        _same(g, gwant, ["d_s", "d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C"])
        pieced = [ws for ws in vk_engine.engine_of(ctx).workspaces.values()
                  if hasattr(ws, "host") and ws.host.cuts and ws.dims.T == 256]   # (the scan's, not Mamba-3's)
        assert pieced and all(getattr(ws.plan, "tchunk", 0) == 32 for ws in pieced)


def test_a_discrete_gpus_staged_transfers_and_the_zeros_of_absent_inputs_fill_pieces():
    # force_staging: host arrays move through staging copies (a discrete GPU's path), piece by
    # piece; g_y None: the zeros the call's sequence fills in, over every piece
    ctx = rt.get_context()
    case = make_problem(15, S=2, T=128, H=2, P=4, N=8, G=1)
    a = case.args()
    x = a["x"].nbytes
    with ctx.seams.override_limits(max_storage_buffer_range=x // 4):
        want = ssm_vk.ssm_scan(**a)
        gwant = ssm_vk.ssm_scan_back(**a, g_y=None, g_states=case.g_states)
    with ctx.seams.override_limits(max_storage_buffer_range=x // 4, max_memory_allocation_size=x // 2):
        ctx.seams.force_staging = True
        try:
            r = ssm_vk.ssm_scan(**a)
            g = ssm_vk.ssm_scan_back(**a, g_y=None, g_states=case.g_states)
        finally:
            ctx.seams.force_staging = False
    assert r.where.startswith("Vulkan") and g.where.startswith("Vulkan")
    _same(r, want, ["y", "states"])
    _same(g, gwant, ["d_s", "d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C"])
