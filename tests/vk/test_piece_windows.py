"""The token-sequential planner's token windows lie in one piece of every array that
``ssm_vk.to_device`` holds in pieces (sizing.even_cuts at sizing.device_piece_bytes), so a call
binds such arrays in place: drawn shapes and limits, forward and backward, no device (the plans
and the cuts are pure Python). tests/vk/test_pieces_vk.py runs the calls."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from ssm_ref import Dims
from ssm_vk.sequential import sequential_planner
from ssm_vk.sizing import DEFAULT_K, Limits, alloc_cap, device_piece_bytes, even_cuts

GPU = Limits(subgroup_size=32, subgroup_ops=frozenset({"basic", "arithmetic", "shuffle"}),
             max_workgroup_invocations=1024, max_shared_memory=48 << 10,
             max_workgroup_count=(2**31 - 1, 65535, 65535), max_storage_buffer_range=2**32 - 1,
             max_memory_allocation_size=4292870144, min_storage_buffer_offset_alignment=16,
             max_workgroup_size=(1024, 1024, 64), max_push_constants_size=256,
             max_storage_buffers_per_stage=2**20, device_type="discrete", device_local_bytes=150 << 30)


@st.composite
def problems(draw):
    H, G = draw(st.sampled_from([(1, 1), (2, 1), (4, 2), (8, 1)]))
    d = Dims(S=draw(st.integers(1, 3)), T=draw(st.integers(1, 5000)), H=H, P=draw(st.integers(1, 16)),
             N=draw(st.integers(1, 64)), G=G, R=1, mamba1=False, a_shape=(H,))
    kib = draw(st.integers(4, 64))   # the binding and the allocation, lowered
    lim = replace(GPU, max_storage_buffer_range=kib << 10,
                  max_memory_allocation_size=draw(st.integers(kib, 2 * kib)) << 10)
    return d, lim


@given(p=problems(), backward=st.booleans())
@settings(max_examples=300, deadline=None)
def test_token_windows_lie_in_one_piece_of_every_array_to_device_cuts(p, backward):
    d, lim = p
    try:
        plan = sequential_planner.sequential_plan(d, lim, backward)
    except Exception as exc:   # (a token beyond a binding: nothing to cut)
        assert type(exc).__name__ == "TooLarge", exc
        return
    whole = alloc_cap(lim.max_memory_allocation_size, lim.min_storage_buffer_offset_alignment, lim.device_local_bytes)
    for shape in ((d.S, d.T, d.H, d.P), (d.S, d.T, d.G, d.N), (d.S, d.T, d.H)):
        per_token = shape[2] * (shape[3] if len(shape) > 3 else 1) * 4
        if d.S * d.T * per_token <= whole:
            continue   # (one buffer)
        starts = even_cuts(shape, 4, device_piece_bytes(lim), DEFAULT_K)
        seq = d.T * per_token
        for w in plan.windows:
            a, b = (w.i0 * seq + w.t0 * per_token, (w.i1 - 1) * seq + w.t1 * per_token)
            inside = [s for s in starts if a < s < b]
            assert not inside, (shape, w, inside)
