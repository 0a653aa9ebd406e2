"""The port interface: how ``ssm_ref.testing.verify``, ``ssm-scan check``, ``ssm-scan fuzz`` and the
properties call an implementation of any declared op (ssm_ref.ops), and what they accept back
(docs/PORTING.md, "The port interface").

All of them call :func:`call_op`, which calls the port and hands its result to :func:`normalise`,
the one reading of a result, by the op's declaration: they accept exactly the same results and
cannot disagree about a port.

A port is a module (or any object) with four names; the scan's::

    NAME                                                  a str: the port's name in reports
    ssm_scan(s, x, dt, A, B, C, ids)                      the forward
    ssm_scan_back(s, x, dt, A, B, C, ids, g_y, g_states)  the backward
    supports(op, s, x, dt, A, B, C, ids)                  whether it runs a case on its device

(another op's: its two functions, the inputs positional in the declared order, the backward then
the cotangents, and a case's keywords by name, such as Mamba-3's rotation) and, optionally for the
scan, ``SNAPSHOTS``: whether it takes K state snapshots (docs/SPEC.md section 3.1), one of
:data:`SNAPSHOT_KINDS`::

    absent, None, False   it takes no K: called exactly as above, checked with K = 1 only
    "all" (or True)       ssm_scan and supports take the keyword snapshots=K, ssm_scan_back takes
                          g_snapshots= (K, S, H, P, N) (it may raise NotImplementedError: no
                          backward of K); every slot is compared (slots k > T are NaN)
    "ggml"                as "all", but the slots k >= T are ggml's: unwritten, anything; only
                          the slots k < T are compared

The keywords are passed only when K > 1 (:func:`snapshot_keywords`; a K = 1 call is the call
above). Results, by the op's names (its outputs, or its gradients): an object with them as
attributes, a mapping with them as keys, a tuple or list in the declared order; the op's
``extras`` (the scan's snapshots) read where given, its ``may_omit`` (the scan's d_s) may be left
out (a tuple without them), and an op that declares ``unpack`` takes one packed 1-D array (the
scan: ggml's SSM_SCAN, y then the K state slots; SSM_SCAN_BACK's six blocks, no d_s). The scan's
forward is thus ``ssm_ref.ScanResult``, a mapping with keys "y" and "states" ("snapshots"
optional), ``(y, states)`` or ``(y, states, snapshots)``, or the packed array; its backward
``ssm_ref.ScanGrads``, a mapping of d_s0, d_x, d_dt, d_A, d_B, d_C (d_s optional), a 7-tuple in
ScanGrads' field order, a 6-tuple in ggmlR's order (d_s0 ... d_C), or the packed array. Arrays may
be anything numpy can read, or objects with a ``.numpy()`` method (device arrays, CPU torch
tensors). ``where`` and ``backend`` are taken from the result when it has them (as ScanResult and
ScanGrads do), else they are "unknown" and the port's NAME. ``supports`` may return
``ssm_ref.Support``, a bool, or ``(bool, reason)``. numpy only.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace

import numpy as np

from ssm_ref.ops import SCAN, Op
from ssm_ref.results import Support

__all__ = [
    "INTERFACE",
    "SNAPSHOT_KINDS",
    "UNKNOWN",
    "PortResult",
    "args_of",
    "call_op",
    "case_keywords",
    "compared_slots",
    "error_text",
    "host",
    "interface_problems",
    "kit_part",
    "normalise",
    "origin",
    "port_name",
    "reference_port",
    "snapshot_keywords",
    "snapshot_kind",
    "support",
    "traceback_text",
]

INTERFACE = ("NAME", "ssm_scan", "ssm_scan_back", "supports")
SNAPSHOT_KINDS = ("all", "ggml")
INPUTS = SCAN.input_names                   # s, x, dt, A, B, C, ids
UNKNOWN = "unknown"
_META = ("where", "backend")


@dataclass(frozen=True)
class PortResult:
    """A port's result, normalised: ``arrays`` holds what it gave by the op's names, host numpy
    arrays (the forward's outputs and the extras given, the scan's y, states, snapshots; or the
    gradients, where those the op may omit may be missing, the scan's d_s; None for the gradient of
    an optional input left None), ``where`` the device it says it ran on ("unknown" when the
    result does not say), ``backend`` what computed it (the port's NAME when the result does not
    say). ``op`` names the function called."""

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


def snapshot_keywords(K: int, g_snapshots=None, backward: bool = False) -> dict:
    """The scan's keywords of K state snapshots, for a port that declares SNAPSHOTS: none for
    K = 1 (the plain call), snapshots=K for the forward, g_snapshots= for the backward (when
    given)."""
    if K <= 1:
        return {}
    if backward:
        return {} if g_snapshots is None else {"g_snapshots": g_snapshots}
    return {"snapshots": K}


def case_keywords(case, backward: bool = False) -> dict:
    """The keyword arguments of a call on ``case``: its own (an OpCase's ``keywords``, such as
    Mamba-3's rotation) and, for a case of K > 1 state snapshots (the scan's ``K`` and
    ``g_snapshots``), :func:`snapshot_keywords`."""
    return {**(getattr(case, "keywords", None) or {}),
            **snapshot_keywords(getattr(case, "K", 1), getattr(case, "g_snapshots", None), backward)}


def reference_port(op: Op, dtype=np.float64):
    """The op's declared reference (forward and backward) as a port computing in ``dtype``: the
    oracle the kit and ``ssm-scan check`` call through :func:`call_op`, read as any port is."""
    return SimpleNamespace(NAME="reference", **{op.name: partial(op.forward, dtype=dtype),
                                                op.backward_name: partial(op.backward, dtype=dtype)})


def call_op(port, op: Op, args: Mapping, cotangents: Mapping | None = None, keywords: Mapping | None = None
            ) -> PortResult:
    """Any declared op (ssm_ref.ops) on ``port``: its forward, ``port.<op.name>(*inputs,
    **keywords)``, or with ``cotangents`` its backward, ``port.<op.backward_name>(*inputs,
    *cotangents, **keywords)``, the arguments positional in the op's order (``args`` and
    ``cotangents`` by name, a missing one None) and ``keywords`` (a case's, such as Mamba-3's
    rotation, or the scan's :func:`snapshot_keywords`) by name; the result read by
    :func:`normalise`. Raises TypeError for a result of no accepted form, or None where an array
    is due; whatever the port raises propagates."""
    backward = cotangents is not None
    fn_name = op.backward_name if backward else op.name
    fn = getattr(port, fn_name, None)
    if not callable(fn):
        raise TypeError(f"{port_name(port)} has no callable {fn_name}")
    pos = tuple(args.get(n) for n in op.input_names)
    if backward:
        pos += tuple(cotangents.get(n) for n in op.cotangent_names)
    out = fn(*pos, **dict(keywords or {}))
    return normalise(op, out, args, keywords, backward=backward, backend=port_name(port))


def normalise(op: Op, out, args: Mapping | None = None, keywords: Mapping | None = None, *,
              backward: bool = False, backend: str = "") -> PortResult:
    """The one reading of a result of ``op``'s forward (or, ``backward``, its backward) called on
    ``args`` with ``keywords`` (the module docstring lists the forms; ``args`` and ``keywords``
    size a packed result). The gradient of an optional input given as None may be None (Mamba-3's
    d_psi without psi); it is kept as None. Raises TypeError naming what was returned and what
    was expected."""
    args = args or {}
    fn_name = op.backward_name if backward else op.name
    names = op.grad_names if backward else op.output_names
    extras = () if backward else tuple(o.name for o in op.extras)
    required = tuple(n for n in names if n not in op.may_omit)
    known = (*names, *extras)
    orders = [o for o in (names, (*names, *extras), required) if o]
    forms = (f"an object with the attributes {required}, a mapping with those keys"
             + (f" ({[n for n in known if n not in required]} optional)" if known != required else "")
             + ", or a tuple of " + " or ".join(str(o) for o in dict.fromkeys(orders))
             + (", or the packed 1-D array" if op.unpack is not None else ""))
    kind = type(out).__name__
    if isinstance(out, Mapping):
        missing = [k for k in required if k not in out]
        unknown = sorted(str(k) for k in out if k not in known and k not in _META)
        if missing or unknown:
            what = "; ".join(([f"without {missing}"] if missing else [])
                             + ([f"with unknown keys {unknown}"] if unknown else []))
            raise TypeError(f"{fn_name} returned a mapping {what}: expected {forms}")
        got = {k: out[k] for k in known if k in out}
    elif all(hasattr(out, k) for k in required) and not isinstance(out, np.ndarray):
        got = {k: getattr(out, k, None) for k in known if hasattr(out, k)}
    elif isinstance(out, tuple | list):
        order = next((o for o in orders if len(o) == len(out)), None)
        if order is None:
            raise TypeError(f"{fn_name} returned a {kind} of {len(out)} items: expected {forms}")
        got = dict(zip(order, out, strict=True))
    elif op.unpack is not None and (isinstance(out, np.ndarray) or hasattr(out, "numpy")):
        a = _array(fn_name, "its result", out)
        if a.ndim != 1:
            raise TypeError(f"{fn_name} returned an array of shape {a.shape}: expected {forms}")
        try:
            got = op.unpack(a, args, keywords or {}, backward)
        except ValueError as e:
            raise TypeError(f"{fn_name} returned a packed 1-D array: {e}") from None
    else:
        raise TypeError(f"{fn_name} returned {kind}: expected {forms}")
    # an optional output left None is not given; the gradients that may be None: those of optional
    # inputs the call left None
    got = {k: v for k, v in got.items() if v is not None or k in required}
    may_be_none = {g.name for g in op.grads if args.get(g.of) is None} if backward else set()
    arrays = {k: None if v is None and k in may_be_none else _array(fn_name, k, v) for k, v in got.items()}
    return PortResult(fn_name, arrays, *origin(out, backend))


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
    """The formatted traceback of an exception raised by a port through :func:`call_op`: the
    port's own frames (those of the tool that called it left out), chained exceptions included. An
    exception of :func:`normalise` (a result of no accepted form: :func:`error_text` says it all)
    gives ""; one raised outside :func:`call_op` keeps every frame."""
    tb = e.__traceback__
    t, inside = tb, False
    while t is not None:
        if t.tb_frame.f_code is call_op.__code__:
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
