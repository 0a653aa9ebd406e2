#version 450
// The backward's d_C[t][n] (CL x N):
//   sum_{s<=t} mgu[t][s] B_s[n]   (segment 1, causal)  +  din_t sum_p gy_t[p] hs[p][n]   (segment 2)
// and alpha, per token and head: segment 2's part . C, into sm (SM_ALPHA). Segment 2 runs first,
// into its own accumulators (acch), per head. HEADLOOP, HPART and FOLD as in chunk_gemm_db.comp
// (with FOLD, the sum over heads of mgu . B).
// The GEMM engine, its defines and what a product defines: glsl/chunk_gemm.glsl.
#define ROWS CL
#define COLS ND
#define K1 CL
#define MASK 1u
#define K2 PD
#define PER_GROUP HEADLOOP
#define HEAD_LOOP 1
#define SEG2_APART 1
#define ROW_SUMS 1
#define A1_RF false
#define B1_CF true
#define A2_RF false
#define B2_CF true
#define A1(r, k) (mgu[mat * CL * CL + r * CL + k])
#define B1(k, cc) ((k < Lc && cc < ND) ? B_of(k, cc) : 0.0)
#define A2(r, k) (r < Lc ? gy_of(r, k) * sdi[r] : 0.0)
#define B2(k, cc) (cc < ND ? hs_of(k, cc) : 0.0)
#if HEADLOOP                      // d_C: (S, T, G, N)
#define OUT_AT(r, cc) (pc.o_out + (tk(r) * pc.G + g) * ND + cc)
#else                             // parts of HPART heads: (S, T, H / HPART, N)
#define OUT_AT(r, cc) (pc.o_out + (tk(r) * (pc.H / HPART) + h / HPART) * ND + cc)
#endif
#if HPART > 1 && HEADLOOP
#error "HPART > 1 is for d_C per head (HEADLOOP = 0) only"
#endif
#include "chunk_gemm.glsl"

void main() {
    GEMM_BEGIN
    uint h_first = PER_GROUP != 0 ? g * hpg : hb * HPART, n_heads = PER_GROUP != 0 ? hpg : HPART;
    for (uint k = 0; k < n_heads; ++k) {
        set_head(h_first + k);
        bool seg1 = FOLD == 0 || h % hpg == 0u;     // uniform: with FOLD, the group's first head only
        [[unroll]] for (uint j = 0; j < TR; ++j)
            [[unroll]] for (uint q = 0; q < TC; ++q) acch[j][q] = 0.0;
        fetch2_any(0u);
        segment2(seg1);             // (then segment 1, if this head takes it)
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
        if (seg1) segment1(rlo, rhi, tr, tc, false);
    }
    GEMM_EPILOGUE
}
