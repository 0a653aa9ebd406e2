"""mamba_ssm's output around the scan, ``(y + x * D) * silu(z)`` (the D skip, the z gate), in
fewer passes over memory than its torch ops one by one (ssm_torch/mamba.py's drop-ins use it).

Written out, autograd runs four ops in the forward (``x * D``, ``+ y``, ``silu``, ``*``) and
six in the backward, each making a new tensor of the output's size -- at a training step's size
100 MB each, whose pages a CPU fills at a few GB/s. :class:`_Gate` runs three in the forward
(``torch.addcmul`` for the skip) and the same six in the backward, silu's derivative written in
place into its input: one op and two new tensors fewer per step, on a CPU and on a GPU alike.
Its derivative is the same formula, checked against autograd's of the ops written out
(tests/pytorch/test_gate.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's name)
from torch.autograd.function import once_differentiable

__all__ = ["gate"]


def gate(y, x, D, z):
    """``(y + x * D) * silu(z)``; D None: no skip term (x unused), z None: no gate. ``D`` broadcasts
    against ``x``; ``z`` has the shape of ``y`` (any strides)."""
    if z is None:
        return y if D is None else torch.addcmul(y, x, D)
    if z.shape != y.shape:
        raise ValueError(f"z: expected the output's shape {tuple(y.shape)}, got {tuple(z.shape)}")
    return _Gate.apply(y, x, D, z)


class _Gate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, x, D, z):
        u = y if D is None else torch.addcmul(y, x, D)
        s = F.silu(z)
        ctx.save_for_backward(u, s, x, D, z)
        return s * u

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        u, s, x, D, z = ctx.saved_tensors
        need_y, need_x, need_D, need_z = ctx.needs_input_grad
        d_z = None
        if need_z:   # silu's derivative applied to g * u, in place
            d_z = g * u
            torch.ops.aten.silu_backward.grad_input(d_z, z, grad_input=d_z)
        if not (need_y or need_x or need_D):   # (z's alone: no pass for the skip's side)
            return None, None, None, d_z
        d_u = g * s                                  # the gradient of y + x * D
        d_x = d_u * D if need_x and D is not None else None
        d_D = (d_u * x).sum_to_size(D.shape) if need_D else None
        return (d_u if need_y else None), d_x, d_D, d_z
