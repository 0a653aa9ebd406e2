"""ssm_torch's Mamba-2 drop-in on ssm_vk through the staging path (a discrete GPU's; the
``force_staging`` seam on lavapipe): a forward and backward in at most four queue submissions,
the backward staging only its incoming gradients (the forward's inputs, handed to ssm_vk as new
numpy views of the same tensors, are bound where the forward put them), and the gradients those
of ssm_ref in float64."""

import numpy as np
import pytest
from torchreq import need_torch

torch = need_torch()

from ssm_torch.mamba import mamba_chunk_scan_combined  # noqa: E402
from ssm_vk import runtime as rt  # noqa: E402

pytestmark = pytest.mark.vulkan


@pytest.fixture
def staged():
    ctx = rt.get_context()
    ctx.seams.force_staging = True
    yield ctx
    for c in {ctx, rt.current_context()} - {None}:
        c.seams.force_staging = False


def _inputs(dtype, seed=0, S=1, T=64, H=16, P=64, N=128):
    rng = np.random.default_rng(seed)

    def t(*shape, lo=-1.0, hi=1.0):
        return torch.tensor(rng.uniform(lo, hi, shape), dtype=dtype, requires_grad=True)

    return dict(x=t(S, T, H, P), dt=t(S, T, H, lo=0.01, hi=0.1), A=t(H, lo=-1.0, hi=-0.2), B=t(S, T, 1, N),
                C=t(S, T, 1, N))


def _grads(inputs, backend):
    out = mamba_chunk_scan_combined(*inputs.values(), 64, backend=backend)
    w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    (out * w).sum().backward()
    got = {"out": out.detach(), **{k: v.grad for k, v in inputs.items()}}
    for v in inputs.values():
        v.grad = None
    return got


def test_the_drop_in_forward_and_backward_submit_at_most_four_times(staged):
    ctx = staged
    inputs = _inputs(torch.float32)
    _grads(inputs, "ssm_vk")                 # plans, compiles and records
    submits, staged_bytes = ctx.stats.submits, ctx.stats.uploaded_bytes
    out = mamba_chunk_scan_combined(*inputs.values(), 64, backend="ssm_vk")
    forward = ctx.stats.uploaded_bytes - staged_bytes
    staged_bytes = ctx.stats.uploaded_bytes
    out.sum().backward()
    assert ctx.stats.submits - submits <= 4
    S, T, H, P = inputs["x"].shape
    N = inputs["B"].shape[-1]
    assert forward == 4 * (S * H * P * N + S * T * H * P + S * T * H + H + 2 * S * T * N)
    assert ctx.stats.uploaded_bytes - staged_bytes == 4 * (S * T * H * P + S * H * P * N)   # g_y, g_states


def test_the_drop_in_gradients_through_the_staging_path(staged):
    got = _grads(_inputs(torch.float32, seed=1, T=24, H=4, P=8, N=16), "ssm_vk")
    want = _grads(_inputs(torch.float64, seed=1, T=24, H=4, P=8, N=16), "ssm_ref")
    for k, w in want.items():   # test_mamba.py's float32 bounds: 3e-6 relative, gradients 30 times that
        tol = 3e-6 if k == "out" else 9e-5
        assert float((got[k].double() - w).norm()) <= tol * float(w.norm()), k
