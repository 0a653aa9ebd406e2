"""The torch ops ssm_torch.mamba's drop-ins run around the scan (the glue), counted with a
TorchDispatchMode: at most the counts docs/TORCH.md ("Performance") quotes from
benchmarks/torch_side_by_side.py, the softplus left to the backend where the math allows, and every
tensor the scan's operator takes already contiguous float32 (the operator copies any other, in the
forward and again in the backward). The values themselves are held to mamba_ssm's references by
test_mamba.py and test_mamba_packed.py."""

import collections

import numpy as np
import pytest
from torchreq import need_torch

torch = need_torch()

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from ssm_torch import mamba  # noqa: E402

VIEWS = {"view", "_unsafe_view", "unsqueeze", "squeeze", "transpose", "permute", "expand", "detach", "alias",
         "as_strided", "slice", "select", "t"}
BACKEND = "ssm_ref"


class Count(TorchDispatchMode):
    """The ops dispatched (by name), and the arguments of each call of the scan's operators."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()
        self.scans = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        if func.namespace == "ssm_scan":
            self.scans.append((name, args))
        return func(*args, **(kwargs or {}))

    def compute(self) -> int:
        """Ops that read or write tensor data, besides the scan's operators."""
        return sum(n for k, n in self.ops.items() if k not in VIEWS and not k.startswith("scan"))


def tensors(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [torch.tensor(rng.uniform(-1, 1, sh), dtype=torch.float32, requires_grad=True) for sh in shapes]


def counted(fn, grads):
    fn()   # first call: anything done once
    with Count() as f:
        out = fn()
    with Count() as b:
        torch.autograd.backward(out, grads)
    return f, b


S, T, H, P, N = 1, 16, 4, 8, 16


def mamba2_args(strided=False):
    x, dt, A, B, C, D, z, bias = tensors((S, T, H, P), (S, T, H), (H,), (S, T, 1, N), (S, T, 1, N), (H,),
                                         (S, T, H, P), (H,))
    if strided:   # split from one projection, as transformers' Mamba2Mixer passes them
        proj = torch.cat([x.detach().reshape(S, T, H * P), B.detach().reshape(S, T, N), C.detach().reshape(S, T, N),
                          dt.detach()], dim=-1).requires_grad_()
        xs, Bs, Cs, dt = torch.split(proj, [H * P, N, N, H], dim=-1)
        x, B, C = xs.reshape(S, T, H, P), Bs.reshape(S, T, 1, N), Cs.reshape(S, T, 1, N)
    return dict(x=x, dt=dt, A=(-A.detach().abs()).requires_grad_(), B=B, C=C, D=D, z=z, dt_bias=bias)


def assert_contiguous_inputs(counts, backward: bool):
    """The scan's operands (s, x, dt, A, B, C) contiguous float32 in every call of its operators."""
    assert counts.scans, "the scan's operator was not called"
    for name, args in counts.scans:
        for i, t in enumerate(args[:6]):
            assert t.dtype == torch.float32 and t.is_contiguous(), f"{name}: operand {i} {tuple(t.stride())}"


@pytest.mark.parametrize("strided", [False, True])
def test_mamba2_glue_ops(strided):
    a = mamba2_args(strided)

    def step():
        return mamba.mamba_chunk_scan_combined(a["x"], a["dt"], a["A"], a["B"], a["C"], 64, D=a["D"], z=a["z"],
                                               dt_bias=a["dt_bias"], dt_softplus=True, return_final_states=True,
                                               backend=BACKEND)

    f, b = counted(step, (torch.ones(S, T, H, P), torch.ones(S, H, P, N)))
    # forward: dt + dt_bias; the zero start state; y + x * D (one addcmul); silu(z), * (3 copies more
    # when strided: x, B, C made contiguous once, which the operator would copy in the forward and
    # the backward)
    assert f.compute() <= (8 if strided else 5), dict(f.ops)
    # backward: the gate's 3 (two products, silu's derivative), the skip's 3 (two products, the sum
    # to D's shape), dt_bias's sum, and x's two gradients added
    assert b.compute() <= 8 + strided, dict(b.ops)
    assert "softplus" not in f.ops and "clamp" not in f.ops     # the backend's softplus: the clamp cannot bind
    assert [args[8] for _, args in f.scans] == ["log1p"]
    assert_contiguous_inputs(f, False)
    assert_contiguous_inputs(b, True)


def test_mamba2_glue_keeps_a_binding_clamp_in_torch():
    a = mamba2_args()
    f, _ = counted(lambda: mamba.mamba_chunk_scan_combined(a["x"], a["dt"], a["A"], a["B"], a["C"], 64,
                                                           dt_bias=a["dt_bias"], dt_softplus=True,
                                                           dt_limit=(0.5, 1.0), backend=BACKEND),
                   torch.ones(S, T, H, P))
    assert f.ops["softplus"] == 1 and f.ops["clamp"] == 1
    assert [args[8] for _, args in f.scans] == ["none"]


def test_mamba1_glue_ops():
    dim, L, n = 12, 16, 8
    u, delta, A, B, C, D, z, bias = tensors((S, dim, L), (S, dim, L), (dim, n), (S, n, L), (S, n, L), (dim,),
                                            (S, dim, L), (dim,))
    A = (-A.detach().abs()).requires_grad_()

    def step():
        return mamba.selective_scan_fn(u, delta, A, B, C, D, z, bias,
                                       delta_softplus=True, return_last_state=True, backend=BACKEND)

    f, b = counted(step, (torch.ones(S, dim, L), torch.ones(S, dim, n)))
    # forward: u, delta, B, C in the scan's layout (one copy each), + delta_bias; the zero start
    # state; y + x * D (one addcmul); silu(z), *
    assert f.compute() <= 9, dict(f.ops)
    # backward: the gate's 3, the skip's 3, delta_bias's sum, x's two gradients added, and 3 copies
    # into the leaves' layout (autograd's, for u, delta and the gate's z)
    assert b.compute() <= 14, dict(b.ops)
    assert "softplus" not in f.ops
    assert [args[8] for _, args in f.scans] == ["log1p"]
    assert_contiguous_inputs(f, False)
    assert_contiguous_inputs(b, True)


def test_decode_step_copies_the_cache_rows_only_for_autograd():
    state = torch.zeros(2, H, P, N)
    x, dt, A, B, C = tensors((2, H, P), (2, H, P), (H, P, N), (2, 1, N), (2, 1, N))
    A = -A.detach().abs()

    def step():
        return mamba.selective_state_update(state, x, dt, A, B, C, dt_softplus=True, backend=BACKEND)

    with torch.no_grad():
        step()
        with Count() as c:
            step()
    assert "clone" not in c.ops and "softplus" not in c.ops, dict(c.ops)
    with Count() as c:
        step()
    assert c.ops["clone"] == 1                  # autograd keeps the rows read: a copy, as state is written
