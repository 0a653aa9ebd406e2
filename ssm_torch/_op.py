"""The scan as PyTorch custom operators: ``ssm_scan::scan`` (forward) and ``ssm_scan::scan_back``
(its backward), and ``ssm_scan::scan_snapshots`` / ``ssm_scan::scan_snapshots_back``, the same
with K state snapshots (``snapshots=K``, docs/SPEC.md section 3.1), registered with
``torch.library`` -- a fake implementation each, for torch.compile and meta tensors, and autograd
for each forward through its backward. The snapshot pair is a pair of its own because an operator's
schema fixes the number of its outputs: the pair without snapshots stays the two outputs it always
had, and never passes ``snapshots`` to a backend.

Glossary: N d_state · P head_dim · H n_head · G n_group · T tokens · S sequences · R cache rows.

The implementations hand CPU tensors to a numpy backend (ssm_fast, ssm_vk or ssm_ref) as numpy
views without copying when they are contiguous and of the working dtype (float32; float64 on
ssm_ref when every float input is float64), and wrap the backend's fresh result arrays as tensors
without copying. The backends never write their inputs, so the caller's tensors are never written.
CUDA tensors (backend="ssm_vk" only) go to ssm_torch/cuda.py: memory shared with the Vulkan device
on the GPU, no copy through the host.
"""

from __future__ import annotations

import importlib
import threading

import numpy as np
import torch

import ssm_ref
import ssm_ref.checks
from ssm_ref.backend_names import BACKENDS, refusal
from ssm_ref.results import Where  # one type for both bridges (ssm_jax's last_where too)

from ._common import backend_kwargs as _backend_kwargs
from ._common import check_shapes, last_where
from ._common import decode as _decode
from ._common import for_caller as _for_caller
from ._common import record as _record

__all__ = ["BACKENDS", "Where", "backend_module", "last_where", "scan", "scan_back", "scan_snapshots",
           "scan_snapshots_back"]


def backend_module(backend: str):
    """The backend module named ``backend`` (one of BACKENDS: the module name the entry points
    resolved), imported on first use."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: {refusal(backend)}")
    return importlib.import_module(backend)


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def work_dtype(backend: str, tensors) -> torch.dtype:
    """float64 when the backend is ssm_ref and every float input is float64, else float32."""
    if backend == "ssm_ref" and all(t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def _host(t: torch.Tensor, work: torch.dtype) -> np.ndarray:
    """``t`` as a numpy array of ``work``'s dtype: a view when it is contiguous of that dtype, a
    converted copy otherwise (never written either way)."""
    t = t.detach()
    if t.dtype != work and t.dtype in _FLOATS:
        t = t.to(work)
    return t.contiguous().numpy()


def _tensor(a, dtype: torch.dtype) -> torch.Tensor:
    """A backend's fresh result as a tensor of ``dtype`` (no copy when the dtype is already right)."""
    if not isinstance(a, np.ndarray):  # a DeviceArray (never for host inputs, but be safe)
        a = a.numpy()
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if t.dtype == dtype else t.to(dtype)


def _cuda(backend: str):
    """ssm_torch.cuda, which runs the operators on CUDA tensors (backend="ssm_vk" only: the other
    backends compute from host memory)."""
    if backend != "ssm_vk":
        raise ValueError(f"CUDA tensors: backend={backend!r} computes from host memory; use backend='ssm_vk' "
                         "(docs/TORCH.md) or move the tensors with .cpu()")
    from . import cuda

    return cuda


def _forward(s, x, dt, A, B, C, ids, backend: str, dt_softplus: str, K: int | None):
    """The backend's forward on the tensors: its ScanResult. ``K`` None: no ``snapshots`` keyword
    (the call of the operator without snapshots); else ``snapshots=K``."""
    mod = backend_module(backend)
    work = work_dtype(backend, (s, x, dt, A, B, C))
    kw = _backend_kwargs(backend, dt_softplus, work)
    if K is not None:
        kw["snapshots"] = K
    ids_ = None if ids is None else ids.detach().cpu().numpy()
    r = mod.ssm_scan(*(_host(t, work) for t in (s, x, dt, A, B, C)), ids_, **kw)
    _record("ssm_scan", r, work)
    return r


def _backward_grads(s, x, dt, A, B, C, ids, g_y, g_states, g_snapshots, backend: str, dt_softplus: str):
    """The backend's backward on the tensors: (d_s, d_x, d_dt, d_A, d_B, d_C), each in its input's
    dtype. ``g_snapshots`` None: no ``g_snapshots`` keyword."""
    mod = backend_module(backend)
    work = work_dtype(backend, (s, x, dt, A, B, C))
    kw = _backend_kwargs(backend, dt_softplus, work)
    if g_snapshots is not None:
        kw["g_snapshots"] = _host(g_snapshots, work)
    ids_ = None if ids is None else ids.detach().cpu().numpy()
    g = mod.ssm_scan_back(*(_host(t, work) for t in (s, x, dt, A, B, C)), ids_, _host(g_y, work),
                          _host(g_states, work), **kw)
    _record("ssm_scan_back", g, work)
    return tuple(_tensor(getattr(g, "d_" + n), t.dtype) for n, t in zip("s x dt A B C".split(), (s, x, dt, A, B, C),
                                                                          strict=True))


@torch.library.custom_op("ssm_scan::scan", mutates_args=())
def scan(s: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
         ids: torch.Tensor | None, backend: str, dt_softplus: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward: (y (S,T,H,P) in x's dtype, states (S,H,P,N) in s's dtype)."""
    if x.device.type == "cuda":
        return _cuda(backend).forward(s, x, dt, A, B, C, ids, dt_softplus, None)
    r = _forward(s, x, dt, A, B, C, ids, backend, dt_softplus, None)
    return _tensor(r.y, x.dtype), _tensor(r.states, s.dtype)


@scan.register_fake
def _scan_fake(s, x, dt, A, B, C, ids, backend, dt_softplus):
    ssm_ref.check_dt_softplus(_decode(dt_softplus))
    d = check_shapes(s, x, dt, A, B, C, ids)
    return x.new_empty((d.S, d.T, d.H, d.P)), s.new_empty((d.S, d.H, d.P, d.N))


@torch.library.custom_op("ssm_scan::scan_back", mutates_args=())
def scan_back(s: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
              C: torch.Tensor, ids: torch.Tensor | None, g_y: torch.Tensor, g_states: torch.Tensor, backend: str,
              dt_softplus: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                         torch.Tensor]:
    """The backward: (d_s, d_x, d_dt, d_A, d_B, d_C), each in its input's dtype and shape."""
    if x.device.type == "cuda":
        return _cuda(backend).backward(s, x, dt, A, B, C, ids, g_y, g_states, None, dt_softplus)
    return _backward_grads(s, x, dt, A, B, C, ids, g_y, g_states, None, backend, dt_softplus)


@scan_back.register_fake
def _scan_back_fake(s, x, dt, A, B, C, ids, g_y, g_states, backend, dt_softplus):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (s, x, dt, A, B, C))


@torch.library.custom_op("ssm_scan::scan_snapshots", mutates_args=())
def scan_snapshots(s: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, ids: torch.Tensor | None, backend: str, dt_softplus: str,
                   K: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward with K state snapshots: (y (S,T,H,P) in x's dtype, states (S,H,P,N) and
    snapshots (K,S,H,P,N) in s's dtype; slot k the state after T - k tokens, slots k > T NaN)."""
    if x.device.type == "cuda":
        return _cuda(backend).forward(s, x, dt, A, B, C, ids, dt_softplus, K)
    r = _forward(s, x, dt, A, B, C, ids, backend, dt_softplus, K)
    return _tensor(r.y, x.dtype), _tensor(r.states, s.dtype), _tensor(r.snapshots, s.dtype)


@scan_snapshots.register_fake
def _scan_snapshots_fake(s, x, dt, A, B, C, ids, backend, dt_softplus, K):
    ssm_ref.check_dt_softplus(_decode(dt_softplus))
    d = check_shapes(s, x, dt, A, B, C, ids, snapshots=K)
    return (x.new_empty((d.S, d.T, d.H, d.P)), s.new_empty((d.S, d.H, d.P, d.N)),
            s.new_empty((d.K, d.S, d.H, d.P, d.N)))


@torch.library.custom_op("ssm_scan::scan_snapshots_back", mutates_args=())
def scan_snapshots_back(s: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                        C: torch.Tensor, ids: torch.Tensor | None, g_y: torch.Tensor, g_states: torch.Tensor,
                        g_snapshots: torch.Tensor, backend: str, dt_softplus: str
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of :func:`scan_snapshots` (g_snapshots (K,S,H,P,N); its slots k > T are
    ignored by the backend): (d_s, d_x, d_dt, d_A, d_B, d_C), each in its input's dtype and shape."""
    if x.device.type == "cuda":
        return _cuda(backend).backward(s, x, dt, A, B, C, ids, g_y, g_states, g_snapshots, dt_softplus)
    return _backward_grads(s, x, dt, A, B, C, ids, g_y, g_states, g_snapshots, backend, dt_softplus)


@scan_snapshots_back.register_fake
def _scan_snapshots_back_fake(s, x, dt, A, B, C, ids, g_y, g_states, g_snapshots, backend, dt_softplus):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (s, x, dt, A, B, C))


def _setup_context(ctx, inputs, output):
    s, x, dt, A, B, C, ids, backend, dt_softplus, *K = inputs
    ctx.save_for_backward(s, x, dt, A, B, C, ids)
    ctx.backend, ctx.dt_softplus = backend, dt_softplus
    ctx.K = K[0] if K else None
    ctx.caller = threading.get_ident()


def _zeros_for(ctx, g_y, g_states):
    """The saved inputs and the outputs' gradients, None made zeros: autograd hands zeros for an
    output the loss does not use (materialized grads); None is handled the same way should that
    ever change."""
    s, x, dt, A, B, C, ids = ctx.saved_tensors
    S, T, H, P = x.shape
    if g_y is None:
        g_y = x.new_zeros((S, T, H, P))
    if g_states is None:
        g_states = s.new_zeros((S, H, P, s.shape[3]))
    return (s, x, dt, A, B, C, ids), g_y, g_states


def _backward(ctx, g_y, g_states):
    inputs, g_y, g_states = _zeros_for(ctx, g_y, g_states)
    grads = scan_back(*inputs, g_y, g_states, ctx.backend, ctx.dt_softplus)
    _for_caller(ctx)
    return (*grads, None, None, None)


def _backward_snapshots(ctx, g_y, g_states, g_snapshots):
    inputs, g_y, g_states = _zeros_for(ctx, g_y, g_states)
    if g_snapshots is None:
        s, x = inputs[0], inputs[1]
        g_snapshots = s.new_zeros((ctx.K, x.shape[0], x.shape[2], x.shape[3], s.shape[3]))
    grads = scan_snapshots_back(*inputs, g_y, g_states, g_snapshots, ctx.backend, ctx.dt_softplus)
    _for_caller(ctx)
    return (*grads, None, None, None, None)


scan.register_autograd(_backward, setup_context=_setup_context)
scan_snapshots.register_autograd(_backward_snapshots, setup_context=_setup_context)
