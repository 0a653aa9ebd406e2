#version 450
// Forward selective scan, token-sequential: one state row (i, h, p) per LN lanes, the state in
// registers, T tokens in order. Optionally writes a checkpoint of every row's state before each
// chunk of K tokens (the backward recomputes from those). Also the first pass of the forward
// parallel over time (SUMMARY): every "sequence" is then a time chunk, started from zero.
//
// Bindings (0-4 declared in common.glsl; all float32 unless noted; every index is relative to
// the element offset o_* of the window the host bound; the window covers sequences [0, S) and
// tokens [0, T) of this dispatch):
//   0 x   (S, T, H, P)          readonly
//   1 dt  (S, T, H)             readonly
//   2 A   (H, 1) or (H, N)      readonly
//   3 B   (S, T, G, N)          readonly
//   4 C   (S, T, G, N)          readonly
//   5 y   (S, T, H, P)          written
//   6 st  (S, H, P, N)          read (initial state) and overwritten (final state)
//   7 ck  (S, H, P, NC, N)      written when CKPT: the state before token c*K goes to chunk c0 + c;
//         (S, H, KA)            when SUMMARY: each row's decay over the window's tokens, the product
//                               of its factors exp(dt' A) (KA = N for Mamba-1, else 1)
//   8 s   (R, H, P, N)          the state cache, when pc.gather: read (initial states), and
//                               written (the final states) when pc.scatter
//   9 ids (S)  uint             readonly: its rows, when pc.gather
//  10 snap (KS, ., H, P, N)     written when SNAP (ssm_scan(snapshots=K)): the state after token t
//                               goes to slot T - 1 - t when that is below pc.KS, the start state to
//                               slot T and NaN to the slots above it when T < pc.KS; slot k of
//                               window row r at o_sn + (k * sst + r) * N (sst: the slot stride in
//                               rows). The host shifts the slots of a token window to its own end.
// With pc.gather = 1 the initial state of sequence i is row ids[o_ids + i] of s (a window that
// starts the sequences: t0 = 0), read in place; otherwise st holds it (the host copied the rows,
// or a previous token window of the same sequence left it). The final state goes to st, or with
// pc.scatter = 1 (ssm_scan's update_cache; only with gather, ids distinct) to row ids[o_ids + i]
// of s, over the initial state it was read from (by the same invocation: no other reads it).
// Push constants: see PC below (same order as ssm_vk/kernels.py FWD_PUSH).
// Defines: common.glsl's, plus TB (tokens per load block), CKPT (0/1), K (checkpoint
// interval, when CKPT), SUMMARY (0/1) and SPREAD (1: the row's lanes share the block's steps
// through subgroupShuffle; needs LN >= TB and subgroup rows). With CKPT the kernel is the backward's recompute pass:
// it writes checkpoints and the final state, not y. With SUMMARY (time chunks, see
// ssm_scan_carry.comp) it starts every row from zero and writes the final state and the decay,
// not y: what the chunk adds to the state, and the factor it multiplies the incoming state by.
// SNAP (0/1, with neither CKPT nor SUMMARY) adds binding 10 and the push constants KS, o_sn,
// sst; without it the kernel is the same SPIR-V as before snapshots existed.

#include "common.glsl"

#ifndef SUMMARY
#define SUMMARY 0
#endif
#ifndef SPREAD
#define SPREAD 0
#endif
#ifndef SNAP
#define SNAP 0
#endif
#define WANT_Y (!CKPT && !SUMMARY)

layout(std430, binding = 5) writeonly buffer By { float y[]; };
layout(std430, binding = 6) buffer Bst { float st_buf[]; };
layout(std430, binding = 7) writeonly buffer Bck { float ck[]; };
layout(std430, binding = 8) buffer Bs { float s_in[]; };
layout(std430, binding = 9) readonly buffer Bids { uint ids[]; };
#if SNAP
layout(std430, binding = 10) writeonly buffer Bsn { float snap[]; };
#endif

layout(push_constant) uniform PC {
    uint S, T, H, P, N, G;   // window sizes (S, T) and problem sizes
    uint HB, PB;             // heads and channels per workgroup (HB * PB <= ROWS)
    uint NHB, NPB;           // head blocks and channel blocks: ceil(H / HB), ceil(P / PB)
    uint gx;                 // workgroups along x (the grid is 2-D when it must be)
    uint NC, c0;             // checkpoints per row in ck, index of this window's first one
    uint o_x, o_dt, o_B, o_C, o_y, o_st, o_ck;
    uint gather, o_s, o_ids;  // initial states from s[ids] (see above); offsets of s and ids
    uint scatter;             // final states into s[ids] instead of st (see above)
    uint o_A;                 // element offset of A in its binding
#if SNAP
    uint KS, o_sn, sst;       // slots this window writes, their offset, the slot stride in rows
#endif
} pc;

void main() {
    Row r = row_of(pc.gx, pc.S, pc.H, pc.P, pc.G, pc.HB, pc.PB, pc.NHB, pc.NPB);
    uint i = r.i, h = r.h, p = r.p, g = r.g, lane = r.lane, row = r.row;
    bool live = r.live;

    XF st[NPL];
#if MAMBA1
    float Ar[NPL];
#endif
    uint src = pc.gather != 0u ? ((live ? ids[pc.o_ids + i] : 0u) * pc.H + h) * pc.P + p : row;  // row of s
    [[unroll]] for (uint k = 0; k < NPL; ++k) {
        uint n = lane + k * LN;
        bool on = live && n < pc.N;
        if (SUMMARY != 0) {
            st[k] = 0.0;
        } else if (pc.gather != 0u) {                    // uniform
            st[k] = on ? s_in[pc.o_s + src * pc.N + n] : 0.0;
        } else {
            st[k] = on ? st_buf[pc.o_st + row * pc.N + n] : 0.0;
        }
#if MAMBA1
        Ar[k] = on ? A[pc.o_A + h * pc.N + n] : 0.0;
#endif
    }
#if !MAMBA1
    float Ah = live ? A[pc.o_A + h] : 0.0;
#endif
#if SNAP
    if (live && pc.T < pc.KS) {                          // the start state, then NaN: no such state
        [[unroll]] for (uint k = 0; k < NPL; ++k) {
            uint n = lane + k * LN;
            if (n < pc.N) {
                snap[pc.o_sn + (pc.T * pc.sst + row) * pc.N + n] = st[k];
                for (uint snk = pc.T + 1u; snk < pc.KS; ++snk)
                    snap[pc.o_sn + (snk * pc.sst + row) * pc.N + n] = uintBitsToFloat(0x7fc00000u);
            }
        }
    }
#endif
#if SUMMARY && MAMBA1
    float dec[NPL];
    [[unroll]] for (uint k = 0; k < NPL; ++k) dec[k] = 1.0;
#elif SUMMARY
    float dec = 1.0;
#endif

    // Tokens go in blocks of TB: the loads of a block do not depend on the state, so they are
    // issued together and their latencies overlap; then the block's state updates run in order,
    // then its TB row sums (independent of each other).
    for (uint t0 = 0; t0 < pc.T; t0 += TB) {
        XF dv[TB], uv[TB];
        float Bv[TB][NPL];
#if WANT_Y
        float Cv[TB][NPL];
#endif
#if SPREAD
        // One step per token of the block, not one per lane: lane j of the row computes token
        // j's (LN >= TB), and every lane of the row reads it from there (the same bits).
        uint jl = lane % TB;
        bool on_jl = live && t0 + jl < pc.T;
        float dt_jl = on_jl ? dt[pc.o_dt + (i * pc.T + min(t0 + jl, pc.T - 1)) * pc.H + h] : 0.0;
        float sp_jl = softplus(dt_jl);
        uint first = gl_SubgroupInvocationID - lane;      // the row's first lane in the subgroup
#endif
        [[unroll]] for (uint j = 0; j < TB; ++j) {
            bool on_t = live && t0 + j < pc.T;
            uint it = i * pc.T + min(t0 + j, pc.T - 1);     // (i, t) in (S, T)
            float xr = on_t ? x[pc.o_x + (it * pc.H + h) * pc.P + p] : 0.0;
#if SPREAD
            float spj = subgroupShuffle(sp_jl, first + j);
            dv[j] = on_t ? spj : 0.0;
#else
            float dtr = on_t ? dt[pc.o_dt + it * pc.H + h] : 0.0;
            dv[j] = on_t ? softplus(dtr) : 0.0;
#endif
            uv[j] = xr * dv[j];
            uint bc = (it * pc.G + g) * pc.N;
            [[unroll]] for (uint k = 0; k < NPL; ++k) {
                uint n = lane + k * LN;
                bool on = on_t && n < pc.N;
                Bv[j][k] = on ? Bm[pc.o_B + bc + n] : 0.0;
#if WANT_Y
                Cv[j][k] = on ? Cm[pc.o_C + bc + n] : 0.0;
#endif
            }
        }
#if WANT_Y
        XF acc[TB];
#endif
        [[unroll]] for (uint j = 0; j < TB; ++j) {
            uint t = t0 + j;
            if (t < pc.T) {                                  // uniform
#if CKPT
                if (t % K == 0 && live) {
                    uint c = pc.c0 + t / K;
                    [[unroll]] for (uint k = 0; k < NPL; ++k) {
                        uint n = lane + k * LN;
                        if (n < pc.N) ck[pc.o_ck + (row * pc.NC + c) * pc.N + n] = st[k];
                    }
                }
#endif
#if !MAMBA1
                float a = exp(dv[j] * Ah);
#endif
#if SUMMARY && !MAMBA1
                dec *= a;
#endif
#if WANT_Y
                acc[j] = 0.0;
#endif
                [[unroll]] for (uint k = 0; k < NPL; ++k) {
                    if (lane + k * LN < pc.N) {   // slots past N stay 0 (no 0 * inf)
#if MAMBA1
                        float a = exp(dv[j] * Ar[k]);
#endif
                        st[k] = st[k] * a + Bv[j][k] * uv[j];
#if SUMMARY && MAMBA1
                        dec[k] *= a;
#endif
#if WANT_Y
                        acc[j] += st[k] * Cv[j][k];
#endif
                    }
                }
#if SNAP
                uint snk = pc.T - 1u - t;                    // the state after token t: slot T - 1 - t
                if (live && snk < pc.KS) {
                    [[unroll]] for (uint k = 0; k < NPL; ++k) {
                        uint n = lane + k * LN;
                        if (n < pc.N) snap[pc.o_sn + (snk * pc.sst + row) * pc.N + n] = st[k];
                    }
                }
#endif
            }
        }
#if WANT_Y
        [[unroll]] for (uint j = 0; j < TB; ++j) {
            if (t0 + j < pc.T) {                             // uniform
                XF yv = row_sum(acc[j]);
                uint it = i * pc.T + t0 + j;
                if (live && lane == 0) y[pc.o_y + (it * pc.H + h) * pc.P + p] = yv;
            }
        }
#endif
    }

    [[unroll]] for (uint k = 0; k < NPL; ++k) {
        uint n = lane + k * LN;
        if (live && n < pc.N) {
            if (pc.scatter != 0u) {                      // uniform
                s_in[pc.o_s + src * pc.N + n] = st[k];
            } else {
                st_buf[pc.o_st + row * pc.N + n] = st[k];
            }
        }
    }
#if SUMMARY && MAMBA1
    [[unroll]] for (uint k = 0; k < NPL; ++k) {
        uint n = lane + k * LN;
        if (live && p == 0u && n < pc.N) ck[pc.o_ck + (i * pc.H + h) * pc.N + n] = dec[k];
    }
#elif SUMMARY
    if (live && p == 0u && lane == 0u) ck[pc.o_ck + i * pc.H + h] = dec;
#endif
}
