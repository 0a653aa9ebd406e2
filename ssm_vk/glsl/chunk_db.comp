#version 450
// d_B[s][n] (CL x N) of each (sequence, chunk, head): sum_{r>=s} mgu[r][s] C_r[n] (segment 1,
// anti-causal) + dout_s sum_p u_s[p] gs[p][n] (segment 2). With HEADLOOP = 1 a tile is one of a
// (sequence, chunk, group), which adds the products of the group's heads in head order and
// writes d_B itself; with HEADLOOP = 0 per-head parts, summed by ssm_scan_reduce.comp.
// The GEMM engine and the bindings: glsl/chunk_gemm.glsl, glsl/chunk_common.glsl.
#define ROWS CL
#define COLS ND
#define K1 CL
#define MASK 2u
#define K2 PD
#define COLS_D ND
#define PER_GROUP HEADLOOP
#define A1_RF true
#define B1_CF true
#define A2_RF false
#define B2_CF true
#include "chunk_gemm.glsl"

float A1(uint r, uint k) { return mgu[mat * CL * CL + k * CL + r]; }
float B1(uint k, uint cc) { return (k < Lc && cc < ND) ? C_of(k, cc) : 0.0; }
float A2(uint r, uint k) { return r < Lc ? u_of(r, k) * sdo[r] : 0.0; }
float B2(uint k, uint cc) { return cc < ND ? gs_of(k, cc) : 0.0; }

void put(uint r, uint cc, float v, inout float part) {
    if (r < Lc && cc < ND) {
        outv[bc_out_at(r, cc)] = v;
        guard(v);
    }
}
#if VOUT
void put4(uint r, uint cc, vec4 v, inout float part) {
    if (r < Lc && cc < COLS_D) out_store4(bc_out_at(r, cc), v);
}
#endif

void main() {
    if (!gemm_begin()) return;
    uint h_first = PER_GROUP != 0 ? g * hpg : hh, n_heads = PER_GROUP != 0 ? hpg : 1u;
    for (uint k = 0; k < n_heads; ++k) {
        set_head(h_first + k);
        fetch1(0u);
        segment1(rlo, rhi, tr, tc, true);
        segment2(false);
    }
    float part0[TR];
    epilogue(part0);
}
