"""ssm_vk/chunked/chunked_planner.py without a device: when the chunked (matrix-form) kernels take a shape, why
they do not, the chunk length the knobs pick, and the windows of whole sequences that keep every
binding, the scratch budget and every grid inside fake device limits."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

import pytest

from ssm_ref import Dims
from ssm_vk import config, registry
from ssm_vk.chunked import chunked_planner as cpm
from ssm_vk.chunked.chunked_planner import GEMM_WG, MODES, chunk_plan, gemm_tile, scratch_elems, why_not
from ssm_vk.sizing import Limits, Window

F32 = 4
ALL_OPS = frozenset({"basic", "vote", "arithmetic", "ballot", "shuffle", "shuffle_relative", "clustered", "quad"})
# Roomy limits (an H200's): only the knobs and the shape decide.
BIG = Limits(subgroup_size=32, subgroup_ops=ALL_OPS, max_workgroup_invocations=1024, max_shared_memory=48 << 10,
             max_workgroup_count=(2**31 - 1, 65535, 65535), max_storage_buffer_range=2**32 - 1,
             max_memory_allocation_size=2**32, min_storage_buffer_offset_alignment=16,
             max_workgroup_size=(1024, 1024, 64), max_push_constants_size=256, max_storage_buffers_per_stage=2**20,
             max_memory_allocation_count=2**32)


def dims(S=2, T=300, H=4, P=8, N=16, G=2, mamba1=False) -> Dims:
    return Dims(S=S, T=T, H=H, P=P, N=N, G=G, R=S, mamba1=mamba1, a_shape=(H, N) if mamba1 else (H,))


class Knobs(dict):
    """The planner's knobs of a test: setting them configures ssm_vk.config (validated)."""

    def __init__(self):
        super().__init__()
        self.handles: list = []

    def update(self, *args, **kw) -> None:
        trial = {**self, **dict(*args, **kw)}
        self.handles.append(config.configure(tune=trial))
        super().update(trial)

    def __setitem__(self, key, value) -> None:
        self.update({key: value})


@pytest.fixture(autouse=True)
def knobs(monkeypatch):
    """The planner's knobs, empty (the defaults) unless a test sets some; SSM_VK_TUNE unset."""
    monkeypatch.delenv("SSM_VK_TUNE", raising=False)
    tune = Knobs()
    yield tune
    for h in reversed(tune.handles):
        h.restore()


def cap_elems(lim: Limits) -> int:
    return (min(lim.max_storage_buffer_range, lim.max_memory_allocation_size)
            - lim.min_storage_buffer_offset_alignment) // F32


def groups(d: Dims, CL: int, Sw: int) -> list[int]:
    """Workgroups of every chunked dispatch for a window of Sw sequences (ssm_vk/chunked/chunked_recording.py)."""
    NCH = -(-d.T // CL)
    out = [Sw * NCH * d.H, -(-(Sw * d.H * d.P * d.N) // GEMM_WG)]     # decay / finish, the pass
    for m in MODES:
        _, _, nrb, ncb = gemm_tile(m, CL, d.P, d.N)
        out.append(Sw * NCH * (d.G if m == "CB" else d.H) * nrb * ncb)
    return out


def fits(d: Dims, lim: Limits, CL: int, Sw: int, backward: bool) -> bool:
    """Every windowed array within the binding cap, every grid within the workgroup counts, and
    (windows of several sequences) the scratch within the budget."""
    e = scratch_elems(d, CL, Sw, backward)
    mx, my = lim.max_workgroup_count[:2]
    scratch = sum(v for k, v in e.items() if k not in ("x", "B", "states")) * F32
    return (max(e.values()) <= cap_elems(lim) and all(g <= mx * my for g in groups(d, CL, Sw))
            and (Sw == 1 or scratch <= cpm.SCRATCH_BUDGET))


def assert_whole_sequence_windows(cp, d: Dims) -> None:
    wins = cp.windows
    assert wins[0].i0 == 0 and wins[-1].i1 == d.S
    assert all(a.i1 == b.i0 for a, b in itertools.pairwise(wins))          # contiguous, in order
    assert all(w.t0 == 0 and w.t1 == d.T for w in wins)                              # whole sequences
    assert all(w.S == cp.Sw for w in wins[:-1]) and 1 <= wins[-1].S <= cp.Sw
    assert cp.NCH == -(-d.T // cp.CL)


# -- why_not -------------------------------------------------------------------------------------

@pytest.mark.parametrize("d, lim, reason", [
    (dims(mamba1=True), BIG, "Mamba-1"),
    (dims(P=257), BIG, "P or N above 256"),
    (dims(N=257), BIG, "P or N above 256"),
    (dims(T=0), BIG, "empty problem"),
    (dims(P=0), BIG, "empty problem"),
    (dims(), replace(BIG, max_workgroup_invocations=128), "workgroups of 256 threads not offered"),
    (dims(), replace(BIG, max_shared_memory=8 << 10), "bytes of shared memory needed"),
])
def test_why_not_names_the_reason(d, lim, reason, knobs):
    for CL in (16, 32, 64):
        assert reason in why_not(d, lim, CL)
    # and the planner then leaves the shape to the token-sequential kernels, even with every knob
    # pointing at the chunked ones
    knobs.update(CHUNK=16, CHUNK_MIN_T=1)
    assert chunk_plan(d, lim, backward=True) is None
    if d.T and not d.P == 0:
        pl = registry.plan(d, lim, backward=True)
        assert pl.family.name == "sequential" and pl.plan.windows


@pytest.mark.parametrize("P, N", [(256, 256), (1, 1), (5, 33), (200, 7)])
def test_why_not_is_empty_up_to_256(P, N):
    assert why_not(dims(P=P, N=N), BIG, 64) == ""


@pytest.mark.parametrize("CL", [16, 32, 64])
def test_shared_memory_threshold_is_the_one_named(CL):
    # The reason names the bytes needed; exactly that much is enough, one byte less is not.
    msg = why_not(dims(), replace(BIG, max_shared_memory=1024), CL)
    need = int(re.match(r"(\d+) bytes of shared memory needed", msg).group(1))
    assert need > 1024
    assert why_not(dims(), replace(BIG, max_shared_memory=need), CL) == ""
    assert "shared memory" in why_not(dims(), replace(BIG, max_shared_memory=need - 1), CL)


# -- knobs ---------------------------------------------------------------------------------------

def test_defaults_take_mamba2_from_64_tokens_forward_and_32_backward():
    # the H200 crossover (docs/BENCHMARKS.md): the chunked backward wins from 32 tokens, the
    # forward from 64 (128 for one sequence)
    assert cpm.CHUNK_MIN_T == {False: 64, True: 32} and cpm.CHUNK_MIN_ST == {False: 128, True: 0}
    assert chunk_plan(dims(T=63), BIG, backward=False) is None
    assert chunk_plan(dims(T=64), BIG, backward=False) is not None          # S = 2
    assert chunk_plan(dims(S=1, T=64), BIG, backward=False) is None
    assert chunk_plan(dims(S=1, T=127), BIG, backward=False) is None
    assert chunk_plan(dims(S=1, T=128), BIG, backward=False) is not None
    assert chunk_plan(dims(S=1, T=32), BIG, backward=True) is not None
    assert chunk_plan(dims(T=31), BIG, backward=True) is None
    assert chunk_plan(dims(T=32), BIG, backward=True) is not None
    for backward in (False, True):
        cp = chunk_plan(dims(T=256), BIG, backward)
        assert cp is not None and cp.CL == 32 and cp.NCH == 8      # S * T = 512: chunks of 32
        assert cp.windows == (Window(0, 2, 0, 256),) and cp.Sw == 2
        cp = chunk_plan(dims(T=1024), BIG, backward)
        assert cp is not None and cp.CL == 64 and cp.NCH == 16     # S * T = 2048: chunks of 64
    assert chunk_plan(dims(T=4096, mamba1=True), BIG, backward=True) is None


def test_chunk_zero_disables(knobs):
    knobs.update(CHUNK=0, CHUNK_MIN_T=1)
    assert chunk_plan(dims(T=4096), BIG, backward=True) is None
    assert registry.plan(dims(T=4096), BIG, backward=True).family.name != "chunked"


@pytest.mark.parametrize("CL", [16, 32, 64])
def test_chunk_knob_sets_the_chunk_length(knobs, CL):
    knobs.update(CHUNK=CL, CHUNK_MIN_T=1)
    for T in (1, CL - 1, CL, CL + 1, 5 * CL + 3):
        cp = chunk_plan(dims(T=T), BIG, backward=True)
        assert cp.CL == CL and cp.NCH == -(-T // CL)
        assert_whole_sequence_windows(cp, dims(T=T))


@pytest.mark.parametrize("CL", [8, 24, 65, 128, -16])
def test_chunk_lengths_the_kernels_do_not_take_are_refused(knobs, monkeypatch, CL):
    with pytest.raises(ValueError, match=rf"CHUNK={CL}: CHUNK .* must be one of 0, 16, 32, 48, 64"):
        knobs.update(CHUNK=CL, CHUNK_MIN_T=1)
    monkeypatch.setenv("SSM_VK_TUNE", f"CHUNK={CL}")
    with pytest.raises(ValueError, match=rf"^SSM_VK_TUNE: CHUNK={CL}"):
        config.settings()


def test_min_t_knob(knobs):
    knobs.update(CHUNK_MIN_T=1000)
    assert chunk_plan(dims(T=999), BIG, backward=False) is None
    assert chunk_plan(dims(T=1000), BIG, backward=False).CL == 64


def test_environment_knobs(monkeypatch):
    monkeypatch.setenv("SSM_VK_TUNE", "CHUNK=32,CHUNK_MIN_T=1")
    cp = chunk_plan(dims(T=5), BIG, backward=True)
    assert cp.CL == 32 and cp.NCH == 1
    monkeypatch.setenv("SSM_VK_TUNE", "CHUNK=0")
    assert chunk_plan(dims(T=4096), BIG, backward=True) is None


# -- windows -------------------------------------------------------------------------------------

@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("k", [1, 2, 3, 6])
def test_windows_shrink_to_what_the_storage_range_holds(knobs, backward, k):
    # A storage range that holds exactly k sequences' worth of the largest windowed array.
    knobs.update(CHUNK=16, CHUNK_MIN_T=1)
    d = dims(S=7, T=40, H=3, P=5, N=12, G=1)
    per_seq = max(scratch_elems(d, 16, 1, backward).values())
    lim = replace(BIG, max_storage_buffer_range=16 + k * per_seq * F32 + F32 - 1)
    cp = chunk_plan(d, lim, backward)
    assert cp.Sw == k
    assert_whole_sequence_windows(cp, d)
    assert len(cp.windows) == -(-7 // k)
    assert all(v <= cap_elems(lim) for v in scratch_elems(d, 16, cp.Sw, backward).values())
    assert any(v > cap_elems(lim) for v in scratch_elems(d, 16, cp.Sw + 1, backward).values())


def test_backward_windows_are_no_larger_than_the_forward_ones(knobs):
    knobs.update(CHUNK=32, CHUNK_MIN_T=1)
    d = dims(S=40, T=100, H=4, P=33, N=20, G=2)
    for rng in (1 << 17, 1 << 19, 1 << 21):
        lim = replace(BIG, max_storage_buffer_range=rng)
        f, b = chunk_plan(d, lim, False), chunk_plan(d, lim, True)
        assert f is not None and b is not None and b.Sw <= f.Sw
        for cp, backward in ((f, False), (b, True)):
            assert fits(d, lim, 32, cp.Sw, backward)
            assert cp.Sw == d.S or not fits(d, lim, 32, cp.Sw + 1, backward)


def test_small_allocation_limit_shrinks_windows_too(knobs):
    knobs.update(CHUNK=16, CHUNK_MIN_T=1)
    d = dims(S=5, T=20, H=2, P=4, N=8, G=1)
    per_seq = max(scratch_elems(d, 16, 1, True).values())
    lim = replace(BIG, max_memory_allocation_size=16 + 2 * per_seq * F32)
    assert chunk_plan(d, lim, True).Sw == 2


def test_grids_limit_the_sequences_per_window(knobs):
    knobs.update(CHUNK=16, CHUNK_MIN_T=1)
    d = dims(S=9, T=50, H=4, P=40, N=140, G=2)
    one = max(groups(d, 16, 1))
    lim = replace(BIG, max_workgroup_count=(one, 2, 1))           # two sequences' worth of workgroups
    cp = chunk_plan(d, lim, True)
    assert cp.Sw == 2 and len(cp.windows) == 5
    assert all(g <= 2 * one for g in groups(d, 16, cp.Sw))
    lim = replace(BIG, max_workgroup_count=(one - 1, 1, 1))       # not even one sequence
    assert chunk_plan(d, lim, True) is None


def test_scratch_budget_limits_windows_of_several_sequences(knobs):
    # Roomy bindings, but the chunk scratch of a window stays within SCRATCH_BUDGET (2 GiB)...
    knobs.update(CHUNK=64, CHUNK_MIN_T=1)
    d = dims(S=64, T=2048, H=32, P=64, N=128, G=1)
    cp = chunk_plan(d, BIG, True)

    def scratch(Sw):
        e = scratch_elems(d, 64, Sw, True, headloop=False)   # the planner budgets the larger set
        return sum(v for k, v in e.items() if k not in ("x", "B", "states")) * F32

    assert 1 < cp.Sw < d.S
    assert scratch(cp.Sw) <= cpm.SCRATCH_BUDGET < scratch(cp.Sw + 1)
    assert_whole_sequence_windows(cp, d)
    # ...but one sequence over the budget still runs, alone (a budget, not a limit).
    d1 = dims(S=3, T=40000, H=32, P=64, N=128, G=1)
    cp1 = chunk_plan(d1, BIG, True)
    assert cp1 is not None and cp1.Sw == 1 and len(cp1.windows) == 3


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_token_windows_when_one_sequence_does_not_fit_none_below_one_chunk(knobs, backward):
    knobs.update(CHUNK=16, CHUNK_MIN_T=1)
    d = dims(S=3, T=64, H=2, P=8, N=16, G=1)
    per_seq = max(scratch_elems(d, 16, 1, backward).values())
    lim = replace(BIG, max_storage_buffer_range=16 + per_seq * F32)
    cp = chunk_plan(d, lim, backward)
    assert cp.Sw == 1 and not cp.tokens and len(cp.windows) == d.S
    # a binding short of one sequence's scratch: token windows of whole chunks, each sequence's
    # chunks counted in order across its windows
    lim = replace(BIG, max_storage_buffer_range=16 + per_seq * F32 - F32)
    cp = chunk_plan(d, lim, backward)
    assert cp.tokens and cp.Sw == 1 and len(cp.windows) > d.S
    assert all(w.t0 % 16 == 0 and w.S == 1 for w in cp.windows)
    assert [(w.i0, w.t0, w.t1) for w in cp.windows] == sorted((w.i0, w.t0, w.t1) for w in cp.windows)
    assert cp.nch_seq == 4 and all(at == w.t0 // 16 for at, w in zip(cp.chunk_at, cp.windows, strict=True))
    # below one chunk's scratch: none; the token-sequential plan still takes it (windows of its own)
    one = max(scratch_elems(d, 16, 1, backward, T=16).values())
    lim = replace(BIG, max_storage_buffer_range=16 + one * F32 - F32)
    assert chunk_plan(d, lim, backward) is None
    pl = registry.plan(d, lim, backward)
    assert pl.family.name == "sequential" and pl.plan.windows


# -- GEMM tiles ----------------------------------------------------------------------------------

@pytest.mark.parametrize("CL", [16, 32, 64])
def test_gemm_tiles_cover_every_matrix(CL):
    for P in (1, 5, 16, 33, 128, 129, 200, 256):
        for N in (1, 7, 64, 200, 256):
            for mode in MODES:
                rows, cols = {"CB": (CL, CL), "GU": (CL, CL), "ZF": (P, N), "ZB": (P, N), "Y": (CL, P),
                              "GAM": (CL, P), "DB": (CL, N), "DC": (CL, N)}[mode]
                RBLK, CBLK, NRB, NCB = gemm_tile(mode, CL, P, N)
                assert RBLK % 16 == 0 and CBLK % 16 == 0 and RBLK <= 64 and CBLK <= 128
                assert CBLK % (GEMM_WG // 16) == 0      # whole columns per thread of the 16 x 16 grid
                assert (NRB - 1) * RBLK < rows <= NRB * RBLK, (mode, P, N)
                assert (NCB - 1) * CBLK < cols <= NCB * CBLK, (mode, P, N)
                if mode in ("Y", "GAM", "DB", "DC"):
                    assert NRB == 1             # a whole chunk per tile: the row sums of GAM / DC
                if mode == "GAM":
                    assert NCB <= 2             # ssm_vk/chunked/glsl/chunk_common.glsl: two column-block slots of P
                if mode == "DC":
                    assert NCB <= 4             # and four of N (DC's column blocks are 64 wide)


def test_token_windows_need_a_sequence_of_d_A_parts_in_one_binding(knobs):
    # d_A's parts of one sequence (H x its chunks) are bound whole by the backward's reduce: where
    # they exceed a binding while windows of a few chunks still fit, the backward is not planned
    # on the chunked kernels, and its forward runs windows of its own and keeps no starts
    knobs.update(CHUNK=16, CHUNK_MIN_T=1)
    d = dims(S=1, T=65536, H=4, P=4, N=4, G=1)
    parts = d.H * (d.T // 16) * F32                            # 64 KiB
    lim = replace(BIG, max_storage_buffer_range=parts // 2)
    assert chunk_plan(d, lim, True) is None
    fwd = chunk_plan(d, lim, False)
    assert fwd.tokens and not fwd.keep
    lim = replace(BIG, max_storage_buffer_range=parts + 64)
    back, fwd = chunk_plan(d, lim, True), chunk_plan(d, lim, False)
    assert back.tokens and fwd.tokens and fwd.keep and fwd.windows == back.windows
