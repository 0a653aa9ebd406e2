#version 450
// The forward's output y[t][p] (CL x P) of each (sequence, chunk, head):
//   sum_{s<=t} mcb[t][s] u_s[p]   (segment 1, causal)  +  din_t sum_n C_t[n] hs[p][n]   (segment 2)
// With VEC_IN its operands are staged with 16-byte loads where the call's offsets allow (vin).
// The GEMM engine, its defines and what a product defines: glsl/chunk_gemm.glsl.
#define ROWS CL
#define COLS PD
#define K1 CL
#define MASK 1u
#define K2 ND
#define A1_RF false
#define B1_CF true
#define A2_RF false
#define B2_CF false
#define A1(r, k) (mcb[mat * CL * CL + r * CL + k])
#define B1(k, cc) ((k < Lc && cc < PD) ? u_of(k, cc) : 0.0)
#define A2(r, k) (r < Lc ? C_of(r, k) * sdi[r] : 0.0)
#define B2(k, cc) (cc < PD ? hs_of(cc, k) : 0.0)
#define OUT_AT(r, cc) (pc.o_out + (tk(r) * pc.H + h) * PD + cc)

#if VEC_IN && (KS % 4 != 0 || RBLK % 4 != 0 || CBLK % 4 != 0 || PD % 4 != 0 || ND % 4 != 0)
#error "VEC_IN is for KS, RBLK, CBLK, P and N multiples of 4"
#endif
// A1 .. B2 at four consecutive k (A1, A2) or columns (B1, B2), from one 16-byte load each
#define VEC_OPERANDS                                                                           \
vec4 A1v(uint r, uint k) { return mcb4[(mat * CL * CL + r * CL + k) >> 2]; }                   \
vec4 B1v(uint k, uint cc) {                                                                    \
    if (k >= Lc || cc >= PD) return vec4(0.0);                                                 \
    return x4[(pc.o_x + (tk(k) * pc.H + h) * PD + cc) >> 2] * sd[k];                           \
}                                                                                              \
vec4 A2v(uint r, uint k) {                                                                     \
    if (r >= Lc) return vec4(0.0);                                                             \
    return Cm4[(pc.o_C + (tk(r) * pc.G + g) * ND + k) >> 2] * sdi[r];                          \
}                                                                                              \
vec4 B2v(uint k, uint cc) {                                                                    \
    return cc < PD ? hs4[(hmat * PD * ND + cc * ND + k) >> 2] : vec4(0.0);                     \
}
#include "chunk_gemm.glsl"

void main() {
    GEMM_BEGIN
    set_head(hb);
    fetch1_any(0u);
    segment1(rlo, rhi, tr, tc, true);
    segment2(false);
    GEMM_EPILOGUE
}
