"""How close a float32 implementation must come to the float64 oracle, and the comparisons.

The bound (docs/SPEC.md, "Tolerance policy"), per output, 2-norms over the whole array:

    ||got - want||  <=  rtol * ||want||  +  atol * sqrt(size)

``rtol`` is the norm-relative error float32 arithmetic may add; ``atol`` is an absolute floor (an
RMS error per element) for outputs whose exact value nearly cancels. Non-finite entries must sit
at the same places as the oracle's, with the same values (nan, +inf, -inf), and are left out of
the norms. Empty arrays pass.

Long scans: beyond 16 tokens every bound grows as T / 16 (:func:`scaled`; measured in
docs/SPEC.md: a GPU's float32 exp is not correctly rounded, and its bias adds up along the scan).

Part of the spec (the contract says how close a result must come): ``ssm-scan check``, the testing
kit (``ssm_ref.testing``: verify, the properties, the fuzzer) and the tests all read it here. No
hypothesis and no backend imports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .ops import SCAN  # the op declares its outputs; this module bounds them

__all__ = [
    "F32_TOL",
    "F64_TOL",
    "MAMBA3_F32_TOL",
    "MAMBA3_MATRIX_TOL",
    "MATRIX_TOL",
    "OUTPUTS",
    "Comparison",
    "Tol",
    "compare",
    "nonfinite_mismatch",
    "rel_err",
    "scaled",
    "share_text",
    "value_text",
]

OUTPUTS = SCAN.output_names + SCAN.grad_names   # y, states, d_s, d_s0, d_x, d_dt, d_A, d_B, d_C


@dataclass(frozen=True)
class Tol:
    rtol: float  # norm-relative
    atol: float  # absolute RMS floor per element

    def times(self, k: float) -> Tol:
        return Tol(self.rtol * k, self.atol * k)


# float32 contract vs float64 oracle. Measured with tests/measure_f32_error.py, seeds 7, 11, 12:
# 12000 drawn shapes in the R test's value ranges (S<=3, T<=16, H<=9, P<=4, N<=9, every ids pattern,
# both variants) plus the R test's shapes at N = 16/128/256 (up to P=64, H=8, T=16). Each comment
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

# A float64 implementation against the float64 oracle (for ssm_ref.testing.verify(..., tol=F64_TOL)):
# both round at 1.1e-16 per operation, so they differ by reordering only. Measured between
# ssm_fast.oracle64 (numba, parallel) and ssm_ref float64 on 1200 drawn problems (typical,
# wide_dt, small_A; long_decay at T = 128): norm-relative at most 1.6e-15 (d_A 2.0e-14), RMS at
# most 4.3e-15 (d_A 1.6e-12): every bound is at least 5x that after scaling for T, most 50x.
F64_TOL = {name: Tol(rtol=1e-13, atol=1e-13) for name in OUTPUTS}
F64_TOL["d_A"] = Tol(rtol=1e-12, atol=1e-11)

# The chunked form on emulated matrix units (ssm_ref.precision, docs/SPEC.md section 15):
# ssm_ref.chunked's float32 forward and backward at "high" and "medium" against ssm_ref.scan in
# float64, per output, with no growth in T (measured up to T = 256). Measured with
# tests/measure_matrix_precision.py, seeds 7, 11, 12: 3000 drawn Mamba-2 problems (S <= 2, T up to
# three chunks of L = 8 or 16, or up to 128 tokens at L = 64; G <= 2, H <= 4, P <= 8, N <= 16; the
# typical, wide_dt, small_A and long_decay regimes). "rel", "used" as in F32_TOL's comment; "bench"
# the norm-relative error at (1, 256, 2, 64, 128), L = 64 (the benchmark's train shape cut down).
MATRIX_TOL = {
    # "high": float32's accuracy, the issue's 2e-6, as rtol wherever ~10x room remains.
    # y rel 2.7e-7, used 12.4%; states 5.3e-7, 13.0%; d_s and d_s0 9.2e-7 (cancellation-small
    # norms: atol 2e-6), 10.3%; d_x 3.0e-7, 9.7%; d_dt 5.7e-7, 13.2%; d_B 2.6e-7, 11.5%; bench
    # 1.0-2.0e-7 for all of them.
    "high": {name: Tol(rtol=2e-6, atol=1e-6) for name in OUTPUTS},
    # "medium": one float16 rounding per operand (2^-11), few terms to average on small problems.
    # y rel 2.1e-3, used 8.6%; states 7.5e-4, 3.4%; d_s, d_s0 2.0e-3, 6.2%; d_x 1.2e-3, 5.9%;
    # d_B 1.3e-3, 5.1%; bench 2.7-4.1e-4 (mamba_ssm's TF32 products: 1.35e-3 at the train shape).
    "medium": {name: Tol(rtol=1.5e-2, atol=5e-3) for name in OUTPUTS},
}
MATRIX_TOL["high"].update(
    d_s=Tol(rtol=2e-6, atol=2e-6),
    d_s0=Tol(rtol=2e-6, atol=2e-6),
    # d_C: a one-token chunk's g_y . u cancels. rel 1.1e-6, used 7.7% (19% at rtol 5e-6 in other draws).
    d_C=Tol(rtol=1e-5, atol=4e-6),
    # d_A: set by the float32 sums around the products, not by them: on the worst draw seen
    # (long_decay, T = 127) the token-sequential float32 scan is 5.0e-4 off, the chunked form at
    # "highest" 2.9e-4, at "high" 9.8e-5 (an rtol of 1e-4 would be 74% used). rel 1.7e-5 here, used 1.5%.
    d_A=Tol(rtol=1e-3, atol=1e-4),
)
MATRIX_TOL["medium"].update(
    # d_dt, d_C: sums over N and P of both signs. d_dt rel 5.1e-3, used 5.5%; d_C 2.7e-3, 3.5%.
    d_dt=Tol(rtol=5e-2, atol=1e-2),
    d_C=Tol(rtol=5e-2, atol=1e-2),
    # d_A cancels (above) and float16's rounding is 8000x float32's: rel 5.9e-2 (9.6e-2 in other
    # draws), used 7.7% (13% in other draws); bench 1.5e-5 to 2.9e-4.
    d_A=Tol(rtol=0.5, atol=0.1),
)

T_MEASURED = 16  # the tables above hold as they are up to this many tokens

# Beyond T_MEASURED tokens the bounds grow like T / 16. Rounding alone would grow like a random
# walk (sqrt(T / 16): the reference's errors do, measured with tests/measure_f32_error.py
# --regime long_decay), but a float32 exp that is not correctly rounded (GLSL allows 3 + 2|x| ulp)
# has a bias that adds up along the scan (measured on lavapipe: docs/SPEC.md, section 10).


def scaled(tol: dict, T: int) -> dict:
    """The table for a scan of T tokens: unchanged up to T = 16, every bound times T / 16 beyond."""
    if T <= T_MEASURED:
        return tol
    return {name: t.times(T / T_MEASURED) for name, t in tol.items()}


def nonfinite_mismatch(got, want) -> str:
    """'' when got and want have the same non-finite pattern, else what differs.

    Same pattern: np.isnan masks equal, np.isposinf masks equal, np.isneginf masks equal (so the
    finite masks are equal too, and every infinity has the same sign). Shapes must match.
    """
    g, w = np.asarray(got), np.asarray(want)
    if g.shape != w.shape:
        return f"shape {g.shape}, expected {w.shape}"
    for what, test in (("nan", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        mg, mw = test(g), test(w)
        if not np.array_equal(mg, mw):
            bad = np.argwhere(mg != mw)
            idx = tuple(int(v) for v in bad[0])
            return (f"{what} at {int(mg.sum())} entries, expected {int(mw.sum())}; first difference at "
                    f"{idx}: got {g[idx]!r}, expected {w[idx]!r} ({len(bad)} entries differ)")
    return ""


def rel_err(got, want) -> float:
    """||got - want|| / ||want|| in float64 (2-norms over all elements).

    Empty arrays: 0.0. want all zero: ||got|| (the absolute error, 0 only if got is zero too).
    Non-finite entries must sit at the same places with the same values (inf sign, nan), else the
    error is inf; the norms then run over the finite entries only. Raises AssertionError when the
    shapes differ.
    """
    g = np.asarray(got, dtype=np.float64)
    w = np.asarray(want, dtype=np.float64)
    if g.shape != w.shape:
        raise AssertionError(f"shape mismatch: got {g.shape}, want {w.shape}")
    if w.size == 0:
        return 0.0
    if nonfinite_mismatch(g, w):
        return math.inf
    fin = np.isfinite(w)
    g, w = g[fin], w[fin]
    diff = float(np.linalg.norm(g - w))
    norm = float(np.linalg.norm(w))
    return diff / norm if norm > 0 else diff


def share_text(used: float, short: bool = False) -> str:
    """How much of its bound an error used, for people: "2.0%" up to the bound, beyond it
    "23.4 x the bound", "6759 x the bound", "6.3e10 x the bound" (``short``: without "the bound")."""
    if math.isnan(used):
        return "-"
    if used <= 1.0:
        return f"{used:.1%}"
    if math.isinf(used):
        times = "inf"
    elif used < 100:
        times = f"{used:.3g}"
    elif used < 1e4:
        times = f"{used:.0f}"
    else:
        mantissa, exponent = f"{used:.1e}".split("e")
        times = f"{mantissa}e{int(exponent)}"
    return f"{times} x" if short else f"{times} x the bound"


def value_text(v) -> str:
    """A float as printed in reports: 9 significant digits (a float32 value exactly), nan, inf."""
    return "-" if v is None else f"{float(v):.9g}"


@dataclass(frozen=True)
class Comparison:
    """One output against its expected value. ``ok`` iff the shapes and the non-finite patterns
    match and err <= bound. ``err`` = ||got - want||, ``bound`` = rtol * ||want|| + atol *
    sqrt(size), ``norm`` = ||want|| (2-norms over the entries where want is finite); ``rel`` =
    err / norm (norm-relative), ``max_rel`` = max|got - want| / max|want| (over finite entries),
    ``used`` = err / bound, ``rel_bound`` = bound / norm (the bound as a norm-relative error).

    ``index`` is the worst element (a tuple into the output's shape): the largest |got - want|
    over the finite entries, or, when the non-finite entries differ, the first entry that
    differs; ``got`` and ``want`` are the values there. All three are None for empty arrays and
    mismatched shapes."""

    output: str
    ok: bool
    err: float
    bound: float
    rel: float
    max_rel: float
    detail: str = ""
    index: tuple | None = None
    got: float | None = None
    want: float | None = None
    norm: float = 0.0

    @property
    def used(self) -> float:
        return self.err / self.bound if self.bound > 0 else (0.0 if self.err == 0 else math.inf)

    @property
    def rel_bound(self) -> float:
        return self.bound / self.norm if self.norm > 0 else self.bound

    @property
    def share(self) -> str:
        """``used`` for people: "2.0%", or "6.3e10 x the bound" (:func:`share_text`)."""
        return share_text(self.used)

    def worst(self) -> str:
        """ "worst at (0, 2, 1, 0): got 0.51234567, want 0.5", or "" without an index."""
        if self.index is None:
            return ""
        return f"worst at {self.index}: got {value_text(self.got)}, want {value_text(self.want)}"

    def message(self, label: str = "") -> str:
        where = self.output + (f" [{label}]" if label else "")
        if self.detail:
            return f"{where}: {self.detail}"
        verdict = f"within the bound ({share_text(self.used)})" if self.ok else f"error {share_text(self.used)}"
        text = (f"{where}: {verdict}: ||got - want|| = {self.err:.3e} {'<=' if self.ok else '>'} bound "
                f"{self.bound:.3e} (rel {self.rel:.3e}, bound as rel {self.rel_bound:.3e}, max rel {self.max_rel:.3e})")
        return text + (f"; {self.worst()}" if self.index is not None else "")


def _at(a: np.ndarray, index: tuple) -> float:
    return float(a[index])


def compare(output: str, got, want, tol: Tol) -> Comparison:
    """``got`` against ``want`` (any float dtypes; compared in float64) with the bound of ``tol``."""
    g = np.asarray(got, dtype=np.float64)
    w = np.asarray(want, dtype=np.float64)
    if g.shape != w.shape:
        return Comparison(output, False, math.inf, 0.0, math.inf, math.inf,
                          f"shape {g.shape}, expected {w.shape}")
    why = nonfinite_mismatch(g, w)
    if why:
        bad = np.argwhere((np.isnan(g) != np.isnan(w)) | (np.isposinf(g) != np.isposinf(w))
                          | (np.isneginf(g) != np.isneginf(w)))
        idx = tuple(int(v) for v in bad[0])
        return Comparison(output, False, math.inf, 0.0, math.inf, math.inf, "non-finite entries differ: " + why,
                          idx, _at(g, idx), _at(w, idx))
    fin = np.isfinite(w)
    gf, wf = g[fin], w[fin]
    if wf.size == 0:
        return Comparison(output, True, 0.0, 0.0, 0.0, 0.0)
    diff = np.where(fin, np.abs(g - np.where(fin, w, 0.0)), -1.0)
    idx = tuple(int(v) for v in np.unravel_index(int(np.argmax(diff)), w.shape))
    err = float(np.linalg.norm(gf - wf))
    norm = float(np.linalg.norm(wf))
    bound = tol.rtol * norm + tol.atol * math.sqrt(wf.size)
    top = float(np.max(np.abs(wf)))
    max_rel = float(np.max(np.abs(gf - wf))) / top if top > 0 else float(np.max(np.abs(gf)))
    rel = err / norm if norm > 0 else err
    return Comparison(output, err <= bound, err, bound, rel, max_rel, "", idx, _at(g, idx), _at(w, idx), norm)


# Mamba-3 (ssm_ref.mamba3_scan, docs/SPEC.md "Mamba-3"): float32 contract vs float64 oracle, the
# same norm rule and the same T / 16 growth beyond 16 tokens. Measured with
# tests/measure_mamba3_f32_error.py, seeds 7, 11, 12, 13: 12000 drawn problems (S <= 3, T <= 16,
# H <= 4, P <= 4 and N <= 10, one in ten at P = 16/32, N = 16-64; SISO and MIMO M <= 4, every F,
# both rotations, states given (80%) or not, repeated and permuted ids). "rel", "rel(all)", "rms"
# and "used" as in F32_TOL's comment. theta is compared on the circle (see
# tests/measure_mamba3_f32_error.py): a float32 angle within rounding of 0 or 2*pi may come out on
# the other side of the wrap, 2*pi away as plain numbers. Every bound is at least 10x what the
# reference needs. The angle sets the scale: θ carries an absolute error of up to T rounding steps
# of numbers near 2*pi (~2.4e-7 each), and everything rotated by it (q, k, so y, h and the gradients)
# inherits it as a relative error -- hence bounds ~5x F32_TOL's.
MAMBA3_F32_TOL = {
    # y = h q per rank: h's error plus the rotation's. rel 4.3e-6, rel(all) 4.3e-6, rms 4.3e-6; used 6.4%.
    "y": Tol(rtol=2e-5, atol=1e-5),
    # theta: T float32 adds and mods of numbers below 2*pi. rel 4.0e-6, rel(all) 3.5e-5 (angles near 0),
    # rms 1.2e-6; used 4.1%.
    "theta": Tol(rtol=3e-5, atol=1e-5),
    # h: T multiply-adds of rotated outer products. rel 1.1e-6, rms 1.9e-6; used 4.3%.
    "h": Tol(rtol=2e-5, atol=5e-6),
    # k: the last key, biased and rotated by the final angle. rel 1.3e-6, rms 2.5e-6; used 4.5%.
    "k": Tol(rtol=2e-5, atol=5e-6),
    # v = psi * x: one rounding. rel 5.7e-8 (half an ulp), rms 1.2e-7; used 4.9%.
    "v": Tol(rtol=1e-6, atol=1e-7),
    # d_x: a sum over ranks of psi * (cotangent of v). rel 1.1e-5, rms 8.6e-6; used 7.7%.
    "d_x": Tol(rtol=5e-5, atol=1e-5),
    # d_dt, d_dA, d_lam: reductions over P x N of the state's cotangent times the state or the outer
    # products. d_dt rel 3.9e-6, d_dA rel 5.1e-6 (rel(all) 9.6e-6), d_lam rel 3.3e-6; used <= 7.5%.
    "d_dt": Tol(rtol=5e-5, atol=1e-5),
    "d_dA": Tol(rtol=5e-5, atol=1e-5),
    "d_lam": Tol(rtol=5e-5, atol=1e-5),
    # d_B, d_C: sums over P and the H/G heads of a group. rel 6.2e-7, rms 3.0e-6; used 4.8%.
    "d_B": Tol(rtol=1e-5, atol=5e-6),
    "d_C": Tol(rtol=1e-5, atol=5e-6),
    # d_B_bias, d_C_bias: summed over S x T besides. rel 2.4e-6, rms 1.3e-5; used 6.2%.
    "d_B_bias": Tol(rtol=3e-5, atol=1e-5),
    "d_C_bias": Tol(rtol=3e-5, atol=1e-5),
    # d_dtheta: the suffix sums of the rotations' angle cotangents. rel 2.6e-6, rms 3.9e-5; used 7.4%.
    "d_dtheta": Tol(rtol=3e-5, atol=1e-5),
    # d_psi: summed over S x T of x times v's cotangent, terms of both signs. rel 2.0e-5, rms 2.4e-5;
    # used 3.6%.
    "d_psi": Tol(rtol=2e-4, atol=5e-5),
    # d_s_theta: the whole sum of every token's angle cotangent, which cancels most.
    # rel 6.2e-5, rel(all) 4.4e-4, rms 4.9e-5; used 5.5%.
    "d_s_theta": Tol(rtol=2e-4, atol=1e-4),
    # d_s_h, d_s_k, d_s_v: the carried cotangents at the start, scatter-added.
    # d_s_h rel 1.1e-6, d_s_k rel 8.9e-7, d_s_v rel 2.2e-6 (rel(all) 8.4e-5); used <= 3.2%.
    "d_s_h": Tol(rtol=2e-5, atol=5e-6),
    "d_s_k": Tol(rtol=2e-5, atol=5e-6),
    "d_s_v": Tol(rtol=3e-5, atol=1e-5),
}

# Mamba-3's chunked form at the matrix-unit settings (ssm_ref.mamba3_chunked, precision=) against
# the float64 scan, scaled by T / 16 beyond 16 tokens as MAMBA3_F32_TOL is. Measured with
# tests/measure_matrix_precision.py --op mamba3, seeds 7 and 11, 300 draws (SISO and MIMO, regimes
# typical, long_decay, small_dA, large_dt, L 4 to 64, T up to 192).
MAMBA3_MATRIX_TOL = {
    # "high": float32's table. The products keep float32's accuracy; the angles and the chunked
    # form's own float32 sums set the worst, as they do at "highest": h rel 1.5e-5 (used 17%), k
    # 1.4e-5 (13%), d_dtheta 3.1e-5 (21%), at T = 75-129; the rest at most 4.2e-6 and 7%.
    "high": dict(MAMBA3_F32_TOL),
    # "medium": one float16 rounding per operand (2^-11): y rel 7.2e-4, d_x 1.0e-3, d_lam 1.6e-3,
    # d_s_v 3.6e-3 (rel(all)), the rest at most 1.3e-3 but the angles' (below); used at most 7.2%.
    "medium": {name: Tol(rtol=1.5e-2, atol=5e-3) for name in MAMBA3_F32_TOL},
}
MAMBA3_MATRIX_TOL["medium"].update(
    # d_dtheta, d_s_theta: the angle cotangents' suffix sums, terms of both signs: rel 1.2e-2 and
    # 1.5e-2 (used 5.7% and 12.9%); at (1, 256, 2, 64, 128) 3.0e-3 and 2.2e-3.
    d_dtheta=Tol(rtol=0.1, atol=5e-2),
    d_s_theta=Tol(rtol=0.1, atol=5e-2),
)
