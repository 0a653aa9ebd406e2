"""Result types shared by every backend (docs/API.md): ScanResult, ScanGrads, Support."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ScanGrads", "ScanResult", "Support"]


def _host(a) -> np.ndarray:
    # ssm_vk's DeviceArray has .numpy(); host arrays pass through.
    return a.numpy() if hasattr(a, "numpy") and not isinstance(a, np.ndarray) else np.asarray(a)


@dataclass(frozen=True, eq=False)
class ScanResult:
    """Forward outputs.

    y: (S, T, H, P)   states: (S, H, P, N) (the final state of sequence i at position i)
    where: the device it ran on ("CPU", "Vulkan0", ...)   backend: the package that computed it
    """

    y: np.ndarray
    states: np.ndarray
    where: str
    backend: str

    def packed(self) -> np.ndarray:
        """1-D float32 in ggml's SSM_SCAN layout: y.ravel() then states.ravel()."""
        from .packing import pack_forward

        return pack_forward(_host(self.y), _host(self.states))


@dataclass(frozen=True, eq=False)
class ScanGrads:
    """Backward outputs: the gradient of the loss for every float input.

    d_s: (R, H, P, N), d_s0 scatter-added into rows ids[i] (the true gradient of the cache s)
    d_s0: (S, H, P, N), the gradient of each sequence's initial state, at position i
    d_x (S, T, H, P), d_dt (S, T, H), d_A (shape of A as given), d_B and d_C (S, T, G, N)
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

    def packed(self) -> np.ndarray:
        """1-D float32 in ggmlR's SSM_SCAN_BACK layout: ds0 | dx | ddt | dA | dB | dC."""
        from .packing import pack_backward

        return pack_backward(*(_host(a) for a in (self.d_s0, self.d_x, self.d_dt, self.d_A,
                                                   self.d_B, self.d_C)))

    def as_dict(self) -> dict:
        """The seven gradient arrays by name (d_s, d_s0, d_x, d_dt, d_A, d_B, d_C)."""
        return {k: getattr(self, k) for k in GRAD_NAMES}


GRAD_NAMES = ("d_s", "d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C")


@dataclass(frozen=True)
class Support:
    """Whether a backend runs a case on its device; truthy iff ``ok``. ``reason`` says why not
    (or, when ok, where it runs)."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok
