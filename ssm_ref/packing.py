"""The ggml / ggmlR 1-D packed layouts (docs/SPEC.md section 7).

Forward (SSM_SCAN):        y (S*T*H*P) | K state slots (K*S*H*P*N), slot 0 the final states
Backward (SSM_SCAN_BACK):  ds0 (S*H*P*N) | dx (S*T*H*P) | ddt (S*T*H) | dA (size of A)
                           | dB (S*T*G*N) | dC (S*T*G*N)
The gradient input of the backward (g_y + g_states, or g_y + g_snapshots) uses the forward layout.
Everything packed is float32, no padding, numpy C order (= ggml's ne order reversed).
"""

from __future__ import annotations

import numpy as np

from .checks import Dims

__all__ = [
    "BACKWARD_BLOCKS",
    "pack_backward",
    "pack_forward",
    "unpack_backward",
    "unpack_forward",
    "unpack_snapshots",
]

BACKWARD_BLOCKS = ("d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C")


def _cat(parts) -> np.ndarray:
    return np.concatenate([np.asarray(p, dtype=np.float32).ravel() for p in parts])


def pack_forward(y: np.ndarray, states: np.ndarray) -> np.ndarray:
    """y (S,T,H,P) and states (S,H,P,N), or the K slots (K,S,H,P,N) -> 1-D float32 of length
    S*T*H*P + K*S*H*P*N."""
    return _cat((y, states))


def _check_len(what: str, packed: np.ndarray, n: int) -> np.ndarray:
    arr = np.asarray(packed)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{what}: expected a 1-D array of length {n}, got shape {arr.shape}")
    return arr


def unpack_forward(packed, dims: Dims) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`pack_forward`: (y (S,T,H,P), states (S,H,P,N): slot 0), copies; the
    layout's K is ``dims.K``."""
    d = dims
    arr = _check_len("packed forward", packed, d.forward_size)
    n_y, row = d.S * d.T * d.H * d.P, d.S * d.H * d.P * d.N
    return (arr[:n_y].reshape(d.S, d.T, d.H, d.P).copy(),
            arr[n_y:n_y + row].reshape(d.S, d.H, d.P, d.N).copy())


def unpack_snapshots(packed, dims: Dims) -> np.ndarray:
    """The K state slots of a packed forward (K = ``dims.K``): (K, S, H, P, N), a copy."""
    d = dims
    arr = _check_len("packed forward", packed, d.forward_size)
    n_y = d.S * d.T * d.H * d.P
    return arr[n_y:].reshape(d.K, d.S, d.H, d.P, d.N).copy()


def pack_backward(d_s0, d_x, d_dt, d_A, d_B, d_C) -> np.ndarray:
    """The six gradient blocks -> 1-D float32 in ggmlR's SSM_SCAN_BACK order."""
    return _cat((d_s0, d_x, d_dt, d_A, d_B, d_C))


def unpack_backward(packed, dims: Dims) -> dict[str, np.ndarray]:
    """Inverse of :func:`pack_backward`: a dict d_s0, d_x, d_dt, d_A, d_B, d_C (copies, shaped)."""
    d = dims
    arr = _check_len("packed backward", packed, d.backward_size)
    shapes = {
        "d_s0": (d.S, d.H, d.P, d.N),
        "d_x": (d.S, d.T, d.H, d.P),
        "d_dt": (d.S, d.T, d.H),
        "d_A": d.a_shape,
        "d_B": (d.S, d.T, d.G, d.N),
        "d_C": (d.S, d.T, d.G, d.N),
    }
    out, o = {}, 0
    for name in BACKWARD_BLOCKS:
        n = int(np.prod(shapes[name]))
        out[name] = arr[o:o + n].reshape(shapes[name]).copy()
        o += n
    return out
