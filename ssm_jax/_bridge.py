"""One mechanism for every op of ssm_ref/ops.py as a differentiable JAX function, driven by the
op's declaration (its inputs, outputs and gradients are read there, not restated): a
:class:`Bridge` computes the op through one ``jax.custom_vjp`` whose forward and backward are
``jax.pure_callback`` calls of a numpy backend on the host -- the backend's functions found by the
declared names, the inputs handed over in the declared order, the gradients read by their
declared names (``op.grad_of``). It works under ``jax.jit``, ``jax.grad`` / ``jax.vjp`` and
``jax.vmap`` (a vmapped call runs the backend once per batch element). The scan (ssm_jax/__init__.py)
and Mamba-3's scan (ssm_jax/_mamba3.py) are bridges; what each adds is its own: its static
arguments and the backend keywords they make, its outputs' shapes, the scan's snapshots.

Also here, for both: the record of the last backend call (``last_where``) and the stand-ins on
which the declared validators check arrays and tracers before any work.
"""

from __future__ import annotations

import functools
import importlib
import threading

import jax
import jax.numpy as jnp
import numpy as np

from ssm_ref.bridging import BridgeLayout, module_name
from ssm_ref.results import Where

__all__ = ["Bridge", "backend_module", "ids_for_check", "last_where", "standin"]

_LOCK = threading.Lock()
# the fields of the last call's Where, made when asked for (one slot: replaced whole, read under the lock)
_LAST: list = [None]


def last_where() -> Where | None:
    """The :class:`ssm_ref.Where` (op, where, backend, dtype) of the last call of a backend in
    this process (callbacks may run on another thread), or None before the first. The type
    ssm_torch.last_where returns."""
    with _LOCK:
        last = _LAST[0]
    return None if last is None else Where(*last)


def _record(op: str, r, work: np.dtype, backend: str) -> None:
    """The last call: ``op`` by the backend whose result is ``r`` (``backend`` when it names none)."""
    last = (op, getattr(r, "where", "CPU"), getattr(r, "backend", backend), work.name)
    with _LOCK:
        _LAST[0] = last


_MODULES: dict = {}


def backend_module(backend: str):
    """The module of ``backend`` (a name ssm_ref.bridging.module_name takes), on first use imported."""
    mod = _MODULES.get(backend)
    if mod is None:
        mod = _MODULES[backend] = importlib.import_module(module_name(backend))
    return mod


def standin(a) -> np.ndarray | None:
    """A zero-stride numpy array of ``a``'s shape that a validator judges as an array of its dtype
    (bfloat16 and JAX's other extra floats as float32); None for None."""
    if a is None:
        return None
    dt = np.dtype(jnp.result_type(a))
    if jnp.issubdtype(dt, jnp.floating) and dt not in (np.float16, np.float32, np.float64):
        dt = np.dtype(np.float32)
    return np.broadcast_to(np.zeros((), dt), tuple(jnp.shape(a)))


def ids_for_check(ids):
    """``ids`` as a validator takes them: their values where they are concrete, a stand-in of their
    shape and dtype under a trace (their values are checked when the call runs)."""
    if ids is None:
        return None
    try:
        return np.asarray(ids)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return standin(ids)


class Bridge(BridgeLayout):
    """An op as a differentiable JAX function: ``bridge(inputs, statics)``.

    op: the declaration (ssm_ref.ops.Op); like and extra: as ssm_ref.bridging.BridgeLayout reads
    them (the input whose dtype each output takes; the outputs beyond the declared ones, whose
    cotangents reach the backend's backward as ``g_<output>`` keywords). keywords(statics) -> the
    backend call's keywords from the static arguments (hashable, the backend's name first; the
    backward's have no ``forward_only`` ones, the last of them: the scan's K; ssm_ref's working
    dtype is added here). shapes(inputs, statics) -> the outputs' shapes.
    """

    def __init__(self, op, *, keywords, shapes, like: dict, forward_only: int = 0, extra: tuple = ()):
        super().__init__(op, like, extra)
        self.keywords, self.shapes, self.forward_only = keywords, shapes, forward_only

    def __call__(self, inputs: tuple, statics: tuple) -> tuple:
        """The op's outputs (declared, then extra), each in its dtype (``like``). ``inputs``: the
        op's, in the declared order, arrays (checked already) or None for an absent optional one.
        Computed in float32 (float64 on ssm_ref when every float input is float64, x64 enabled)."""
        arrays = [None if a is None else jnp.asarray(a) for a in inputs]
        f64 = statics[0] == "ssm_ref" and all(arrays[i] is None or arrays[i].dtype == jnp.float64
                                              for i in self.floats)
        work = np.dtype(np.float64 if f64 else np.float32)
        cast = (None if a is None else a.astype(work) if f else a.astype(jnp.int32)
                for a, f in zip(arrays, self.is_float, strict=True))
        out = _primitive(self, statics, work, *cast)
        return tuple(o.astype(d) for o, d in zip(out, self.dtypes(arrays), strict=True))

    def _keywords(self, statics, work: np.dtype) -> dict:
        kw = self.keywords(statics)
        if statics[0] == "ssm_ref":
            kw["dtype"] = work
        return kw

    def _forward(self, statics, work, inputs):
        structs = tuple(jax.ShapeDtypeStruct(s, work) for s in self.shapes(inputs, statics))
        kw, backend, name, outputs = self._keywords(statics, work), statics[0], self.op.name, self.outputs
        given = tuple(i for i, a in enumerate(inputs) if a is not None)
        n = self.n_inputs

        def host(*arrays):
            args = [None] * n
            for i, a in zip(given, arrays, strict=True):
                args[i] = np.asarray(a)
            r = getattr(backend_module(backend), name)(*args, **kw)
            _record(name, r, work, backend)
            return tuple(np.asarray(getattr(r, o), work) for o in outputs)

        return jax.pure_callback(host, structs, *(inputs[i] for i in given), vmap_method="sequential")

    def _backward(self, statics, work, inputs, cotangents):
        statics = statics[:len(statics) - self.forward_only]
        kw, backend, name = self._keywords(statics, work), statics[0], self.op.backward_name
        given = tuple(i for i, a in enumerate(inputs) if a is not None)
        grads = tuple((i, g) for i, g in zip(self.floats, self.grads, strict=True) if inputs[i] is not None)
        structs = tuple(jax.ShapeDtypeStruct(inputs[i].shape, work) for i, _ in grads)
        n, k, m, extra = self.n_inputs, len(given), self.n_declared, self.extra_keywords

        def host(*arrays):
            args = [None] * n
            for i, a in zip(given, arrays[:k], strict=True):
                args[i] = np.asarray(a)
            cot = [np.asarray(c) for c in arrays[k:]]
            g = getattr(backend_module(backend), name)(*args, *cot[:m], **kw, **dict(zip(extra, cot[m:], strict=True)))
            _record(name, g, work, backend)
            return tuple(np.asarray(getattr(g, d), work) for _, d in grads)

        out = jax.pure_callback(host, structs, *(inputs[i] for i in given), *(c.astype(work) for c in cotangents),
                                vmap_method="sequential")
        result = [None] * n   # (index inputs and absent ones: no cotangent)
        for (i, _), g in zip(grads, out, strict=True):
            result[i] = g
        return tuple(result)


# The bridge, its static arguments and the working dtype are static; absent inputs are None.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _primitive(bridge, statics, work, *inputs):
    return bridge._forward(statics, work, inputs)


def _fwd(bridge, statics, work, *inputs):
    return bridge._forward(statics, work, inputs), inputs


def _bwd(bridge, statics, work, inputs, cotangents):
    return bridge._backward(statics, work, inputs, cotangents)


_primitive.defvjp(_fwd, _bwd)
