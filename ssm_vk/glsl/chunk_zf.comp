#version 450
// hs[p][n] = sum_s dout_s u_s[p] B_s[n] (P x N) of each (sequence, chunk, head): a chunk's own
// contribution to the state after it (Z), segment 1 alone, over the chunk's tokens, unmasked.
// The GEMM engine and the bindings: glsl/chunk_gemm.glsl, glsl/chunk_common.glsl.
#define ROWS PD
#define COLS ND
#define K1 CL
#define MASK 0u
#define K2 0u
#define COLS_D ND
#define PER_GROUP 0
#define A1_RF true
#define B1_CF true
#define A2_RF false
#define B2_CF false
#include "chunk_gemm.glsl"

float A1(uint r, uint k) { return (k < Lc && r < PD) ? u_of(k, r) * sdo[k] : 0.0; }
float B1(uint k, uint cc) { return (k < Lc && cc < ND) ? B_of(k, cc) : 0.0; }
float A2(uint r, uint k) { return 0.0; }
float B2(uint k, uint cc) { return 0.0; }

void put(uint r, uint cc, float v, inout float part) {
    if (r < PD && cc < ND) hs[hmat * PD * ND + r * ND + cc] = v;
}
#if VOUT
void put4(uint r, uint cc, vec4 v, inout float part) {
    if (r < PD && cc < ND) hs4[(hmat * PD * ND + r * ND + cc) >> 2] = v;
}
#endif

void main() {
    if (!gemm_begin()) return;
    gemm_both();
    float part0[TR];
    epilogue(part0);
}
