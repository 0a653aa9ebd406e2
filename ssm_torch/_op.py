"""The scan as PyTorch custom operators, two bridges (ssm_torch/_bridge.py) of its declaration
(ssm_ref.ops.SCAN): ``ssm_scan::scan`` (forward) and ``ssm_scan::scan_back`` (its backward), and
``ssm_scan::scan_snapshots`` / ``ssm_scan::scan_snapshots_back``, the same with K state snapshots
(``snapshots=K``, docs/SPEC.md section 3.1). The snapshot pair is a pair of its own because an
operator's schema fixes the number of its outputs: the pair without snapshots stays the two
outputs it always had, and never passes ``snapshots`` to a backend.

Each operator takes the scan's inputs in the declared order, then the backend's name, the step's
form as ssm_torch/_common.py encodes it (the invariant mode riding on it) and, for the snapshot
pair, K. What is the scan's own is here: those keywords, its outputs' shapes (the fake
implementation checks the shapes as the backends do), and CUDA tensors (backend="ssm_vk" only),
which go to ssm_torch/cuda.py: memory shared with the Vulkan device on the GPU, no copy through
the host.

Glossary: N d_state · P head_dim · H n_head · G n_group · T tokens · S sequences · R cache rows ·
K snapshots.
"""

from __future__ import annotations

import ssm_ref
from ssm_ref.ops import SCAN

from ._bridge import Bridge, cuda_module
from ._common import backend_kwargs, check_shapes, decode

__all__ = ["scan", "scan_back", "scan_snapshots", "scan_snapshots_back"]


class _Cuda:
    """The operators on CUDA tensors: ssm_torch/cuda.py (K None and no snapshots' cotangent for
    the pair without snapshots; the backward's statics have no K)."""

    @staticmethod
    def forward(inputs, statics):
        backend, code, *K = statics
        return cuda_module(backend).forward(*inputs, code, K[0] if K else None)

    @staticmethod
    def backward(inputs, cotangents, statics):
        backend, code = statics
        return cuda_module(backend).backward(*inputs, *(*cotangents, None)[:3], code)


def _shapes(inputs, statics) -> tuple:
    """y (S,T,H,P), states (S,H,P,N) [, snapshots (K,S,H,P,N)], the inputs and the form checked
    as the backends check them."""
    _, code, *K = statics
    ssm_ref.check_dt_softplus(decode(code))
    d = check_shapes(inputs, snapshots=K[0] if K else 1)
    return ((d.S, d.T, d.H, d.P), (d.S, d.H, d.P, d.N), (d.K, d.S, d.H, d.P, d.N))[:2 + len(K)]


# y in x's dtype, the states (and the snapshots) in s's (the start state of the declared pair)
_STATICS = (("backend", "str"), ("dt_softplus", "str"))
_PARTS = {"keywords": backend_kwargs, "shapes": _shapes, "like": {"y": "x", "states": "x"}, "device": _Cuda}
_SCAN = Bridge(SCAN, "scan", _STATICS, **_PARTS)
_SNAPSHOTS = Bridge(SCAN, "scan_snapshots", _STATICS, forward_only=(("K", "int"),), extra=(("snapshots", "s"),),
                    **_PARTS)

scan, scan_back = _SCAN.forward, _SCAN.backward
scan_snapshots, scan_snapshots_back = _SNAPSHOTS.forward, _SNAPSHOTS.backward
