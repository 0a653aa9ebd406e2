#version 450
// The backward's d_B[s][n] (CL x N):
//   sum_{r>=s} mgu[r][s] C_r[n]   (segment 1, anti-causal)  +  dout_s sum_p u_s[p] gs[p][n]   (segment 2)
// With HEADLOOP = 1 (large problems) a workgroup per (sequence, chunk, group) adds the products
// of the group's heads in head order into one tile and writes d_B itself; with HEADLOOP = 0
// (more workgroups for small problems) a workgroup per (sequence, chunk, head) -- per HPART
// consecutive heads of a group, added in head order -- writes a part, (S, T, H / HPART, N),
// which ssm_scan_reduce.comp sums over the heads of each group. With FOLD = 1 segment 1 runs
// once per group: its C is the group's, so the sum over heads of mgu . C is (sum over heads of
// mgu) . C; ssm_scan_reduce.comp (MODE 2) has put that sum into the slot of the group's first
// head, and only that head's product takes segment 1.
// The GEMM engine, its defines and what a product defines: glsl/chunk_gemm.glsl.
#define ROWS CL
#define COLS ND
#define K1 CL
#define MASK 2u
#define K2 PD
#define PER_GROUP HEADLOOP
#define HEAD_LOOP 1
#define A1_RF true
#define B1_CF true
#define A2_RF false
#define B2_CF true
#define A1(r, k) (mgu[mat * CL * CL + k * CL + r])
#define B1(k, cc) ((k < Lc && cc < ND) ? C_of(k, cc) : 0.0)
#define A2(r, k) (r < Lc ? u_of(r, k) * sdo[r] : 0.0)
#define B2(k, cc) (cc < ND ? gs_of(k, cc) : 0.0)
#if HEADLOOP                      // d_B: (S, T, G, N)
#define OUT_AT(r, cc) (pc.o_out + (tk(r) * pc.G + g) * ND + cc)
#else                             // parts of HPART heads: (S, T, H / HPART, N)
#define OUT_AT(r, cc) (pc.o_out + (tk(r) * (pc.H / HPART) + h / HPART) * ND + cc)
#endif
#if HPART > 1 && HEADLOOP
#error "HPART > 1 is for d_B per head (HEADLOOP = 0) only"
#endif
#include "chunk_gemm.glsl"

void main() {
    GEMM_BEGIN
    uint h_first = PER_GROUP != 0 ? g * hpg : hb * HPART, n_heads = PER_GROUP != 0 ? hpg : HPART;
    for (uint k = 0; k < n_heads; ++k) {
        set_head(h_first + k);
        bool seg1 = FOLD == 0 || h % hpg == 0u;     // uniform: with FOLD, the group's first head only
        if (seg1) {
            fetch1_any(0u);
            segment1(rlo, rhi, tr, tc, true);
        } else {
            fetch2_any(0u);
        }
        segment2(false);
    }
    GEMM_EPILOGUE
}
