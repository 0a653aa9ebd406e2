"""One mechanism for every op of ssm_ref/ops.py as PyTorch custom operators, driven by the op's
declaration (its inputs, outputs and gradients are read there, not restated): a :class:`Bridge`
registers ``ssm_scan::<name>`` (the forward) and ``ssm_scan::<name>_back`` (its backward) with
``torch.library`` -- their schemas made from the declared inputs, a fake implementation each (for
torch.compile and meta tensors), and autograd for the forward through the backward. The scan's
operators (ssm_torch/_op.py) and Mamba-3's (ssm_torch/_mamba3_op.py) are bridges; what each adds
is its own: its static arguments and the backend keywords they make, its outputs' shapes, and the
scan's extra output (snapshots) and CUDA-tensor path.

An operator takes the op's inputs in the declared order (None for an absent optional one), then
its static arguments, the backend's name first. The tensors reach the backend as numpy views
without copying when they are contiguous CPU tensors of the working dtype (float32; float64 on
ssm_ref when every float input is float64); the backend's fresh results are wrapped as tensors
without copying, and its gradients are read by their declared names (``op.grad_of``), each in its
input's dtype. The backends never write their inputs, so the caller's tensors are never written.
"""

from __future__ import annotations

import functools
import importlib
import operator
import threading

import numpy as np
import torch

from ssm_ref.bridging import BridgeLayout, module_name

from . import _common

__all__ = ["Bridge", "backend_module", "cuda_module", "work_dtype"]


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


_MODULES: dict = {}   # (a dict look-up per call instead of the import machinery's)


def backend_module(backend: str):
    """The backend module named ``backend``, imported on first use (ValueError for another name)."""
    mod = _MODULES.get(backend)
    if mod is None:
        mod = _MODULES[backend] = importlib.import_module(module_name(backend))
    return mod


def cuda_module(backend: str):
    """ssm_torch.cuda, which runs the operators on CUDA tensors (backend="ssm_vk" only: the other
    backends compute from host memory)."""
    if backend != "ssm_vk":
        raise ValueError(f"CUDA tensors: backend={backend!r} computes from host memory; use backend='ssm_vk' "
                         "(docs/TORCH.md) or move the tensors with .cpu()")
    from . import cuda

    return cuda


def work_dtype(backend: str, tensors) -> torch.dtype:
    """float64 when the backend is ssm_ref and every float input given (not None) is float64,
    else float32."""
    if backend == "ssm_ref" and all(t is None or t.dtype == torch.float64 for t in tensors):
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


def _fresh(a, arrays) -> np.ndarray:
    """A backend's result array, copied when it may share memory with an input (a result handed
    back from the inputs as they were, e.g. Mamba-3's start state when T = 0): an operator's
    outputs must not alias its inputs."""
    a = np.asarray(a)
    if any(i is not None and np.may_share_memory(a, i) for i in arrays):
        return a.copy()
    return a


_is_none = functools.partial(operator.is_, None)


def _schema(params, returns: str) -> str:
    return "(" + ", ".join(f"{kind} {name}" for name, kind in params) + ") -> " + returns


def _tensors(n: int) -> str:
    return "(" + ", ".join(["Tensor"] * n) + ")"   # (a fixed count: cheaper to return than Tensor[])


class Bridge(BridgeLayout):
    """An op's forward and backward as the custom operators ``ssm_scan::<name>`` (:attr:`forward`)
    and ``ssm_scan::<name>_back`` (:attr:`backward`), differentiable through the backward.

    op: the declaration (ssm_ref.ops.Op); like and extra: as ssm_ref.bridging.BridgeLayout reads
    them (the input whose dtype each output takes; the outputs beyond the declared ones, whose
    cotangents reach the backend's backward as ``g_<output>`` keywords). statics: ((name, schema
    type), ...), both operators' arguments after the inputs (the backward's after the
    cotangents), ("backend", "str") first. forward_only: the forward's arguments after those (the
    scan's K). keywords(statics) -> the backend call's keywords from the operator's static
    arguments (the backward's have no forward_only ones; ssm_ref's working dtype is added here).
    shapes(inputs, statics) -> the outputs' shapes, the op's validator run first (the fake
    implementation; a cotangent autograd left None). device: None, or an object whose
    ``forward(inputs, statics)`` and ``backward(inputs, cotangents, statics)`` compute on CUDA
    tensors (the scan's ssm_vk path). fresh: copy a result that may share memory with an input.

    The forward returns the outputs (declared, then extra); the backward the float inputs'
    gradients in the declared order (an empty tensor for an input that is None).
    """

    def __init__(self, op, name: str, statics: tuple, *, keywords, shapes, like: dict, forward_only: tuple = (),
                 extra: tuple = (), device=None, fresh: bool = False):
        super().__init__(op, like, extra)
        self.keywords, self.shapes, self.device, self.fresh = keywords, shapes, device, fresh
        self._n_back = len(statics)   # the static arguments the backward takes
        self._results = operator.attrgetter(*self.outputs)   # a forward's outputs, by name (two or more)
        # autograd's gradients: the backward's, then None for the index inputs and the static
        # arguments; None too for an optional input that is absent
        if self.floats != tuple(range(len(self.floats))):
            raise ValueError(f"op {op.name!r}: its float inputs must lead its index inputs")
        self._tail = (None,) * (self.n_inputs - len(self.floats) + len(statics) + len(forward_only))
        self._optional = tuple(i for i in self.floats if op.inputs[i].optional)

        ins = [(a.name, "Tensor?" if a.optional else "Tensor") for a in op.inputs]
        cots = [("g_" + o, "Tensor") for o in self.outputs]
        lib = "ssm_scan::" + name
        self.forward = torch.library.custom_op(lib, self._forward, mutates_args=(), schema=_schema(
            ins + list(statics) + list(forward_only), _tensors(len(self.outputs))))
        self.backward = torch.library.custom_op(lib + "_back", self._backward, mutates_args=(), schema=_schema(
            ins + cots + list(statics), _tensors(len(self.floats))))
        self.forward.register_fake(self._forward_fake)
        self.backward.register_fake(self._backward_fake)
        self.forward.register_autograd(self._autograd, setup_context=self._setup_context)

    def _call(self, inputs, statics):
        """The backend's module, the working dtype, the inputs as the backend takes them, and the
        call's keywords."""
        backend = statics[0]
        kw = self.keywords(statics)
        work = torch.float32
        if backend == "ssm_ref":   # (float64 where every float input is)
            work = work_dtype(backend, inputs[:len(self.floats)])
            kw["dtype"] = np.float64 if work == torch.float64 else np.float32
        arrays = [None if t is None else _host(t, work) if f else t.detach().cpu().numpy()
                  for t, f in zip(inputs, self.is_float, strict=True)]
        return backend_module(backend), work, arrays, kw

    def _forward(self, *args):
        n = self.n_inputs
        inputs, statics = args[:n], args[n:]
        if self.device is not None and inputs[self.anchor].device.type == "cuda":
            return self.device.forward(inputs, statics)
        mod, work, arrays, kw = self._call(inputs, statics)
        name = self.op.name
        r = getattr(mod, name)(*arrays, **kw)
        _common.record(name, r, work, statics[0])
        outs = self._results(r)
        if self.fresh:
            outs = [_fresh(a, arrays) for a in outs]
        return tuple(map(_tensor, outs, self.dtypes(inputs)))

    def _forward_fake(self, *args):
        inputs, statics = args[:self.n_inputs], args[self.n_inputs:]
        x = inputs[self.anchor]
        return tuple(x.new_empty(s, dtype=d)
                     for s, d in zip(self.shapes(inputs, statics), self.dtypes(inputs), strict=True))

    def _backward(self, *args):
        n = self.n_inputs
        m = n + len(self.outputs)
        inputs, cots, statics = args[:n], args[n:m], args[m:]
        if self.device is not None and inputs[self.anchor].device.type == "cuda":
            return self.device.backward(inputs, cots, statics)
        mod, work, arrays, kw = self._call(inputs, statics)
        k = self.n_declared
        for key, c in zip(self.extra_keywords, cots[k:], strict=True):
            kw[key] = _host(c, work)
        name = self.op.backward_name
        g = getattr(mod, name)(*arrays, *(_host(c, work) for c in cots[:k]), **kw)
        _common.record(name, g, work, statics[0])
        empty = inputs[self.anchor].new_empty
        return tuple([empty(0) if inputs[i] is None else _tensor(getattr(g, d), inputs[i].dtype)
                      for i, d in zip(self.floats, self.grads, strict=True)])

    def _backward_fake(self, *args):
        inputs = args[:self.n_inputs]
        empty = inputs[self.anchor].new_empty
        fmt = torch.contiguous_format
        return tuple(empty(0) if inputs[i] is None else torch.empty_like(inputs[i], memory_format=fmt)
                     for i in self.floats)

    def _setup_context(self, ctx, inputs, output):
        ctx.save_for_backward(*inputs[:self.n_inputs])
        ctx.statics = inputs[self.n_inputs:]
        ctx.caller = threading.get_ident()

    def _autograd(self, ctx, *cots):
        inputs = ctx.saved_tensors
        if any(map(_is_none, cots)):
            # autograd hands zeros for an output the loss does not use (materialized grads); None is
            # handled the same way should that ever change
            shapes = self.shapes(inputs, ctx.statics)
            x = inputs[self.anchor]
            cots = [x.new_zeros(s, dtype=d) if c is None else c
                    for c, s, d in zip(cots, shapes, self.dtypes(inputs), strict=True)]
        grads = self.backward(*inputs, *cots, *ctx.statics[:self._n_back])
        _common.for_caller(ctx)
        out = [*grads, *self._tail]
        for i in self._optional:
            if inputs[i] is None:
                out[i] = None
        return tuple(out)
