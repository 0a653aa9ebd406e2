"""What the chunked Mamba-3 kernels' test files share (test_mamba3_chunked_vk.py, the forward;
test_mamba3_chunked_back_vk.py, the backward): the op's inputs in order, a GPU's roomy limits (the
planner's tests), a case's arguments, the recompute counter and the strategy of multi-chunk cases."""

from __future__ import annotations

from hypothesis import strategies as st

import ssm_vk
from ssm_ref.testing import mamba3_cases
from ssm_vk.engine import engine_of
from ssm_vk.sizing import Limits

INPUTS = ("x", "dt", "dA", "lam", "B", "C", "B_bias", "C_bias", "dtheta", "psi", "s_theta", "s_h", "s_k", "s_v",
          "ids")
# Roomy limits of a GPU (an H100's, about): only the knobs and the shape decide.
GPU = Limits(subgroup_size=32, subgroup_ops=frozenset({"basic"}), max_workgroup_invocations=1024,
             max_shared_memory=48 << 10, max_workgroup_count=(2**31 - 1, 65535, 65535),
             max_storage_buffer_range=2**32 - 1, max_memory_allocation_size=2**32,
             min_storage_buffer_offset_alignment=16, max_workgroup_size=(1024, 1024, 64),
             max_push_constants_size=256, max_storage_buffers_per_stage=2**20, device_type="discrete")


def args_of(case) -> dict:
    return {**case.args(), **case.keywords}


def reruns() -> int:
    """Calls recomputed on the token-sequential kernels after the chunked ones flagged them."""
    return engine_of(ssm_vk.runtime.get_context()).reruns


@st.composite
def chunked_cases(draw):
    """A case of several chunks of L tokens, the last one partial where T is not a multiple of L."""
    L = draw(st.integers(2, 4))
    T = draw(st.integers(L + 1, 3 * L + 1))
    mimo = draw(st.booleans())
    M = draw(st.integers(1, 3)) if mimo else None
    S = draw(st.integers(1, 2))
    G = draw(st.integers(1, 2))
    H = G * draw(st.integers(1, 2))
    N = draw(st.integers(1, 8))
    F = draw(st.sampled_from((0, N // 2, max(1, N // 4)))) if N % 2 == 0 else 0
    states = draw(st.booleans())
    pattern = draw(st.sampled_from(("permutation", "duplicates", "unused") if S > 1 else ("unused", "identity"))) \
        if states else "none"
    case = mamba3_cases.make_case(draw(st.integers(0, 2**32 - 1)), S=S, T=T, H=H, P=draw(st.integers(1, 5)), N=N,
                                  G=G, M=M, F=F, ids=pattern, states=states,
                                  psi=draw(st.booleans()) if mimo else True,
                                  rotation=draw(st.sampled_from(("interleaved", "halved"))),
                                  regime=draw(st.sampled_from(("typical", "small_dA", "large_dt", "tiny", "large"))))
    return L, case
