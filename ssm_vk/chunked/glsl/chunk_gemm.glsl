// The GEMM engine of the chunked Mamba-2 scan's matrix products (ssm_ref/chunked.py). Each
// product is a file, glsl/chunk_gemm_<product>.comp, that defines its shape, operands and stores
// as macros, includes this file and writes main() from the pieces here:
//
//   cb  cb[t][s]   (CL x CL)  sum_n C_t[n] B_s[n]
//   gu  gu[t][s]   (CL x CL)  sum_p gy_t[p] u_s[p]
//   zf  hs[p][n]   (P x N)    sum_s dout_s u_s[p] B_s[n]
//   zb  gs[p][n]   (P x N)    sum_r din_r gy_r[p] C_r[n]
//   y   y[t][p]    (CL x P)   sum_{s<=t} mcb[t][s] u_s[p] + din_t sum_n C_t[n] hs[p][n]
//   gam d_x[s][p]  (CL x P)   sum_{r>=s} mcb[r][s] gy_r[p] + dout_s sum_n B_s[n] gs[p][n]
//   db  d_B[s][n]  (CL x N)   sum_{r>=s} mgu[r][s] C_r[n] + dout_s sum_p u_s[p] gs[p][n]
//   dc  d_C[t][n]  (CL x N)   sum_{s<=t} mgu[t][s] B_s[n] + din_t sum_p gy_t[p] hs[p][n]
//
// (u_s = x_s * d_s.) Each workgroup computes an RBLK x CBLK tile of one (sequence, chunk, head)
// matrix -- (.., group) with PER_GROUP -- as a sum over up to two contraction segments, staged
// through shared memory KS at a time:
//
//   segment 1: over the chunk's tokens (K1 = CL), masked causal (MASK 1: k <= row), anti-causal
//              (MASK 2: k >= row) or not at all (MASK 0); masked entries are left out of the
//              sum, never multiplied by zero
//   segment 2: over N or P (K2), unmasked
//
// A product defines, before including this file:
//   ROWS, COLS, K1, MASK, K2     the matrix and its segments (K1 or K2 0: no such segment)
//   A1(r, k), B1(k, cc)          segment 1's operands (where K1 > 0): expressions, 0 past the
//                                matrix; A1_RF / B1_CF true where consecutive rows / columns (else
//                                consecutive k) are contiguous in memory, so threads stage them so
//   A2, B2, A2_RF, B2_CF         the same for segment 2 (where K2 > 0)
//   STORE1(r, cc, v, sum)        statement: the tile's element (r, cc) is v (sum: the row's float
//                                for per-token sums); STORE4: four columns cc..cc+3, v a vec4 (the
//                                16-byte epilogue, VOUT). A product writing token rows of out
//                                (y, d_B, d_C) defines OUT_AT(r, cc), their index, instead
//   and where they apply:
//   PER_GROUP 1                  workgroups per (sequence, chunk, group) (default 0: per head)
//   GROUP_MAT 1                  mat is the group's matrix, no per-head scalars (cb)
//   HEAD_LOOP 1                  main loops over heads (db, dc): FOLD and HPART are allowed
//   SEG2_APART 1                 segment 2 adds into acch, apart from segment 1's acc1 (dc)
//   ROW_SUMS 1                   row_sums() and its table red (gam, dc)
//   VEC_OPERANDS                 functions A1v .. B2v: the operands' four values at one 16-byte
//                                load, for VEC_IN (y)
//   SEG2_SIDE, SEG2_SIDE_STORE, SEG2_SIDE_FETCH(j)   functions beside segment 2's staging, and
//                                their calls in it (gam's <G_c, H_c>)
// main() is GEMM_BEGIN, the product's order of set_head() and segments, GEMM_EPILOGUE. The pieces
// are macros, and the product's functions are placed in the engine's order, rather than functions
// the engine calls: an earlier split through functions with out-parameters was 5-7% slower on an
// H200 (docs/BENCHMARKS.md, "one file per product"); this one compiled to the same SPIR-V as the
// single file it replaced.
//
// Defines: chunk_common's, RBLK and CBLK (tile; RBLK a multiple of ROWG, CBLK of WG / ROWG), KS,
// ROWG, HEADLOOP, FOLD and HPART (db, dc), VEC_OUT (1: 16-byte stores in the epilogue where they
// fit), VEC_IN (y: stage operands with 16-byte loads where the call's offsets allow). Bindings and
// push constants: glsl/chunk_common.glsl.
//
// Thread (tr, tc) of the 16 x (WG / 16) thread grid owns rows tr * TR .. tr * TR + TR - 1
// (contiguous: whole masked slices are skipped) and columns tc, tc + CG, ... (strided: the
// shared-memory reads of a warp hit distinct banks).

#extension GL_EXT_control_flow_attributes : enable
#include "chunk_common.glsl"

#ifndef FOLD
#define FOLD 0
#endif
#ifndef HPART
#define HPART 1
#endif
#ifndef HEAD_LOOP
#define HEAD_LOOP 0
#endif
#if (HPART > 1 || FOLD) && !HEAD_LOOP
#error "FOLD and HPART are for db and dc"
#endif

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
#ifndef VEC_IN
#define VEC_IN 0
#endif
#if VEC_IN && !defined(VEC_OPERANDS)
#error "VEC_IN: this product has no 16-byte operands"
#endif
#if BS4 && (COLS % 4 == 0) && VEC_OUT
#define VOUT 1
#else
#define VOUT 0
#endif
#if VOUT || VEC_IN
layout(std430, binding = 6) buffer Bhs4 { vec4 hs4[]; };
#endif
#if VEC_IN
// 16-byte views of the inputs the staging loads read (the call's element offsets o_x and o_C
// must then be multiples of 4: see vin)
layout(std430, binding = 0) readonly buffer Bx4 { vec4 x4[]; };
layout(std430, binding = 4) readonly buffer BC4 { vec4 Cm4[]; };
layout(std430, binding = 9) buffer Bmcb4 { vec4 mcb4[]; };
#endif
#if VOUT
layout(std430, binding = 7) buffer Bgs4 { vec4 gs4[]; };
layout(std430, binding = 8) buffer Bcb4 { vec4 cb4[]; };
layout(std430, binding = 10) buffer Bgu4 { vec4 gu4[]; };
layout(std430, binding = 13) buffer Bout4 { vec4 outv4[]; };
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
#ifndef ROW_SUMS
#define ROW_SUMS 0
#endif
#if ROW_SUMS
shared float red[RBLK][CG];
#endif

uint i, c, h, g, Lc, mat, hmat, r0, c0;   // h, hmat, mat: the head set_head() took

// Clamped token index: loads of padded tokens read a valid address and are then discarded.
uint tk(uint t) { return tok(i, c, min(t, Lc - 1u)); }

float u_of(uint t, uint p) { return x[pc.o_x + (tk(t) * pc.H + h) * PD + p] * sd[t]; }
float gy_of(uint t, uint p) { return gy[pc.o_gy + (tk(t) * pc.H + h) * PD + p]; }
float B_of(uint t, uint n) { return Bm[pc.o_B + (tk(t) * pc.G + g) * ND + n]; }
float C_of(uint t, uint n) { return Cm[pc.o_C + (tk(t) * pc.G + g) * ND + n]; }
float hs_of(uint p, uint n) { return hs[hmat * PD * ND + p * ND + n]; }
float gs_of(uint p, uint n) { return gs[hmat * PD * ND + p * ND + n]; }

// The product's operands: A1(row, k), B1(k, col) of segment 1, A2, B2 of segment 2 (0 where the
// product has no such segment).
#ifndef A1_RF
#define A1_RF false
#define B1_CF false
#endif
#ifndef A2_RF
#define A2_RF false
#define B2_CF false
#endif
#ifdef A1
float opA1(uint r, uint k) { return A1(r, k); }
float opB1(uint k, uint cc) { return B1(k, cc); }
#else
float opA1(uint r, uint k) { return 0.0; }
float opB1(uint k, uint cc) { return 0.0; }
#endif
#ifdef A2
float opA2(uint r, uint k) { return A2(r, k); }
float opB2(uint k, uint cc) { return B2(k, cc); }
#else
float opA2(uint r, uint k) { return 0.0; }
float opB2(uint k, uint cc) { return 0.0; }
#endif

// One set of accumulators for both segments, or (SEG2_APART) segment 2's in acch.
float acc1[TR][TC];
#ifndef SEG2_APART
#define SEG2_APART 0
#endif
#if SEG2_APART
float acch[TR][TC];
#define acc2 acch
#else
#define acc2 acc1
#endif
#ifndef PER_GROUP
#define PER_GROUP 0
#endif
#ifndef GROUP_MAT
#define GROUP_MAT 0
#endif

// Staging: each thread fetches its share of a slice from global memory into registers (fa, fb),
// then stores it to shared memory. The fetch of the next slice is issued before the products of
// this one, so its latency hides behind them. One fetch/store pair per segment, so that each is
// compiled for its own loaders (no per-element choice between the two).
const uint NFA = (KS * RBLK + WG - 1u) / WG;   // the most of any segment
const uint NFB = (KS * CBLK + WG - 1u) / WG;
const uint NS1 = K1 / KS;                       // slices of segment 1 (CL is a multiple of KS)
const uint NS2 = (K2 + KS - 1u) / KS;           // slices of segment 2
// VEC_IN's quads of four per thread (the most of any segment) take 4 registers each
const uint NQA = VEC_IN != 0 ? 4u * ((KS * RBLK / 4u + WG - 1u) / WG) : 0u;
const uint NQB = VEC_IN != 0 ? 4u * ((KS * CBLK / 4u + WG - 1u) / WG) : 0u;
float fa[NFA > NQA ? NFA : NQA], fb[NFB > NQB ? NFB : NQB];

// Staging unit e of a slice: W consecutive elements (W = 1; 4 for VEC_IN's 16-byte loads) along
// whichever direction is contiguous in memory -- rows (columns) where *_RF (*_CF), else k: its
// first row (column) pos and its k offset kk. (W = 1 is spelled out: the float staging keeps the
// code it had before W existed.)
#define UNIT1(e, LEN, RF)                                                                      \
    uint pos = RF ? (e) % LEN : (e) / KS, kk = RF ? (e) / LEN : (e) % KS
#define UNIT4(e, LEN, RF)                                                                      \
    uint pos = RF ? (e) % (LEN / 4u) * 4u : (e) / (KS / 4u), kk = RF ? (e) / (LEN / 4u) : (e) % (KS / 4u) * 4u
// Keeping a unit's values in fa / fb (KEEPW), and putting them into shared memory (PUTW_A, PUTW_B:
// element q of the unit at row / column pos + q, or at k offset kk + q).
#define KEEP1(f, m, v) f[m] = (v)
#define KEEP4(f, m, v) { vec4 q4 = (v); f[4u * m] = q4.x; f[4u * m + 1u] = q4.y; f[4u * m + 2u] = q4.z; f[4u * m + 3u] = q4.w; }
#define PUT1_A(RF, kk, r, f, m) PUT_A(kk, r, f[m])
#define PUT1_B(CF, kk, c, f, m) PUT_B(kk, c, f[m])
#define PUT4_A(RF, kk, r, f, m) [[unroll]] for (uint q = 0; q < 4u; ++q) PUT_A(RF ? kk : kk + q, r + (RF ? q : 0u), f[4u * m + q])
#define PUT4_B(CF, kk, c, f, m) [[unroll]] for (uint q = 0; q < 4u; ++q) PUT_B(CF ? kk : kk + q, c + (CF ? q : 0u), f[4u * m + q])

// fetch: the units of a slice this thread takes, loaded (AF, BF: W values each, of type VT) into
// fa, fb; store: the same units from fa, fb into shared memory.
#define FETCH(NAME, AF, BF, ARF, BCF, KLEN, W, UNIT, VT, KEEP)                                 \
void NAME(uint j) {                                                                            \
    uint lid = gl_LocalInvocationIndex;                                                        \
    uint k0 = j * KS;                                                                          \
    [[unroll]] for (uint m = 0; m < (KS * RBLK / W + WG - 1u) / WG; ++m) {                     \
        uint e = lid + m * WG;                                                                 \
        UNIT(e, RBLK, ARF);                                                                    \
        uint k = k0 + kk;                                                                      \
        KEEP(fa, m, (e < KS * RBLK / W && (KLEN % KS == 0u || k < KLEN)) ? AF(r0 + pos, k) : VT(0.0)); \
    }                                                                                          \
    [[unroll]] for (uint m = 0; m < (KS * CBLK / W + WG - 1u) / WG; ++m) {                     \
        uint e = lid + m * WG;                                                                 \
        UNIT(e, CBLK, BCF);                                                                    \
        uint k = k0 + kk;                                                                      \
        KEEP(fb, m, (e < KS * CBLK / W && (KLEN % KS == 0u || k < KLEN)) ? BF(k, c0 + pos) : VT(0.0)); \
    }                                                                                          \
}

#define STORE(NAME, ARF, BCF, W, UNIT, PUTA, PUTB)                                             \
void NAME() {                                                                                  \
    uint lid = gl_LocalInvocationIndex;                                                        \
    [[unroll]] for (uint m = 0; m < (KS * RBLK / W + WG - 1u) / WG; ++m) {                     \
        uint e = lid + m * WG;                                                                 \
        UNIT(e, RBLK, ARF);                                                                    \
        if (e < KS * RBLK / W) PUTA(ARF, kk, pos, fa, m);                                      \
    }                                                                                          \
    [[unroll]] for (uint m = 0; m < (KS * CBLK / W + WG - 1u) / WG; ++m) {                     \
        uint e = lid + m * WG;                                                                 \
        UNIT(e, CBLK, BCF);                                                                    \
        if (e < KS * CBLK / W) PUTB(BCF, kk, pos, fb, m);                                      \
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

FETCH(fetch1, opA1, opB1, A1_RF, B1_CF, K1, 1u, UNIT1, float, KEEP1)
FETCH(fetch2, opA2, opB2, A2_RF, B2_CF, K2, 1u, UNIT1, float, KEEP1)
STORE(store1, A1_RF, B1_CF, 1u, UNIT1, PUT1_A, PUT1_B)
STORE(store2, A2_RF, B2_CF, 1u, UNIT1, PUT1_A, PUT1_B)

// VEC_IN: the same slices staged four elements at a time (W = 4), each unit read with one
// 16-byte load (the product's A1v .. B2v: the four values of A1 .. B2 there) and kept in the same
// registers (fa, fb). vin (the call's offsets are multiples of 4) picks this or the float staging
// for the whole dispatch; both give the same values.
bool vin = false;
#if VEC_IN
VEC_OPERANDS
FETCH(fetch1v, A1v, B1v, A1_RF, B1_CF, K1, 4u, UNIT4, vec4, KEEP4)
FETCH(fetch2v, A2v, B2v, A2_RF, B2_CF, K2, 4u, UNIT4, vec4, KEEP4)
STORE(store1v, A1_RF, B1_CF, 4u, UNIT4, PUT4_A, PUT4_B)
STORE(store2v, A2_RF, B2_CF, 4u, UNIT4, PUT4_A, PUT4_B)
// The staging every segment calls: 16-byte or float.
void fetch1_any(uint j) { if (vin) fetch1v(j); else fetch1(j); }
void fetch2_any(uint j) { if (vin) fetch2v(j); else fetch2(j); }
void store1_any() { if (vin) store1v(); else store1(); }
void store2_any() { if (vin) store2v(); else store2(); }
#else
void fetch1_any(uint j) { fetch1(j); }
void fetch2_any(uint j) { fetch2(j); }
void store1_any() { store1(); }
void store2_any() { store2(); }
#endif

// Work beside segment 2's staging: SEG2_SIDE_STORE before each slice is stored, SEG2_SIDE_FETCH(j)
// with the fetch of slice j + 1.
#ifdef SEG2_SIDE
SEG2_SIDE
#else
#define SEG2_SIDE_STORE
#define SEG2_SIDE_FETCH(j)
#endif

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
// first slice during the last one. Each slice: stored, then (barrier) its products, then (barrier:
// every thread has read it) the next slice may be stored.
void segment1(uint rlo, uint rhi, uint tr, uint tc, bool then2) {
    for (uint j = 0; j < NS1; ++j) {
        store1_any();
        barrier();
        if (j + 1u < NS1) fetch1_any(j + 1u); else if (then2 && NS2 > 0u) fetch2_any(0u);
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
        SEG2_SIDE_STORE
        store2_any();
        barrier();
        SEG2_SIDE_FETCH(j)
        if (j + 1u < NS2) fetch2_any(j + 1u); else if (then1 && NS1 > 0u) fetch1_any(0u);
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

#if ROW_SUMS
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
#endif

// The scalars of head hd into shared memory (every thread reaches it; the barrier publishes
// them).
void set_head(uint hd) {
    h = hd;
    hmat = head_mat(i, c, h);
    mat = GROUP_MAT != 0 ? group_mat(i, c, g) : hmat;
    for (uint t = gl_LocalInvocationIndex; t < CL; t += WG) {
        bool on = t < Lc && GROUP_MAT == 0;
        sd[t] = on ? softplus(dt[pc.o_dt + tk(t) * pc.H + h]) : 0.0;
        sdi[t] = on ? dec[hmat * DEC + t] : 0.0;
        sdo[t] = on ? dec[hmat * DEC + CL + t] : 0.0;
    }
    barrier();
}

// main()'s start: the workgroup's tile (globals i, c, g, Lc, r0, c0; locals cbk its column block,
// hb its head -- its group with PER_GROUP, its part of HPART heads with HPART --, hpg heads per
// group, lid, tr, tc its thread, rlo .. rhi the thread's rows), the accumulators zeroed.
// Workgroups past the grid return.
#define GEMM_BEGIN                                                                             \
    uint wg = wg_index();                                                                      \
    uint HH = PER_GROUP != 0 ? pc.G : pc.H / HPART;   /* workgroups' heads */                  \
    uint total = pc.S * pc.NCH * HH * NRB * NCBK;                                              \
    if (wg >= total) return;                      /* uniform over the workgroup */             \
    uint bat = wg / (NRB * NCBK);                                                              \
    uint rem = wg % (NRB * NCBK);                                                              \
    uint rb = rem / NCBK, cbk = rem % NCBK;                                                    \
    i = bat / (pc.NCH * HH);                                                                   \
    c = (bat / HH) % pc.NCH;                                                                   \
    uint hb = bat % HH;                                                                        \
    uint hpg = pc.H / pc.G;                                                                    \
    g = PER_GROUP != 0 ? hb : hb * HPART / hpg;                                                \
    Lc = chunk_len(c);                                                                         \
    r0 = rb * RBLK;                                                                            \
    c0 = cbk * CBLK;                                                                           \
    uint lid = gl_LocalInvocationIndex;                                                        \
    uint tr = lid / CG, tc = lid % CG;                                                         \
    vin = VEC_IN != 0 && ((pc.o_x | pc.o_C) & 3u) == 0u;   /* uniform: the call's offsets */   \
    [[unroll]] for (uint j = 0; j < TR; ++j)                                                   \
        [[unroll]] for (uint q = 0; q < TC; ++q) acc1[j][q] = 0.0;                             \
    uint rlo = r0 + tr * TR, rhi = rlo + TR - 1u;

// A token row of out, four columns from at: one 16-byte store where at is a multiple of 4.
#define OUT4(at, v)                                                                            \
    if ((at & 3u) == 0u) {                                                                     \
        outv4[at >> 2] = v;                                                                    \
    } else {                                                                                   \
        outv[at] = v.x; outv[at + 1u] = v.y; outv[at + 2u] = v.z; outv[at + 3u] = v.w;         \
    }                                                                                          \
    if (any(not(lessThanEqual(abs(v), vec4(3.4028234664e38))))) atomicOr(flag[0], 1u);
#ifdef OUT_AT
#define STORE1(r, cc, v, sum) if (r < Lc && cc < COLS) { outv[OUT_AT(r, cc)] = v; guard(v); }
#define STORE4(r, cc, v, sum) if (r < Lc && cc < COLS) { uint at = OUT_AT(r, cc); OUT4(at, v) }
#endif

// main()'s end: the tile written through the product's STORE4 (VOUT) or STORE1; part0[j], its
// sum argument, starts at 0 for each of the thread's rows.
#if VOUT
#define GEMM_EPILOGUE                                                                          \
    float part0[TR];                                                                           \
    [[unroll]] for (uint j = 0; j < TR; ++j) {                                                 \
        uint r = rlo + j;                                                                      \
        part0[j] = 0.0;                                                                        \
        [[unroll]] for (uint w = 0; w < TC / 4u; ++w) {                                        \
            uint cc = c0 + (tc + CG * w) * 4u;        /* = col_of(tc, 4 w); COLS % 4 == 0 */   \
            vec4 v = vec4(acc1[j][4u * w], acc1[j][4u * w + 1u], acc1[j][4u * w + 2u], acc1[j][4u * w + 3u]); \
            STORE4(r, cc, v, part0[j])                                                         \
        }                                                                                      \
    }
#else
#define GEMM_EPILOGUE                                                                          \
    float part0[TR];                                                                           \
    [[unroll]] for (uint j = 0; j < TR; ++j) {                                                 \
        uint r = rlo + j;                                                                      \
        part0[j] = 0.0;                                                                        \
        [[unroll]] for (uint q = 0; q < TC; ++q) {                                             \
            uint cc = c0 + col_of(tc, q);                                                      \
            float v = acc1[j][q];                                                              \
            STORE1(r, cc, v, part0[j])                                                         \
        }                                                                                      \
    }
#endif
