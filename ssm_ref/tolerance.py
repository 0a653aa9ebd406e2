"""How close a float32 backend must come to the float64 oracle: the one tolerance table.

Every backend is judged the same way, by the tests (``tests/registry.py``) and by
``ssm-scan check``: its float32 result against the oracle (``ssm_ref`` with ``dtype=np.float64``)
on the same float32-representable inputs, output by output, with the bound of :data:`F32_TOL`::

    ||got - want||  <=  rtol * ||want||  +  atol * sqrt(size)         (2-norms, in float64)

``rtol`` is the norm-relative error float32 arithmetic may add; ``atol`` is an absolute floor
(an RMS error per element) for outputs whose exact value nearly cancels (a one-element d_A or y
can be 1e-3 of its terms, and then float32's absolute error is all that is left).

The bounds are claimed for inputs in the seed's ranges (tests/problems.py), dt in [-0.5, 0.5] in
particular. Far down the log branch the float32 softplus log(1 + exp(dt)) itself is off by about
6e-8 / exp(dt) relative (SCAN.md asks for exactly that formula), so float32 and float64 part
ways by design: measured on y and d_x, 5e-7 for dt in [-3, -2], 4e-6 in [-5, -4], 7e-5 in
[-8, -7], 4e-3 in [-12, -11], 0.2 in [-16, -15]. See docs/SPEC.md, "Tolerance policy".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["F32_TOL", "OUTPUTS", "Tol", "Verdict", "abs_err", "judge", "rel_err"]

# Forward outputs, then the backward's (ScanGrads field order).
OUTPUTS = ("y", "states", "d_s", "d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C")


@dataclass(frozen=True)
class Tol:
    rtol: float  # norm-relative
    atol: float  # absolute RMS floor per element


# float32 contract vs float64 oracle. Measured with tests/measure_f32_error.py, seeds 7, 11, 12:
# 12000 drawn shapes in the seed's value ranges (S<=3, T<=16, H<=9, P<=4, N<=9, every ids pattern,
# both variants) plus the seed's shapes at N = 16/128/256 (up to P=64, H=8, T=16). Each comment
# gives the worst seen: "rel" = norm-relative error over outputs whose norm is not
# cancellation-small (>= 0.1 * sqrt(size)), "rel(all)" the same over every output, "rms" the
# absolute RMS error, "used" the largest share of the bound below any case used. Every bound is
# at least 10x what the reference needs; faster backends that reorder sums or fuse multiply-adds
# should land within a small factor of the reference, which leaves them room.
F32_TOL = {
    # y = sum_n st*C: one reduction over N per token on top of the state's error.
    # rel 5.4e-7, rel(all) 1.8e-6 (a one-element y cancelling to 1e-3 of its terms), rms 1.3e-7; used 4.2%.
    "y": Tol(rtol=3e-6, atol=1e-6),
    # states: T multiply-adds per element, no reduction. rel 4.0e-7, rel(all) 9.1e-7, rms 5.6e-8; used 3.8%.
    "states": Tol(rtol=3e-6, atol=1e-6),
    # d_s0 = a_0 * lam_0: lam carries the whole reverse recurrence.
    # rel 3.3e-7, rel(all) 6.0e-7, rms 9.5e-8; used 5.0%.
    "d_s0": Tol(rtol=3e-6, atol=1e-6),
    # d_s: d_s0 scatter-added; duplicate ids add one rounding per extra sequence.
    # rel 3.3e-7, rel(all) 7.5e-7, rms 9.5e-8; used 5.0%.
    "d_s": Tol(rtol=3e-6, atol=1e-6),
    # d_x = gamma * d, gamma a reduction over N. rel 3.5e-7, rel(all) 3.7e-7, rms 2.0e-7; used 4.1%.
    "d_x": Tol(rtol=3e-6, atol=1e-6),
    # d_dt: reductions over N (inside dd) and over P of terms of both signs.
    # rel 3.7e-7, rel(all) 1.5e-5, rms 4.6e-7; used 4.0%.
    "d_dt": Tol(rtol=5e-6, atol=1e-6),
    # d_A: per head (per (h, n) for Mamba-1), summed over S*T*P(*N) terms that partly cancel:
    # the loosest output. rel 2.3e-6, rel(all) 2.5e-4 (a one-element d_A cancelling), rms 3.8e-6; used 8.8%.
    "d_A": Tol(rtol=2e-5, atol=1e-5),
    # d_B, d_C: sums over the H/G heads and P channels of a group; at P=64, H=8 the absolute error
    # grows with the sum. d_B rel 4.5e-7, rms 1.4e-6, used 7.9%; d_C rel 4.3e-7, rms 1.0e-6, used 7.3%.
    "d_B": Tol(rtol=5e-6, atol=2e-6),
    "d_C": Tol(rtol=5e-6, atol=2e-6),
}


def rel_err(got, want) -> float:
    """||got - want|| / ||want|| in float64 (2-norms over all elements).

    Empty arrays: 0.0. want all zero: ||got|| (the absolute error, 0 only if got is zero too).
    Non-finite entries must sit at the same places with the same values (inf sign, nan), else the
    error is inf; the norms then run over the finite entries only. Shapes must match (else
    AssertionError: a shape mismatch is a broken backend, not an error size).
    """
    g = np.asarray(got, dtype=np.float64)
    w = np.asarray(want, dtype=np.float64)
    if g.shape != w.shape:
        raise AssertionError(f"shape mismatch: got {g.shape}, want {w.shape}")
    if w.size == 0:
        return 0.0
    fin_g, fin_w = np.isfinite(g), np.isfinite(w)
    if not np.array_equal(fin_g, fin_w):
        return math.inf
    if not np.array_equal(g[~fin_w], w[~fin_w], equal_nan=True):
        return math.inf
    g, w = g[fin_w], w[fin_w]
    diff = float(np.linalg.norm(g - w))
    norm = float(np.linalg.norm(w))
    return diff / norm if norm > 0 else diff


def abs_err(got, want) -> float:
    """||got - want|| over the entries where ``want`` is finite (float64)."""
    g = np.asarray(got, dtype=np.float64)
    w = np.asarray(want, dtype=np.float64)
    fin = np.isfinite(w)
    return float(np.linalg.norm(g[fin] - w[fin]))


@dataclass(frozen=True)
class Verdict:
    """One output judged against the oracle: ``ok`` iff ``err <= bound`` (and the shapes and the
    non-finite entries agree). ``rel`` is the norm-relative error (inf on a mismatch); ``used``
    the share of the bound taken (0 for an exact match)."""

    output: str
    ok: bool
    rel: float
    err: float
    bound: float
    message: str = ""

    @property
    def used(self) -> float:
        if self.err == 0.0:
            return 0.0
        return self.err / self.bound if self.bound > 0 else math.inf


def judge(output: str, got, want, tol: dict | None = None) -> Verdict:
    """Judge a float32 ``output`` (a name of :data:`OUTPUTS`) against the float64 oracle's
    ``want`` with ``tol[output]`` (default :data:`F32_TOL`). Never raises on a bad result: a wrong
    shape or misplaced non-finite entries give ``ok=False`` with a message."""
    t = (tol or F32_TOL)[output]
    g, w = np.asarray(got), np.asarray(want)
    if g.shape != w.shape:
        return Verdict(output, False, math.inf, math.inf, 0.0, f"shape {g.shape}, oracle {w.shape}")
    r = rel_err(g, w)
    if r == 0.0:
        return Verdict(output, True, 0.0, 0.0, 0.0)
    if not math.isfinite(r):
        return Verdict(output, False, math.inf, math.inf, 0.0, "non-finite entries differ from the oracle's")
    fin = np.isfinite(w)
    norm = float(np.linalg.norm(w[fin].astype(np.float64)))
    err = abs_err(g, w)
    bound = t.rtol * norm + t.atol * math.sqrt(int(fin.sum()))
    ok = err <= bound
    msg = "" if ok else (f"||got - want|| = {err:.3e} > {bound:.3e} (rel_err {r:.3e}, rtol {t.rtol:g}, "
                         f"atol {t.atol:g}, size {w.size})")
    return Verdict(output, ok, r, err, bound, msg)
