"""Mamba-3's scan (the op ``mamba3_scan`` of ssm_ref/ops.py) as PyTorch custom operators, a bridge
(ssm_torch/_bridge.py) of its declaration, as the scan's are: ``ssm_scan::mamba3_scan`` (forward)
and ``ssm_scan::mamba3_scan_back`` (its backward). Each takes the op's 15 inputs in the declared
order (None for an absent optional one), then the backend's name and the rotation. What is
Mamba-3's own is here: the rotation (its one keyword), its outputs' shapes and dtypes, which
backends compute it (the default backend), and CUDA tensors (backend="ssm_vk" only), which go to
ssm_torch/_cuda_mamba3.py (ssm_torch/cuda.py's arena).

Glossary (docs/SPEC.md, ssm_ref's mamba3 module): S sequences, T tokens, H heads, P channels per
head, N state size, G groups, M MIMO rank, F rotated pairs, R cache rows. B.ndim == 4 is SISO,
B.ndim == 5 MIMO (a rank axis on B, C, the biases, y, and the k and v states).
"""

from __future__ import annotations

import torch

from ssm_ref import bridging
from ssm_ref.mamba3_checks import output_shapes
from ssm_ref.ops import MAMBA3

from . import _common
from ._bridge import Bridge, backend_module, cuda_module

__all__ = ["check", "computes", "default_backend", "scan", "scan_back"]


# (run, not traced, under torch.compile: importing a backend is no part of a graph)
@torch.compiler.assume_constant_result
def computes(backend: str) -> bool:
    """Whether the backend module named ``backend`` has the op's forward and backward."""
    return bridging.computes(MAMBA3, backend_module(backend))


@torch.compiler.assume_constant_result
def default_backend() -> str:
    """ssm_fast where it computes the op, else ssm_ref (the scan's default is ssm_fast)."""
    return bridging.default_backend(MAMBA3, backend_module)


def check(inputs: tuple, rotation: str) -> None:
    """The declared validator on the tensors' shapes and dtypes (and the ids' values when they are
    real): the backends' errors, before any data is touched; under torch.compile, while tracing."""
    *floats, ids = inputs
    MAMBA3.check_forward(*map(_common.standin, floats), _common.ids_for_check(ids), rotation=rotation)


_SHAPED_BY = tuple(MAMBA3.input_names.index(n) for n in ("x", "B", "dtheta"))


def _shapes(inputs, statics) -> tuple:
    check(inputs, statics[1])
    return output_shapes(*(inputs[i].shape for i in _SHAPED_BY))


def _on_cuda(backend: str):
    """ssm_torch/_cuda_mamba3.py, for backend="ssm_vk" (the other backends refused as the scan's)."""
    cuda_module(backend)
    from . import _cuda_mamba3

    return _cuda_mamba3


class _Cuda:
    """The operators on CUDA tensors (backend="ssm_vk" only): ssm_torch/_cuda_mamba3.py."""

    @staticmethod
    def forward(inputs, statics):
        backend, rotation = statics
        return _on_cuda(backend).forward(inputs, rotation, _BRIDGE.dtypes(inputs))

    @staticmethod
    def backward(inputs, cotangents, statics):
        backend, rotation = statics
        return _on_cuda(backend).backward(inputs, cotangents, rotation)


# y in x's dtype; each final state in its start state's when the states are given, else theta in
# dtheta's, h and v in x's, k in B's
_BRIDGE = Bridge(MAMBA3, "mamba3_scan", (("backend", "str"), ("rotation", "str")),
                 keywords=lambda statics: {"rotation": statics[1]}, shapes=_shapes,
                 like={"y": "x", "theta": "dtheta", "h": "x", "k": "B", "v": "x"}, fresh=True, device=_Cuda)
scan, scan_back = _BRIDGE.forward, _BRIDGE.backward
