"""How the scan's arguments' shapes agree: the messages of a wrong shape, and which argument a
disagreement is blamed on when the arrays' sizes do not fit together (the one that disagrees
with what the others agree on). Part of the validator (ssm_ref.checks), which decides the order
of the checks; also the default of C that tells mamba_ssm's five arrays (x, dt, A, B, C) from a
forgotten C."""

from __future__ import annotations

import numpy as np

__all__ = ["MISSING", "a_error", "blame", "check_five_arrays", "expect_ndim", "expect_shape", "fmt"]


def fmt(symbols: str, numbers) -> str:
    nums = ", ".join(str(n) for n in numbers)
    if len(numbers) == 1:
        nums += ","
    return f"{symbols} = ({nums})"


def expect_shape(name: str, arr: np.ndarray, symbols: str, expected: tuple) -> None:
    if arr.shape != tuple(expected):
        raise ValueError(f"{name}: expected shape {fmt(symbols, expected)}, got {tuple(arr.shape)}")


def expect_ndim(name: str, arr: np.ndarray, symbols: str, known: tuple) -> None:
    """``known``: the expected shape with the sizes not yet known given as their symbol."""
    if arr.ndim != len(known):
        want = symbols if all(isinstance(k, str) for k in known) else fmt(symbols, known)
        raise ValueError(f"{name}: expected shape {want}, got {tuple(arr.shape)}")


# The axes of each array (docs/SPEC.md shapes); A's are (H,), (H, 1) or (H, N).
_AXES = {"x": "STHP", "s": "RHPN", "dt": "STH", "B": "STGN", "C": "STGN"}
_SYMBOLS = {"x": "(S, T, H, P)", "s": "(R, H, P, N)", "dt": "(S, T, H)", "B": "(S, T, G, N)", "C": "(S, T, G, N)"}


def _axes(name: str, shape: tuple) -> str:
    if name != "A":
        return _AXES[name]
    return "H" if len(shape) == 1 or shape[1] == 1 else "HN"


def blame(arrays: dict) -> None:
    """Raise the ValueError of the first argument (in argument order) whose sizes disagree with
    what the other arguments agree on. Each size (S, T, H, P, N, G) is the one most of the arrays
    that carry it give; a tie goes to an array that no majority outvoted on another size, then to
    the earlier argument. So x passed channels-first (S, H, P, T) is reported as x, not as the dt
    or s that are right. ``arrays``: x, s (None for zero start
    states, which follow x), dt, A, B, C, each with its number of axes already checked."""
    claims: dict = {}
    given = {k: tuple(int(v) for v in a.shape) for k, a in arrays.items() if a is not None}
    for name, shape in given.items():
        for sym, v in zip(_axes(name, shape), shape, strict=True):
            claims.setdefault(sym, []).append((v, name))
    def vote(suspect: set) -> dict:
        out = {}
        for sym, cl in claims.items():
            votes = [v for v, _ in cl]
            trusted = {v for v, n in cl if n not in suspect}
            out[sym] = max(votes, key=lambda v: (votes.count(v), v in trusted, -votes.index(v)))
        return out

    first = vote(set())
    # an array outvoted on one size (more arrays give another) loses the ties on the others
    outvoted = {n for sym, cl in claims.items() for v, n in cl
                if sum(u == first[sym] for u, _ in cl) > sum(u == v for u, _ in cl)}
    agreed = vote(outvoted)
    for name, shape in given.items():
        axes = _axes(name, shape)
        want = tuple(agreed[a] for a in axes)
        if shape == want:
            continue
        if name == "A":
            a_error(agreed["H"], agreed["N"], shape)
        why = "; ".join(f"{a} = {agreed[a]} in {', '.join(n for v, n in claims[a] if v == agreed[a] and n != name)}"
                        for a, v in zip(axes, shape, strict=True) if v != agreed[a])
        order = " -- the same sizes in another order: the axes are " + _SYMBOLS[name] if sorted(shape) == sorted(
            want) else ""
        raise ValueError(f"{name}: expected shape {fmt(_SYMBOLS[name], want)}, got {shape} ({why}){order}")
    raise AssertionError(f"sizes disagree but no argument was blamed: {given}")   # unreachable


def a_error(H: int, N: int, a_shape: tuple) -> None:
    raise ValueError(f"A: expected shape (H,) or (H, 1) = ({H},) or ({H}, 1) for Mamba-2, "
                     f"or (H, N) = ({H}, {N}) for Mamba-1, got {a_shape}")


class _Missing:
    """C's default in the backends' signatures: a call with five arrays -- mamba_ssm's (x, dt, A, B,
    C), which has no start states -- then gets an error naming s rather than Python's "missing C"."""

    def __repr__(self) -> str:
        return "<required>"


MISSING = _Missing()


def check_five_arrays(x, C) -> None:
    """Raise when C was not given (:data:`MISSING`): a TypeError naming s when the second array
    looks like dt (three axes), as in mamba_ssm's (x, dt, A, B, C); else one naming C. Any array
    type with ``ndim`` (numpy, torch, jax)."""
    if C is not MISSING:
        return
    if getattr(x, "ndim", None) == 3:   # dt where x belongs: the arrays were shifted by one
        raise TypeError("s: the start states come first, (s, x, dt, A, B, C[, ids]); this call passed five arrays, "
                        "as mamba_ssm's functions take them (x, dt, A, B, C). Pass None for zero start states: "
                        "(None, x, dt, A, B, C)")
    raise TypeError("C: missing (expected a float array of shape (S, T, G, N))")
