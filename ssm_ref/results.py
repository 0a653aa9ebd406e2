"""Result types shared by every backend and bridge (docs/API.md): ScanResult, ScanGrads, Support,
and Where (what ssm_torch.last_where / ssm_jax.last_where report)."""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass

import numpy as np

from .ops import MAMBA3, SCAN

# What every backend's products compute today (ssm_ref.precision.PRECISIONS: no backend runs the
# matrix units yet, so a call asking for "high" or "medium" computes this and its result says so)
PRECISION = "highest"

__all__ = ["GRAD_NAMES", "Mamba3Grads", "Mamba3Result", "NamedGrads", "ScanGrads", "ScanResult", "Support", "Where"]


def _host(a) -> np.ndarray:
    # ssm_vk's DeviceArray has .numpy(); host arrays pass through.
    return a.numpy() if hasattr(a, "numpy") and not isinstance(a, np.ndarray) else np.asarray(a)


class _OneSlot:
    """``ScanResult.snapshots`` of a result made without it (``snapshots=1``, the default): the
    one slot, ``states`` as (1, S, H, P, N), a view made on first read and then kept (so a device
    call's Python does not pay for a view nobody reads); None when ``states`` is None."""

    def __get__(self, obj, cls=None):
        if obj is None:
            return None   # the dataclass's default: a ScanResult(...) without snapshots
        st = obj.states
        v = None if st is None else st[None] if isinstance(st, np.ndarray) else st.reshape((1, *st.shape))
        obj.__dict__["snapshots"] = v   # frozen, so not through setattr; the next read finds it
        return v


@dataclass(frozen=True, eq=False)
class ScanResult:
    """Forward outputs.

    y: (S, T, H, P)   states: (S, H, P, N) (the final state of sequence i at position i)
    where: the device it ran on ("CPU", "Vulkan0", ...)   backend: the package that computed it
    snapshots: (K, S, H, P, N) for ``snapshots=K`` (docs/SPEC.md section 3): slot k is the state
    after T - k tokens; slot 0 equals ``states``, slot T is the start state, slots k > T are NaN.
    With K = 1 it holds the one slot, ``states``; None when ``update_cache=True`` and K = 1 (the
    final state went into the cache; with K > 1 the slots are returned, slot 0 included).

    precision: the arithmetic of the products, with PyTorch's names (docs/SPEC.md section 15):
    "highest" (float32) from every backend today, whatever a call asked for.

    Unpacks as a pair: ``y, states = ssm_scan(...)`` (iteration yields y then states; len 2).
    Frozen: its fields cannot be reassigned.
    """

    y: np.ndarray
    states: np.ndarray
    where: str
    backend: str
    snapshots: np.ndarray | None = _OneSlot()
    precision = PRECISION   # (a class attribute: no annotation, so no dataclass field and no per-call cost)

    def __iter__(self):
        yield self.y
        yield self.states

    def __len__(self) -> int:
        return 2

    def packed(self) -> np.ndarray:
        """1-D float32 in ggml's SSM_SCAN layout: y.ravel(), then the K state slots (K = 1:
        states.ravel())."""
        from .packing import pack_forward

        if self.snapshots is not None:
            return pack_forward(_host(self.y), _host(self.snapshots))
        if self.states is None:
            raise ValueError("packed: this result has no states (update_cache=True wrote them into the cache)")
        return pack_forward(_host(self.y), _host(self.states))


class NamedGrads:
    """Read-only mapping access by name to a backward's gradients, the names its op declares
    (``_names``, the op's ``grad_names``): ``g["d_x"]``, ``keys()``, ``values()``, ``items()``,
    ``get()``, ``len(g)``, ``"d_x" in g``, ``dict(g)``, ``f(**g)``; iteration yields the names, as a
    dict's does. Shared by ScanGrads and Mamba3Grads (each a frozen dataclass of those fields)."""

    _names: tuple = ()

    def as_dict(self) -> dict:
        """The gradient arrays by name, in the op's order."""
        return {k: getattr(self, k) for k in self._names}

    def __getitem__(self, name: str):
        if name not in self._names:
            raise KeyError(f"{name!r}: a {type(self).__name__} holds {', '.join(self._names)}")
        return getattr(self, name)

    def keys(self) -> tuple:
        """The gradients' names, in the op's order."""
        return self._names

    def values(self) -> tuple:
        """The gradient arrays, in the order of :meth:`keys`."""
        return tuple(getattr(self, k) for k in self._names)

    def items(self) -> tuple:
        """(name, array) pairs, in the order of :meth:`keys`."""
        return tuple((k, getattr(self, k)) for k in self._names)

    def get(self, name: str, default=None):
        return getattr(self, name) if name in self._names else default

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name) -> bool:
        return name in self._names


@dataclass(frozen=True, eq=False)
class ScanGrads(NamedGrads):
    """Backward outputs: the gradient of the loss for every float input.

    d_s: (R, H, P, N), d_s0 scatter-added into rows ids[i] (the true gradient of the cache s)
    d_s0: (S, H, P, N), the gradient of each sequence's initial state, at position i
    d_x (S, T, H, P), d_dt (S, T, H), d_A (shape of A as given), d_B and d_C (S, T, G, N)

    Read-only mapping access to the seven gradients by name, in the order of GRAD_NAMES (d_s,
    d_s0, d_x, d_dt, d_A, d_B, d_C): ``g["d_x"]``, ``keys()``, ``values()``, ``items()``, ``get()``,
    ``len(g)`` (7), ``"d_x" in g``, ``dict(g)``, ``f(**g)``; iteration yields the names, as a
    dict's does. The attributes (``g.d_x``) are the same arrays. Not registered as a
    collections.abc.Mapping: code that tells results from mappings (ssm_ref.testing.ports) reads
    it by its attributes, ``where`` and ``backend`` included. Frozen: nothing can be reassigned.
    """

    d_s: np.ndarray
    d_s0: np.ndarray
    d_x: np.ndarray
    d_dt: np.ndarray
    d_A: np.ndarray
    d_B: np.ndarray
    d_C: np.ndarray
    where: str
    backend: str
    _names = SCAN.grad_names   # (a class attribute: no annotation, so no dataclass field)
    precision = PRECISION      # (as ScanResult's)

    def packed(self) -> np.ndarray:
        """1-D float32 in ggmlR's SSM_SCAN_BACK layout: ds0 | dx | ddt | dA | dB | dC."""
        from .packing import pack_backward

        return pack_backward(*(_host(a) for a in (self.d_s0, self.d_x, self.d_dt, self.d_A,
                                                   self.d_B, self.d_C)))

GRAD_NAMES = SCAN.grad_names   # d_s, d_s0, d_x, d_dt, d_A, d_B, d_C: ScanGrads' fields, in order


@dataclass(frozen=True, eq=False)
class Mamba3Result:
    """The Mamba-3 scan's outputs (ssm_ref.mamba3_scan, docs/SPEC.md "Mamba-3").

    y (S, T, H, P) SISO | (S, T, M, H, P) MIMO; the final state's four parts: theta (S, H, F),
    h (S, H, P, N), k (S, H, N) | (S, H, M, N), v (S, H, P) | (S, H, M, P) -- None, all four, after
    ``update_cache=True`` wrote them into the cache. where: the device it ran on ("CPU", ...).
    Unpacks as five: ``y, theta, h, k, v = mamba3_scan(...)``. Frozen. ``precision`` as
    ScanResult's.
    """

    y: np.ndarray
    theta: np.ndarray | None
    h: np.ndarray | None
    k: np.ndarray | None
    v: np.ndarray | None
    where: str = "CPU"
    precision = PRECISION   # (as ScanResult's)

    def __iter__(self):
        return iter((self.y, self.theta, self.h, self.k, self.v))

    def __len__(self) -> int:
        return 5


# The Mamba-3 backward's gradients: one field per name the op declares (MAMBA3.grad_names), then
# where. Mapping access by name as ScanGrads' (NamedGrads); d_psi is None when psi was None.
Mamba3Grads = make_dataclass(
    "Mamba3Grads", [*MAMBA3.grad_names, ("where", str, field(default="CPU"))], bases=(NamedGrads,),
    namespace={"_names": MAMBA3.grad_names, "__module__": __name__, "precision": PRECISION,
               "__doc__": "The gradients of ssm_ref.mamba3_scan_back by name (" + ", ".join(MAMBA3.grad_names)
                          + "), each in its input's shape (the d_s_* in the caches'); a read-only mapping like "
                          "ScanGrads, plus ``where`` and ``precision`` (ScanResult's). Frozen."},
    frozen=True, eq=False)


@dataclass(frozen=True)
class Support:
    """Whether a backend runs a case on its device; truthy iff ``ok``. ``reason`` says why not
    (or, when ok, where it runs)."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class Where:
    """Where a bridge's last computation ran (ssm_torch.last_where, ssm_jax.last_where): ``op``
    ("ssm_scan" or "ssm_scan_back"), ``where`` ("CPU", "Vulkan0", ...), ``backend`` (the module
    that did the arithmetic: "ssm_fast", "ssm_vk" or "ssm_ref"; after a fallback not the one asked
    for), ``dtype`` (its working precision, "float32" or "float64"), ``precision`` (the products'
    arithmetic, as ScanResult's)."""

    op: str
    where: str
    backend: str
    dtype: str
    precision = PRECISION   # (as ScanResult's)
