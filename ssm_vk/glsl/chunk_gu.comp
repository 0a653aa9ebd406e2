#version 450
// gu[t][s] = sum_p gy_t[p] u_s[p] (CL x CL) of each (sequence, chunk, head): segment 2 alone,
// over P. The GEMM engine and the bindings: glsl/chunk_gemm.glsl, glsl/chunk_common.glsl.
#define ROWS CL
#define COLS CL
#define K1 0u
#define MASK 0u
#define K2 PD
#define COLS_D CL
#define PER_GROUP 0
#define A1_RF false
#define B1_CF false
#define A2_RF false
#define B2_CF false
#include "chunk_gemm.glsl"

float A1(uint r, uint k) { return 0.0; }
float B1(uint k, uint cc) { return 0.0; }
float A2(uint r, uint k) { return r < Lc ? gy_of(r, k) : 0.0; }
float B2(uint k, uint cc) { return cc < Lc ? u_of(cc, k) : 0.0; }

void put(uint r, uint cc, float v, inout float part) {
    if (r < CL && cc < CL) gu[mat * CL * CL + r * CL + cc] = v;
}
#if VOUT
void put4(uint r, uint cc, vec4 v, inout float part) {
    if (r < CL && cc < CL) gu4[(mat * CL * CL + r * CL + cc) >> 2] = v;
}
#endif

void main() {
    if (!gemm_begin()) return;
    gemm_both();
    float part0[TR];
    epilogue(part0);
}
