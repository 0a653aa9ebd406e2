"""Mamba-3's scan (the op ``mamba3_scan``) on CUDA tensors, ``backend="ssm_vk"``: ssm_torch/cuda.py's
arena and its steps (:func:`ssm_torch.cuda.run`), with Mamba-3's own inputs (absent optional ones
are not copied), outputs and gradients (the start states' gradients are written also without
start states: R = S rows that no tensor is made of). Mamba-3's backward keeps nothing of its
forward, so no slot is held between calls. ssm_torch/_mamba3_op.py's operators call it."""

from __future__ import annotations

import torch

from ssm_ref.mamba3_checks import output_shapes as mamba3_shapes
from ssm_ref.ops import MAMBA3
from ssm_vk import runtime as rt

from . import _common, cuda

__all__ = ["backward", "forward"]


_M3 = MAMBA3.float_inputs      # x .. s_v, then ids
_M3_SHAPED_BY = tuple(MAMBA3.input_names.index(n) for n in ("x", "B", "dtheta"))


def _m3_present(floats) -> dict:
    """The float inputs given (not None), by name, in the declared order."""
    return {n: t for n, t in zip(_M3, floats, strict=True) if t is not None}


def _m3_args(arrays: list, names) -> list:
    """The 14 float arguments of ssm_vk's call: the arena's arrays of ``names``, None elsewhere."""
    by = dict(zip(names, arrays, strict=True))
    return [by.get(n) for n in _M3]


def forward(inputs, rotation: str, dtypes, side=None) -> tuple:
    """ssm_torch's Mamba-3 forward operator on CUDA tensors. ``inputs``: the op's 15 inputs in the
    declared order (None for an absent optional one), ``dtypes`` the outputs' (the bridge's rule).
    Returns (y, theta, h, k, v). Raises as ssm_torch.cuda.forward."""
    import ssm_vk

    *floats, ids = inputs
    named = _m3_present(floats)
    side = side if side is not None else cuda.side_for(named["x"].device)
    MAMBA3.check_forward(*(None if t is None else _common.standin(t) for t in floats),
                         _common.ids_for_check(ids), rotation=rotation)
    ctx = rt.get_context()
    side.check(ctx, named)
    shapes = mamba3_shapes(*(inputs[i].shape for i in _M3_SHAPED_BY))
    outs = {n: (tuple(s), d) for n, s, d in zip(MAMBA3.output_names, shapes, dtypes, strict=True)}
    ids_ = cuda.host_ids(ids)
    names = tuple(named)

    def call(a, out):
        return ssm_vk.mamba3_scan(*_m3_args(a, names), ids_, rotation=rotation, out=out)

    r, tensors = cuda.run(ctx, side, named, outs, call, True, keep=False)
    _common.record(MAMBA3.name, r, torch.float32, "ssm_vk")
    return tensors


def backward(inputs, cotangents, rotation: str, side=None) -> tuple:
    """ssm_torch's Mamba-3 backward operator on CUDA tensors. ``inputs`` as
    :func:`forward`'s, ``cotangents`` (g_y, g_theta, g_h, g_k, g_v). Returns the 14 float
    inputs' gradients in the declared order, each in its input's dtype and shape (an empty tensor
    for an input that is None). Raises as ssm_torch.cuda.forward."""
    import ssm_vk

    *floats, ids = inputs
    named = _m3_present(floats)
    x = named["x"]
    side = side if side is not None else cuda.side_for(x.device)
    outs = {MAMBA3.grad_of[n]: (tuple(t.shape), t.dtype) for n, t in named.items()}
    names = tuple(named)
    named.update(zip(MAMBA3.cotangent_names, cotangents, strict=True))
    ctx = rt.get_context()
    side.check(ctx, named)
    # without start states the call still writes their gradients (zero states of S rows, the final
    # states' shapes): no tensor of them
    unread = {}
    if "s_h" not in names:
        finals = mamba3_shapes(*(inputs[i].shape for i in _M3_SHAPED_BY))[1:]
        unread = {"d_" + n: tuple(s) for n, s in zip(MAMBA3.input_names[10:14], finals, strict=True)}
    ids_ = cuda.host_ids(ids)
    n = len(names)

    def call(a, out):
        return ssm_vk.mamba3_scan_back(*_m3_args(a[:n], names), ids_, *a[n:], rotation=rotation, out=out)

    g, tensors = cuda.run(ctx, side, named, outs, call, False, unread, keep=False)
    _common.record(MAMBA3.backward_name, g, torch.float32, "ssm_vk")
    by = dict(zip(names, tensors, strict=True))
    return tuple(by[nm] if nm in by else x.new_empty(0) for nm in _M3)
