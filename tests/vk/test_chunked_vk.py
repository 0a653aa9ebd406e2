"""ssm_vk's chunked (matrix-form) Mamba-2 kernels (ssm_vk/chunked/glsl/chunk_*.comp,
ssm_vk/chunked/chunked_recording.py) against the float64 oracle on lavapipe, under the validation layer
(tests/conftest.py).

The ``chunked`` fixture forces them on small problems (knobs CHUNK_MIN_T=1 and CHUNK) and every
check asserts that the workspace that ran the call really planned them. Then: drawn Mamba-2
problems, token counts around the chunk boundaries for each chunk length, head_dim and d_state off
the 16-multiples up to the largest (256), groups, repeated ids and unread cache rows, windows of
whole sequences forced by a small storage range (bit-identical to one window), the fall-back to the
token-sequential kernels when the chunked scratch cannot fit, reruns, device-resident inputs, and
which path the default knobs pick; and the property suite (ssm_ref.testing.properties) on the chunked
kernels in the regimes where it holds there.

The SPIR-V of the chunked kernels is compiled per (P, N, chunk length) -- several seconds each on
lavapipe's machine -- so the tests share a few shapes: P=3, N=5 everywhere but in the P/N test.
"""

from __future__ import annotations

from itertools import product

import numpy as np
import plans
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from problems import make_problem, problems
from registry import F32_TOL, Backend, assert_close, oracle_back, oracle_scan

import ssm_ref
import ssm_vk
from ssm_ref.testing.properties import PROPERTIES
from ssm_ref.tolerance import scaled
from ssm_vk import config, registry
from ssm_vk import engine as vk_engine
from ssm_vk import runtime as rt
from ssm_vk.chunked import chunked_specs as specs
from ssm_vk.chunked.chunked_planner import scratch_elems
from ssm_vk.sizing import Limits
from ssm_vk.workspace import Workspace

pytestmark = pytest.mark.vulkan

GRADS = ssm_ref.GRAD_NAMES
OUTPUTS = ("y", "states", *GRADS)
FINITE_REGIMES = ("typical", "wide_dt", "small_A", "long_decay")
P0, N0 = 3, 5            # the shared shape (one set of chunk kernels per chunk length)


def vk_backend(T: int) -> Backend:
    # The float32 bounds, grown for long scans as the property suite grows them (ssm_ref.tolerance).
    return Backend(name="ssm_vk", module=ssm_vk, where=r"Vulkan\d+", tol=scaled(F32_TOL, T))


@pytest.fixture
def chunked(monkeypatch, knobs):
    """Force the chunked kernels (CHUNK_MIN_T=1, CHUNK=16 unless ``force(CL)`` says otherwise)."""
    monkeypatch.delenv("SSM_VK_TUNE", raising=False)

    def force(CL: int = 16) -> int:
        knobs(CHUNK=CL, CHUNK_MIN_T=1)
        return CL

    force(16)
    yield force
    vk_engine.clear()


@pytest.fixture
def default_knobs(monkeypatch):
    monkeypatch.delenv("SSM_VK_TUNE", raising=False)
    vk_engine.clear()
    yield
    vk_engine.clear()


def dims_of(case):
    return ssm_ref.check_forward(**case.args()).dims


def planned(case, backward: bool):
    """The plan ssm_vk makes for ``case`` on this device now (knobs and limits as they are)."""
    return registry.plan(dims_of(case), Limits.of(rt.get_context().info), backward)


def chunks(case, backward: bool):
    """The ChunkPlan of :func:`planned`, None where another family runs the shape."""
    return plans.of(planned(case, backward), "chunked")


def ran_chunks(case, backward: bool):
    """The ChunkPlan of the workspace that ran the last call of this shape (looked up, not re-made),
    None where another family ran it."""
    ctx = rt.get_context()
    ws = vk_engine.engine_of(ctx).find_workspace(dims_of(case), backward, Limits.of(ctx.info), config.settings())
    return ws.plan if ws.family.name == "chunked" else None


def run(case):
    """Forward and backward of ``case`` on ssm_vk; both on the GPU."""
    r = ssm_vk.ssm_scan(**case.args())
    g = ssm_vk.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    assert r.where.startswith("Vulkan") and r.backend == "ssm_vk", (r.where, r.backend)
    assert g.where == r.where and g.backend == "ssm_vk"
    return {"y": r.y, "states": r.states, **g.as_dict()}


def check_case(case, label: str = "", CL=16):
    """Every output of ``case`` against the float64 oracle. CL: the chunk length the calls must
    have run with (asserted on the plan before and on the workspace after); None: the
    token-sequential kernels; a pair: (forward, backward)."""
    cls = CL if isinstance(CL, tuple) else (CL, CL)
    for backward in (False, True):
        cp, want = chunks(case, backward), cls[backward]
        assert (cp is None) if want is None else (cp is not None and cp.CL == want), (label, backward, cp)
    got = run(case)
    for backward in (False, True):
        cp, want = ran_chunks(case, backward), cls[backward]
        assert (cp is None) if want is None else (cp is not None and cp.CL == want), (label, backward, cp)
    o = oracle_scan(**case.args())
    og = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    want = {"y": o.y, "states": o.states, **og.as_dict()}
    vk = vk_backend(case.dims["T"])
    for k in OUTPUTS:
        assert got[k].dtype == np.float32, k
        assert_close(vk, k, got[k], want[k], label=label)
    return got


# -- drawn problems ------------------------------------------------------------------------------

MAMBA2 = problems(variants=("mamba2",), regimes=FINITE_REGIMES, max_S=3, max_T=40, max_T_long=40, max_G=3,
                  max_H_per_G=2, min_P=P0, max_P=P0, min_N=N0, max_N=N0, max_elements=6000
                  ).filter(lambda c: c.dims["T"] > 0)


@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=MAMBA2)
def test_drawn_mamba2_problems_match_the_oracle(chunked, case):
    check_case(case, label=case.label)


# -- shapes --------------------------------------------------------------------------------------

@pytest.mark.parametrize("CL", [16, 32, 64])
def test_token_counts_around_the_chunk_boundaries(chunked, CL):
    chunked(CL)
    for T in (1, CL - 1, CL, CL + 1, 2 * CL + 3):
        case = make_problem(np.random.default_rng(T), S=2, T=T, H=4, P=P0, N=N0, G=2, ids=[1, 1], R=3)
        got = check_case(case, label=f"CL={CL} T={T}", CL=CL)
        assert np.all(got["d_s"][[0, 2]] == 0) and np.any(got["d_s"][1] != 0)


@pytest.mark.parametrize("P, N", [(5, 33), (33, 200), (256, 256)])
def test_head_dim_and_d_state_off_the_tiles(chunked, P, N):
    # P, N not multiples of 16 leave partial GEMM tiles; 200 and 256 take two column blocks of
    # 128 (and P = 200, 256 four row blocks of 64 in the chunk-state products); 256 is the largest
    # the chunked kernels take.
    case = make_problem(np.random.default_rng(P * N), S=2, T=21, H=4, P=P, N=N, G=2, ids="permutation")
    check_case(case, label=f"P={P} N={N}")


def test_groups_repeated_ids_and_unread_rows(chunked):
    # G = 3 groups of 2 heads; sequences 0, 2, 3 share cache row 4, rows 0, 1, 3, 5 are unread:
    # d_s is d_s0 scatter-added (in sequence order) into row 4, zero elsewhere.
    case = make_problem(np.random.default_rng(21), S=4, T=19, H=6, P=P0, N=N0, G=3, ids=[4, 2, 4, 4], R=6)
    got = check_case(case, label="groups and ids")
    assert np.all(got["d_s"][[0, 1, 3, 5]] == 0)
    assert np.array_equal(got["d_s"][2], got["d_s0"][1])
    with np.errstate(all="ignore"):
        want = (got["d_s0"][0].astype(np.float64) + got["d_s0"][2] + got["d_s0"][3])
    np.testing.assert_allclose(got["d_s"][4], want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("T, batch", [(20, 2), (100, 8), (600, 32)])   # 2, 7 and 38 chunks of 16
def test_the_pass_gives_the_same_bits_for_every_batch_of_chunks(chunked, knobs, T, batch):
    # How many chunks' loads the pass over chunks issues together (by default as many as it
    # has, from 2, 8 and 32) changes no result.
    case = make_problem(np.random.default_rng(T), S=2, T=T, H=2, P=P0, N=N0, G=1)
    assert specs.pass_batch(chunks(case, True)) == batch
    base = check_case(case, label="default batch")
    for pb in (1, 3, 32):
        knobs(CHUNK=16, CHUNK_MIN_T=1, PASS_PB=pb)
        got = run(case)
        for k in OUTPUTS:
            assert got[k].tobytes() == base[k].tobytes(), (pb, k)


def close_to(got: dict, base: dict, label) -> None:
    """Equal up to rounding: the same terms in the same order, but the compiler may contract a
    product and a sum into one fused multiply-add in one kernel and not in another."""
    for k in OUTPUTS:
        scale = float(np.max(np.abs(base[k]), initial=0.0))
        np.testing.assert_allclose(got[k], base[k], rtol=1e-5, atol=1e-6 * scale, err_msg=f"{label} {k}")


@pytest.mark.parametrize("P, N, H, G", [(P0, N0, 8, 2), (64, 64, 4, 1), (33, 8, 12, 3)])
def test_the_gemm_kernels_knobs(chunked, knobs, P, N, H, G):
    # The GEMM kernels' slices of 8 tokens, another thread grid (P = N = 64: whole vec4s of
    # columns per thread), float loads instead of 16-byte ones for Y's staging (VEC_IN=0; 16-byte
    # where P and N are multiples of 4) and other chunk-state tiles: each against the oracle, rerun
    # to the same bits, and within rounding of the defaults.
    case = make_problem(np.random.default_rng(P * H), S=2, T=45, H=H, P=P, N=N, G=G, ids="permutation")
    knobs(CHUNK=16, CHUNK_MIN_T=1, VEC_IN=1)
    base = check_case(case, label="defaults")
    for tune in (dict(KS=8), dict(GWG=64, ROWG=16), dict(VEC_IN=0), dict(ZF_RBLK=32, ZF_CBLK=64)):
        knobs(CHUNK=16, CHUNK_MIN_T=1, **{"VEC_IN": 1, **tune})
        cp = chunks(case, False)
        for mode in ("ZF", "Y"):
            vec = "VEC_IN" in dict(specs.gemm_spec(dims_of(case), cp, mode).defines)
            assert vec == (mode == "Y" and tune.get("VEC_IN", 1) == 1 and P % 4 == 0 and N % 4 == 0), (tune, mode)
        got = check_case(case, label=str(tune))
        assert ran_chunks(case, False) == cp
        again = run(case)
        for k in OUTPUTS:
            assert again[k].tobytes() == got[k].tobytes(), (tune, k)
        if "GWG" not in tune:    # another grid adds its per-token sums over other column groups
            close_to(got, base, tune)


@pytest.mark.parametrize("H, G", [(6, 2), (5, 1), (3, 3)])
def test_d_B_and_d_C_take_the_chunks_own_tokens_once_per_group(chunked, knobs, H, G):
    # With DBC_FOLD (the default) d_B and d_C take the product over the chunk's own tokens once per
    # group, from M o GU summed over its heads, instead of once per head: per head and per group
    # (HEADLOOP), against the oracle, rerun to the same bits, and within rounding of the products
    # per head. One head per group (H = G) has nothing to fold.
    case = make_problem(np.random.default_rng(H * 7 + G), S=2, T=37, H=H, P=P0, N=N0, G=G)
    results = {}
    for fold, headloop in product((0, 1), (0, 1)):
        knobs(CHUNK=16, CHUNK_MIN_T=1, DBC_FOLD=fold, HEADLOOP=headloop)
        cp = chunks(case, True)
        assert cp.fold == (fold == 1 and H > G) and cp.headloop == bool(headloop)
        folded = [s for s in specs.chunk_kernels(dims_of(case), cp, True) if s.name == "ssm_scan_reduce"
                  and ("MODE", 2) in s.defines]
        assert bool(folded) == cp.fold
        got = check_case(case, label=f"fold={fold} headloop={headloop}")
        again = run(case)
        for k in OUTPUTS:
            assert again[k].tobytes() == got[k].tobytes(), (fold, headloop, k)
        results[fold, headloop] = got
    for headloop in (0, 1):
        close_to(results[1, headloop], results[0, headloop], f"headloop={headloop}")


@pytest.mark.parametrize("H, G", [(8, 2), (6, 1)])
def test_d_B_and_d_C_parts_of_several_heads_match_one_part_per_head(chunked, knobs, H, G):
    # Per head (HEADLOOP=0), a workgroup of d_B (d_C) can add the products of DB_HPART (DC_HPART)
    # heads of a group into one part (fewer parts for the reduce to add), each its own number:
    # against the oracle, rerun to the same bits, within rounding of one part per head; a value that
    # does not divide the group's heads is lowered to 1.
    case = make_problem(np.random.default_rng(H * 5 + G), S=2, T=41, H=H, P=P0, N=N0, G=G)
    hpg = H // G
    knobs(CHUNK=16, CHUNK_MIN_T=1, HEADLOOP=0)
    base = check_case(case, label="one head per part")
    for hb, hc in ((2, 2), (hpg, 1), (1, hpg), (5, 2)):
        knobs(CHUNK=16, CHUNK_MIN_T=1, HEADLOOP=0, DB_HPART=hb, DC_HPART=hc)
        cp = chunks(case, True)
        want = [h if hpg % h == 0 else 1 for h in (hb, hc)]
        assert [cp.hpart("DB"), cp.hpart("DC")] == want, (hb, hc, cp)
        for mode, h in zip(("DB", "DC"), want, strict=True):
            spec = specs.gemm_spec(dims_of(case), cp, mode)
            assert (("HPART", h) in spec.defines) == (h > 1), (mode, spec.defines)
        label = f"{hb} / {hc} heads per part"
        got = check_case(case, label=label)
        again = run(case)
        for k in OUTPUTS:
            assert again[k].tobytes() == got[k].tobytes(), (label, k)
        close_to(got, base, label)


# -- windows and fall-back -----------------------------------------------------------------------

def test_windows_of_whole_sequences_are_bit_identical_to_one_window(chunked):
    case = make_problem(np.random.default_rng(31), S=5, T=40, H=2, P=P0, N=N0, G=2, ids="duplicates")
    whole = check_case(case, label="one window")
    assert len(ran_chunks(case, True).windows) == 1
    d = dims_of(case)
    ctx = rt.get_context()
    align = ctx.info.min_storage_buffer_offset_alignment
    per_seq = max(scratch_elems(d, 16, 1, True).values())
    with ctx.seams.override_limits(max_storage_buffer_range=align + 2 * per_seq * 4):
        cp = chunks(case, True)
        assert cp is not None and cp.Sw == 2 and [w.S for w in cp.windows] == [2, 2, 1]
        assert len(chunks(case, False).windows) > 1
        split = check_case(case, label="windows")
    # Windows hold whole sequences, each computed as in one window; d_A's sum over sequences is one
    # reduction as long as the per-sequence parts (H * NCH floats each) fit one binding, as here.
    for k in OUTPUTS:
        assert split[k].tobytes() == whole[k].tobytes(), k


def _one_chunk_range(case, backward: bool) -> int:
    """Bytes of the largest binding of one window of one chunk of 16 tokens (forward or backward)."""
    return max(scratch_elems(dims_of(case), 16, 1, backward, headloop=False, T=16).values()) * 4


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=MAMBA2.filter(lambda c: c.dims["T"] > 16))
def test_token_windows_of_one_sequence_carry_the_state(chunked, case):
    # A storage range that holds one chunk's scratch of one sequence, not a whole sequence's: the
    # chunked kernels run token windows of whole chunks (the state carried from one window to the
    # next, the backward walking each sequence forward for its windows' starts, then back), on
    # the GPU, every output the bits of the same call in one window (the chunks and the order of
    # d_A's sums are the same) and within the float32 tolerance of float64
    ctx = rt.get_context()
    one = check_case(case, label="one window")
    assert all(len(chunks(case, b).windows) <= case.dims["S"] for b in (False, True))
    vk_engine.clear()
    with ctx.seams.override_limits(max_storage_buffer_range=_one_chunk_range(case, True) + 256):
        for backward in (False, True):
            cp = chunks(case, backward)
            assert cp is not None and cp.tokens and len(cp.windows) > case.dims["S"], (backward, cp)
            assert all(w.t0 % 16 == 0 and w.S == 1 for w in cp.windows)
        windowed = check_case(case, label="token windows")
    for k in OUTPUTS:
        assert windowed[k].tobytes() == one[k].tobytes(), k


def test_token_windows_backward_takes_the_starting_states_its_forward_kept(chunked):
    # on DeviceArrays, the forward over token windows keeps each window's starting state (over the
    # backward's windows); the backward of the same arrays takes them instead of walking the
    # sequence forward again, twice in a row (it reads them, never writes them), with the bits of
    # the backward that walks (host inputs); with x written over since, it walks again
    ctx = rt.get_context()
    case = make_problem(np.random.default_rng(43), S=2, T=72, H=2, P=P0, N=N0, G=1, ids="permutation")
    a, kw = case.args(), dict(g_y=case.g_y, g_states=case.g_states)
    vk_engine.clear()
    with ctx.seams.override_limits(max_storage_buffer_range=_one_chunk_range(case, True) + 256):
        fwd, bwd = chunks(case, False), chunks(case, True)
        assert fwd.tokens and bwd.tokens and fwd.windows == bwd.windows and fwd.keep
        want = ssm_vk.ssm_scan_back(**a, **kw)
        dev = {k: (ssm_vk.to_device(v) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
               for k, v in {**a, **kw}.items()}
        ssm_vk.ssm_scan(**{k: dev[k] for k in a})
        engine = vk_engine.current()
        for n in (1, 2):
            before = engine.states_reused
            got = ssm_vk.ssm_scan_back(**dev)
            assert engine.states_reused == before + 1, n
            for k in ("d_s", "d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C"):
                assert np.asarray(getattr(got, k)).tobytes() == np.asarray(getattr(want, k)).tobytes(), (n, k)
        x2 = np.asarray(a["x"]) * np.float32(0.5)
        dev["x"].write(x2)
        before = engine.states_reused
        got = ssm_vk.ssm_scan_back(**dev)
        assert engine.states_reused == before
        want = ssm_vk.ssm_scan_back(**{**a, "x": x2}, **kw)
        assert all(np.asarray(getattr(got, k)).tobytes() == np.asarray(getattr(want, k)).tobytes()
                   for k in ("d_x", "d_dt", "d_A", "d_B", "d_C"))
    vk_engine.clear()


@pytest.mark.parametrize("headloop", [0, 1])
def test_token_windows_with_d_B_and_d_C_per_group_or_per_head(chunked, knobs, headloop):
    # HEADLOOP forced either way (d_B, d_C summed over a group's heads in the product's workgroup,
    # or per head and reduced after each window): the token windows give the one-window bits
    ctx = rt.get_context()
    case = make_problem(np.random.default_rng(45), S=2, T=56, H=4, P=P0, N=N0, G=2, ids="permutation")
    knobs(HEADLOOP=headloop)
    one = run(case)
    vk_engine.clear()
    with ctx.seams.override_limits(max_storage_buffer_range=_one_chunk_range(case, True) + 256):
        cp = chunks(case, True)
        assert cp.tokens and cp.headloop == bool(headloop)
        windowed = run(case)
    vk_engine.clear()
    for k in OUTPUTS:
        assert windowed[k].tobytes() == one[k].tobytes(), k


def test_token_windows_record_their_profile_timestamps_once(chunked, monkeypatch):
    # SSM_VK_PROFILE=1: the first window's steps are timestamped, each label once in a sequence
    # (the walk to the windows' starts too), and the calls give the unprofiled bits
    ctx = rt.get_context()
    case = make_problem(np.random.default_rng(44), S=1, T=72, H=2, P=P0, N=N0, G=1, ids="identity")
    with ctx.seams.override_limits(max_storage_buffer_range=_one_chunk_range(case, True) + 256):
        assert chunks(case, True).tokens
        vk_engine.clear()
        want = run(case)
        monkeypatch.setenv("SSM_VK_PROFILE", "1")
        vk_engine.clear()
        got = run(case)
    vk_engine.clear()
    for k in OUTPUTS:
        assert got[k].tobytes() == want[k].tobytes(), k


def test_falls_back_to_the_sequential_kernels_when_one_chunk_cannot_fit(chunked):
    # A storage range below one chunk's scratch of one sequence: no chunked plan, the
    # token-sequential kernels (token windows) run it, still on the GPU and still right.
    case = make_problem(np.random.default_rng(41), S=2, T=40, H=2, P=P0, N=N0, G=1, ids="unused")
    ctx = rt.get_context()
    with ctx.seams.override_limits(max_storage_buffer_range=_one_chunk_range(case, False) - 4):
        for backward in (False, True):
            assert config.settings().knob("CHUNK_MIN_T") == 1 and planned(case, backward).plan.windows
        check_case(case, label="fall-back", CL=None)


# -- runs ----------------------------------------------------------------------------------------

def test_bit_identical_reruns_and_rerecordings(chunked):
    case = make_problem(np.random.default_rng(51), S=3, T=35, H=4, P=P0, N=N0, G=2, ids="duplicates")
    first = check_case(case, label="first")
    again = run(case)                       # the recorded sequence replayed
    vk_engine.clear()
    fresh = run(case)                       # recorded anew in a new workspace
    assert ran_chunks(case, True) is not None
    for k in OUTPUTS:
        assert first[k].tobytes() == again[k].tobytes() == fresh[k].tobytes(), k


def test_device_resident_inputs_give_the_host_results(chunked):
    case = make_problem(np.random.default_rng(61), S=2, T=33, H=4, P=P0, N=N0, G=2, ids="permutation")
    host = check_case(case, label="host")
    dev = {k: (v if k == "ids" or v is None else ssm_vk.to_device(v)) for k, v in case.args().items()}
    r = ssm_vk.ssm_scan(**dev)
    g = ssm_vk.ssm_scan_back(**dev, g_y=ssm_vk.to_device(case.g_y), g_states=ssm_vk.to_device(case.g_states))
    assert ran_chunks(case, False) is not None and ran_chunks(case, True) is not None
    assert isinstance(r.y, ssm_vk.DeviceArray) and isinstance(g.d_x, ssm_vk.DeviceArray)
    got = {"y": r.y.numpy(), "states": r.states.numpy(), **{k: getattr(g, k).numpy() for k in GRADS}}
    for k in OUTPUTS:
        assert got[k].tobytes() == host[k].tobytes(), k


# -- the forward's chunk states, kept for the backward --------------------------------------------

def on_device(args: dict) -> dict:
    return {k: (v if k == "ids" or v is None else ssm_vk.to_device(v)) for k, v in args.items()}


def grads(g) -> dict:
    return {k: np.asarray(getattr(g, k).numpy() if isinstance(getattr(g, k), ssm_vk.DeviceArray)
                          else getattr(g, k)) for k in GRADS}


def back_host(args: dict, case) -> dict:
    """The backward from host inputs: never takes a forward's chunk states."""
    host = {k: (v.numpy() if isinstance(v, ssm_vk.DeviceArray) else v) for k, v in args.items()}
    before = vk_engine.current().states_reused
    g = grads(ssm_vk.ssm_scan_back(**host, g_y=case.g_y, g_states=case.g_states))
    assert vk_engine.current().states_reused == before
    return g


def assert_same(a: dict, b: dict) -> None:
    for k in GRADS:
        assert a[k].tobytes() == b[k].tobytes(), k


def test_a_backward_takes_the_chunk_states_its_forward_left(chunked, monkeypatch, knobs):
    # Device-resident inputs, forward then backward: the backward binds the forward's chunk states
    # instead of recomputing them, and gives the recomputing call's results bit for bit.
    case = make_problem(np.random.default_rng(81), S=3, T=40, H=4, P=P0, N=N0, G=2, ids="permutation")
    dev = on_device(case.args())
    gy, gs = ssm_vk.to_device(case.g_y), ssm_vk.to_device(case.g_states)
    want = back_host(dev, case)
    check_case(case, label="oracle")         # the recomputing path against float64
    for _ in range(2):                       # recorded, then replayed
        before = vk_engine.current().states_reused
        ssm_vk.ssm_scan(**dev)
        g = grads(ssm_vk.ssm_scan_back(**dev, g_y=gy, g_states=gs))
        assert vk_engine.current().states_reused == before + 1
        assert_same(g, want)
    knobs(KEEP_STATES=0)   # the knob: the forward leaves nothing
    vk_engine.clear()
    before = vk_engine.current().states_reused
    ssm_vk.ssm_scan(**dev)
    assert_same(grads(ssm_vk.ssm_scan_back(**dev, g_y=gy, g_states=gs)), want)
    assert vk_engine.current().states_reused == before


def test_the_chunk_states_are_taken_only_for_the_same_inputs(chunked):
    rng = np.random.default_rng(82)
    case = make_problem(rng, S=3, T=40, H=4, P=P0, N=N0, G=2, ids="permutation")
    other = make_problem(rng, S=3, T=40, H=4, P=P0, N=N0, G=2, ids="permutation")
    gy, gs = ssm_vk.to_device(case.g_y), ssm_vk.to_device(case.g_states)

    def backward_after_forward(fwd_args, bwd_args, between=None):
        ssm_vk.ssm_scan(**fwd_args)
        if between is not None:
            between()
        before = vk_engine.current().states_reused
        g = grads(ssm_vk.ssm_scan_back(**bwd_args, g_y=gy, g_states=gs))
        assert vk_engine.current().states_reused == before, "took chunk states of other inputs"
        return g

    dev = on_device(case.args())
    for k in ("s", "x", "dt", "A", "B", "C"):          # one input another array (same values too)
        bwd = {**dev, k: ssm_vk.to_device(other.args()[k])}
        assert_same(backward_after_forward(dev, bwd), back_host(bwd, case))
        same_values = {**dev, k: ssm_vk.to_device(dev[k].numpy())}
        backward_after_forward(dev, same_values)
    # other ids
    ids2 = np.ascontiguousarray(case.args()["ids"][::-1])
    bwd = {**dev, "ids": ids2}
    assert_same(backward_after_forward(dev, bwd), back_host(bwd, case))
    # the same inputs, with a forward of other inputs in between (it overwrote the chunk states)
    dev2 = on_device(other.args())
    assert_same(backward_after_forward(dev, dev, between=lambda: ssm_vk.ssm_scan(**dev2)), back_host(dev, case))
    # a forward from host inputs leaves nothing to take
    assert_same(backward_after_forward(case.args(), dev), back_host(dev, case))
    # an input written in place from the host after the forward (DeviceArray.write), or through a
    # view of it: the tables are of the old values
    for k in ("x", "B", "dt"):
        old = dev[k].numpy()
        assert_same(backward_after_forward(dev, dev, between=lambda k=k: dev[k].write(other.args()[k])),
                    back_host(dev, case))
        dev[k].write(old)
    view = dev["C"].reshape(dev["C"].size)
    assert_same(backward_after_forward(dev, dev, between=lambda: view.write(other.args()["C"].reshape(-1))),
                back_host(dev, case))
    dev["C"].write(case.args()["C"])
    # ... or given to a call of another shape (which leaves the forward's tables where they are) as
    # its out= array, which the call writes over
    third = make_problem(rng, S=3, T=40, H=4, P=P0, N=N0 + 4, G=2, ids="permutation")
    y_of_x = {"y": dev["x"], "states": ssm_vk.to_device(np.zeros((3, 4, P0, N0 + 4), np.float32))}
    assert_same(backward_after_forward(dev, dev, between=lambda: ssm_vk.ssm_scan(**third.args(), out=y_of_x)),
                back_host(dev, case))
    # ... or the output of a prepared call, run again on new inputs
    pdev = on_device(third.args())
    prep = ssm_vk.prepare_scan(**pdev)
    fed = {**dev, "x": prep.run().y}

    def rerun():
        pdev["x"].write(other.args()["x"])
        prep.run()

    assert_same(backward_after_forward(fed, fed, between=rerun), back_host(fed, case))
    prep.close()
    # an input released after the forward, its buffer handed to a new array with other values
    x_old = dev["x"]
    ssm_vk.ssm_scan(**dev)
    buf = x_old.buffer
    x_old.release()
    x_new = ssm_vk.to_device(other.args()["x"])
    assert x_new.buffer is buf                         # the pool gave the same buffer back
    bwd = {**dev, "x": x_new}
    before = vk_engine.current().states_reused
    g = grads(ssm_vk.ssm_scan_back(**bwd, g_y=gy, g_states=gs))
    assert vk_engine.current().states_reused == before
    assert_same(g, back_host(bwd, case))


def test_a_backward_in_more_windows_than_its_forward_recomputes(chunked):
    # a storage range that takes the forward's tables of all the sequences in one window but the
    # backward's (larger) only in windows of fewer sequences: the forward's tables, bound whole,
    # are not the backward's windows', so the backward recomputes, every gradient the host call's
    ctx = rt.get_context()
    case = make_problem(np.random.default_rng(84), S=4, T=40, H=4, P=8, N=32, G=2, ids="permutation")
    d = dims_of(case)
    rng = max(scratch_elems(d, 16, d.S, False, headloop=False).values()) * 4 + 256
    with ctx.seams.override_limits(max_storage_buffer_range=rng):
        fwd, bwd = chunks(case, False), chunks(case, True)
        assert len(fwd.windows) == 1 and len(bwd.windows) > 1 and not bwd.tokens, (fwd, bwd)
        dev = on_device(case.args())
        gy, gs = ssm_vk.to_device(case.g_y), ssm_vk.to_device(case.g_states)
        want = back_host(dev, case)
        ssm_vk.ssm_scan(**dev)
        before = vk_engine.current().states_reused
        assert_same(grads(ssm_vk.ssm_scan_back(**dev, g_y=gy, g_states=gs)), want)
        assert vk_engine.current().states_reused == before


def test_a_non_finite_forward_leaves_no_chunk_states(chunked):
    case = make_problem(np.random.default_rng(83), S=2, T=37, H=2, P=P0, N=N0, G=1, ids="identity")
    args = case.args()
    args["x"] = args["x"].copy()
    args["x"][1, 20, 1, 2] = np.inf
    dev = on_device(args)
    before, reruns = vk_engine.current().states_reused, vk_engine.current().reruns
    ssm_vk.ssm_scan(**dev)
    assert vk_engine.current().reruns == reruns + 1
    ssm_vk.ssm_scan_back(**dev, g_y=ssm_vk.to_device(case.g_y), g_states=ssm_vk.to_device(case.g_states))
    assert vk_engine.current().states_reused == before


# -- default knobs -------------------------------------------------------------------------------

def test_default_knobs_pick_the_chunked_kernels_by_length(default_knobs):
    # forward from 64 tokens (128 for one sequence), backward from 32; chunks of 32 while
    # S * T <= 1024
    at64 = make_problem(np.random.default_rng(71), S=2, T=64, H=2, P=P0, N=N0, G=1, ids="identity")
    assert chunks(at64, True).NCH == 2
    check_case(at64, label="mamba2 T=64", CL=32)
    one64 = make_problem(np.random.default_rng(75), S=1, T=64, H=2, P=P0, N=N0, G=1, ids="identity")
    check_case(one64, label="mamba2 S=1 T=64", CL=(None, 32))
    at63 = make_problem(np.random.default_rng(72), S=1, T=63, H=2, P=P0, N=N0, G=1, ids="identity")
    check_case(at63, label="mamba2 T=63", CL=(None, 32))
    at31 = make_problem(np.random.default_rng(74), S=1, T=31, H=2, P=P0, N=N0, G=1, ids="identity")
    check_case(at31, label="mamba2 T=31", CL=None)
    long1 = make_problem(np.random.default_rng(73), S=1, T=256, H=2, P=P0, N=N0, G=1, ids="identity",
                         variant="mamba1")
    check_case(long1, label="mamba1 T=256", CL=None)


# -- the property suite --------------------------------------------------------------------------

# Every property of ssm_ref.testing.properties on the chunked path, in every regime the property is for.
# The matrix form alone does not keep SPEC.md's non-finite behaviour (its sums can turn an inf into
# nan and back: nonfinite_pattern, the oracles, mamba2_as_mamba1 and split_tokens failed on the
# "overflow" and "nonfinite" regimes before the guard); the kernels flag any non-finite output and
# ssm_vk then recomputes the call with the token-sequential kernels (test below).
CHUNKED_PROPERTIES = list(PROPERTIES)


@pytest.mark.parametrize("name", CHUNKED_PROPERTIES)
@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_properties_hold_on_the_chunked_kernels(chunked, name, data):
    prop = PROPERTIES[name]
    regimes = tuple(prop.regimes)
    case = data.draw(problems(variants=("mamba2",), regimes=regimes, max_S=3, max_T=40, max_T_long=40, max_G=2,
                              max_H_per_G=2, min_P=P0, max_P=P0, min_N=N0, max_N=N0, max_elements=6000
                              ).filter(lambda c: c.dims["T"] > 0), label="case")
    assert chunks(case, False) is not None and chunks(case, True) is not None
    assume(prop.check(ssm_vk, case, F32_TOL))


def test_a_non_finite_result_is_recomputed_by_the_sequential_kernels(chunked):
    # inf in one x: the chunked kernels flag it, and the call returns what the token-sequential
    # kernels give (bit for bit), with the float32 reference's pattern of inf and nan.
    from ssm_ref.tolerance import nonfinite_mismatch

    case = make_problem(np.random.default_rng(5), S=2, T=37, H=2, P=P0, N=N0, G=1, ids="identity")
    args = case.args()
    args["x"] = args["x"].copy()
    args["x"][1, 20, 1, 2] = np.inf
    before = vk_engine.current().reruns
    r = ssm_vk.ssm_scan(**args)
    g = ssm_vk.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states)
    assert vk_engine.current().reruns == before + 2
    assert r.where.startswith("Vulkan") and g.where == r.where
    ref = ssm_ref.ssm_scan(**args)
    refg = ssm_ref.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states)
    assert not nonfinite_mismatch(r.y, ref.y) and not nonfinite_mismatch(r.states, ref.states)
    for k in ssm_ref.GRAD_NAMES:
        assert not nonfinite_mismatch(getattr(g, k), getattr(refg, k)), k
    chunked(0)      # the token-sequential kernels only
    r0 = ssm_vk.ssm_scan(**args)
    g0 = ssm_vk.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states)
    chunked(16)
    assert np.array_equal(r.y, r0.y, equal_nan=True) and np.array_equal(r.states, r0.states, equal_nan=True)
    for k in ssm_ref.GRAD_NAMES:
        assert np.array_equal(getattr(g, k), getattr(g0, k), equal_nan=True), k
    # a finite call is not recomputed
    before = vk_engine.current().reruns
    ssm_vk.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    assert vk_engine.current().reruns == before


@pytest.mark.parametrize("headloop", [0, 1])
def test_d_B_and_d_C_per_group_and_per_head(chunked, monkeypatch, headloop, knobs):
    # HEADLOOP=1: DB/DC add a group's heads inside the workgroup and write d_B, d_C; 0: per-head
    # parts summed by the reduce kernel. Both against the oracle, with 3 heads per group.
    knobs(HEADLOOP=headloop)
    vk_engine.clear()
    case = make_problem(np.random.default_rng(81 + headloop), S=2, T=45, H=6, P=P0, N=N0, G=2, ids="duplicates")
    assert chunks(case, True).headloop == bool(headloop)
    check_case(case, label=f"HEADLOOP={headloop}", CL=16)


@pytest.mark.parametrize("held", [0, 1, 2])
def test_a_training_loop_replays_its_sequences(held):
    # y, states, d_x, d_s0 and d_s share a size class here (T * P == P * N): the workspace must get
    # back a set of output buffers it has recorded for, or every step records anew (seen on an
    # H200: a 6-7 ms step where forward + backward took 0.6 ms). ``held``: the loop keeps the
    # results of that many earlier steps alive while it calls (``out = step()`` keeps one).
    S, T, H, P, N, G = 4, 8, 2, 4, 8, 2
    rng = np.random.default_rng(9)
    case = make_problem(rng, S=S, T=T, H=H, P=P, N=N, G=G, ids="identity")
    dev = {k: ssm_vk.to_device(v) for k, v in case.args().items() if k != "ids"}
    gy, gs = ssm_vk.to_device(case.g_y), ssm_vk.to_device(case.g_states)
    recorded = []
    real = Workspace.sequence

    def counting(ws, key, record):
        recorded.append(key not in ws.sequences)
        return real(ws, key, record)

    vk_engine.clear()
    # free buffers of the outputs' size classes in the pool (left by other shapes' calls, say)
    junk = [ssm_vk.to_device(np.zeros(n, np.float32)) for n in [S * T * H * P] * 6 + [S * T * G * N] * 4]
    del junk
    kept: list = []
    try:
        Workspace.sequence = counting
        for _ in range(20):
            r = ssm_vk.ssm_scan(**dev)
            g = ssm_vk.ssm_scan_back(**dev, ids=None, g_y=gy, g_states=gs)
            kept = [(r, g), *kept][:held]
            del r, g
    finally:
        Workspace.sequence = real
    # one sequence each way for each set of buffers the loop cycles through (held + 1 sets),
    # recorded in the first steps, then none
    assert len(recorded) == 40 and sum(recorded) == 2 * (held + 1), str(recorded)
    assert not any(recorded[4 * (held + 1):]), str(recorded)
    assert len(kept) == held


def test_a_wheel_without_chunked_spirv_runs_the_sequential_kernels(monkeypatch, tmp_path):
    # A wheel's packaged SPIR-V without the chunked variants and no glslc: a Mamba-2 shape the
    # chunked kernels would take runs on the packaged token-sequential kernels, on the GPU (it
    # fell back to the CPU before).
    from faultcase import fresh_context

    from ssm_cli.build import variants
    from ssm_vk.runtime import shaders

    monkeypatch.delenv("SSM_VK_TUNE", raising=False)
    ctx = rt.get_context()
    case = make_problem(np.random.default_rng(91), S=2, T=70, H=2, P=4, N=8, G=1, ids="identity")
    assert chunks(case, False) is not None and chunks(case, True) is not None
    pkg = tmp_path / "pkg"
    shaders.build_all(variants([Limits.of(ctx.info)], [8], ()), pkg)   # sequential only
    monkeypatch.setenv("PATH", str(tmp_path))                                  # no glslc
    monkeypatch.setenv("SSM_SCAN_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(shaders, "PACKAGED_SPIRV", pkg)
    vk_engine.clear()
    fresh_context()                                                            # nothing built
    try:
        for op in ("ssm_scan", "ssm_scan_back"):
            sup = ssm_vk.supports(op, **case.args())
            assert sup and "token-sequential kernels run it" in sup.reason, (op, sup)  # said, not silent
        got = run(case)
        assert ran_chunks(case, False) is None and ran_chunks(case, True) is None
    finally:
        vk_engine.clear()
    o = oracle_scan(**case.args())
    og = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    want = {"y": o.y, "states": o.states, **og.as_dict()}
    for k in OUTPUTS:
        assert_close(vk_backend(70), k, got[k], want[k], label="no chunked SPIR-V")
