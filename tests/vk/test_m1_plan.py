"""The planner of the Mamba-1 kernels with time in a workgroup's threads (ssm_vk/m1/m1_planner.py): where
it takes a shape (Mamba-1 with P = 1 on a GPU, channels per group a multiple of the subgroup
size, N up to 32) and where it leaves it to the token-sequential kernels; the chunks, slices and
workgroups it plans on an H200's and smaller limits; the kernels and buffers that follow. Pure
Python (no Vulkan)."""

from __future__ import annotations

import plans
import pytest

from ssm_ref import Dims
from ssm_vk import budget, config, registry
from ssm_vk.m1 import m1_planner as m1_plan_module
from ssm_vk.m1.m1_planner import (
    M1_BWD_NB,
    M1_NW,
    M1_ONE_THREADS,
    M1_SPS_TI_MIN,
    M1_THREADS,
    shared_bytes,
)
from ssm_vk.sizing import Limits

M1_BWD_TI = config.KNOBS["M1_TI"].default
M1_ONE_TI = config.KNOBS["M1_ONE_TI"].default
OPS = frozenset({"basic", "vote", "arithmetic", "ballot", "shuffle", "shuffle_relative"})


def limits(device_type="discrete", sg=32, shared=48 << 10, ops=OPS, invocations=1024) -> Limits:
    return Limits(subgroup_size=sg, subgroup_ops=ops, max_workgroup_invocations=invocations,
                  max_shared_memory=shared, max_workgroup_count=(2**31 - 1, 65535, 65535),
                  max_storage_buffer_range=2**32 - 1, max_memory_allocation_size=2**32,
                  min_storage_buffer_offset_alignment=16, max_workgroup_size=(1024, 1024, 64),
                  device_type=device_type)


def m1(S, T, H, N=16, G=1) -> Dims:
    return Dims(S=S, T=T, H=H, P=1, N=N, G=G, R=S, mamba1=True, a_shape=(H, N))


def assert_one_pass_slices(d: Dims, mp) -> None:
    """The forward in one pass: its slices per subgroup (SPS) are the most that keep the threads
    within M1_ONE_THREADS and slices of M1_SPS_TI_MIN tokens or more (1 where none do); the tokens
    are cut evenly over every slice, each channel block is CW = RW / SPS channels."""
    assert mp.NCH == 1 and mp.SPS & (mp.SPS - 1) == 0 and mp.SPS <= mp.RW
    assert mp.CW == mp.RW // mp.SPS and mp.NRB == d.H // mp.CW and mp.TI == -(-d.T // (mp.NW * mp.SPS))

    def fits(sps):
        return (sps <= mp.RW and sps * mp.NW * d.S * d.H <= M1_ONE_THREADS
                and -(-d.T // (sps * mp.NW)) >= M1_SPS_TI_MIN)

    assert (mp.SPS == 1 or fits(mp.SPS)) and not fits(2 * mp.SPS)
    assert mp.TB == max(1, 8 // mp.SPS)      # a lane's share of a block's B and C stays TB * N / CW


@pytest.mark.parametrize(("S", "T", "H"), [(1, 512, 1536), (8, 2048, 1536), (1, 16384, 1536), (4, 1024, 5120)])
def test_the_four_mamba1_shapes_take_them_on_a_gpu(S, T, H):
    d = m1(S, T, H)
    fwd = registry.plan(d, limits(), False, config.DEFAULTS)
    bwd = registry.plan(d, limits(), True, config.DEFAULTS)
    for pl, backward in ((fwd, False), (bwd, True)):
        mp = plans.of(pl, "m1")
        assert mp is not None and pl.family.name == "m1"
        assert mp.RW == 32 and mp.NRB == H // mp.CW
        assert mp.NCH == -(-T // mp.L)                        # every token in a chunk, the last one partial
        assert shared_bytes(16, mp.RW, mp.NW, backward) <= 48 << 10
    fwd, bwd = fwd.plan, bwd.plan
    assert bwd.SPS == 1
    if T <= 16 * M1_ONE_TI:
        # a sequence that 16 slices (48 KiB of shared memory) of at most M1_ONE_TI tokens hold: one pass
        assert fwd.NW == 16
        assert_one_pass_slices(d, fwd)
        # few threads at (1, 512, 1536): subgroups take several slices; many at (4, 1024, 5120): one
        assert (fwd.SPS > 1) == (S * H < 8192)
    else:
        # the forward cuts time until about M1_THREADS threads run, slices of 8 tokens at least
        assert fwd.TI == max(8, -(-T // -(-M1_THREADS // (S * H)))) and fwd.NW == 4
    # the backward: its default slices (one shared table of N + 1 floats per thread fits 16 of them)
    assert (bwd.TI, bwd.NB, bwd.NW) == (M1_BWD_TI, M1_BWD_NB, M1_NW) == (4, 4, 16)


@pytest.mark.parametrize(("T", "sg", "shared", "NW"), [(512, 32, 48 << 10, 16), (64, 32, 48 << 10, 16),
                                                       (2, 32, 48 << 10, 16), (512, 8, 32 << 10, 32),
                                                       (512, 64, 48 << 10, 8), (500, 32, 32 << 10, 8)])
def test_a_forward_that_one_workgroup_holds_is_one_dispatch(T, sg, shared, NW):
    # as many slices as the workgroup and shared memory take (at most 32), the tokens cut evenly
    d = m1(2, T, 4 * sg)
    lim = limits(sg=sg, shared=shared)
    pl = registry.plan(d, lim, False, config.DEFAULTS)
    mp = plans.of(pl, "m1")
    assert mp.NW == NW and mp.WG <= 1024
    assert_one_pass_slices(d, mp)
    assert shared_bytes(16, sg, NW, False) <= shared < shared_bytes(16, sg, 2 * NW, False) or NW == 32
    specs = registry.kernels_needed(d, pl, False)
    assert [(k.name, dict(k.defines).get("MODE")) for k in specs][:2] == [("m1_scan", 2), ("ssm_scan", None)]
    sizes = budget.buffers(d, pl, lim, False)
    assert not any(k.startswith(("scratch:m1:agg", "scratch:m1:cb", "scratch:m1:cdec")) for k in sizes)
    # longer than its slices of M1_ONE_TI tokens hold, or the knob at 0: passes over time chunks
    long = plans.of(registry.plan(m1(2, NW * M1_ONE_TI + 1, 4 * sg), lim, False, config.DEFAULTS), "m1")
    off = plans.of(registry.plan(d, lim, False, config.Settings((("M1_ONE_TI", 0),), False)), "m1")
    assert long.NCH > 1 and long.NW == 4
    assert off.NW == 4 and (off.NCH > 1 or T <= 4 * off.TI)


def test_the_kernels_and_buffers_of_a_plan():
    d = m1(2, 4096, 1536)
    lim = limits()
    fwd = registry.plan(d, lim, False, config.DEFAULTS)
    names = [(k.name, dict(k.defines).get("MODE")) for k in registry.kernels_needed(d, fwd, False)]
    assert names[:3] == [("m1_scan", 0), ("ssm_scan_carry", None), ("m1_scan", 1)]
    assert ("ssm_scan", None) in names        # the token-sequential forward, for a call with inf or nan
    bwd = registry.plan(d, lim, True, config.DEFAULTS)
    specs = registry.kernels_needed(d, bwd, True)
    assert [k.name for k in specs[:6]] == ["m1_scan", "ssm_scan_carry", "ssm_scan_carry", "m1_scan_back",
                                           "ssm_scan_reduce", "ssm_scan_reduce"]
    assert dict(specs[0].defines)["ADJ"] == 1 and dict(specs[0].defines)["NW"] == plans.of(bwd, "m1").SNW
    sizes = budget.buffers(d, bwd, lim, True)
    assert sizes["scratch:m1:part_B"] == 4 * 2 * 4096 * (1536 // 32) * 16
    assert sizes["scratch:m1:cbl"] == 4 * 2 * plans.of(bwd, "m1").NCH * 1536 * 16
    assert "rerun:out:d_x" in sizes and "flag_host" in sizes


@pytest.mark.parametrize(("d", "lim", "why"), [
    (m1(1, 512, 1536), limits("cpu"), "a CPU device"),
    (m1(1, 512, 1536, N=33), limits(), "N above 32"),
    (m1(1, 512, 1528), limits(), "not a multiple of the subgroup size"),
    (m1(1, 512, 1536, G=96), limits(), "channels per group"),
    (m1(1, 1, 1536), limits(), "fewer than two tokens"),
    (m1(1, 512, 1536), limits(ops=frozenset({"basic", "arithmetic"})), "no subgroup shuffles"),
    (Dims(S=1, T=512, H=24, P=64, N=16, G=1, R=1, mamba1=True, a_shape=(24, 16)), limits(), "one channel per head"),
    (Dims(S=1, T=512, H=1536, P=1, N=16, G=1, R=1, mamba1=False, a_shape=(1536,)), limits(), "not Mamba-1"),
])
def test_shapes_they_leave_to_the_other_kernels(d, lim, why):
    assert why in m1_plan_module.applies(d, lim, config.DEFAULTS)
    for backward in (False, True):
        assert plans.of(registry.plan(d, lim, backward, config.DEFAULTS), "m1") is None


def test_the_knob_and_the_recompute_of_a_nonfinite_call():
    d = m1(1, 512, 1536)
    off = config.Settings((("M1", 0),), False)
    on_cpu = config.Settings((("M1", 1),), False)
    for backward in (False, True):
        assert plans.of(registry.plan(d, limits(), backward, off), "m1") is None
        assert plans.of(registry.plan(d, limits(), backward, config.DEFAULTS, rerun=True), "m1") is None
        assert plans.of(registry.plan(d, limits("cpu"), backward, on_cpu), "m1") is not None


def test_slices_shrink_to_the_shared_memory_and_threads_a_device_has():
    d = m1(1, 4096, 256)
    small = limits(sg=8, shared=16 << 10, invocations=128)
    for backward in (False, True):
        mp = plans.of(registry.plan(d, small, backward, config.DEFAULTS), "m1")
        assert mp.RW == 8 and mp.WG <= 128 and shared_bytes(16, 8, mp.NW, backward) <= 16 << 10
    # a subgroup of 64 at 8 KiB: the backward's slices shrink to the most that fit
    wide = limits(sg=64, shared=8 << 10)
    mp = plans.of(registry.plan(m1(1, 4096, 512), wide, True, config.DEFAULTS), "m1")
    assert shared_bytes(16, 64, mp.NW, True) <= 8 << 10 < shared_bytes(16, 64, 2 * mp.NW, True)
    assert mp.NW == 1
