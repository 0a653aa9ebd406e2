#version 450
// gu[t][s] = sum_p gy_t[p] u_s[p] (CL x CL) of each (sequence, chunk, head): segment 2 only.
// The GEMM engine, its defines and what a product defines: glsl/chunk_gemm.glsl.
#define ROWS CL
#define COLS CL
#define K1 0
#define MASK 0u
#define K2 PD
#define A2(hh, r, k) (r < Lc ? gy_of(r, k) : 0.0)
#define B2(hh, k, cc) (cc < Lc ? u_of(cc, k) : 0.0)
// (the first branch never runs: it keeps the SPIR-V of the one file cb and gu shared)
#define STORE1(hh, r, cc, v, sum) if (r < CL && cc < CL) { if (false) cb[mat * CL * CL + r * CL + cc] = v; else gu[mat * CL * CL + r * CL + cc] = v; }
#define STORE4(hh, r, cc, v, sum) if (r < CL && cc < CL) gu4[(mat * CL * CL + r * CL + cc) >> 2] = v;
#include "chunk_gemm.glsl"

void main() {
    GEMM_BEGIN
    GEMM_SEGMENTS
    GEMM_EPILOGUE
}
