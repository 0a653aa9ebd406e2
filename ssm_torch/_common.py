"""What ssm_torch's operators (ssm_torch/_bridge.py, the scan's ssm_torch/_op.py, Mamba-3's
ssm_torch/_mamba3_op.py) and the scan's CUDA-tensor path (ssm_torch/cuda.py) share: the scan's step
form as its operators' schemas carry it (a string, the invariant mode riding on it) and the
keywords it makes, the stand-ins on which the declared validators check tensors before any data
is touched, and the record of each thread's last computation (``last_where``), whose state this
module owns.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import torch

import ssm_ref
import ssm_ref.checks
from ssm_ref.results import Where  # one type for both bridges (ssm_jax's last_where too)

__all__ = ["Where", "backend_kwargs", "check_shapes", "decode", "encode", "for_caller", "ids_for_check", "last_where",
           "record", "standin", "tensor_arg"]

# The custom op's schema has no Optional[str]: None travels as this name.
_NONE = "none"


# .value: this thread's last computation, the fields of its Where (made when asked for: a frozen
# dataclass costs a call about a microsecond to make); .seq: when (a number of _SEQ)
_LAST = threading.local()
_SEQ = itertools.count()
# Autograd runs the backward of CUDA tensors on a thread of its own (one per device): the thread
# that ran the forward still sees that backward as its last computation. thread id -> (seq, fields).
_BACKWARDS: dict = {}


def last_where() -> Where | None:
    """The :class:`Where` of this thread's last forward or backward computed by a backend (None
    before the first); a backward is this thread's when its forward was, whichever thread autograd
    ran it on (CUDA tensors: a device thread of autograd's). Set when the computation runs: under
    torch.compile when the compiled code runs, not when it is traced."""
    last = getattr(_LAST, "value", None)
    other = _BACKWARDS.get(threading.get_ident())
    if other is not None and other[0] > getattr(_LAST, "seq", -1):
        last = other[1]
    return None if last is None else Where(*last)


_INVARIANT = "+invariant"   # the invariant mode rides on the form's string (the ops' schemas stay as they are)


def encode(dt_softplus, invariant: bool = False) -> str:
    form = _NONE if dt_softplus is None else dt_softplus
    return form + _INVARIANT if invariant else form


def decode(dt_softplus: str):
    form = dt_softplus.removesuffix(_INVARIANT)
    return None if form == _NONE else form


def backend_kwargs(statics: tuple) -> dict:
    """The keywords of a scan call from its operator's static arguments (backend, the encoded form
    [, K]): the form, checked (every backend takes the three), ssm_vk's invariant mode when asked
    for, ``snapshots=K``."""
    code = statics[1]
    kw = {"dt_softplus": ssm_ref.check_dt_softplus(decode(code))}
    if statics[0] == "ssm_vk" and code.endswith(_INVARIANT):
        kw["invariant"] = True
    if len(statics) > 2:
        kw["snapshots"] = statics[2]
    return kw


# numpy dtypes of the stand-ins for the shared checker: the same kind (float, integer, bool,
# complex) as the tensor's, so that the checker says what it says of a numpy array of that kind
_NP_OF = {torch.float16: np.float16, torch.bfloat16: np.float32, torch.float32: np.float32,
          torch.float64: np.float64, torch.bool: np.bool_, torch.uint8: np.uint8, torch.int8: np.int8,
          torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64, torch.complex32: np.complex64,
          torch.complex64: np.complex64, torch.complex128: np.complex128}


def tensor_arg(name: str, t, optional: bool = False):
    """``t`` when it is a torch.Tensor (or None where ``optional``); else TypeError naming ``name``
    (the drop-ins' argument check)."""
    if t is None and optional:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    return t


def standin(t: torch.Tensor | None) -> np.ndarray | None:
    """A zero-stride numpy array of ``t``'s shape whose dtype the checker judges as ``t``'s (None
    for None)."""
    return None if t is None else np.broadcast_to(np.zeros((), _NP_OF.get(t.dtype, np.object_)), tuple(t.shape))


def ids_for_check(ids):
    """``ids`` as a validator takes them: their values where they are real, a stand-in of their
    shape where they are fake or meta (their values are unknown until the call runs)."""
    if ids is None:
        return None
    if isinstance(ids, torch._subclasses.FakeTensor) or ids.device.type == "meta":
        return np.broadcast_to(np.zeros((), np.int64), tuple(ids.shape))
    return ids.detach().cpu().numpy()


def check_shapes(inputs, snapshots=1) -> ssm_ref.Dims:
    """The scan's checker on the tensors' shapes and dtypes (and the ids' values when they are
    real): the backends' errors, before any data is touched. ``inputs``: the scan's, in the
    declared order; ``s`` None: zero start states, as the backends take it (ids must then be
    None). ``snapshots``: K, checked and kept as dims.K."""
    *floats, ids = inputs
    return ssm_ref.checks.check_shapes(*map(standin, floats), ids_for_check(ids), snapshots=snapshots)


_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64"}


def record(op: str, r, work: torch.dtype, backend: str | None = None) -> None:
    """This thread's last computation: ``op`` by the backend whose result is ``r`` (``backend``
    when the result names none), in ``work``."""
    _LAST.value = (op, getattr(r, "where", "CPU"), getattr(r, "backend", backend), _DTYPE_NAMES[work])
    _LAST.seq = next(_SEQ)


def for_caller(ctx) -> None:
    """A backward autograd ran on another thread than its forward's: record it for that thread
    too (last_where)."""
    caller = ctx.caller
    if caller != threading.get_ident() and getattr(_LAST, "value", None) is not None:
        _BACKWARDS[caller] = (_LAST.seq, _LAST.value)
