"""ssm_torch/_gate.py: mamba_ssm's skip and gate around the scan, ``(y + x * D) * silu(z)``, in
one function with a hand-written backward. Its values and gradients against the same ops
written out (autograd's derivative of them) in float64, and torch.autograd.gradcheck's finite
differences, for the layouts the drop-ins give it (D per channel or per head, broadcast; z
transposed; without D; without z), every subset of inputs needing a gradient, and inputs left
unwritten.
"""

import itertools

import pytest
from torchreq import need_torch

torch = need_torch()

import torch.nn.functional as F  # noqa: E402, N812

from ssm_torch._gate import gate  # noqa: E402


def written_out(y, x, D, z):
    out = y if D is None else y + x * D
    return out if z is None else out * F.silu(z)


def _case(layout, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    if layout == "mamba2, D (H, P)":
        return r(2, 5, 3, 4), r(2, 5, 3, 4), r(3, 4), r(2, 5, 3, 4)
    if layout == "mamba2, D (H,) broadcast":
        return r(2, 5, 3, 4), r(2, 5, 3, 4), r(3)[:, None], r(2, 5, 3, 4)
    if layout == "mamba1, z transposed":   # (batch, L, d_inner, 1), z a view of (batch, d_inner, L)
        return r(2, 6, 5, 1), r(2, 6, 5, 1), r(5)[:, None], r(2, 5, 6).transpose(1, 2).unsqueeze(-1)
    if layout == "no D":
        return r(3, 4, 2), None, None, r(3, 4, 2)
    if layout == "no z":
        return r(3, 4, 2), r(3, 4, 2), r(4, 2), None
    raise AssertionError(layout)


LAYOUTS = ["mamba2, D (H, P)", "mamba2, D (H,) broadcast", "mamba1, z transposed", "no D", "no z"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_values_and_gradients_equal_the_ops_written_out(layout):
    ins = _case(layout)
    names = ("y", "x", "D", "z")
    live = [i for i, t in enumerate(ins) if t is not None]
    for k in range(1, len(live) + 1):
        for need in itertools.combinations(live, k):
            a = [None if t is None else t.detach().clone().requires_grad_(i in need) for i, t in enumerate(ins)]
            b = [None if t is None else t.detach().clone().requires_grad_(i in need) for i, t in enumerate(ins)]
            kept = [None if t is None else t.detach().clone() for t in a]
            got, want = gate(*a), written_out(*b)
            torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-14)
            w = torch.randn(got.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
            (got * w).sum().backward()
            (want * w).sum().backward()
            for i in need:
                torch.testing.assert_close(a[i].grad, b[i].grad, rtol=1e-12, atol=1e-12,
                                           msg=lambda m, i=i, need=need: f"d_{names[i]} ({layout}, {need}): {m}")
            for i in range(4):
                if i not in need:
                    assert a[i] is None or a[i].grad is None
                if a[i] is not None:
                    assert torch.equal(a[i].detach(), kept[i]), f"{names[i]} was written"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradcheck(layout):
    ins = [None if t is None else t.requires_grad_() for t in _case(layout, seed=3)]
    assert torch.autograd.gradcheck(gate, tuple(ins), eps=1e-6, atol=1e-7, rtol=1e-6)


def test_float32_stays_float32_and_a_bad_z_is_refused():
    y, x, D, z = (t.float() for t in _case("mamba2, D (H, P)"))
    assert gate(y, x, D, z).dtype == torch.float32
    with pytest.raises(ValueError, match=r"z: expected the output's shape \(2, 5, 3, 4\)"):
        gate(y, x, D, z[:, :1])


def test_a_second_derivative_says_it_is_not_supported():
    y, x, D, z = (t.requires_grad_() for t in _case("mamba2, D (H, P)"))
    (g,) = torch.autograd.grad(gate(y, x, D, z).sum(), z, create_graph=True)
    with pytest.raises(RuntimeError, match=r"differentiate twice|does not require grad"):
        g.sum().backward()
