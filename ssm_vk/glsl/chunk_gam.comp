#version 450
// The backward's d_x (CL x P) of each (sequence, chunk, head): Gam[s][p] = sum_{r>=s}
// mcb[r][s] gy_r[p] (segment 1, anti-causal) + dout_s sum_n B_s[n] gs[p][n] (segment 2), written
// as d_x = Gam * d_s; beside it the per-token sums Gam . x and beta (segment 2's part . u) into
// sm, and <G_c, H_c> over the tile's columns of P into the chunk's first token's slot.
// The GEMM engine and the bindings: glsl/chunk_gemm.glsl, glsl/chunk_common.glsl.
#define ROWS CL
#define COLS PD
#define K1 CL
#define MASK 2u
#define K2 ND
#define COLS_D PD
#define PER_GROUP 0
#define A1_RF true
#define B1_CF true
#define A2_RF false
#define B2_CF false
// <G_c, H_c>: segment 2 stages every element of gs[p][n] once; the hs element at the same (p, n)
// is fetched beside it (gh_fetch, with fetch2) and the product added when it is stored
// (gh_store, with store2), in slice order.
void gh_fetch(uint j);
void gh_store();
#define SEG2_STORE_HOOK() gh_store()
#define SEG2_FETCH_HOOK(j) gh_fetch(j)
#include "chunk_gemm.glsl"

float A1(uint r, uint k) { return mcb[mat * CL * CL + k * CL + r]; }
float B1(uint k, uint cc) { return (k < Lc && cc < PD) ? gy_of(k, cc) : 0.0; }
float A2(uint r, uint k) { return r < Lc ? B_of(r, k) * sdo[r] : 0.0; }
float B2(uint k, uint cc) { return cc < PD ? gs_of(cc, k) : 0.0; }

float fh[NFB];
float gh = 0.0;
void gh_fetch(uint j) {
    uint lid = gl_LocalInvocationIndex;
    [[unroll]] for (uint m = 0; m < NFB; ++m) {
        uint e = lid + m * WG;
        uint cc = e / KS, k = j * KS + e % KS;           // B2's staging order (B2_CF false)
        fh[m] = (e < KS * CBLK && k < K2 && c0 + cc < PD) ? hs_of(c0 + cc, k) : 0.0;
    }
}
void gh_store() {
    [[unroll]] for (uint m = 0; m < NFB; ++m) gh += fb[m] * fh[m];
}

uint dx_at(uint r, uint cc) { return pc.o_out + (tk(r) * pc.H + h) * PD + cc; }
uint x_at(uint r, uint cc) { return pc.o_x + (tk(r) * pc.H + h) * PD + cc; }

void put(uint r, uint cc, float v, inout float part) {
    if (r < Lc && cc < PD) {
        outv[dx_at(r, cc)] = v * sd[r];
        guard(v * sd[r]);
        part += v * x[x_at(r, cc)];                 // Gam . x
    }
}
#if VOUT
void put4(uint r, uint cc, vec4 v, inout float part) {
    if (r < Lc && cc < COLS_D) {
        uint ax = x_at(r, cc);
        [[unroll]] for (uint e = 0; e < 4u; ++e) part += v[e] * x[ax + e];   // Gam . x
        out_store4(dx_at(r, cc), v * sd[r]);
    }
}
#endif

void main() {
    if (!gemm_begin()) return;
    set_head(hh);
    if (NS2 > 0u) { gh_fetch(0u); fetch2(0u); } else if (NS1 > 0u) fetch1(0u);
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
    float part0[TR];
    epilogue(part0);
    row_sums(part0, tr, tc, SM_GX, cbk);
    // <G_c, H_c> of this column block: the threads' sums added by a fixed tree (red holds WG
    // floats: RBLK >= ROWG), into the chunk's first token's slot (one row block: r0 == 0).
    uint lid = gl_LocalInvocationIndex;
    red[lid / CG][lid % CG] = gh;
    barrier();
    [[unroll]] for (uint w = WG / 2u; w > 0u; w >>= 1) {
        if (lid < w) red[lid / CG][lid % CG] += red[(lid + w) / CG][(lid + w) % CG];
        barrier();
    }
    if (lid == 0u && r0 == 0u) sm[(tk(0u) * pc.H + h) * NSM + SM_GH + cbk] = red[0][0];
}
