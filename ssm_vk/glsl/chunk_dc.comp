#version 450
// d_C[t][n] (CL x N) of each (sequence, chunk, head): sum_{s<=t} mgu[t][s] B_s[n] (segment 1,
// causal) + din_t sum_p gy_t[p] hs[p][n] (segment 2, kept apart per head for alpha: its part .
// C, a per-token sum into sm). HEADLOOP as in chunk_db.comp.
// The GEMM engine and the bindings: glsl/chunk_gemm.glsl, glsl/chunk_common.glsl.
#define ROWS CL
#define COLS ND
#define K1 CL
#define MASK 1u
#define K2 PD
#define COLS_D ND
#define PER_GROUP HEADLOOP
#define A1_RF false
#define B1_CF true
#define A2_RF false
#define B2_CF true
#define SEG2_APART 1
#include "chunk_gemm.glsl"

float A1(uint r, uint k) { return mgu[mat * CL * CL + r * CL + k]; }
float B1(uint k, uint cc) { return (k < Lc && cc < ND) ? B_of(k, cc) : 0.0; }
float A2(uint r, uint k) { return r < Lc ? gy_of(r, k) * sdi[r] : 0.0; }
float B2(uint k, uint cc) { return cc < ND ? hs_of(k, cc) : 0.0; }

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
        [[unroll]] for (uint j = 0; j < TR; ++j)
            [[unroll]] for (uint q = 0; q < TC; ++q) acch[j][q] = 0.0;
        fetch2(0u);
        segment2(true);
        float part[TR];            // alpha of head h: its boundary part . C
        [[unroll]] for (uint j = 0; j < TR; ++j) {
            uint r = rlo + j;
            part[j] = 0.0;
            [[unroll]] for (uint q = 0; q < TC; ++q) {
                uint cc = c0 + col_of(tc, q);
                if (r < Lc && cc < ND) part[j] += acch[j][q] * C_of(r, cc);
                acc1[j][q] += acch[j][q];
            }
        }
        row_sums(part, tr, tc, SM_ALPHA, cbk);
        segment1(rlo, rhi, tr, tc, false);
    }
    float part0[TR];
    epilogue(part0);
}
