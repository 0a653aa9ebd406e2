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
    "dims_of",
    "pack_backward",
    "pack_forward",
    "unpack_backward",
    "unpack_forward",
    "unpack_result",
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


def _shape(a) -> tuple:
    s = getattr(a, "shape", None)
    return tuple(int(v) for v in (s if s is not None else np.shape(a)))


def dims_of(args, K: int = 1) -> Dims | None:
    """The Dims of the scan's inputs by name (s, x, A, B, ...; arrays or anything with a shape)
    with K state slots, or None when their shapes do not make a problem (then a packed result
    cannot be unpacked)."""
    try:
        R, H, P, N = _shape(args["s"])
        S, T, _, _ = _shape(args["x"])
        G = _shape(args["B"])[2]
        a_shape = _shape(args["A"])
    except (ValueError, TypeError, IndexError, KeyError):
        return None
    return Dims(S=S, T=T, H=H, P=P, N=N, G=G, R=R, mamba1=a_shape == (H, N) and N > 1, a_shape=a_shape, K=K)


def unpack_result(packed, args, keywords, backward: bool) -> dict[str, np.ndarray]:
    """A port's result given as ggml's packed 1-D array, by name: the forward's y and states (and,
    with ``keywords`` snapshots=K > 1, the K "snapshots"), or the backward's six blocks. ``args``:
    the call's inputs by name, which give the sizes. Raises ValueError when it does not fit them."""
    K = int((keywords or {}).get("snapshots", 1) or 1)
    dims = dims_of(args, K)
    if dims is None:
        raise ValueError("the inputs' shapes do not say how to unpack it")
    if backward:
        return unpack_backward(packed, dims)
    y, states = unpack_forward(packed, dims)
    return {"y": y, "states": states, **({"snapshots": unpack_snapshots(packed, dims)} if K > 1 else {})}
