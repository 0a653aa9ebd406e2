"""Argument checks of the Mamba-3 scan (``mamba3_scan``, ``mamba3_scan_back``), shared by every
backend: one validator, so every backend raises the same error for the same bad input.

Glossary (docs/SPEC.md, "Mamba-3"): S sequences · T tokens · H heads · P channels per head ·
N state size · G groups (head h reads group h // (H/G)) · M MIMO rank · F rotated pairs ·
R cache rows.

``check_mamba3_forward`` / ``check_mamba3_backward`` take the caller's array-likes, check every
argument before any work, and return an :class:`M3Problem`: the sizes, the arrays in the working
dtype (read-only, C-contiguous; the caller's arrays are never written or kept) in one layout for
SISO and MIMO -- SISO is rank M = 1 with the rank axis added, ``psi`` None is ones -- and the ids.
Who defines a size: x gives S, T, H, P; B gives G, N (and M with MIMO); dtheta gives F; the
first given state part gives R. Every other shape is checked against those, in argument order.
TypeError for dtypes, kinds and keywords of the wrong type; ValueError for shapes, sizes, ids and
the rules between arguments; each message names the argument.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arraylike import finish, float_array
from .checks import check_dtype
from .ids import arange_ids, check_distinct_ids, check_ids
from .shapes import fmt

__all__ = ["ROTATIONS", "STATE_NAMES", "M3Dims", "M3Problem", "check_mamba3_backward", "check_mamba3_forward",
           "check_mamba3_update_cache", "check_rotation", "drop_rank", "output_shapes", "pair_index"]

ROTATIONS = ("interleaved", "halved")
STATE_NAMES = ("s_theta", "s_h", "s_k", "s_v")


@dataclass(frozen=True)
class M3Dims:
    """The sizes of one Mamba-3 problem. ``mimo``: B was (S, T, M, G, N); SISO has M = 1 and no
    rank axis in its arrays (the Problem adds one)."""

    S: int
    T: int
    H: int
    P: int
    N: int
    G: int
    M: int
    F: int
    R: int
    mimo: bool

    @property
    def heads_per_group(self) -> int:
        return self.H // self.G

    def group_of_head(self) -> np.ndarray:
        """(H,) int64: head h reads group h // (H // G)."""
        return np.arange(self.H, dtype=np.int64) // self.heads_per_group


@dataclass(frozen=True)
class M3Problem:
    """Checked inputs in the working dtype, rank axis always present:
    x (S,T,H,P), dt dA lam (S,T,H), B C (S,T,M,G,N), B_bias C_bias (H,M,N), dtheta (S,T,H,F),
    psi (H,M,P) (ones when not given), s_theta (R,H,F), s_h (R,H,P,N), s_k (R,H,M,N),
    s_v (R,H,M,P) (zeros (S, ...) when not given, R = S), ids (S,) int64.
    The backward's cotangents (zeros when not given): g_y (S,T,M,H,P), g_theta (S,H,F),
    g_h (S,H,P,N), g_k (S,H,M,N), g_v (S,H,M,P)."""

    dims: M3Dims
    x: np.ndarray
    dt: np.ndarray
    dA: np.ndarray
    lam: np.ndarray
    B: np.ndarray
    C: np.ndarray
    B_bias: np.ndarray
    C_bias: np.ndarray
    dtheta: np.ndarray
    psi: np.ndarray
    s_theta: np.ndarray
    s_h: np.ndarray
    s_k: np.ndarray
    s_v: np.ndarray
    ids: np.ndarray
    psi_given: bool
    states_given: bool
    rotation: str
    dtype: np.dtype
    g_y: np.ndarray | None = None
    g_theta: np.ndarray | None = None
    g_h: np.ndarray | None = None
    g_k: np.ndarray | None = None
    g_v: np.ndarray | None = None


def check_rotation(rotation) -> str:
    """``rotation``: "interleaved" (pairs (2j, 2j+1)) or "halved" (pairs (j, j + N/2)); ValueError
    naming rotation otherwise."""
    if not isinstance(rotation, str) or rotation not in ROTATIONS:
        raise ValueError(f"rotation: expected 'interleaved' (pairs (2j, 2j+1)) or 'halved' (pairs (j, j + N/2)), "
                         f"got {rotation!r}")
    return rotation


def output_shapes(x_shape, B_shape, dtheta_shape) -> tuple:
    """The forward's outputs' shapes (y, theta, h, k, v) from the shapes of x (S, T, H, P), B
    (S, T, G, N) SISO | (S, T, M, G, N) MIMO and dtheta (S, T, H, F), as the bridges declare them
    before the call (the arguments checked already)."""
    S, T, H, P = x_shape
    N, F = B_shape[-1], dtheta_shape[-1]
    rk = (B_shape[2],) if len(B_shape) == 5 else ()   # MIMO's rank axis; SISO has none
    return (S, T, *rk, H, P), (S, H, F), (S, H, P, N), (S, H, *rk, N), (S, H, *rk, P)


def drop_rank(dims: M3Dims, a: np.ndarray, axis: int) -> np.ndarray:
    """SISO's arrays have no rank axis: ``a`` without the one of size 1 at ``axis`` that the
    problem carries throughout (a view); MIMO's unchanged. Every backend's results go through it."""
    return a if dims.mimo else a.squeeze(axis)


def pair_index(rotation: str, N: int, F: int) -> tuple[np.ndarray, np.ndarray]:
    """The two members (a, b) of the F rotated pairs of an N-vector, each (F,) int64: interleaved
    (2j, 2j+1), halved (j, j + N/2), j < F."""
    j = np.arange(F, dtype=np.int64)
    if rotation == "interleaved":
        return 2 * j, 2 * j + 1
    return j, j + N // 2


def _shape(name: str, arr: np.ndarray, symbols: str, expected: tuple) -> None:
    if tuple(arr.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {fmt(symbols, expected)}, got {tuple(arr.shape)}")


def _arrays(kw: dict, work: np.dtype) -> dict:
    return {k: float_array(k, v, work) for k, v in kw.items()}


def _check(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v, ids, rotation, dtype):
    work = check_dtype(dtype)
    rotation = check_rotation(rotation)
    a = _arrays(dict(x=x, dt=dt, dA=dA, lam=lam, B=B, C=C, B_bias=B_bias, C_bias=C_bias, dtheta=dtheta), work)
    x_ = a["x"]
    if x_.ndim != 4:
        raise ValueError(f"x: expected shape (S, T, H, P), got {tuple(x_.shape)}")
    S, T, H, P = (int(v) for v in x_.shape)
    if S < 1:
        raise ValueError(f"x: S (the number of sequences) must be >= 1, got shape {tuple(x_.shape)}")
    for name in ("dt", "dA", "lam"):
        _shape(name, a[name], "(S, T, H)", (S, T, H))
    B_ = a["B"]
    if B_.ndim == 4:
        mimo, M = False, 1
        G, N = int(B_.shape[2]), int(B_.shape[3])
        _shape("B", B_, "(S, T, G, N)", (S, T, G, N))
    elif B_.ndim == 5:
        mimo = True
        M, G, N = (int(v) for v in B_.shape[2:])
        _shape("B", B_, "(S, T, M, G, N)", (S, T, M, G, N))
        if M < 1:
            raise ValueError(f"B: M (the MIMO rank) must be >= 1, got shape {tuple(B_.shape)}")
    else:
        raise ValueError(f"B: expected shape (S, T, G, N) (SISO) or (S, T, M, G, N) (MIMO rank M), "
                         f"got {tuple(B_.shape)}")
    if G < 1:
        raise ValueError(f"B: G (the number of groups) must be >= 1, got shape {tuple(B_.shape)}")
    if H % G:
        raise ValueError(f"B: H % G must be 0 (each group is shared by H/G heads), got H = {H}, G = {G}")
    if mimo:
        _shape("C", a["C"], "(S, T, M, G, N)", (S, T, M, G, N))
        for name in ("B_bias", "C_bias"):
            _shape(name, a[name], "(H, M, N)", (H, M, N))
    else:
        _shape("C", a["C"], "(S, T, G, N)", (S, T, G, N))
        for name in ("B_bias", "C_bias"):
            _shape(name, a[name], "(H, N)", (H, N))
    th = a["dtheta"]
    if th.ndim != 4:
        raise ValueError(f"dtheta: expected shape (S, T, H, F) = ({S}, {T}, {H}, F), got {tuple(th.shape)}")
    F = int(th.shape[3])
    _shape("dtheta", th, "(S, T, H, F)", (S, T, H, F))
    if F > 0 and N % 2:
        raise ValueError(f"dtheta: F = {F} rotated pairs need an even state size N, got N = {N} (B's last axis)")
    if 2 * F > N:
        raise ValueError(f"dtheta: F (rotated pairs) must be at most N/2 = {N // 2}, got F = {F}")

    if psi is not None:
        if not mimo:
            raise ValueError("psi: SISO (B of shape (S, T, G, N)) has no value projection; expected None, got an array")
        psi_ = float_array("psi", psi, work)
        _shape("psi", psi_, "(H, M, P)", (H, M, P))
    else:
        psi_ = np.ones((H, M, P), dtype=work)

    given = [n for n, v in zip(STATE_NAMES, (s_theta, s_h, s_k, s_v), strict=True) if v is not None]
    if given and len(given) < 4:
        missing = [n for n in STATE_NAMES if n not in given]
        raise ValueError(f"{missing[0]}: the start state's four parts are given together or not at all; got "
                         f"{', '.join(given)} but not {', '.join(missing)}")
    states_given = bool(given)
    if states_given:
        st = _arrays(dict(s_theta=s_theta, s_h=s_h, s_k=s_k, s_v=s_v), work)
        R = int(st["s_theta"].shape[0]) if st["s_theta"].ndim == 3 else -1
        if R < 1:
            raise ValueError(f"s_theta: expected shape (R, H, F) = (R, {H}, {F}) with R >= 1, "
                             f"got {tuple(st['s_theta'].shape)}")
        _shape("s_theta", st["s_theta"], "(R, H, F)", (R, H, F))
        _shape("s_h", st["s_h"], "(R, H, P, N)", (R, H, P, N))
        if mimo:
            _shape("s_k", st["s_k"], "(R, H, M, N)", (R, H, M, N))
            _shape("s_v", st["s_v"], "(R, H, M, P)", (R, H, M, P))
        else:
            _shape("s_k", st["s_k"], "(R, H, N)", (R, H, N))
            _shape("s_v", st["s_v"], "(R, H, P)", (R, H, P))
        ids_ = check_ids(ids, S, R)
    else:
        if ids is not None:
            raise ValueError("ids: the start states are None (zero start states, one per sequence), so ids must be "
                             "None")
        R = S
        rank = (M,) if mimo else ()   # the caller's layout: the rank axis is added below
        st = {"s_theta": np.zeros((S, H, F), work), "s_h": np.zeros((S, H, P, N), work),
              "s_k": np.zeros((S, H, *rank, N), work), "s_v": np.zeros((S, H, *rank, P), work)}
        ids_ = None
    dims = M3Dims(S=S, T=T, H=H, P=P, N=N, G=G, M=M, F=F, R=R, mimo=mimo)
    out = {k: finish(v, work) for k, v in a.items()}
    if not mimo:   # the one layout: a rank axis of 1
        out["B"], out["C"] = out["B"][:, :, None], out["C"][:, :, None]
        out["B_bias"], out["C_bias"] = out["B_bias"][:, None], out["C_bias"][:, None]
    out["psi"] = finish(psi_, work)
    for k, v in st.items():
        v = finish(v, work)
        if not mimo and k in ("s_k", "s_v"):
            v = v[:, :, None]
        out[k] = v
    return dict(dims=dims, **out, ids=arange_ids(S) if ids_ is None else ids_, psi_given=psi is not None,
                states_given=states_given, rotation=rotation, dtype=work)


def check_mamba3_forward(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi=None, s_theta=None, s_h=None,
                         s_k=None, s_v=None, ids=None, *, rotation="interleaved", dtype=np.float32) -> M3Problem:
    """Check the forward's arguments (shapes: module docstring, docs/SPEC.md "Mamba-3") and return an
    :class:`M3Problem`. Raises TypeError / ValueError naming the argument before any work."""
    return M3Problem(**_check(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v, ids,
                              rotation, dtype))


def check_mamba3_backward(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi=None, s_theta=None, s_h=None,
                          s_k=None, s_v=None, ids=None, g_y=None, g_theta=None, g_h=None, g_k=None, g_v=None, *,
                          rotation="interleaved", dtype=np.float32) -> M3Problem:
    """Check the backward's arguments: the forward's, then the cotangents of the five outputs, each
    None for zeros or of its output's shape: g_y (S,T,H,P) | (S,T,M,H,P), g_theta (S,H,F),
    g_h (S,H,P,N), g_k (S,H,N) | (S,H,M,N), g_v (S,H,P) | (S,H,M,P)."""
    p = _check(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v, ids, rotation, dtype)
    d, work = p["dims"], p["dtype"]
    S, T, H, P, N, M, F = d.S, d.T, d.H, d.P, d.N, d.M, d.F
    if d.mimo:
        want = {"g_y": ("(S, T, M, H, P)", (S, T, M, H, P)), "g_k": ("(S, H, M, N)", (S, H, M, N)),
                "g_v": ("(S, H, M, P)", (S, H, M, P))}
    else:
        want = {"g_y": ("(S, T, H, P)", (S, T, H, P)), "g_k": ("(S, H, N)", (S, H, N)),
                "g_v": ("(S, H, P)", (S, H, P))}
    want["g_theta"] = ("(S, H, F)", (S, H, F))
    want["g_h"] = ("(S, H, P, N)", (S, H, P, N))
    inner = {"g_y": (S, T, M, H, P), "g_theta": (S, H, F), "g_h": (S, H, P, N), "g_k": (S, H, M, N),
             "g_v": (S, H, M, P)}
    for name, value in (("g_y", g_y), ("g_theta", g_theta), ("g_h", g_h), ("g_k", g_k), ("g_v", g_v)):
        if value is None:
            p[name] = np.zeros(inner[name], work)
            continue
        arr = float_array(name, value, work)
        _shape(name, arr, *want[name])
        p[name] = finish(arr, work).reshape(inner[name])   # SISO: a rank axis of 1 added
    return M3Problem(**p)


def check_mamba3_update_cache(update_cache, caches: tuple, p: M3Problem) -> bool:
    """``update_cache`` must be True or False (TypeError otherwise); returned. True writes each
    sequence's four final state parts into row ids[i] of s_theta, s_h, s_k, s_v, so the four must
    be given as writeable numpy float arrays (TypeError / ValueError naming the part) and the ids
    distinct (ValueError naming ids). Run after the shape checks, before any work."""
    if update_cache is not True and update_cache is not False:
        raise TypeError(f"update_cache: expected True or False, got {update_cache!r}")
    if not update_cache:
        return False
    if not p.states_given:
        raise ValueError("s_theta: update_cache=True writes the final states into the four cache arrays, got None "
                         "(zero start states, no cache): pass s_theta, s_h, s_k and s_v")
    for name, s in zip(STATE_NAMES, caches, strict=True):
        if not isinstance(s, np.ndarray) or s.dtype.kind != "f":
            got = f"{type(s).__name__} of {s.dtype}" if isinstance(s, np.ndarray) else type(s).__name__
            raise TypeError(f"{name}: update_cache=True writes the final states into {name}: expected a writeable "
                            f"numpy float array, got {got}")
        if not s.flags.writeable:
            raise ValueError(f"{name}: update_cache=True writes the final states into {name}, which is read-only")
    check_distinct_ids(p.ids, "the cache")
    return True
