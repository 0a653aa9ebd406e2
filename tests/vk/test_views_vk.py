"""Inputs that are views into a larger DeviceArray, at any element offset (binding offsets must be
aligned, so the kernels add the rest): every kernel family -- token by token, over time chunks,
the chunked Mamba-2 kernels, Mamba-1 with time in threads -- gives the bits it gives for the same
values in arrays of their own. A (a few floats, often sliced from a model's parameters) was once
read from the aligned start of its binding instead."""

from __future__ import annotations

import numpy as np
import pytest

import ssm_ref
import ssm_vk
from ssm_ref import GRAD_NAMES
from ssm_ref.testing.cases import make_problem
from ssm_vk import config
from ssm_vk import runtime as rt
from ssm_vk.registry import plan
from ssm_vk.sizing import Limits

pytestmark = pytest.mark.vulkan

def _subgroup() -> int:
    return rt.get_context().info.subgroup_size


def viewed(a: np.ndarray, pad: int):
    """``a`` as a view ``pad`` elements into a larger DeviceArray (the rest poisoned)."""
    flat = np.concatenate([np.full(pad, 1e30, np.float32), a.ravel().astype(np.float32),
                           np.full(3, -1e30, np.float32)])
    return ssm_vk.to_device(flat).view(pad, a.shape)


KINDS = {   # name: (case arguments, knobs)
    "token by token": (dict(S=2, T=9, H=4, P=2, N=5, G=2, variant="mamba1"), {"TCHUNK": 0, "M1": 0}),
    "time chunks": (dict(S=2, T=48, H=4, P=1, N=16, G=1, variant="mamba1"), {"TCHUNK": 12, "CHUNK": 0, "M1": 0}),
    # (P and N of tests/vk/test_chunked_vk.py: its chunk kernels, compiled once in a session)
    "chunked": (dict(S=2, T=80, H=4, P=3, N=5, G=2, variant="mamba2"), {"CHUNK": 16, "CHUNK_MIN_T": 0}),
    "time in threads": (dict(S=2, T=70, P=1, N=16, G=1, variant="mamba1"), {"M1": 1, "M1_FTI": 8, "M1_NW": 2}),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pad", [1, 3])
def test_inputs_viewed_at_any_offset_give_the_same_bits(kind, pad):
    shape, tune = KINDS[kind]
    if kind == "time in threads":
        shape = dict(shape, H=_subgroup())
    case = make_problem(7, ids="identity", **shape)
    args = {k: v for k, v in case.args().items()}
    grads = {"g_y": case.g_y, "g_states": case.g_states}
    with config.configure(tune=tune):
        if kind == "chunked":
            for backward in (False, True):
                lim = Limits.of(rt.get_context().info)
                assert plan(ssm_ref.check_forward(**case.args()).dims, lim, backward).family.name == "chunked", backward
        own = {k: (v if k == "ids" else ssm_vk.to_device(v)) for k, v in args.items()}
        want_f = ssm_vk.ssm_scan(**own)
        want_b = ssm_vk.ssm_scan_back(**own, **{k: ssm_vk.to_device(v) for k, v in grads.items()})
        views = {k: (v if k == "ids" else viewed(v, pad + i)) for i, (k, v) in enumerate(args.items())}
        got_f = ssm_vk.ssm_scan(**views)
        got_b = ssm_vk.ssm_scan_back(**views, **{k: viewed(v, pad) for k, v in grads.items()})
    assert got_f.where.startswith("Vulkan")
    for k in ("y", "states"):
        assert np.array_equal(getattr(got_f, k).numpy(), getattr(want_f, k).numpy()), k
    for k in GRAD_NAMES:
        assert np.array_equal(getattr(got_b, k).numpy(), getattr(want_b, k).numpy()), k
