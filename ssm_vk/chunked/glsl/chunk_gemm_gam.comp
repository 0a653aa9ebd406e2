#version 450
// The backward's d_x[s][p] = Gam[s][p] * d_s (CL x P) of each (sequence, chunk, head), with
//   Gam[s][p] = sum_{r>=s} mcb[r][s] gy_r[p]   (segment 1, anti-causal)
//             + dout_s sum_n B_s[n] gs[p][n]    (segment 2, run first: beta, its part . u, is a
//                                                per-token sum of its own)
// and the per-token sums Gam . x (SM_GX) and beta (SM_BETA) into sm, and <G_c, H_c> over the
// tile's columns of P into the chunk's first token's slot (SM_GH).
// The GEMM engine, its defines and what a product defines: glsl/chunk_gemm.glsl.
#define ROWS CL
#define COLS PD
#define K1 CL
#define MASK 2u
#define K2 ND
#define ROW_SUMS 1
#define A1_RF true
#define B1_CF true
#define A2_RF false
#define B2_CF false
#define A1(r, k) (mcb[mat * CL * CL + k * CL + r])
#define B1(k, cc) ((k < Lc && cc < PD) ? gy_of(k, cc) : 0.0)
#define A2(r, k) (r < Lc ? B_of(r, k) * sdo[r] : 0.0)
#define B2(k, cc) (cc < PD ? gs_of(cc, k) : 0.0)
// d_x = Gam * d_s; sum: Gam . x
#define STORE1(r, cc, v, sum)                                                                  \
    if (r < Lc && cc < PD) {                                                                   \
        outv[pc.o_out + (tk(r) * pc.H + h) * PD + cc] = v * sd[r];                             \
        guard(v * sd[r]);                                                                      \
        float xv = x[pc.o_x + (tk(r) * pc.H + h) * PD + cc];                                   \
        sum += v * xv;                                                                         \
    }
#define STORE4(r, cc, v, sum)                                                                  \
    if (r < Lc && cc < COLS) {                                                                 \
        uint at = pc.o_out + (tk(r) * pc.H + h) * PD + cc;                                     \
        uint ax = pc.o_x + (tk(r) * pc.H + h) * PD + cc;                                       \
        [[unroll]] for (uint e = 0; e < 4u; ++e) sum += v[e] * x[ax + e];                      \
        v *= sd[r];                                                                            \
        OUT4(at, v)                                                                            \
    }

// <G_c, H_c> over this tile's columns of P (chunk_finish's dch term): segment 2 stages every
// element of gs[p][n] once; the hs element at the same (p, n) is fetched beside it (gh_fetch,
// with fetch2) and the product added when it is stored (gh_store, with store2), in slice order.
#define SEG2_SIDE                                                                              \
float fh[NFB];                                                                                 \
float gh = 0.0;                                                                                \
void gh_fetch(uint j) {                                                                        \
    uint lid = gl_LocalInvocationIndex;                                                        \
    [[unroll]] for (uint m = 0; m < NFB; ++m) {                                                \
        uint e = lid + m * WG;                                                                 \
        uint cc = e / KS, k = j * KS + e % KS;           /* B2's staging order (B2_CF false) */ \
        fh[m] = (e < KS * CBLK && k < K2 && c0 + cc < PD) ? hs_of(c0 + cc, k) : 0.0;           \
    }                                                                                          \
}                                                                                              \
void gh_store() {                                                                              \
    [[unroll]] for (uint m = 0; m < NFB; ++m) gh += fb[m] * fh[m];                             \
}
#define SEG2_SIDE_STORE gh_store();
#define SEG2_SIDE_FETCH(j) if (j + 1u < NS2) gh_fetch(j + 1u);
#include "chunk_gemm.glsl"

void main() {
    GEMM_BEGIN
    set_head(hb);
    gh_fetch(0u);
    fetch2_any(0u);
    segment2(true);
    float part[TR];            // beta: the boundary part . u
    [[unroll]] for (uint j = 0; j < TR; ++j) {
        uint r = rlo + j;
        part[j] = 0.0;
        [[unroll]] for (uint q = 0; q < TC; ++q) {
            uint cc = c0 + col_of(tc, q);
            if (r < Lc && cc < PD) part[j] += acc1[j][q] * u_of(r, cc);
        }
    }
    row_sums(part, tr, tc, SM_BETA, cbk);
    segment1(rlo, rhi, tr, tc, false);
    GEMM_EPILOGUE
    row_sums(part0, tr, tc, SM_GX, cbk);
    // <G_c, H_c> of this column block: the threads' sums added by a fixed tree (red holds WG
    // floats: RBLK >= ROWG), into the chunk's first token's slot (one row block: r0 == 0).
    red[lid / CG][lid % CG] = gh;
    barrier();
    [[unroll]] for (uint w = WG / 2u; w > 0u; w >>= 1) {
        if (lid < w) red[lid / CG][lid % CG] += red[(lid + w) / CG][(lid + w) % CG];
        barrier();
    }
    if (lid == 0u && r0 == 0u) sm[(tk(0u) * pc.H + h) * NSM + SM_GH + cbk] = red[0][0];
}
