#version 450
// gu[t][s] = sum_p gy_t[p] u_s[p] (CL x CL) of each (sequence, chunk, head): segment 2 only.
// The GEMM engine, its defines and what a product defines: glsl/chunk_gemm.glsl.
#define ROWS CL
#define COLS CL
#define K1 0
#define MASK 0u
#define K2 PD
#define A2(r, k) (r < Lc ? gy_of(r, k) : 0.0)
#define B2(k, cc) (cc < Lc ? u_of(cc, k) : 0.0)
#define STORE1(r, cc, v, sum) if (r < CL && cc < CL) gu[mat * CL * CL + r * CL + cc] = v;
#define STORE4(r, cc, v, sum) if (r < CL && cc < CL) gu4[(mat * CL * CL + r * CL + cc) >> 2] = v;
#include "chunk_gemm.glsl"

void main() {
    GEMM_BEGIN
    set_head(hb);
    fetch2_any(0u);
    segment2(false);
    GEMM_EPILOGUE
}
