"""Mamba-3's scan on CUDA tensors through ssm_torch (backend="ssm_vk"), its machinery on any
machine: ssm_torch/_cuda_mamba3.py over ssm_torch/cuda.py's arena, with the host stand-in of
CUDA's side (bridgecheck.HostSide: every step but the import and the stream waits runs as on a
GPU), and the checks that route CUDA tensors to it or refuse them. On a GPU:
tests/pytorch/test_cuda_tensors.py. Expected values come from ssm_ref in float64 on the same
numbers, held to the float32 bounds of the Mamba-3 kernels (ssm_ref.tolerance.MAMBA3_F32_TOL)."""

import numpy as np
import pytest
from torchreq import need_torch

torch = need_torch()

import ssm_ref  # noqa: E402
import ssm_torch  # noqa: E402
from ssm_ref.ops import MAMBA3  # noqa: E402
from ssm_ref.testing import mamba3_cases  # noqa: E402
from ssm_ref.tolerance import MAMBA3_F32_TOL, compare  # noqa: E402
from ssm_torch import _cuda_mamba3, _mamba3_op  # noqa: E402

pytestmark = pytest.mark.vulkan

FLOATS = MAMBA3.float_inputs
OUTS = MAMBA3.output_names


def _inputs(case, dtype=torch.float32):
    """The op's 15 inputs as tensors (None where absent), floats in ``dtype``."""
    t = [None if case.inputs[n] is None else torch.tensor(case.inputs[n]).to(dtype) for n in FLOATS]
    ids = case.inputs["ids"]
    return [*t, None if ids is None else torch.tensor(ids)]


def _oracle(inputs, case):
    """The forward and backward of ssm_ref in float64 on exactly the numbers of ``inputs``."""
    np_in = [None if a is None else a.double().numpy() for a in inputs[:-1]]
    ids = None if inputs[-1] is None else inputs[-1].numpy()
    kw = {"rotation": case.keywords["rotation"], "dtype": np.float64}
    cots = {k: np.asarray(v, np.float64) for k, v in case.cotangents.items()}
    return ssm_ref.mamba3_scan(*np_in, ids, **kw), ssm_ref.mamba3_scan_back(*np_in, ids, **cots, **kw)


def _close(name, got, want):
    c = compare(name, want, got.double().numpy(), MAMBA3_F32_TOL[name])
    assert c.ok, c


@pytest.mark.parametrize(("shape", "dtype"), [
    (dict(S=2, T=6, H=4, P=3, N=8, G=2, F=2, R=3, ids="permutation"), torch.float32),
    (dict(S=2, T=5, H=2, P=4, N=6, G=1, M=2, F=1, states=False), torch.float32),
    (dict(S=3, T=4, H=2, P=2, N=4, G=1, F=1, R=2, ids="duplicates", rotation="halved"), torch.float64)])
def test_forward_and_backward_against_the_float64_oracle(side, shape, dtype):
    case = mamba3_cases.make_case(31, **shape)
    inputs = _inputs(case, dtype)
    rotation = case.keywords["rotation"]
    want, gwant = _oracle(inputs, case)
    outs = _cuda_mamba3.forward(inputs, rotation, _mamba3_op._BRIDGE.dtypes(inputs), side=side)
    assert len(outs) == len(OUTS)
    for name, got in zip(OUTS, outs, strict=True):
        assert got.dtype == dtype and tuple(got.shape) == np.shape(getattr(want, name)), name
        _close(name, got, getattr(want, name))
    w = ssm_torch.last_where()
    assert (w.op, w.backend) == ("mamba3_scan", "ssm_vk") and w.where.startswith("Vulkan"), w
    cots = [torch.tensor(case.cotangents[k]) for k in MAMBA3.cotangent_names]
    grads = _cuda_mamba3.backward(inputs, cots, rotation, side=side)
    assert len(grads) == len(FLOATS)
    for name, t, g in zip(FLOATS, inputs, grads, strict=False):
        if t is None:
            assert g.numel() == 0, name
            continue
        assert g.dtype == dtype and g.shape == t.shape, name
        _close("d_" + name, g, gwant["d_" + name])
    assert ssm_torch.last_where().op == "mamba3_scan_back"


def test_the_steps_run_in_order_and_nothing_is_held_for_the_scan(side, ctx_mapped):
    # the inputs given are copied in (absent ones are not), then Vulkan, then the outputs read; the
    # scan's backward must not take Mamba-3's slots for its forward's inputs (slots share names)
    case = mamba3_cases.make_case(32, S=1, T=3, H=2, P=2, N=4, G=1, F=1, states=False)
    inputs = _inputs(case)
    _cuda_mamba3.forward(inputs, "interleaved", _mamba3_op._BRIDGE.dtypes(inputs), side=side)
    log = side.log
    assert log[:2] == ["check", "before_writes"]
    cut = log.index("before_vulkan")
    assert log[2:cut] == [f"view {tuple(t.shape)}" for t in inputs[:-1] if t is not None]
    assert log[cut + 1:] == [*(f"view {s}" for s in ((1, 3, 2, 2), (1, 2, 1), (1, 2, 2, 4), (1, 2, 4), (1, 2, 2))),
                             "after_reads"]
    arena = ctx_mapped.owned.extension(f"torch-arena:{side.key}")
    assert arena.held is None


def test_cuda_tensors_pass_the_checks_with_ssm_vk_alone_and_reach_the_bridge(monkeypatch):
    # ssm_torch.mamba3_scan's checks let CUDA tensors through with backend="ssm_vk" (and refuse
    # them with another backend, naming the first tensor); the operator's CUDA path (_Cuda) sends
    # them to ssm_torch/_cuda_mamba3.py with the outputs' dtypes, or refuses a host backend
    case = mamba3_cases.make_case(33, S=2, T=3, H=2, P=2, N=4, G=1, F=1, states=False)
    inputs = _inputs(case)
    fakes = [None if t is None else FakeCuda(tuple(t.shape), t.dtype) for t in inputs[:-1]]
    for backend in (None, "ssm_fast", "ssm_ref"):
        with pytest.raises(ValueError, match=r"^x: expected a CPU tensor .*\(CUDA tensors: with backend='ssm_vk'\), "
                                             r"got one on cuda:0"):
            ssm_torch.mamba3_scan(*fakes, backend=backend)
    with pytest.raises(ValueError, match=r"^C: on cuda:1, the other tensors on cuda:0$"):
        ssm_torch.mamba3_scan(*fakes[:5], FakeCuda(tuple(fakes[5].shape), torch.float32, 1), *fakes[6:],
                              backend="ssm_vk")
    with pytest.raises(ValueError, match=r"^ids: on cuda:1, the other tensors on cuda:0; ids may be on the CPU"):
        ssm_torch.mamba3_scan(*fakes, FakeCuda((2,), torch.int64, 1), backend="ssm_vk")
    seen = []
    monkeypatch.setattr(_mamba3_op, "scan", lambda *a: seen.append((len(a), a[-2:])))
    ssm_torch.mamba3_scan(*fakes, torch.tensor([0, 1]), backend="vk", rotation="halved")
    assert seen == [(17, ("ssm_vk", "halved"))]

    with pytest.raises(ValueError, match=r"^CUDA tensors: backend='ssm_fast' computes from host memory"):
        _mamba3_op._Cuda.forward(inputs, ("ssm_fast", "interleaved"))
    calls = []
    monkeypatch.setattr(_cuda_mamba3, "forward", lambda i, r, d: calls.append((len(i), r, tuple(d))))
    monkeypatch.setattr(_cuda_mamba3, "backward", lambda i, c, r: calls.append((len(i), len(c), r)))
    half = [None if t is None else t.half() for t in inputs[:-1]] + [None]
    _mamba3_op._Cuda.forward(half, ("ssm_vk", "halved"))
    _mamba3_op._Cuda.backward(half, [None] * 5, ("ssm_vk", "halved"))
    assert calls == [(15, "halved", (torch.float16,) * 5), (15, 5, "halved")]


class FakeCuda(torch.Tensor):
    """A tensor that says it is on a CUDA device (no data: the checks before any work read only its
    device, dtype and shape)."""

    @staticmethod
    def __new__(cls, shape, dtype=torch.float32, index=0):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=f"cuda:{index}")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise AssertionError(f"{func} ran on a tensor the checks should have refused")
