#version 450
// cb[t][s] = sum_n C_t[n] B_s[n] (CL x CL) of each (sequence, chunk, group): segment 2 only.
// The GEMM engine, its defines and what a product defines: glsl/chunk_gemm.glsl.
#define ROWS CL
#define COLS CL
#define K1 0
#define MASK 0u
#define K2 ND
#define PER_GROUP 1
#define GROUP_MAT 1
#define A2(r, k) (r < Lc ? C_of(r, k) : 0.0)
#define B2(k, cc) (cc < Lc ? B_of(cc, k) : 0.0)
#define STORE1(r, cc, v, sum) if (r < CL && cc < CL) cb[mat * CL * CL + r * CL + cc] = v;
#define STORE4(r, cc, v, sum) if (r < CL && cc < CL) cb4[(mat * CL * CL + r * CL + cc) >> 2] = v;
#include "chunk_gemm.glsl"

void main() {
    GEMM_BEGIN
    set_head(0u);
    fetch2_any(0u);
    segment2(false);
    GEMM_EPILOGUE
}
