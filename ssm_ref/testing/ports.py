"""The port interface: how ``ssm_ref.testing.verify``, ``ssm-scan check`` and ``ssm-scan fuzz``
call an implementation of the scan, and what they accept back (docs/PORTING.md, "The port
interface").

All three call :func:`call`, which calls the port and hands its result to :func:`normalise`, so
they accept exactly the same results and cannot disagree about a port.

A port is a module (or any object) with four names::

    NAME                                                  a str: the port's name in reports
    ssm_scan(s, x, dt, A, B, C, ids)                      the forward
    ssm_scan_back(s, x, dt, A, B, C, ids, g_y, g_states)  the backward
    supports(op, s, x, dt, A, B, C, ids)                  whether it runs a case on its device

and, optionally, ``SNAPSHOTS``: whether it takes K state snapshots (docs/SPEC.md section 3.1),
one of :data:`SNAPSHOT_KINDS`::

    absent, None, False   it takes no K: called exactly as above, checked with K = 1 only
    "all" (or True)       ssm_scan and supports take the keyword snapshots=K, ssm_scan_back takes
                          g_snapshots= (K, S, H, P, N) (it may raise NotImplementedError: no
                          backward of K); every slot is compared (slots k > T are NaN)
    "ggml"                as "all", but the slots k >= T are ggml's: unwritten, anything; only
                          the slots k < T are compared

The keywords are passed only when K > 1 (a K = 1 call is the call above). The functions are called
positionally. Results, forward: ``ssm_ref.ScanResult`` or any object with ``.y`` and ``.states``
(``.snapshots`` (K, S, H, P, N) read when it is not None); a mapping with keys "y" and "states"
("snapshots" optional); a tuple or list ``(y, states)`` or ``(y, states, snapshots)``; the packed
1-D array of ggml's SSM_SCAN (y then the K state slots: states is slot 0). Backward: ``ssm_ref.ScanGrads`` or any object
with the attributes d_s0, d_x, d_dt, d_A, d_B, d_C (d_s optional); a mapping with those keys (d_s
optional); a 7-tuple in ScanGrads' field order (d_s, d_s0, d_x, d_dt, d_A, d_B, d_C); a 6-tuple in
ggmlR's SSM_SCAN_BACK order (d_s0, d_x, d_dt, d_A, d_B, d_C: d_s not given); the packed 1-D array
of SSM_SCAN_BACK (d_s not given). Arrays may be anything numpy can read, or objects with a
``.numpy()`` method (device arrays, CPU torch tensors). ``where`` and ``backend`` are taken from
the result when it has them (as ScanResult and ScanGrads do), else they are "unknown" and the
port's NAME. ``supports`` may return ``ssm_ref.Support``, a bool, or ``(bool, reason)``.
numpy only.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ssm_ref.checks import Dims
from ssm_ref.ops import SCAN, Op
from ssm_ref.packing import BACKWARD_BLOCKS, unpack_backward, unpack_forward, unpack_snapshots
from ssm_ref.results import GRAD_NAMES, Support

__all__ = [
    "BACKWARD",
    "FORWARD",
    "INTERFACE",
    "SNAPSHOT_KINDS",
    "UNKNOWN",
    "PortResult",
    "call",
    "call_op",
    "compared_slots",
    "dims_of",
    "error_text",
    "host",
    "interface_problems",
    "kit_part",
    "normalise",
    "origin",
    "port_name",
    "snapshot_kind",
    "support",
    "traceback_text",
]

INTERFACE = ("NAME", "ssm_scan", "ssm_scan_back", "supports")
OPS = ("ssm_scan", "ssm_scan_back")
FORWARD = SCAN.output_names                 # y, states
FORWARD_WITH_SNAPSHOTS = (*FORWARD, "snapshots")
SNAPSHOT_KINDS = ("all", "ggml")
BACKWARD = GRAD_NAMES                       # d_s, d_s0, d_x, d_dt, d_A, d_B, d_C: a 7-tuple's order
BACKWARD_WITHOUT_D_S = BACKWARD_BLOCKS      # d_s0, d_x, d_dt, d_A, d_B, d_C: a 6-tuple's order
INPUTS = SCAN.input_names                   # s, x, dt, A, B, C, ids
UNKNOWN = "unknown"
_META = ("where", "backend")

_FORWARD_FORMS = "an object with .y and .states (.snapshots optional; ssm_ref.ScanResult), a mapping with " \
                 "keys 'y' and 'states' ('snapshots' optional), a tuple (y, states) or (y, states, snapshots), " \
                 "or the packed 1-D array (y then the K state slots)"
_BACKWARD_FORMS = "an object with .d_s0 .d_x .d_dt .d_A .d_B .d_C (.d_s optional; ssm_ref.ScanGrads), a " \
                  "mapping with those keys, a 7-tuple (d_s, d_s0, d_x, d_dt, d_A, d_B, d_C), a 6-tuple " \
                  "(d_s0, d_x, d_dt, d_A, d_B, d_C), or the packed 1-D array of SSM_SCAN_BACK"


@dataclass(frozen=True)
class PortResult:
    """A port's result, normalised: ``arrays`` holds the outputs it gave (host numpy arrays, by
    name: y, states and, when given, snapshots; or d_s, d_s0, d_x, d_dt, d_A, d_B, d_C, where d_s
    may be missing), ``where``
    the device it says it ran on ("unknown" when the result does not say), ``backend`` what computed
    it (the port's NAME when the result does not say)."""

    op: str
    arrays: dict
    where: str
    backend: str

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def __contains__(self, name: str) -> bool:
        return name in self.arrays


def port_name(port) -> str:
    """The port's NAME, else its module name, else its type's name."""
    name = getattr(port, "NAME", None)
    if isinstance(name, str) and name:
        return name
    return getattr(port, "__name__", type(port).__name__)


def snapshot_kind(port) -> str:
    """What the port declares of K (its ``SNAPSHOTS``, module docstring): "all", "ggml", or ""
    (it takes no K). Raises TypeError for a value of no such meaning."""
    value = getattr(port, "SNAPSHOTS", None)
    if value is None or value is False:
        return ""
    if value is True:
        return "all"
    if isinstance(value, str) and value in SNAPSHOT_KINDS:
        return value
    raise TypeError(f"SNAPSHOTS of {port_name(port)} is {value!r}: expected None, False, True, 'all' or 'ggml'")


def compared_slots(kind: str, K: int, T: int) -> int:
    """How many leading snapshot slots are compared for a port of SNAPSHOTS ``kind``: all K
    ("all"), the k < T that ggml writes ("ggml"); 0 for a port that takes no K."""
    if kind == "all":
        return K
    if kind == "ggml":
        return min(K, T)
    return 0


def interface_problems(port, op: Op = SCAN) -> list[str]:
    """What keeps ``port`` from being a port of ``op`` (the scan by default): "lacks supports",
    "ssm_scan is not callable", a SNAPSHOTS of no meaning, ... (empty when it has the four names:
    NAME, the op's forward and backward, supports)."""
    out = []
    try:
        snapshot_kind(port)
    except TypeError as e:
        out.append(str(e))
    for attr in ("NAME", op.name, op.backward_name, "supports"):
        if not hasattr(port, attr):
            out.append(f"lacks {attr}")
        elif attr == "NAME":
            if not isinstance(port.NAME, str):
                out.append(f"NAME is a {type(port.NAME).__name__}, not a str")
        elif not callable(getattr(port, attr)):
            out.append(f"{attr} is not callable")
    return out


def host(a) -> np.ndarray:
    """``a`` as a numpy array: device arrays and tensors through their ``.numpy()``."""
    if not isinstance(a, np.ndarray) and hasattr(a, "numpy"):
        return np.asarray(a.numpy())
    return np.asarray(a)


def _shape(a) -> tuple:
    s = getattr(a, "shape", None)
    return tuple(int(v) for v in (s if s is not None else np.shape(a)))


def dims_of(args: Sequence, K: int = 1) -> Dims | None:
    """The Dims of positional inputs (s, x, dt, A, B, C, ids, ...) with K state slots, or None
    when their shapes do not make a problem (then a packed result cannot be unpacked)."""
    try:
        s, x, _dt, A, B = args[:5]
        R, H, P, N = _shape(s)
        S, T, _, _ = _shape(x)
        G = _shape(B)[2]
        a_shape = _shape(A)
    except (ValueError, TypeError, IndexError):
        return None
    return Dims(S=S, T=T, H=H, P=P, N=N, G=G, R=R, mamba1=a_shape == (H, N) and N > 1, a_shape=a_shape, K=K)


def _array(op: str, name: str, v) -> np.ndarray:
    try:
        a = host(v)
    except Exception as e:
        raise TypeError(f"{op} returned {name} as {type(v).__name__}, which is no array: {e}") from e
    if a.dtype.kind not in "fiub":
        raise TypeError(f"{op} returned {name} as {type(v).__name__} (numpy reads it as dtype {a.dtype}), "
                        "expected an array of real numbers")
    return a


def _meta(out, key: str, default: str) -> str:
    v = out.get(key) if isinstance(out, Mapping) else getattr(out, key, None)
    return v if isinstance(v, str) and v else default


def origin(out, backend: str = "") -> tuple[str, str]:
    """(where, backend) of a result without reading its arrays: its ``where`` and ``backend``
    (attributes, or keys of a mapping) when it has them, else "unknown" and ``backend`` (the
    port's NAME)."""
    return _meta(out, "where", UNKNOWN), _meta(out, "backend", backend or UNKNOWN)


def normalise(op: str, out, dims: Dims | None, *, backend: str = "") -> PortResult:
    """The one reading of a port's result (the module docstring lists the forms). ``op`` is
    "ssm_scan" or "ssm_scan_back"; ``dims`` is needed only for packed 1-D results (its K: the
    slots of a packed forward; K > 1 unpacks them as "snapshots"). Raises TypeError naming what
    was returned and what was expected."""
    if op not in OPS:
        raise ValueError(f"op: expected 'ssm_scan' or 'ssm_scan_back', got {op!r}")
    forward = op == "ssm_scan"
    required = FORWARD if forward else BACKWARD_WITHOUT_D_S
    known = FORWARD_WITH_SNAPSHOTS if forward else BACKWARD
    forms = _FORWARD_FORMS if forward else _BACKWARD_FORMS
    kind = type(out).__name__
    if isinstance(out, Mapping):
        missing = [k for k in required if k not in out]
        unknown = sorted(str(k) for k in out if k not in known and k not in _META)
        if missing or unknown:
            what = "; ".join(([f"without {missing}"] if missing else []) + ([f"with unknown keys {unknown}"]
                                                                             if unknown else []))
            raise TypeError(f"{op} returned a mapping {what}: expected {forms}")
        got = {k: out[k] for k in known if k in out and not (k == "snapshots" and out[k] is None)}
    elif all(hasattr(out, k) for k in required) and not isinstance(out, np.ndarray):
        got = {k: getattr(out, k) for k in known if getattr(out, k, None) is not None or k in required}
    elif isinstance(out, tuple | list):
        orders = (FORWARD, FORWARD_WITH_SNAPSHOTS) if forward else (BACKWARD, BACKWARD_WITHOUT_D_S)
        order = next((o for o in orders if len(o) == len(out)), None)
        if order is None:
            raise TypeError(f"{op} returned a {kind} of {len(out)} items: expected {forms}")
        got = dict(zip(order, out, strict=True))
    elif isinstance(out, np.ndarray) or hasattr(out, "numpy"):
        a = _array(op, "its result", out)
        if a.ndim != 1:
            raise TypeError(f"{op} returned an array of shape {a.shape}: expected {forms}")
        if dims is None:
            raise TypeError(f"{op} returned a 1-D array, but the inputs' shapes do not say how to unpack it")
        try:
            if forward:
                got = dict(zip(FORWARD, unpack_forward(a, dims), strict=True))
                if dims.K > 1:
                    got["snapshots"] = unpack_snapshots(a, dims)
            else:
                got = unpack_backward(a, dims)
        except ValueError as e:
            raise TypeError(f"{op} returned a packed 1-D array: {e}") from None
    else:
        raise TypeError(f"{op} returned {kind}: expected {forms}")
    arrays = {k: _array(op, k, v) for k, v in got.items()}
    return PortResult(op, arrays, *origin(out, backend))


def call(fn, op: str, args: Sequence, *, backend: str = "", K: int = 1, g_snapshots=None) -> PortResult:
    """``fn(*args)`` normalised (:func:`normalise`); ``args`` are the positional inputs (s, x, dt,
    A, B, C, ids, and g_y, g_states for the backward). K > 1 (a port that declares SNAPSHOTS):
    the forward is called with ``snapshots=K``, the backward, given ``g_snapshots``, with
    ``g_snapshots=``; K = 1 calls ``fn(*args)`` alone, as for a port that takes no K.
    Whatever ``fn`` raises propagates; a result of no accepted form raises TypeError."""
    kw = {}
    if K > 1 and op == "ssm_scan":
        kw["snapshots"] = K
    elif K > 1 and g_snapshots is not None:
        kw["g_snapshots"] = g_snapshots
    out = fn(*args, **kw)
    return normalise(op, out, dims_of(args, K), backend=backend)


def kit_part(op: Op, what: str):
    """The testing kit's part ``what`` of ``op`` ("make_case", "cases", "strategy", "properties" or "golden"):
    what its declaration gives, or the attribute its ``"module:attribute"`` text names, imported
    here (the spec names the kit's parts, the kit imports them). ValueError when it declares none."""
    ref = getattr(op, what)
    if ref is None:
        raise ValueError(f"op {op.name!r} declares no {what}")
    if isinstance(ref, str):
        module, _, attr = ref.partition(":")
        return getattr(importlib.import_module(module), attr)
    return ref


def call_op(port, op: Op, args: Mapping, cotangents: Mapping | None = None, keywords: Mapping | None = None
            ) -> PortResult:
    """Any declared op (ssm_ref.ops) on ``port``: its forward, ``port.<op.name>(*inputs,
    **keywords)``, or with ``cotangents`` its backward, ``port.<op.backward_name>(*inputs,
    *cotangents, **keywords)``, the arguments positional in the op's order (``args`` and
    ``cotangents`` by name, a missing one None) and ``keywords`` (a case's, such as Mamba-3's
    rotation) by name. The result is read by the op's names: an object with them as attributes,
    a mapping with them as keys, or a tuple or list in the op's order. The gradient of an optional
    input given as None may be None (Mamba-3's d_psi without psi); it is kept as None. Raises
    TypeError for a result of no such form, or None where an array is due; whatever the port
    raises propagates. (The scan's own reading, :func:`call`, also takes ggml's packed layouts
    and the K state snapshots.)"""
    backward = cotangents is not None
    fn_name = op.backward_name if backward else op.name
    fn = getattr(port, fn_name, None)
    if not callable(fn):
        raise TypeError(f"{port_name(port)} has no callable {fn_name}")
    pos = tuple(args.get(n) for n in op.input_names)
    if backward:
        pos += tuple(cotangents.get(n) for n in op.cotangent_names)
    out = fn(*pos, **dict(keywords or {}))
    names = op.grad_names if backward else op.output_names
    forms = f"an object with the attributes {names}, a mapping with those keys, or a tuple in that order"
    if isinstance(out, Mapping):
        missing = [k for k in names if k not in out]
        if missing:
            raise TypeError(f"{fn_name} returned a mapping without {missing}: expected {forms}")
        got = {k: out[k] for k in names}
    elif isinstance(out, tuple | list):
        if len(out) != len(names):
            raise TypeError(f"{fn_name} returned a {type(out).__name__} of {len(out)} items: expected {forms}")
        got = dict(zip(names, out, strict=True))
    elif all(hasattr(out, k) for k in names):
        got = {k: getattr(out, k) for k in names}
    else:
        raise TypeError(f"{fn_name} returned {type(out).__name__}: expected {forms}")
    # the gradients that may be None: those of optional inputs the call left None
    may_be_none = {g.name for g in op.grads if backward and args.get(g.of) is None} if backward else set()
    arrays = {k: None if v is None and k in may_be_none else _array(fn_name, k, v) for k, v in got.items()}
    return PortResult(fn_name, arrays, *origin(out, port_name(port)))


def args_of(kwargs: Mapping, *extra) -> tuple:
    """The positional inputs from keyword arguments (ids None when missing)."""
    return tuple(kwargs.get(k) for k in (*INPUTS, *extra))


def support(value) -> Support:
    """A port's ``supports`` answer as a Support: a Support (or anything with ``.ok`` and
    ``.reason``), a bool, or ``(bool, reason)``. Raises TypeError for anything else."""
    if isinstance(value, Support):
        return value
    if isinstance(value, bool | np.bool_):
        return Support(bool(value), "")
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], bool | np.bool_):
        return Support(bool(value[0]), str(value[1]))
    if hasattr(value, "ok"):
        return Support(bool(value.ok), str(getattr(value, "reason", "") or ""))
    raise TypeError(f"supports returned {type(value).__name__}: expected an ssm_ref.Support, a bool or "
                    "(bool, reason)")


def error_text(e: BaseException) -> str:
    """ "RuntimeError: device lost": the exception's type and the first line of its message."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def traceback_text(e: BaseException) -> str:
    """The formatted traceback of an exception raised by a port through :func:`call`: the port's
    own frames (those of the tool that called it left out), chained exceptions included. An
    exception of :func:`normalise` (a result of no accepted form: :func:`error_text` says it all)
    gives ""; one raised outside :func:`call` keeps every frame."""
    tb = e.__traceback__
    t, inside = tb, False
    while t is not None:
        if t.tb_frame.f_code is call.__code__:
            tb, inside = t.tb_next, True
        t = t.tb_next
    if inside:
        rest, t = [], tb
        while t is not None:
            rest.append(t.tb_frame.f_code.co_filename)
            t = t.tb_next
        if all(f == __file__ for f in rest):   # raised by normalise: the message says it all
            return ""
    return "".join(traceback.format_exception(type(e), e, tb)).rstrip("\n")
