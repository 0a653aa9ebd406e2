"""Matrix-unit precision: the arithmetic of a product on half-precision matrix units
(VK_KHR_cooperative_matrix, tensor cores), emulated exactly in numpy so that its error can be
measured on the CPU and a GPU's products can be held to it (docs/SPEC.md, "Matrix-unit precision").

The three settings take PyTorch's names (``torch.set_float32_matmul_precision``):

    "highest"  float32 products and sums (numpy's matmul in the working dtype): today's arithmetic.
    "high"     error-compensated: each float32 operand split into float16 parts hi + lo, three
               products lo*hi + hi*lo + hi*hi accumulated in float32 (lo*lo left out). Ootomo and
               Yokota 2022, https://arxiv.org/abs/2203.03341; CUTLASS's 3xTF32 is the same idea.
    "medium"   one product per product: float16 operands (hi alone), float32 accumulation.

One product C = A B (A: (m, k), B: (k, n), both float32) at "high" or "medium":

1. **Scale, one per operand block.** An operand block is the whole matrix the product reads (in
   the chunked form: one chunk's B or C of a group, one chunk's u of a head, one chunk state, ...),
   scaled once by the kernel that produces it, not per tile. Its exponent ``e`` puts the largest
   finite |entry| into [2^14, 2^15): ``e = 15 - frexp(max)[1]``, ``e = 0`` when no entry is finite
   and nonzero. A power of two, so scaling is exact and undone exactly at the end; one scale per
   block rather than per row or column, because the chunked form contracts the same block along
   either axis (B in C B^T over N, in the chunk states over tokens) and a per-row scale would
   not factor out of a sum over rows. The price: entries far below their block's largest lose
   relative accuracy (below).
2. **Split.** ``s = a * 2^e`` (float32, exact); ``hi = float16(s)``; ``lo = float16(s - hi)``, each
   rounded to nearest, ties to even (numpy's float16 conversion); ``s - hi`` is exact in float32.
   ``hi + lo`` equals ``s`` within ``2^-22 |s| + 2^-25`` (11 + 11 significand bits; 2^-25 is half
   float16's smallest subnormal, reached only 2^17 below the block's largest): exactly where ``s``
   has at most 22 significant bits and none below 2^-24. "medium" keeps ``hi`` only.
3. **Products and sums.** A float16 x float16 product is exact in float32. The contraction runs in
   blocks of ``k_block`` (the unit's K, 16) in ascending order; per block, the products are
   accumulated into one float32 accumulator as the unit's fused multiply-adds: lo_a*hi_b, then
   hi_a*lo_b, then hi_a*hi_b (small terms first), each as ``acc = float32(acc + sum of the block's
   products)``, the sum formed in float64 in a fixed order (exact while its terms span fewer than
   27 binades; beyond, one float64 rounding, far below the float32 one) and rounded to float32,
   to nearest even. Hardware rounds inside a block its own way (NVIDIA's tensor cores truncate
   the aligned sum: Fasi et al. 2021, https://doi.org/10.7717/peerj-cs.330), so a GPU's products
   are held to this emulation by a tolerance, not bit for bit.
4. **Unscale.** ``C = acc * 2^-(e_a + e_b)`` in float32: exact unless the result is subnormal or
   overflows in float32, as a float32 product would.

Non-finite operands: an inf or nan entry keeps its value in ``hi`` (``lo = 0`` there) and the
scale is taken over the finite entries; the rows of A and the columns of B it touches come out
inf or nan (often nan where float32 gives inf: a correction product meets inf x 0), nothing else
does. Zero and empty blocks: all parts zero. The chunked GPU kernels recompute any call with a
non-finite output on the token-sequential kernels (docs/KERNELS.md, "Numerics").
"""

from __future__ import annotations

import numpy as np

__all__ = ["PRECISIONS", "UNIT_K", "block_exponent", "check_precision", "matmul", "split"]

PRECISIONS = ("highest", "high", "medium")
UNIT_K = 16      # the contraction depth of one float16 matrix-unit product (16 x 16 x 16 tiles)
_TOP = 15        # a block's largest |entry| is scaled into [2^(_TOP - 1), 2^_TOP): float16 holds
                 # up to 65504 < 2^16, so even hi rounded up to 2^15 cannot overflow


def check_precision(value, name: str = "precision") -> str:
    """``value`` when it is one of PRECISIONS; else ValueError naming the argument ``name``."""
    if not isinstance(value, str) or value not in PRECISIONS:
        raise ValueError(f"{name}: expected one of {PRECISIONS}, got {value!r}")
    return value


def block_exponent(a: np.ndarray) -> int:
    """The exponent e that scales the largest finite |entry| of ``a`` into [2^14, 2^15); 0 when
    ``a`` has no finite nonzero entry."""
    fin = np.abs(a[np.isfinite(a)])
    top = float(fin.max()) if fin.size else 0.0
    return 0 if top == 0.0 else _TOP - int(np.frexp(top)[1])


def split(a: np.ndarray, precision: str = "high"):
    """(hi, lo, e): float16 parts of the float32 block ``a`` scaled by 2^e (module docstring,
    steps 1-2), same shape as ``a``; ``lo`` is all zeros at "medium" and where ``hi`` is not
    finite. Raises ValueError for "highest" (nothing is split) or an unknown precision."""
    if check_precision(precision) == "highest":
        raise ValueError("precision: 'highest' products are float32; nothing is split")
    e = block_exponent(a)
    with np.errstate(over="ignore", invalid="ignore"):
        s = np.ldexp(a, e).astype(np.float32)                 # exact: a power of two
        hi = s.astype(np.float16)                               # round to nearest even
        if precision == "medium":
            return hi, np.zeros_like(hi), e
        r = np.where(np.isfinite(s), s - hi.astype(np.float32), np.float32(0))   # exact in float32
    return hi, r.astype(np.float16), e


def _check_operands(a, b, k_block) -> None:
    for name, v in (("a", a), ("b", b)):
        if not isinstance(v, np.ndarray) or v.dtype != np.float32 or v.ndim != 2:
            got = f"{v.dtype} array of {v.ndim} dims" if isinstance(v, np.ndarray) else type(v).__name__
            raise TypeError(f"{name}: matrix-unit products take 2-d float32 arrays, got {got}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"b: {b.shape[0]} rows, expected {a.shape[1]} (the columns of a)")
    if isinstance(k_block, bool) or not isinstance(k_block, (int, np.integer)) or k_block < 1:
        raise ValueError(f"k_block: expected an integer >= 1, got {k_block!r}")


def matmul(a: np.ndarray, b: np.ndarray, precision: str = "highest", *, k_block: int = UNIT_K) -> np.ndarray:
    """``a @ b`` computed as a matrix unit does at ``precision`` (module docstring).

    "highest": ``np.matmul(a, b)`` in the operands' dtype, bit for bit (any shapes numpy takes).
    "high", "medium": ``a`` (m, k) and ``b`` (k, n) float32, each one operand block (one scale);
    returns (m, n) float32; ``k_block`` is the contraction depth of one unit product.
    Raises ValueError for an unknown precision, mismatched shapes or k_block < 1; TypeError for
    operands that are not 2-d float32 arrays (at "high" and "medium").
    """
    if check_precision(precision) == "highest":
        return np.matmul(a, b)
    _check_operands(a, b, k_block)
    a_hi, a_lo, e_a = split(a, precision)                       # (m, k) each
    b_hi, b_lo, e_b = split(b, precision)                       # (k, n) each
    wide = [v.astype(np.float64) for v in (a_hi, a_lo, b_hi, b_lo)]   # exact
    a_hi, a_lo, b_hi, b_lo = wide
    terms = [(a_hi, b_hi)] if precision == "medium" else [(a_lo, b_hi), (a_hi, b_lo), (a_hi, b_hi)]
    acc = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)  # (m, n)
    with np.errstate(invalid="ignore", over="ignore"):
        for k0 in range(0, a.shape[1], k_block):
            k1 = min(k0 + k_block, a.shape[1])
            for x, y in terms:
                block = (x[:, k0:k1, None] * y[None, k0:k1, :]).sum(axis=1)   # (m, n), fixed order
                acc = (acc.astype(np.float64) + block).astype(np.float32)     # one rounding
        return np.ldexp(acc, -(e_a + e_b)).astype(np.float32)
