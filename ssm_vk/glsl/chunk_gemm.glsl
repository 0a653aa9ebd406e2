// The GEMM engine of the chunked Mamba-2 scan's matrix products (glsl/chunk_<product>.comp,
// one file per product: cb, gu, zf, zb, y, gam, db, dc). Each workgroup computes an RBLK x CBLK
// tile of one (sequence, chunk, head) matrix -- (.., group) for cb -- as a sum over up to two
// contraction segments, staged through shared memory KS at a time:
//
//   segment 1: over the chunk's tokens (K1 = CL), masked causal (MASK 1: k <= row), anti-causal
//              (MASK 2: k >= row) or not at all (MASK 0); masked entries are left out of the
//              sum, never multiplied by zero
//   segment 2: over N or P (K2), unmasked
//
// A product file defines, before it includes this one: the matrix ROWS x COLS, K1, K2, MASK,
// COLS_D (the row length of the matrix it writes, for 16-byte stores), PER_GROUP (1: one tile
// per group, not per head), optionally HEADLESS (1: the group's own matrix, no head: cb), the
// staging orders A1_RF / B1_CF / A2_RF / B2_CF (consecutive threads stage consecutive rows /
// columns, else consecutive k: whichever is contiguous in memory), optionally SEG2_APART
// (segment 2 into its own accumulators acch) and the hooks SEG2_STORE_HOOK() /
// SEG2_FETCH_HOOK(j) (run beside segment 2's staging). After it: the operands A1(row, k),
// B1(k, col), A2(row, k), B2(k, col) -- 0 past the matrix --, put / put4 (the epilogue's store
// of one value / of four consecutive columns) and main().
//
// Bindings and push constants: glsl/chunk_common.glsl. Defines: chunk_common's, RBLK and CBLK
// (tile; RBLK a multiple of ROWG, CBLK of WG / ROWG), KS, ROWG, HEADLOOP (db, dc), VEC_OUT (1:
// 16-byte stores in the epilogue where they fit). Thread (tr, tc) of the ROWG x (WG / ROWG)
// thread grid owns rows tr * TR .. tr * TR + TR - 1 (contiguous: whole masked slices are
// skipped) and columns tc, tc + CG, ... (strided: the shared-memory reads of a warp hit
// distinct banks).

#extension GL_EXT_control_flow_attributes : enable
#include "chunk_common.glsl"

const uint RG = ROWG;           // row groups of the thread grid (16 or 8)
const uint CG = WG / RG;
const uint TR = RBLK / RG;
const uint TC = CBLK / CG;
const uint NRB = (ROWS + RBLK - 1u) / RBLK;
const uint NCBK = (COLS + CBLK - 1u) / CBLK;

#if (RBLK / ROWG) % 4 == 0
#define AS4 1          // a thread's rows are whole vec4s: one 16-byte shared load per 4 rows
shared vec4 As4[KS][RBLK / 4u + 1u];
#else
#define AS4 0
shared float As[KS][RBLK + 1u];
#endif
#if (CBLK / (WG / ROWG)) % 4 == 0
#define BS4 1          // a thread's columns are whole vec4s (tc*4 .. tc*4+3, then CG*4 further on)
shared vec4 Bs4[KS][CBLK / 4u];
#else
#define BS4 0
shared float Bs[KS][CBLK + 1u];
#endif

// VOUT: a thread's columns are whole vec4s and so are the matrix rows: the epilogue writes 16
// bytes at a time (a warp's stores then fill whole 32-byte sectors).
#if BS4 && (COLS_D % 4 == 0) && VEC_OUT
#define VOUT 1
layout(std430, binding = 6) buffer Bhs4 { vec4 hs4[]; };
layout(std430, binding = 7) buffer Bgs4 { vec4 gs4[]; };
layout(std430, binding = 8) buffer Bcb4 { vec4 cb4[]; };
layout(std430, binding = 10) buffer Bgu4 { vec4 gu4[]; };
layout(std430, binding = 13) buffer Bout4 { vec4 outv4[]; };
#else
#define VOUT 0
#endif

// Column (within the tile) of a thread's q-th accumulator.
uint col_of(uint tc, uint q) {
#if BS4
    return (tc + CG * (q >> 2)) * 4u + (q & 3u);
#else
    return tc + CG * q;
#endif
}
shared float sd[CL];      // d_t = softplus(dt)
shared float sdi[CL];     // din_t
shared float sdo[CL];     // dout_t
shared float red[RBLK][CG];

// The tile: sequence i, chunk c (Lc tokens), head h of group g, its matrices' indices, the
// tile's first row and column; the thread's place in the grid and its rows rlo .. rhi.
uint i, c, h, g, Lc, mat, hmat, r0, c0;
uint hh, hpg, cbk, tr, tc, rlo, rhi;

// Clamped token index: loads of padded tokens read a valid address and are then discarded.
uint tk(uint t) { return tok(i, c, min(t, Lc - 1u)); }

float u_of(uint t, uint p) { return x[pc.o_x + (tk(t) * pc.H + h) * PD + p] * sd[t]; }
float gy_of(uint t, uint p) { return gy[pc.o_gy + (tk(t) * pc.H + h) * PD + p]; }
float B_of(uint t, uint n) { return Bm[pc.o_B + (tk(t) * pc.G + g) * ND + n]; }
float C_of(uint t, uint n) { return Cm[pc.o_C + (tk(t) * pc.G + g) * ND + n]; }
float hs_of(uint p, uint n) { return hs[hmat * PD * ND + p * ND + n]; }
float gs_of(uint p, uint n) { return gs[hmat * PD * ND + p * ND + n]; }

// The product's operands and stores (defined by the including file).
float A1(uint r, uint k);
float B1(uint k, uint cc);
float A2(uint r, uint k);
float B2(uint k, uint cc);
void put(uint r, uint cc, float v, inout float part);
#if VOUT
void put4(uint r, uint cc, vec4 v, inout float part);
#endif

// One set of accumulators for both segments, unless the product keeps segment 2 apart.
float acc1[TR][TC];
#ifdef SEG2_APART
float acch[TR][TC];
#define acc2 acch
#else
#define acc2 acc1
#endif
#ifndef HEADLESS
#define HEADLESS 0      // 1: a product of a group's matrices (cb), with no head of its own
#endif
#ifndef SEG2_STORE_HOOK
#define SEG2_STORE_HOOK()
#endif
#ifndef SEG2_FETCH_HOOK
#define SEG2_FETCH_HOOK(j)
#endif

// Staging: each thread fetches its share of a slice from global memory into registers (fa, fb),
// then stores it to shared memory. The fetch of the next slice is issued before the products of
// this one, so its latency hides behind them. One fetch/store pair per segment, so that each is
// compiled for its own loaders (no per-element choice between the two).
const uint NFA = (KS * RBLK + WG - 1u) / WG;
const uint NFB = (KS * CBLK + WG - 1u) / WG;
const uint NS1 = K1 / KS;                       // slices of segment 1 (CL is a multiple of KS)
const uint NS2 = (K2 + KS - 1u) / KS;           // slices of segment 2
float fa[NFA], fb[NFB];

#define FETCH(NAME, AF, BF, ARF, BCF, KLEN)                                                    \
void NAME(uint j) {                                                                            \
    uint lid = gl_LocalInvocationIndex;                                                        \
    uint k0 = j * KS;                                                                          \
    [[unroll]] for (uint m = 0; m < NFA; ++m) {                                                \
        uint e = lid + m * WG;                                                                 \
        uint rr = ARF ? e % RBLK : e / KS, kk = ARF ? e / RBLK : e % KS;                       \
        uint k = k0 + kk;                                                                      \
        fa[m] = (e < KS * RBLK && (KLEN % KS == 0u || k < KLEN)) ? AF(r0 + rr, k) : 0.0;       \
    }                                                                                          \
    [[unroll]] for (uint m = 0; m < NFB; ++m) {                                                \
        uint e = lid + m * WG;                                                                 \
        uint cc = BCF ? e % CBLK : e / KS, kk = BCF ? e / CBLK : e % KS;                       \
        uint k = k0 + kk;                                                                      \
        fb[m] = (e < KS * CBLK && (KLEN % KS == 0u || k < KLEN)) ? BF(k, c0 + cc) : 0.0;       \
    }                                                                                          \
}

#define STORE(NAME, ARF, BCF)                                                                  \
void NAME() {                                                                                  \
    uint lid = gl_LocalInvocationIndex;                                                        \
    [[unroll]] for (uint m = 0; m < NFA; ++m) {                                                \
        uint e = lid + m * WG;                                                                 \
        uint kk = ARF ? e / RBLK : e % KS, rr = ARF ? e % RBLK : e / KS;                       \
        if (e < KS * RBLK) PUT_A(kk, rr, fa[m]);                                               \
    }                                                                                          \
    [[unroll]] for (uint m = 0; m < NFB; ++m) {                                                \
        uint e = lid + m * WG;                                                                 \
        uint kk = BCF ? e / CBLK : e % KS, cc = BCF ? e % CBLK : e / KS;                       \
        if (e < KS * CBLK) PUT_B(kk, cc, fb[m]);                                               \
    }                                                                                          \
}

#if AS4
#define PUT_A(kk, rr, v) As4[kk][(rr) >> 2][(rr) & 3u] = (v)
#else
#define PUT_A(kk, rr, v) As[kk][rr] = (v)
#endif
#if BS4
#define PUT_B(kk, cc, v) Bs4[kk][(cc) >> 2][(cc) & 3u] = (v)
#else
#define PUT_B(kk, cc, v) Bs[kk][cc] = (v)
#endif

FETCH(fetch1, A1, B1, A1_RF, B1_CF, K1)
FETCH(fetch2, A2, B2, A2_RF, B2_CF, K2)
STORE(store1, A1_RF, B1_CF)
STORE(store2, A2_RF, B2_CF)

// The TR rows of thread row-group tr at slice position kk.
void load_rows(uint kk, uint tr, out float a[TR]) {
#if AS4
    [[unroll]] for (uint v = 0; v < TR / 4u; ++v) {
        vec4 q = As4[kk][tr * (TR / 4u) + v];
        a[4u * v] = q.x; a[4u * v + 1u] = q.y; a[4u * v + 2u] = q.z; a[4u * v + 3u] = q.w;
    }
#else
    [[unroll]] for (uint jj = 0; jj < TR; ++jj) a[jj] = As[kk][tr * TR + jj];
#endif
}

// The TC columns of thread column-group tc at slice position kk.
void load_cols(uint kk, uint tc, out float b[TC]) {
#if BS4
    [[unroll]] for (uint w = 0; w < TC / 4u; ++w) {
        vec4 q = Bs4[kk][tc + CG * w];
        b[4u * w] = q.x; b[4u * w + 1u] = q.y; b[4u * w + 2u] = q.z; b[4u * w + 3u] = q.w;
    }
#else
    [[unroll]] for (uint q = 0; q < TC; ++q) b[q] = Bs[kk][tc + CG * q];
#endif
}

// Segment 1 (the chunk's tokens, masked): slices j = 0 .. NS1-1; ``then2``: prefetch segment 2's
// first slice during the last one.
void segment1(uint rlo, uint rhi, uint tr, uint tc, bool then2) {
    for (uint j = 0; j < NS1; ++j) {
        store1();
        barrier();
        if (j + 1u < NS1) fetch1(j + 1u); else if (then2 && NS2 > 0u) fetch2(0u);
        uint k0 = j * KS, khi = k0 + KS - 1u;
        bool skip = (MASK == 1u && k0 > rhi) || (MASK == 2u && khi < rlo);
        bool full = MASK == 0u || (MASK == 1u && khi <= rlo) || (MASK == 2u && k0 >= rhi);
        if (!skip) {
            [[unroll]] for (uint kk = 0; kk < KS; ++kk) {
                float a[TR], b[TC];
                load_rows(kk, tr, a);
                load_cols(kk, tc, b);
                if (full) {
                    [[unroll]] for (uint jj = 0; jj < TR; ++jj)
                        [[unroll]] for (uint q = 0; q < TC; ++q) acc1[jj][q] += a[jj] * b[q];
                } else {
                    uint k = k0 + kk;
                    [[unroll]] for (uint jj = 0; jj < TR; ++jj) {
                        bool inc = MASK == 1u ? k <= rlo + jj : k >= rlo + jj;
                        [[unroll]] for (uint q = 0; q < TC; ++q) acc1[jj][q] += inc ? a[jj] * b[q] : 0.0;
                    }
                }
            }
        }
        barrier();
    }
}

// Segment 2 (N or P, unmasked); ``then1``: prefetch segment 1's first slice during the last one.
void segment2(bool then1) {
    uint lid = gl_LocalInvocationIndex;
    uint tr = lid / CG, tc = lid % CG;
    for (uint j = 0; j < NS2; ++j) {
        SEG2_STORE_HOOK();
        store2();
        barrier();
        if (j + 1u < NS2) SEG2_FETCH_HOOK(j + 1u);
        if (j + 1u < NS2) fetch2(j + 1u); else if (then1 && NS1 > 0u) fetch1(0u);
        [[unroll]] for (uint kk = 0; kk < KS; ++kk) {
            float a[TR], b[TC];
            load_rows(kk, tr, a);
            load_cols(kk, tc, b);
            [[unroll]] for (uint jj = 0; jj < TR; ++jj)
                [[unroll]] for (uint q = 0; q < TC; ++q) acc2[jj][q] += a[jj] * b[q];
        }
        barrier();
    }

}

// Row sums of ``part`` over the CG column groups (in column-group order) into slot ``slot`` +
// column block of sm, for the chunk's tokens.
void row_sums(float part[TR], uint tr, uint tc, uint slot, uint cbk) {
    uint lid = gl_LocalInvocationIndex;
    [[unroll]] for (uint j = 0; j < TR; ++j) red[tr * TR + j][tc] = part[j];
    barrier();
    if (lid < RBLK && r0 + lid < Lc) {
        float s = 0.0;
        for (uint q = 0; q < CG; ++q) s += red[lid][q];
        sm[(tk(r0 + lid) * pc.H + h) * NSM + slot + cbk] = s;
    }
    barrier();
}

// Head h's scalars into shared memory (every thread reaches it; the barrier publishes them).
void set_head(uint hd) {
    h = hd;
    hmat = head_mat(i, c, h);
    mat = HEADLESS != 0 ? group_mat(i, c, g) : hmat;
    for (uint t = gl_LocalInvocationIndex; t < CL; t += WG) {
        bool on = t < Lc && HEADLESS == 0;
        sd[t] = on ? softplus(dt[pc.o_dt + tk(t) * pc.H + h]) : 0.0;
        sdi[t] = on ? dec[hmat * DEC + t] : 0.0;
        sdo[t] = on ? dec[hmat * DEC + CL + t] : 0.0;
    }
    barrier();
}

// The tile of this workgroup and the thread's place in it, accumulators zeroed; false for a
// workgroup past the last tile (uniform over the workgroup).
bool gemm_begin() {
    uint wg = wg_index();
    uint HH = PER_GROUP != 0 ? pc.G : pc.H;
    uint total = pc.S * pc.NCH * HH * NRB * NCBK;
    if (wg >= total) return false;
    uint bat = wg / (NRB * NCBK);
    uint rem = wg % (NRB * NCBK);
    uint rb = rem / NCBK;
    cbk = rem % NCBK;
    i = bat / (pc.NCH * HH);
    c = (bat / HH) % pc.NCH;
    hh = bat % HH;
    hpg = pc.H / pc.G;
    g = PER_GROUP != 0 ? hh : hh / hpg;
    Lc = chunk_len(c);
    r0 = rb * RBLK;
    c0 = cbk * CBLK;
    uint lid = gl_LocalInvocationIndex;
    tr = lid / CG;
    tc = lid % CG;
    [[unroll]] for (uint j = 0; j < TR; ++j)
        [[unroll]] for (uint q = 0; q < TC; ++q) acc1[j][q] = 0.0;
    rlo = r0 + tr * TR;
    rhi = rlo + TR - 1u;
    return true;
}

// The products of a tile with both segments in order (segment 1 first): every product but
// gam, db and dc.
void gemm_both() {
    set_head(PER_GROUP != 0 ? 0u : hh);
    if (NS1 > 0u) fetch1(0u); else if (NS2 > 0u) fetch2(0u);
    segment1(rlo, rhi, tr, tc, true);
    segment2(false);
}

// Writes the tile through put / put4; ``part0``: what put adds per row (gam's Gam . x).
void epilogue(out float part0[TR]) {
    [[unroll]] for (uint j = 0; j < TR; ++j) {
        uint r = rlo + j;
        part0[j] = 0.0;
#if VOUT
        [[unroll]] for (uint w = 0; w < TC / 4u; ++w) {
            uint cc = c0 + (tc + CG * w) * 4u;        // = col_of(tc, 4 w); COLS_D % 4 == 0
            put4(r, cc, vec4(acc1[j][4u * w], acc1[j][4u * w + 1u], acc1[j][4u * w + 2u], acc1[j][4u * w + 3u]),
                 part0[j]);
        }
#else
        [[unroll]] for (uint q = 0; q < TC; ++q) put(r, c0 + col_of(tc, q), acc1[j][q], part0[j]);
#endif
    }
}

// Four consecutive values into out at ``at`` (16 bytes at once when aligned), the non-finite
// flag raised for any of them.
void out_store4(uint at, vec4 v) {
#if VOUT
    if ((at & 3u) == 0u) {
        outv4[at >> 2] = v;
    } else {
        outv[at] = v.x; outv[at + 1u] = v.y; outv[at + 2u] = v.z; outv[at + 3u] = v.w;
    }
    if (any(not(lessThanEqual(abs(v), vec4(3.4028234664e38))))) atomicOr(flag[0], 1u);
#endif
}

// Where d_B / d_C (S, T, G, N) -- or with HEADLOOP = 0 their per-head parts (S, T, H, N), which
// ssm_scan_reduce.comp sums over the heads of each group -- take row r, column cc of the tile.
uint bc_out_at(uint r, uint cc) {
#if HEADLOOP
    return pc.o_out + (tk(r) * pc.G + g) * ND + cc;
#else
    return pc.o_out + (tk(r) * pc.H + h) * ND + cc;
#endif
}
