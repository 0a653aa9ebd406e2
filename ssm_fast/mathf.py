"""float32 exp, softplus, sigmoid, sin and cos that LLVM can vectorise.

numba lowers ``math.exp`` to a call of the C library's scalar ``expf`` (no vector math library is
configured unless Intel SVML is installed), so a loop over n with an exp inside runs one element at
a time. These helpers use only arithmetic, rounding and bit casts, which LLVM vectorises.

Accuracy (tests/fast/test_fast_math.py): ``exp_f32`` within 3 ulp of numpy's float32 exp over
[-110, 92]; ``softplus_f32`` within 1.4e-7 absolute of the exact log(1 + e^z) (numpy's float32
evaluation of that formula: 2.1e-7). Semantics match docs/SPEC.md and numpy: exp overflows to inf above
~88.72, gives subnormals and then 0 below ~-87.3, nan stays nan; softplus is z above 20 and
log(1 + exp(z)) (not log1p) below.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .config import MATH, MATH_INLINE

__all__ = ["exp_f32", "sigmoid_f32", "sincos_f32", "softplus_f32"]

_F = np.float32
ZERO = _F(0.0)
ONE = _F(1.0)
HALF = _F(0.5)
TWENTY = _F(20.0)

# exp: x = k ln2 + r, |r| <= ln2/2 (Cody-Waite split of ln2), e^r by a degree-7 polynomial
# (Cephes expf's minimax coefficients), 2^k applied in two halves so the result under- and
# overflows exactly where e^x does.
_LOG2E = _F(1.44269504088896341)
_LN2_HI = _F(0.693359375)
_LN2_LO = _F(-2.12194440e-4)
_EXP_LO = _F(-104.0)  # e^-104 < half the smallest subnormal: the result is 0
_EXP_HI = _F(89.0)    # e^89 > FLT_MAX: the result is inf
_E0 = _F(1.9875691500e-4)
_E1 = _F(1.3981999507e-3)
_E2 = _F(8.3334519073e-3)
_E3 = _F(4.1665795894e-2)
_E4 = _F(1.6666665459e-1)
_E5 = _F(5.0000001201e-1)

# log on [1, 2^30] (the argument of softplus' log): w = m 2^e with m in [sqrt(1/2), sqrt(2)),
# log(m) = f - f^2/2 + f^3 P(f) with f = m - 1 (Cephes logf's coefficients).
_SQRT2 = _F(1.41421356237309505)
_L0 = _F(7.0376836292e-2)
_L1 = _F(-1.1514610310e-1)
_L2 = _F(1.1676998740e-1)
_L3 = _F(-1.2420140846e-1)
_L4 = _F(1.4249322787e-1)
_L5 = _F(-1.6668057665e-1)
_L6 = _F(2.0000714765e-1)
_L7 = _F(-2.4999993993e-1)
_L8 = _F(3.3333331174e-1)


@intrinsic
def _pow2(typingctx, k):
    """2**k as float32 for an integral float32 k in [-126, 127] (built from the exponent bits)."""
    if k != types.float32:
        return None
    sig = types.float32(types.float32)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        ki = builder.fptosi(args[0], i32)
        bits = builder.shl(builder.add(ki, ir.Constant(i32, 127)), ir.Constant(i32, 23))
        return builder.bitcast(bits, ir.FloatType())

    return sig, codegen


@intrinsic
def _split_exponent(typingctx, w):
    """(m, e) with w = m * 2**e, m in [1, 2), e integral (float32); for positive normal w."""
    if w != types.float32:
        return None
    sig = types.UniTuple(types.float32, 2)(types.float32)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        f32 = ir.FloatType()
        bits = builder.bitcast(args[0], i32)
        e = builder.sub(builder.lshr(bits, ir.Constant(i32, 23)), ir.Constant(i32, 127))
        mbits = builder.or_(builder.and_(bits, ir.Constant(i32, 0x007FFFFF)), ir.Constant(i32, 0x3F800000))
        m = builder.bitcast(mbits, f32)
        ef = builder.sitofp(e, f32)
        return context.make_tuple(builder, signature.return_type, (m, ef))

    return sig, codegen


@njit(**MATH)
def exp_f32(x):
    """e**x in float32 (within 3 ulp of numpy), inf above ~88.72, 0 below ~-103.97, nan -> nan."""
    xc = _EXP_HI if x > _EXP_HI else x
    xc = _EXP_LO if xc < _EXP_LO else xc
    xc = xc if xc == xc else ZERO           # nan: compute on 0, return nan below
    k = np.floor(xc * _LOG2E + HALF)         # nearest integer to x / ln2, in [-150, 129]
    r = xc - k * _LN2_HI
    r = r - k * _LN2_LO
    z = r * r
    p = _E0 * r + _E1
    p = p * r + _E2
    p = p * r + _E3
    p = p * r + _E4
    p = p * r + _E5
    e_r = p * z + r + ONE
    k1 = np.floor(k * HALF)                  # 2^k = 2^k1 * 2^k2, both factors normal
    e = e_r * _pow2(k1) * _pow2(k - k1)
    return e if x == x else x


@njit(**MATH)
def _log_ge1(w):
    """log(w) for w in [1, 2^30] (finite, normal): the log of softplus."""
    m, e = _split_exponent(w)
    big = m > _SQRT2                          # use m/2 in [sqrt(1/2), 1) and e+1
    m = m * HALF if big else m
    e = e + ONE if big else e
    f = m - ONE
    z = f * f
    p = _L0 * f + _L1
    p = p * f + _L2
    p = p * f + _L3
    p = p * f + _L4
    p = p * f + _L5
    p = p * f + _L6
    p = p * f + _L7
    p = p * f + _L8
    y = f * z * p
    y = y + e * _LN2_LO
    y = y - HALF * z
    return f + y + e * _LN2_HI


@njit(**MATH_INLINE)
def softplus_f32(z):
    """docs/SPEC.md's softplus in float32: z if z > 20 else log(1 + exp(z)); nan -> nan."""
    zc = TWENTY if z > TWENTY else z        # keeps exp finite on the branch we discard
    zc = zc if zc == zc else ZERO
    d = _log_ge1(ONE + exp_f32(zc))
    d = z if z > TWENTY else d
    return d if z == z else z


@njit(**MATH_INLINE)
def sigmoid_f32(z):
    """d softplus / dz in float32: 1 / (1 + exp(-z)), and 1 when z > 20 (docs/SPEC.md section 4)."""
    return ONE if z > TWENTY else ONE / (ONE + exp_f32(-z))


# sin and cos of an angle (Mamba-3's rotation): x = j pi/4 + r, |r| <= pi/4, with pi/4 split in
# three parts (Cody-Waite) and Cephes sinf/cosf's minimax polynomials for sin and cos on r; the
# octant j picks the polynomial and the signs. Exact reduction up to |x| = 8192 (the angles are
# in [0, 2 pi]); beyond it, and for inf and nan, the result is nan.
_FOPI = _F(1.27323954473516)
_DP1 = _F(0.78515625)
_DP2 = _F(2.4187564849853515625e-4)
_DP3 = _F(3.77489497744594108e-8)
_S0 = _F(-1.9515295891e-4)
_S1 = _F(8.3321608736e-3)
_S2 = _F(-1.6666654611e-1)
_C0 = _F(2.443315711809948e-5)
_C1 = _F(-1.388731625493765e-3)
_C2 = _F(4.166664568298827e-2)
_REDUCE_MAX = _F(8192.0)
_NAN = _F(np.nan)


@njit(**MATH_INLINE)
def sincos_f32(x):
    """(sin x, cos x) in float32, within 2 ulp of numpy's for |x| <= 8192; nan beyond, and for
    inf and nan. Arithmetic, a float-to-int conversion and selects only: vectorisable."""
    ax = np.abs(x)
    ok = ax <= _REDUCE_MAX                   # False for nan too
    axc = ax if ok else ZERO
    j = np.int32(axc * _FOPI)
    j = (j + np.int32(1)) & np.int32(-2)     # the even octant nearest below-or-at: r in [-pi/4, pi/4]
    y = np.float32(j)
    r = axc - y * _DP1
    r = r - y * _DP2
    r = r - y * _DP3
    z = r * r
    ps = ((_S0 * z + _S1) * z + _S2) * z * r + r
    pc = ((_C0 * z + _C1) * z + _C2) * z * z - HALF * z + ONE
    j = j & np.int32(7)
    swap = (j & np.int32(2)) != 0            # octants 2, 6: sin and cos polynomials trade places
    s = pc if swap else ps
    c = ps if swap else pc
    s = -s if (j >= np.int32(4)) != (x < ZERO) else s
    c = -c if (j == np.int32(2)) or (j == np.int32(4)) else c
    return (s if ok else _NAN), (c if ok else _NAN)
