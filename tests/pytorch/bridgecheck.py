"""Helpers of the tests of CUDA tensors through ssm_vk (test_cuda_tensors.py on a GPU, its stand-ins
test_cuda_bridge.py and test_mamba3_cuda_bridge.py on the host): a case's tensors, the float64
oracle of exactly those numbers, the comparison of outputs that were rounded to a narrower dtype
once, and the host stand-in for CUDA's side of the arena (:class:`HostSide`; the fixtures
``side`` and ``ctx_mapped`` in conftest.py)."""

from __future__ import annotations

import numpy as np
import torch
from registry import BACKENDS, Backend, assert_close

import ssm_ref
from ssm_ref.tolerance import Tol
from ssm_vk.runtime import external

NAMES = ("s", "x", "dt", "A", "B", "C")
VK = next(b for b in BACKENDS if b.name == "ssm_vk")

# The unit roundoff of each dtype the outputs may be returned in: the float32 result rounded once
# to it adds at most u * |value| per element, so u * ||want|| (a hair more) to the norm of the error.
UNIT = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 0.0, torch.float64: 0.0}


def leaves(case, dtype=torch.float32, device="cpu", requires_grad=True, dtypes=None):
    """The case's arrays as tensors of ``dtype`` (or ``dtypes[name]``) on ``device``, and its ids."""
    args = case.args()
    dtypes = dtypes or {}
    out = {k: torch.tensor(np.asarray(args[k], np.float64), dtype=dtypes.get(k, dtype), device=device,
                           requires_grad=requires_grad) for k in NAMES}
    ids = None if args["ids"] is None else torch.tensor(np.asarray(args["ids"]), device=device)
    return out, ids


def host64(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().double().numpy()


def oracle(t: dict, ids, g_y, g_states, K=None, g_snapshots=None, form="ggml"):
    """The float64 oracle on the numbers the tensors hold (rounded inputs included): the forward
    (with K slots when given) and the backward of the given output gradients."""
    args = {k: host64(t[k]) for k in NAMES}
    ids_ = None if ids is None else ids.detach().cpu().numpy()
    extra = {} if K is None else {"snapshots": K}
    r = ssm_ref.ssm_scan(*args.values(), ids_, dtype=np.float64, dt_softplus=form, **extra)
    gx = {} if g_snapshots is None else {"g_snapshots": g_snapshots}
    g = ssm_ref.ssm_scan_back(*args.values(), ids_, g_y, g_states, dtype=np.float64, dt_softplus=form, **gx)
    return r, g


def assert_close_as(dtype, output: str, got, want, label: str = "") -> None:
    """assert_close of ssm_vk's float32 ``output``, returned in ``dtype``: its tolerance plus one
    rounding to ``dtype``."""
    u = UNIT[dtype]
    entry = VK
    if u:
        tol = VK.tol[output]
        entry = Backend(name=VK.name, module=VK.module, where=VK.where,
                        tol={output: Tol(rtol=tol.rtol + u * (1 + tol.rtol) * 1.001, atol=tol.atol)})
    got = host64(got) if isinstance(got, torch.Tensor) else got
    assert_close(entry, output, got, want, label=label or str(dtype))


def rounded(a: np.ndarray, dtype) -> np.ndarray:
    """``a`` rounded to ``dtype`` and back to float64 (an output gradient a loss in that dtype hands back)."""
    return torch.from_numpy(np.asarray(a, np.float64)).to(dtype).double().numpy()



def assert_compiles_as_eager(model: torch.nn.Module, u: torch.Tensor) -> None:
    """``model(u)`` (a scalar loss) traces into one graph with no break under torch.compile
    (fullgraph), and the compiled loss and every parameter's gradient equal eager mode's."""
    explained = torch._dynamo.explain(model)(u)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    compiled = torch.compile(model, fullgraph=True)
    loss_c = compiled(u)
    loss_c.backward()
    grads_c = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    loss_e = model(u)
    loss_e.backward()
    assert torch.allclose(loss_c, loss_e, rtol=1e-6, atol=0)
    for n, p in model.named_parameters():
        assert torch.allclose(grads_c[n], p.grad, rtol=1e-5, atol=1e-7), n


class HostSide:
    """The arena's other side on the host: the exported buffer's mapping stands in for CUDA's
    import. ``log`` records the steps, in order."""

    device = torch.device("cpu")

    def __init__(self):
        self.key = f"host-stand-in-{id(self)}"   # an arena of its own
        self.log = []
        self.attached = 0

    def check(self, ctx, named):
        self.log.append("check")

    def attach(self, buffer):
        assert isinstance(buffer, external.ExportableBuffer)
        self.attached += 1
        return buffer

    def detach(self, imported):
        self.attached -= 1

    def view(self, buffer, shape):
        n = int(np.prod(shape))
        self.log.append(f"view {tuple(shape)}")
        return torch.frombuffer(buffer.mapping, dtype=torch.float32, count=n).view(shape)

    def before_writes(self, arena):
        self.log.append("before_writes")

    def before_vulkan(self):
        self.log.append("before_vulkan")

    def after_reads(self, arena):
        self.log.append("after_reads")

    def drain(self, arena):
        self.log.append("drain")
