"""ssm_vk's argument checks: ssm_ref's validator, and a shortcut for device-resident calls that repeat.

A training loop calls ssm_scan / ssm_scan_back with float32 DeviceArrays of the same shapes every
step. With ``keep_device`` the validator checks device arrays by shape and dtype and converts
none, so every one of its checks but the ids' values and the host memory rule is a function of
the arguments' shapes and dtypes alone. :func:`check_forward` / :func:`check_backward` therefore
look such a call up by its shapes (``_PASSED``: the Dims of shapes that passed the validator
before, in this process) and on a hit run only what can still fail, in the validator's order:
the ids (``ssm_ref.checks.check_ids``, which raises as the validator does) and the host memory
rule. Anything else -- a miss, a host array, another dtype, a memory rule that fails -- goes to
``ssm_ref.check_forward`` / ``check_backward``, which raise exactly as always. The shortcut saves
about 130 k CPU instructions of a forward call and 150 k of a backward call that misses its kept replay
(docs/BENCHMARKS.md).

The prepared calls that plain calls keep for their repeats (replay_cache.py, replay.Replay) key a call
by more than its shapes (the buffers, the knobs) and take :func:`problem` directly.
"""

from __future__ import annotations

import numpy as np

from ssm_ref.checks import Dims, Problem, arange_ids, check_ids, split_g_y
from ssm_ref.checks import check_backward as ref_check_backward
from ssm_ref.checks import check_forward as ref_check_forward
from ssm_ref.memory import host_memory_bytes

from .arrays import DeviceArray

__all__ = ["check_backward", "check_forward", "frozen_result", "problem"]

_F32 = np.dtype(np.float32)
_I64 = np.dtype(np.int64)

_PASSED: dict[tuple, Dims] = {}   # (what, the float arguments' shapes) -> the Dims the validator gave them
_PASSED_MAX = 256
_FORWARD, _BACKWARD, _BACKWARD_PACKED = ("forward",), ("backward", False), ("backward", True)
_BACKWARD_SNAPSHOTS = ("backward", "g_snapshots")   # g_snapshots' shape (its K) is in the key


def _key(what: tuple, arrays: tuple) -> tuple | None:
    """``what`` and the shapes of ``arrays`` when each is a float32 DeviceArray, else None."""
    key = list(what)
    for a in arrays:
        if type(a) is not DeviceArray or a.dtype is not _F32:
            return None
        key.append(a.shape)
    return tuple(key)


def _passed(key: tuple, dims: Dims) -> None:
    if len(_PASSED) >= _PASSED_MAX:
        _PASSED.clear()
    _PASSED[key] = dims


def _known(key: tuple | None, arrays: tuple, ids) -> Problem | None:
    """The Problem of a call whose shapes passed the validator before (``key``), or None: the
    full path."""
    dims = _PASSED.get(key) if key is not None else None
    return None if dims is None else problem(dims, arrays, ids)


def check_forward(s, x, dt, A, B, C, ids=None, K: int = 1) -> Problem:
    """``ssm_ref.check_forward(s, x, dt, A, B, C, ids, keep_device=True, snapshots=K)``, through the
    shortcut above (K, already checked by ssm_ref.check_snapshots, is part of the key: the Dims
    hold it)."""
    arrays = (s, x, dt, A, B, C)
    key = _key(_FORWARD if K == 1 else ("forward", K), arrays)
    p = _known(key, arrays, ids)
    if p is not None:
        return p
    p = ref_check_forward(s, x, dt, A, B, C, ids, keep_device=True, snapshots=K)
    if key is not None:
        _passed(key, p.dims)
    return p


def check_backward(s, x, dt, A, B, C, ids=None, g_y=None, g_states=None, g_snapshots=None) -> Problem:
    """``ssm_ref.check_backward(..., keep_device=True, g_snapshots=g_snapshots)``, through the
    shortcut above (``g_states`` None beside a 1-D ``g_y``: ``g_y`` packed, its length giving K;
    any other None: the validator's zeros)."""
    arrays = (s, x, dt, A, B, C, g_y, g_states)
    if g_snapshots is not None:   # keyed by its shape too (K); None beside it: the validator's zeros
        arrays = (*arrays, g_snapshots)
        key = _key(_BACKWARD_SNAPSHOTS, arrays) if g_states is not None else None
    elif g_states is not None:
        key = _key(_BACKWARD, arrays)
    elif type(g_y) is DeviceArray and len(g_y.shape) == 1:   # the packed g_y
        key = _key(_BACKWARD_PACKED, arrays[:7])
    else:   # zeros for a None (the validator makes them)
        key = None
    p = _known(key, arrays, ids)
    if p is not None:
        return p
    p = ref_check_backward(s, x, dt, A, B, C, ids, g_y, g_states, keep_device=True, g_snapshots=g_snapshots)
    if key is not None:
        _passed(key, p.dims)
    return p


def problem(dims: Dims, arrays: tuple, ids, known_ids=None, template=None) -> Problem | None:
    """The Problem the validator makes of a call whose float arguments ``arrays`` -- (s, x, dt, A,
    B, C), and for the backward (g_y, g_states) and maybe g_snapshots, g_states None for a packed
    g_y -- are float32
    DeviceArrays of the shapes of an earlier call that passed it with ``dims``; or None: the
    caller then takes the validator, which raises what is wrong. Checks the ids (raising as the
    validator does) and the host memory rule, in the validator's order.

    ``known_ids``: (bytes, ids) of an earlier call that passed, its checked read-only int64 copy:
    an int64 ``ids`` whose bytes (one read of the caller's memory) equal them takes that copy
    instead of being checked again. ``template``: unused (replay.OpCalls' signature: Mamba-3's
    problem takes the first call's keywords from it).
    """
    ids_ = None
    if known_ids is not None and type(ids) is np.ndarray and ids.dtype is _I64 and ids.shape == known_ids[1].shape:
        if ids.tobytes() == known_ids[0]:   # (a copy: what another thread writes later does not matter)
            ids_ = known_ids[1]
    if ids_ is None:
        ids_ = check_ids(ids, dims.S, dims.R)
    # The validator's host memory rule for inputs that are all device arrays: nothing is copied
    # and the outputs stay on the device, so the call needs the ids' int64 copy alone. When that
    # is over the limit, the validator raises its message.
    if dims.S * 8 > host_memory_bytes()[0]:
        return None
    s, x, dt, A, B, C = arrays[:6]
    A2 = A.reshape(dims.H, dims.N if dims.mamba1 else 1)  # a view, as the validator makes (even of (H, 1))
    g_y = g_states = g_snapshots = None
    if len(arrays) >= 8:
        g_y, g_states = arrays[6:8]
        if len(arrays) == 9:
            g_snapshots = arrays[8]
        elif g_states is None:
            g_y, g_states, g_snapshots = split_g_y(g_y, dims)
    p = object.__new__(Problem)   # frozen_result(Problem, ...), one call less
    p.__dict__.update(dims=dims, s=s, x=x, dt=dt, A=A2, B=B, C=C, ids=arange_ids(dims.S) if ids_ is None else ids_,
                      g_y=g_y, g_states=g_states, dtype=_F32, g_snapshots=g_snapshots)
    return p


def frozen_result(cls, fields: dict):
    """``cls(**fields)`` for a frozen dataclass without ``__post_init__`` (ScanResult, ScanGrads,
    Problem) with every field given, without its __init__'s object.__setattr__ a field (a part
    of a device call's Python worth saving: docs/ARCHITECTURE.md, "Repeated calls")."""
    r = object.__new__(cls)
    r.__dict__.update(fields)
    return r
