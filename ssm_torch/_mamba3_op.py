"""Mamba-3's scan (the op ``mamba3_scan`` of ssm_ref/ops.py) as PyTorch custom operators:
``ssm_scan::mamba3_scan`` (forward) and ``ssm_scan::mamba3_scan_back`` (its backward), registered
with ``torch.library`` -- a fake implementation each, for torch.compile and meta tensors, and
autograd for the forward through the backward -- the way ssm_torch/_op.py registers the scan.

Each call goes through the op's declaration: the backend module's functions are looked up by the
declared names (``op.name``, ``op.backward_name``), the inputs handed over in the declared order,
the gradients read by the declared names (``op.grad_of``). The tensors reach the backend as numpy
views when they are contiguous CPU tensors of the working dtype (float32; float64 on ssm_ref when
every float input is float64), and the backend's fresh results are wrapped without copying.

Glossary (docs/SPEC.md, ssm_ref's mamba3 module): S sequences, T tokens, H heads, P channels per
head, N state size, G groups, M MIMO rank, F rotated pairs, R cache rows. B.ndim == 4 is SISO,
B.ndim == 5 MIMO (a rank axis on B, C, the biases, y, and the k and v states).
"""

from __future__ import annotations

import threading

import numpy as np
import torch

import ssm_ref
import ssm_ref.ops
from ssm_ref.results import Where

from . import _common
from ._op import _host, _tensor, backend_module, work_dtype

__all__ = ["OP_NAME", "ROTATIONS", "computes", "default_backend", "op", "scan", "scan_back"]

OP_NAME = "mamba3_scan"
ROTATIONS = ("interleaved", "halved")
# The start state's four parts, in the declared order (s_theta, s_h, s_k, s_v), and the final
# state's (theta, h, k, v): the output each start state continues.
STATES = ("s_theta", "s_h", "s_k", "s_v")
FINALS = ("theta", "h", "k", "v")


def op() -> ssm_ref.ops.Op:
    """The op's declaration (ssm_ref/ops.py registers it when imported)."""
    return ssm_ref.ops.get(OP_NAME)


# (run, not traced, under torch.compile: importing a backend is no part of a graph)
@torch.compiler.assume_constant_result
def computes(backend: str) -> bool:
    """Whether the backend module named ``backend`` has the op's forward and backward."""
    mod = backend_module(backend)
    d = op()
    return callable(getattr(mod, d.name, None)) and callable(getattr(mod, d.backward_name, None))


@torch.compiler.assume_constant_result
def default_backend() -> str:
    """ssm_fast where it computes the op, else ssm_ref (the scan's default is ssm_fast)."""
    try:
        if computes("ssm_fast"):
            return "ssm_fast"
    except ImportError:   # (numba missing: ssm_fast cannot be imported)
        pass
    return "ssm_ref"


def _arrays(inputs: tuple, work: torch.dtype) -> list:
    """The 15 inputs as the backend takes them: float tensors as numpy arrays of the working dtype,
    ids as int64, None kept."""
    out = []
    for t in inputs:
        if t is None:
            out.append(None)
        elif t.dtype.is_floating_point:
            out.append(_host(t, work))
        else:
            out.append(t.detach().cpu().numpy())
    return out


def _fresh(a, inputs) -> np.ndarray:
    """A backend's result array, copied when it may share memory with an input (a result the
    backend handed back from its inputs as they were, e.g. the start state of T = 0): an
    operator's outputs must not alias its inputs."""
    a = np.asarray(a)
    if any(i is not None and np.may_share_memory(a, i) for i in inputs):
        return a.copy()
    return a


def _record(name: str, r, work: torch.dtype, backend: str) -> None:
    _common._LAST.value = Where(op=name, where=getattr(r, "where", "CPU"), backend=getattr(r, "backend", backend),
                                dtype=str(work).removeprefix("torch."))
    _common._LAST.seq = next(_common._SEQ)


def _grad(g, name: str):
    """A gradient of the backend's result by its declared name (a mapping or attributes)."""
    if isinstance(g, dict) or hasattr(g, "keys"):
        return g[name]
    return getattr(g, name)


def out_dtypes(x, B, dtheta, states) -> tuple:
    """The outputs' dtypes: y in x's; each final state in its start state's dtype when the states
    are given, else theta in dtheta's, h and v in x's, k in B's."""
    s_theta, s_h, s_k, s_v = states
    if s_theta is not None:
        return x.dtype, s_theta.dtype, s_h.dtype, s_k.dtype, s_v.dtype
    return x.dtype, dtheta.dtype, x.dtype, B.dtype, x.dtype


def out_shapes(x, B, dtheta) -> tuple:
    """(y, theta, h, k, v) shapes from the inputs' shapes."""
    S, T, H, P = x.shape
    N, F = B.shape[-1], dtheta.shape[-1]
    if B.dim() == 5:
        M = B.shape[2]
        return (S, T, M, H, P), (S, H, F), (S, H, P, N), (S, H, M, N), (S, H, M, P)
    return (S, T, H, P), (S, H, F), (S, H, P, N), (S, H, N), (S, H, P)


def check(inputs: tuple, rotation: str) -> None:
    """The declared validator on the tensors' shapes and dtypes (and the ids' values when they are
    real): the backends' errors, before any data is touched; under torch.compile, while tracing."""
    *floats, ids = inputs
    if ids is None:
        ids_ = None
    elif isinstance(ids, torch._subclasses.FakeTensor) or ids.device.type == "meta":
        ids_ = np.broadcast_to(np.zeros((), np.int64), tuple(ids.shape))
    else:
        ids_ = ids.detach().cpu().numpy()
    standins = [None if t is None else _common._standin(t) for t in floats]
    op().check_forward(*standins, ids_, rotation=rotation)


@torch.library.custom_op("ssm_scan::mamba3_scan", mutates_args=())
def scan(x: torch.Tensor, dt: torch.Tensor, dA: torch.Tensor, lam: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
         B_bias: torch.Tensor, C_bias: torch.Tensor, dtheta: torch.Tensor, psi: torch.Tensor | None,
         s_theta: torch.Tensor | None, s_h: torch.Tensor | None, s_k: torch.Tensor | None,
         s_v: torch.Tensor | None, ids: torch.Tensor | None, rotation: str, backend: str
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward: (y, theta, h, k, v) -- shapes as :func:`out_shapes`, dtypes as
    :func:`out_dtypes`."""
    inputs = (x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v, ids)
    d = op()
    work = work_dtype(backend, [t for t in inputs[:-1] if t is not None])
    arrays = _arrays(inputs, work)
    kw = {"rotation": rotation}
    if backend == "ssm_ref":
        kw["dtype"] = np.float64 if work == torch.float64 else np.float32
    r = getattr(backend_module(backend), d.name)(*arrays, **kw)
    _record(d.name, r, work, backend)
    dtypes = out_dtypes(x, B, dtheta, (s_theta, s_h, s_k, s_v))
    return tuple(_tensor(_fresh(getattr(r, n), arrays), t) for n, t in zip(("y", *FINALS), dtypes, strict=True))


@scan.register_fake
def _scan_fake(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v, ids, rotation, backend):
    inputs = (x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v, ids)
    check(inputs, rotation)
    shapes = out_shapes(x, B, dtheta)
    dtypes = out_dtypes(x, B, dtheta, (s_theta, s_h, s_k, s_v))
    return tuple(x.new_empty(s, dtype=t) for s, t in zip(shapes, dtypes, strict=True))


@torch.library.custom_op("ssm_scan::mamba3_scan_back", mutates_args=())
def scan_back(x: torch.Tensor, dt: torch.Tensor, dA: torch.Tensor, lam: torch.Tensor, B: torch.Tensor,
              C: torch.Tensor, B_bias: torch.Tensor, C_bias: torch.Tensor, dtheta: torch.Tensor,
              psi: torch.Tensor | None, s_theta: torch.Tensor | None, s_h: torch.Tensor | None,
              s_k: torch.Tensor | None, s_v: torch.Tensor | None, ids: torch.Tensor | None, g_y: torch.Tensor,
              g_theta: torch.Tensor, g_h: torch.Tensor, g_k: torch.Tensor, g_v: torch.Tensor, rotation: str,
              backend: str) -> list[torch.Tensor]:
    """The backward: the gradients of the 14 float inputs in the declared order, each in its
    input's dtype and shape (the states' cache-shaped: each sequence's start-state gradient
    scatter-added into row ids[i]); an empty tensor for an input that is None."""
    inputs = (x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v, ids)
    d = op()
    work = work_dtype(backend, [t for t in inputs[:-1] if t is not None])
    arrays = _arrays(inputs, work)
    cot = [_host(g, work) for g in (g_y, g_theta, g_h, g_k, g_v)]
    kw = {"rotation": rotation}
    if backend == "ssm_ref":
        kw["dtype"] = np.float64 if work == torch.float64 else np.float32
    g = getattr(backend_module(backend), d.backward_name)(*arrays, *cot, **kw)
    _record(d.backward_name, g, work, backend)
    out = []
    for name, t in zip(d.float_inputs, inputs[:-1], strict=True):
        out.append(x.new_empty(0) if t is None else _tensor(np.asarray(_grad(g, d.grad_of[name])), t.dtype))
    return out


@scan_back.register_fake
def _scan_back_fake(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v, ids, g_y, g_theta,
                    g_h, g_k, g_v, rotation, backend):
    floats = (x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v)
    return [x.new_empty(0) if t is None else torch.empty_like(t, memory_format=torch.contiguous_format)
            for t in floats]


def _setup_context(ctx, inputs, output):
    *tensors, rotation, backend = inputs
    ctx.present = tuple(t is not None for t in tensors)
    ctx.save_for_backward(*tensors)
    ctx.rotation, ctx.backend = rotation, backend
    ctx.caller = threading.get_ident()


def _backward(ctx, g_y, g_theta, g_h, g_k, g_v):
    inputs = ctx.saved_tensors
    x, B, dtheta = inputs[0], inputs[4], inputs[8]
    shapes = out_shapes(x, B, dtheta)
    dtypes = out_dtypes(x, B, dtheta, inputs[10:14])
    # autograd hands zeros for an output the loss does not use; None is handled the same way
    cot = [x.new_zeros(s, dtype=t) if g is None else g
           for g, s, t in zip((g_y, g_theta, g_h, g_k, g_v), shapes, dtypes, strict=True)]
    grads = scan_back(*inputs, *cot, ctx.rotation, ctx.backend)
    _common.for_caller(ctx)
    out = [g if present else None for g, present in zip(grads, ctx.present[:14], strict=True)]
    return (*out, None, None, None)


scan.register_autograd(_backward, setup_context=_setup_context)
