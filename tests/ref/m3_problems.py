"""Small Mamba-3 problems for the reference's tests (tests/ref/test_mamba3_*.py), drawn from a
numpy Generator, and the finite-difference oracle of the float64 forward.

The values keep the scan well inside float64 and away from the one place the forward is not
smooth: the final angle theta jumps by 2*pi where it wraps (every other use of theta is
periodic), so a problem whose final angles come within WRAP_MARGIN of 0 or 2*pi is redrawn.
"""

from __future__ import annotations

import numpy as np

import ssm_ref

INPUTS = ("x", "dt", "dA", "lam", "B", "C", "B_bias", "C_bias", "dtheta", "psi", "s_theta", "s_h", "s_k", "s_v")
OUTPUTS = ("y", "theta", "h", "k", "v")
WRAP_MARGIN = 0.05
TWO_PI = 2 * np.pi


def _ids(rng, kind: str, S: int, R: int):
    if kind == "none":
        return None
    if kind == "identity":
        return np.arange(S)
    if kind == "permutation":
        return rng.permutation(R)[:S]
    if kind == "duplicates":   # every row read twice where S allows
        return np.sort(rng.integers(0, max(1, (S + 1) // 2), S)) % R
    raise ValueError(kind)


def make(rng, *, S=2, T=3, H=2, P=2, N=4, G=1, M=None, F=1, R=None, ids="none", states=True, psi=True,
         rotation="interleaved", wrap_margin=WRAP_MARGIN):
    """(kwargs of mamba3_scan in float64, the cotangents g_y, g_theta, g_h, g_k, g_v). ``M`` None:
    SISO; ``states`` False: no start state (ids must be "none"); ``R`` defaults to S (S + 1 with
    duplicate or permuted ids). ``wrap_margin`` 0 takes the first problem drawn, wrap or not."""
    r = rng.standard_normal
    R = R or (S + 1 if ids in ("duplicates", "permutation") else S)
    rank = () if M is None else (M,)
    for _ in range(100):
        a = dict(
            x=r((S, T, H, P)),
            dt=rng.uniform(0.05, 0.8, (S, T, H)),
            lam=rng.uniform(0.05, 0.95, (S, T, H)),
            B=r((S, T, *rank, G, N)), C=r((S, T, *rank, G, N)),
            B_bias=r((H, *rank, N)), C_bias=r((H, *rank, N)),
            dtheta=rng.uniform(-2.0, 2.0, (S, T, H, F)),
            psi=r((H, M, P)) if (M is not None and psi) else None,
        )
        a["dA"] = -a["dt"] * rng.uniform(0.2, 1.5, (S, T, H))
        if states:
            a.update(s_theta=rng.uniform(0, TWO_PI, (R, H, F)), s_h=r((R, H, P, N)), s_k=r((R, H, *rank, N)),
                     s_v=r((R, H, *rank, P)), ids=_ids(rng, ids, S, R))
        theta = ssm_ref.mamba3_scan(**a, rotation=rotation, dtype=np.float64).theta
        if np.all((theta >= wrap_margin) & (theta <= TWO_PI - wrap_margin)):
            break
    else:
        raise AssertionError("no problem with its final angles away from the wrap")
    out = ssm_ref.mamba3_scan(**a, rotation=rotation, dtype=np.float64)
    cot = {"g_" + n: r(getattr(out, n).shape) for n in OUTPUTS}
    return a, cot


def drawn_shape(rng, n: int, mimo: bool, edges: bool = False) -> dict:
    """The keywords of :func:`make` for the n-th of a run of drawn shapes: G in 1-2, even N up to 8,
    S, T, heads, channels, rank (``mimo``) and rotated pairs drawn, start states for two draws in
    three and then their ids. ``edges`` also takes F = 0 at n = 1 and no psi at n = 4."""
    G = int(rng.choice([1, 2]))
    N = 2 * int(rng.integers(1, 5))
    states = n % 3 != 0
    kw = dict(S=int(rng.integers(1, 4)), T=int(rng.integers(1, 12)), H=G * int(rng.integers(1, 3)),
              P=int(rng.integers(1, 4)), N=N, G=G, M=int(rng.integers(1, 4)) if mimo else None,
              F=0 if edges and n == 1 else int(rng.integers(0, N // 2 + 1)), states=states,
              ids=str(rng.choice(["none", "duplicates", "permutation"])) if states else "none")
    if edges:
        kw["psi"] = n != 4
    return kw


def loss(args: dict, cot: dict, rotation: str) -> float:
    out = ssm_ref.mamba3_scan(**args, rotation=rotation, dtype=np.float64)
    return float(sum(np.sum(getattr(out, n) * cot["g_" + n]) for n in OUTPUTS))


def fd_grad(args: dict, name: str, cot: dict, rotation: str, h: float = 1e-3) -> np.ndarray:
    """The gradient of :func:`loss` w.r.t. every entry of ``args[name]`` by the fourth-order central
    stencil (f(-2h) - 8 f(-h) + 8 f(h) - f(2h)) / 12h."""
    base = np.array(args[name], dtype=np.float64)
    out = np.zeros_like(base)
    for i in np.ndindex(base.shape):
        f = []
        for step in (-2, -1, 1, 2):
            moved = base.copy()
            moved[i] += step * h
            f.append(loss({**args, name: moved}, cot, rotation))
        out[i] = (f[0] - 8 * f[1] + 8 * f[2] - f[3]) / (12 * h)
    return out


def fd_directional(args: dict, name: str, direction: np.ndarray, cot: dict, rotation: str, h: float = 1e-3) -> float:
    """d loss / d args[name] along ``direction``, by the same stencil."""
    base = np.array(args[name], dtype=np.float64)
    f = [loss({**args, name: base + step * h * direction}, cot, rotation) for step in (-2, -1, 1, 2)]
    return (f[0] - 8 * f[1] + 8 * f[2] - f[3]) / (12 * h)
