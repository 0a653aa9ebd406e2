"""The forward and backward parallel over time (ssm_vk/sequential/time_chunks.py) against the float64
oracle: time chunks of every size that divides T, both variants, every ids pattern, the cache rows
read in place or copied, device-resident inputs; reruns bit for bit; inf and nan as the
token-by-token scan gives them; and the planner's choice, which only a GPU device gets by default."""

from __future__ import annotations

import numpy as np
import plans
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from problems import make_problem, problems
from registry import F32_TOL, Backend, assert_close, oracle_back, oracle_scan

import ssm_vk
from ssm_ref import GRAD_NAMES, Dims, check_backward, check_forward
from ssm_vk import budget, config, engine, registry
from ssm_vk import runtime as rt
from ssm_vk.registry import kernels_needed
from ssm_vk.sizing import Limits

pytestmark = pytest.mark.vulkan

VK = Backend(name="ssm_vk", module=ssm_vk, where=r"Vulkan\d+", tol=F32_TOL)


def chunked_by(T: int, nch: int) -> dict:
    # CHUNK=0: no chunked matrix kernels, which would take long enough Mamba-2 sequences first
    return {"TCHUNK": T // nch, "CHUNK": 0, "M1": 0}


def drawn_tune(T: int, nch: int) -> dict:
    """Chunks for a drawn T: nch of them where they divide T into chunks of 2 or more tokens, else
    2 where T is even, else none."""
    if T % nch or T // nch < 2:
        nch = 2 if T % 2 == 0 else 1
    return chunked_by(T, nch) if nch > 1 else {"TCHUNK": 0}


def ran_time_chunks(case, tune) -> bool:
    lim = Limits.of(rt.get_context().info)
    with config.configure(tune=tune):
        return plans.tchunk(registry.plan(check_forward(**case.args()).dims, lim, False)) > 0


@settings(max_examples=25, deadline=None)
@given(problems(min_T=4, max_T=24, max_N=20), st.sampled_from((2, 3, 4)))
def test_drawn_problems_in_time_chunks_match_the_oracle(case, nch):
    tune = drawn_tune(case.dims["T"], nch)
    with config.configure(tune=tune):
        r = ssm_vk.ssm_scan(**case.args())
    assert r.where.startswith("Vulkan") and r.backend == "ssm_vk"
    o = oracle_scan(**case.args())
    assert_close(VK, "y", r.y, o.y, label=repr(case))
    assert_close(VK, "states", r.states, o.states, label=repr(case))


@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
@pytest.mark.parametrize("N", [1, 16, 33])
@pytest.mark.parametrize("resident", [False, True])
def test_time_chunks_match_the_oracle_and_rerun_bit_for_bit(variant, N, resident):
    case = make_problem(np.random.default_rng(N), S=3, T=48, H=4, P=3, N=N, G=2, variant=variant,
                        ids="duplicates")
    tune = chunked_by(48, 4)
    assert ran_time_chunks(case, tune)
    args = case.args()
    if resident:
        args = {k: ssm_vk.to_device(v) if k != "ids" else v for k, v in args.items()}
    with config.configure(tune=tune):
        first = ssm_vk.ssm_scan(**args)
        again = ssm_vk.ssm_scan(**args)
    y, states = (np.asarray(a.numpy() if resident else a) for a in (first.y, first.states))
    o = oracle_scan(**case.args())
    assert_close(VK, "y", y, o.y, label=f"{variant} N={N}")
    assert_close(VK, "states", states, o.states, label=f"{variant} N={N}")
    for a, b in ((first.y, again.y), (first.states, again.states)):
        assert np.array_equal(*(np.asarray(v.numpy() if resident else v) for v in (a, b)))


def ran_time_chunks_back(case, tune) -> bool:
    lim = Limits.of(rt.get_context().info)
    with config.configure(tune=tune):
        d = check_backward(**case.args(), g_y=case.g_y, g_states=case.g_states).dims
        return plans.tchunk(registry.plan(d, lim, True)) > 0


@settings(max_examples=25, deadline=None)
@given(problems(min_T=4, max_T=24, max_N=20), st.sampled_from((2, 3, 4)))
def test_drawn_backwards_in_time_chunks_match_the_oracle(case, nch):
    tune = drawn_tune(case.dims["T"], nch)
    with config.configure(tune=tune):
        g = ssm_vk.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    assert g.where.startswith("Vulkan") and g.backend == "ssm_vk"
    og = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    for k in GRAD_NAMES:
        assert_close(VK, k, getattr(g, k), getattr(og, k), label=repr(case))


@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
@pytest.mark.parametrize("N", [1, 16, 33])
@pytest.mark.parametrize("resident", [False, True])
def test_backward_time_chunks_match_the_oracle_and_rerun_bit_for_bit(variant, N, resident):
    case = make_problem(np.random.default_rng(N + 1), S=3, T=48, H=4, P=3, N=N, G=2, variant=variant,
                        ids="duplicates")
    tune = chunked_by(48, 4)
    assert ran_time_chunks_back(case, tune)
    args = {**case.args(), "g_y": case.g_y, "g_states": case.g_states}
    if resident:
        args = {k: ssm_vk.to_device(v) if k != "ids" else v for k, v in args.items()}
    with config.configure(tune=tune):
        first = ssm_vk.ssm_scan_back(**args)
        again = ssm_vk.ssm_scan_back(**args)
    og = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    for k in GRAD_NAMES:
        a, b = (np.asarray(getattr(r, k).numpy() if resident else getattr(r, k)) for r in (first, again))
        assert_close(VK, k, a, getattr(og, k), label=f"{variant} N={N} {k}")
        assert np.array_equal(a, b), k


@pytest.mark.parametrize("heads", [16, 20])   # 16: every workgroup sums its heads' partials; 20: not
def test_mamba1_backward_over_time_with_one_group_matches_the_oracle(heads):
    # Mamba-1's shape: every channel a head of the one group, P = 1; the d_B / d_C partials
    # summed over a workgroup's heads (the layout's HSUM) and over time chunks
    case = make_problem(np.random.default_rng(heads), S=2, T=64, H=heads, P=1, N=16, G=1, variant="mamba1",
                        ids="identity")
    lim = Limits.of(rt.get_context().info)
    for tune in (chunked_by(64, 8), {"TCHUNK": 0}, {"TCHUNK": 0, "HSUM": 0}):
        with config.configure(tune=tune):
            g = ssm_vk.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
            d = check_backward(**case.args(), g_y=case.g_y, g_states=case.g_states).dims
            lay = plans.sequential(registry.plan(d, lim, True)).layout
        assert lay.HSUM == int(tune.get("HSUM", 1) == 1 and heads % lay.HB == 0 and lay.HB > 1)
        og = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
        for k in GRAD_NAMES:
            assert_close(VK, k, getattr(g, k), getattr(og, k), label=f"H={heads} {tune} {k}")


def token_by_token_and_rerun(fn, args: dict):
    """``fn(**args)`` token by token, then over 4 time chunks of T = 64 (whose non-finite result
    must be recomputed token by token: exactly one rerun)."""
    with config.configure(tune={"TCHUNK": 0}):
        want = fn(**args)
    e = engine.engine_of(rt.get_context())
    before = e.reruns
    with config.configure(tune=chunked_by(64, 4)):
        got = fn(**args)
    assert e.reruns == before + 1
    return want, got


@pytest.mark.parametrize("where", [("x", (1, 20, 2, 0), np.inf), ("dt", (0, 40, 1), np.nan),
                                   ("g_y", (1, 3, 0, 0), -np.inf), ("s", (0, 1, 0, 2), np.inf)])
def test_backward_inf_and_nan_come_out_as_token_by_token(where):
    name, at, value = where
    case = make_problem(np.random.default_rng(19), S=2, T=64, H=4, P=1, N=16, G=1, variant="mamba1",
                        ids="identity")
    args = {**case.args(), "g_y": case.g_y.copy(), "g_states": case.g_states}
    args[name] = args[name].copy()
    args[name][at] = value
    want, got = token_by_token_and_rerun(ssm_vk.ssm_scan_back, args)
    for k in GRAD_NAMES:
        assert np.array_equal(getattr(got, k), getattr(want, k), equal_nan=True), k
    assert not all(np.isfinite(getattr(got, k)).all() for k in GRAD_NAMES)


def test_the_cache_rows_copied_give_the_same_bits_as_read_in_place(monkeypatch):
    case = make_problem(np.random.default_rng(5), S=2, T=32, H=2, P=2, N=16, G=1, variant="mamba1", R=5)
    tune = chunked_by(32, 4)
    with config.configure(tune=tune):
        in_place = ssm_vk.ssm_scan(**case.args())
        from ssm_vk.sequential import sequential_recording as sequential
        monkeypatch.setattr(sequential, "cache_rows", lambda ws, p, s_at: None)
        engine.clear(rt.get_context())
        copied = ssm_vk.ssm_scan(**case.args())
    assert np.array_equal(in_place.y, copied.y) and np.array_equal(in_place.states, copied.states)


@pytest.mark.parametrize("where", [("x", (1, 20, 2, 0), np.inf), ("dt", (0, 40, 1), np.nan),
                                   ("B", (1, 3, 0, 5), -np.inf), ("s", (0, 1, 0, 2), np.inf)])
def test_inf_and_nan_come_out_as_token_by_token(where):
    name, at, value = where
    case = make_problem(np.random.default_rng(9), S=2, T=64, H=4, P=1, N=16, G=1, variant="mamba1",
                        ids="identity")
    args = case.args()
    args[name] = args[name].copy()
    args[name][at] = value
    want, got = token_by_token_and_rerun(ssm_vk.ssm_scan, args)
    assert np.array_equal(got.y, want.y, equal_nan=True)
    assert np.array_equal(got.states, want.states, equal_nan=True)
    assert not np.isfinite(got.y).all()


def _limits(device_type: str) -> Limits:
    return Limits(subgroup_size=32, subgroup_ops=frozenset({"basic", "shuffle", "arithmetic"}),
                  max_workgroup_invocations=1024, max_shared_memory=48 << 10,
                  max_workgroup_count=(1 << 31 - 1, 65535, 65535), max_storage_buffer_range=4 << 30,
                  max_memory_allocation_size=4 << 30, min_storage_buffer_offset_alignment=64,
                  device_type=device_type)


def _dims(S, T, H, P, N, mamba1=True) -> Dims:
    return Dims(S=S, T=T, H=H, P=P, N=N, G=1, R=S, mamba1=mamba1, a_shape=(H, N) if mamba1 else (H,))


# The Mamba-1 kernels with time in threads take these shapes on a GPU first (tests/vk/test_m1_vk.py);
# the time chunks are what a GPU plans where those do not apply, and what these tests pin.
NO_M1 = config.Settings((("M1", 0),), False)


def _gpu_plan_in_chunks(S, T, H, want_nch, backward):
    """The plan of Mamba-1 at (S, T, H), N = 16, on a GPU without the time-in-threads kernels:
    ``want_nch`` chunks per sequence (1: none), and where it cuts, threads enough or the shortest
    chunks."""
    d = _dims(S, T, H, 1, 16)
    pl = registry.plan(d, _limits("discrete"), backward, NO_M1)
    assert (T // plans.tchunk(pl) if plans.tchunk(pl) else 1) == want_nch
    from ssm_vk.sequential import sequential_planner as sq
    enough, shortest = (sq.TCHUNK_BWD_THREADS, sq.TCHUNK_BWD_MIN) if backward else (sq.TCHUNK_THREADS, sq.TCHUNK_MIN)
    if plans.tchunk(pl):
        assert S * H * plans.sequential(pl).layout.LN * want_nch >= enough or plans.tchunk(pl) == shortest
    return d, pl


@pytest.mark.parametrize(("S", "T", "H", "want_nch"), [
    (1, 512, 1536, 16),     # 1536 rows: chunks of 32 tokens, the shortest
    (1, 16384, 1536, 128),
    (2, 4096, 1536, 64),
    (8, 2048, 1536, 1),     # rows enough: token by token
    (4, 1024, 5120, 1),
    (1, 509, 1536, 1),      # a prime length: no chunks
])
def test_the_planner_cuts_mamba1_on_a_gpu_until_the_threads_are_there(S, T, H, want_nch):
    d, pl = _gpu_plan_in_chunks(S, T, H, want_nch, backward=False)
    if plans.tchunk(pl):
        names = [k.name for k in kernels_needed(d, pl, False)]
        assert names == ["ssm_scan", "ssm_scan_carry", "ssm_scan"]
        sizes = budget.buffers(d, pl, _limits("discrete"), False)
        assert sizes["scratch:tc:b"] == 4 * S * want_nch * H * 16
        assert "rerun:out:y" in sizes and "flag_host" in sizes


@pytest.mark.parametrize(("S", "T", "H", "want_nch"), [
    (1, 512, 1536, 16),     # 1536 rows: chunks of 32 tokens, the shortest
    (8, 2048, 1536, 32),    # 49 k threads: still chunks (the backward's token step is long)
    (1, 16384, 1536, 256),
    (4, 1024, 5120, 1),     # rows enough: token by token
])
def test_the_planner_cuts_the_mamba1_backward_on_a_gpu(S, T, H, want_nch):
    d, pl = _gpu_plan_in_chunks(S, T, H, want_nch, backward=True)
    if plans.tchunk(pl):
        names = {(k.name, dict(k.defines).get("BSUM", 0), dict(k.defines).get("REVERSE", 0))
                 for k in kernels_needed(d, pl, True)}
        # the summaries, both carries, the checkpoint pass, the walk back, the sums (and the d_s scatter)
        want = {("ssm_scan", 0, 0), ("ssm_scan_back", 1, 0), ("ssm_scan_carry", 0, 0), ("ssm_scan_carry", 0, 1),
                ("ssm_scan_back", 0, 0), ("ssm_scan_reduce", 0, 0)}
        assert want <= names and names - want <= {("rows", 0, 0)}
        sizes = budget.buffers(d, pl, _limits("discrete"), True)
        assert sizes["scratch:tc:b"] == sizes["scratch:tc:lam"] == 4 * S * want_nch * H * 16
        assert "rerun:out:d_x" in sizes and "flag_host" in sizes


@pytest.mark.parametrize(("S", "T", "H", "fwd"), [
    (1, 512, 1536, (4, 4)),     # over time chunks: four values per lane
    (1, 16384, 1536, (4, 4)),
    (4, 1024, 5120, (4, 4)),    # 82 k threads at four values per lane: token by token
    (8, 2048, 1536, (8, 8)),    # 49 k at four, 98 k at two: two per lane, blocks of eight tokens
])
def test_the_mamba1_layouts_on_a_gpu(S, T, H, fwd):
    d = _dims(S, T, H, 1, 16)
    lay = plans.sequential(registry.plan(d, _limits("discrete"), False, NO_M1)).layout
    assert (lay.LN, lay.TB, lay.SPREAD) == (*fwd, 1)
    back = plans.sequential(registry.plan(d, _limits("discrete"), True, NO_M1)).layout
    assert (back.LN, back.K, back.TBR, back.SPREAD, back.HSUM) == (4, 4, 4, 1, 1)
    # a CPU device keeps the forward's two values per lane in blocks of four tokens
    cpu = plans.sequential(registry.plan(d, _limits("cpu"), False, config.DEFAULTS)).layout
    assert (cpu.LN, cpu.TB) == (8, 4)


@pytest.mark.parametrize("tune", [{"LN": 4, "TCHUNK": 12}, {"LN": 4, "TCHUNK": 0}, {"LN": 8, "TB": 8, "TCHUNK": 0},
                                  {"LN": 8, "TB": 8, "TCHUNK": 16}])
@pytest.mark.parametrize("N", [16, 13])
def test_the_gpu_layouts_of_mamba1_match_the_oracle(tune, N):
    # the layouts a GPU plans (above), forced here on whatever device runs the tests
    case = make_problem(np.random.default_rng(N), S=3, T=48, H=8, P=1, N=N, G=2, variant="mamba1",
                        ids="duplicates")
    with config.configure(tune={**tune, "CHUNK": 0}):
        r = ssm_vk.ssm_scan(**case.args())
        again = ssm_vk.ssm_scan(**case.args())
    o = oracle_scan(**case.args())
    assert_close(VK, "y", r.y, o.y, label=f"{tune} N={N}")
    assert_close(VK, "states", r.states, o.states, label=f"{tune} N={N}")
    assert np.array_equal(r.y, again.y) and np.array_equal(r.states, again.states)


@pytest.mark.parametrize("device_type", ["cpu"])
def test_not_on_a_cpu_device_nor_for_mamba2(device_type):
    d = _dims(1, 512, 1536, 1, 16)
    for backward in (False, True):
        assert plans.tchunk(registry.plan(d, _limits(device_type), backward, config.DEFAULTS)) == 0
        d2 = _dims(1, 512, 4, 64, 16, mamba1=False)
        assert plans.tchunk(registry.plan(d2, _limits("discrete"), backward, config.DEFAULTS)) == 0
        # and the recompute of a non-finite result never takes them
        assert plans.tchunk(registry.plan(_dims(1, 512, 1536, 1, 16), _limits("discrete"), backward, NO_M1,
                                          rerun=True)) == 0


def test_an_illegal_chunk_length_is_refused(monkeypatch):
    monkeypatch.setenv("SSM_VK_TUNE", "TCHUNK=1")
    with pytest.raises(ValueError, match=r"^SSM_VK_TUNE: TCHUNK=1"):
        config.settings()
