#version 450
// y[t][p] (CL x P) of each (sequence, chunk, head): sum_{s<=t} mcb[t][s] u_s[p] (segment 1,
// causal) + din_t sum_n C_t[n] hs[p][n] (segment 2: the incoming state's part).
// The GEMM engine and the bindings: glsl/chunk_gemm.glsl, glsl/chunk_common.glsl.
#define ROWS CL
#define COLS PD
#define K1 CL
#define MASK 1u
#define K2 ND
#define COLS_D PD
#define PER_GROUP 0
#define A1_RF false
#define B1_CF true
#define A2_RF false
#define B2_CF false
#include "chunk_gemm.glsl"

float A1(uint r, uint k) { return mcb[mat * CL * CL + r * CL + k]; }
float B1(uint k, uint cc) { return (k < Lc && cc < PD) ? u_of(k, cc) : 0.0; }
float A2(uint r, uint k) { return r < Lc ? C_of(r, k) * sdi[r] : 0.0; }
float B2(uint k, uint cc) { return cc < PD ? hs_of(cc, k) : 0.0; }

uint y_at(uint r, uint cc) { return pc.o_out + (tk(r) * pc.H + h) * PD + cc; }

void put(uint r, uint cc, float v, inout float part) {
    if (r < Lc && cc < PD) {
        outv[y_at(r, cc)] = v;
        guard(v);
    }
}
#if VOUT
void put4(uint r, uint cc, vec4 v, inout float part) {
    if (r < Lc && cc < COLS_D) out_store4(y_at(r, cc), v);
}
#endif

void main() {
    if (!gemm_begin()) return;
    gemm_both();
    float part0[TR];
    epilogue(part0);
}
