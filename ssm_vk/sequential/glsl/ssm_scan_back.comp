#version 450
// Backward selective scan, token-sequential with chunked recompute. For each state row
// (i, h, p) held by LN lanes: walk the window's chunks of K tokens from last to first; in each,
// recompute the K states from the chunk's checkpoint into registers, then walk the tokens back
// carrying lam (= dL/dstate). Sums over channels p (d_B, d_C, d_dt) are reduced inside the
// workgroup in a fixed order and written as one partial per (i, t, h, channel block); a second
// kernel (ssm_scan_reduce.comp) sums the partials over heads of a group and channel blocks.
// No atomics: every output element has one writer and a fixed order of additions.
//
// Bindings (0-4 declared in common.glsl; float32; indices relative to the element offsets o_*
// of the bound window):
//   0 x    (S, T, H, P)        readonly          7 ck   (S, H, P, NC, N)  readonly checkpoints
//   1 dt   (S, T, H)           readonly          8 dx   (S, T, H, P)      written
//   2 A    (H, 1) or (H, N)    readonly          9 dBp  (S, T, H, NPB, N) written partials
//   3 B    (S, T, G, N)        readonly         10 dCp  (S, T, H, NPB, N) written partials
//   4 C    (S, T, G, N)        readonly         11 ddtp (S, T, H, NPB)    written partials
//   5 gy   (S, T, H, P)        readonly         12 dAp  (S, H, P, 1|N)    carried (read, summed on, written)
//   6 lam  (S, H, P, N)  in: dL/dstate after the window's last token; out: a_0 * lam_0 of
//                        the window (= d_s0 after the first window)
// Push constants: PC below (ssm_vk/kernels.py BWD_PUSH). Defines: common.glsl's, plus K, TBR
// (tokens per round of shared-memory reduction; K % TBR == 0), HSUM and BSUM:
//   HSUM 1: the d_B / d_C partials are summed over the workgroup's HB heads too (they must share
//        a group: (H / G) % HB == 0), so bindings 9 and 10 are (S, T, NHB, NPB, N);
//   BSUM 1: the first pass of the backward parallel over time (ssm_vk/record/time_chunks.py):
//        every "sequence" is a time chunk; lam starts from zero at its end and walks back over
//        its tokens (lam_t = g_y_t C_t + a_{t+1} lam_{t+1}); a_0 * lam_0 goes to binding 6, which
//        is all it writes: what the chunk adds to the adjoint it passes on (its decay is the
//        forward summary's). Reads only dt, A, C and g_y; TB tokens per load block.
//   SPREAD 1: each token's step (and its derivative) is computed by one lane of the row and read
//        by the others through subgroupShuffle -- the same bits, a K-th of the work (needs rows
//        inside subgroups: ROW_SUM 2 or 3; with BSUM, TB <= LN). The walk back also reuses the
//        decay factors of the recompute instead of taking exp again (so in every layout).
//   SNAP 1 (not with BSUM): binding 13 gsn, the gradient of ssm_scan's snapshots
//        (ssm_scan_back(g_snapshots=...)), and the push constants KS, o_gsn, sst: slot
//        T - 1 - t (below pc.KS) adds to the carry before token t, slot T (when T < pc.KS) to
//        a_0 * lam_0; slot k of window row r at o_gsn + (k * sst + r) * N. Without it the kernel
//        is the same SPIR-V as before snapshots existed.

#include "common.glsl"

#ifndef HSUM
#define HSUM 0
#endif
#ifndef BSUM
#define BSUM 0
#endif
#ifndef SPREAD
#define SPREAD 0
#endif
#ifndef SNAP
#define SNAP 0
#endif

layout(std430, binding = 5) readonly buffer Bgy { float gy[]; };
layout(std430, binding = 6) buffer Blam { float lam_buf[]; };
layout(std430, binding = 7) readonly buffer Bck { float ck[]; };
layout(std430, binding = 8) writeonly buffer Bdx { float dx[]; };
layout(std430, binding = 9) writeonly buffer BdB { float dBp[]; };
layout(std430, binding = 10) writeonly buffer BdC { float dCp[]; };
layout(std430, binding = 11) writeonly buffer Bddt { float ddtp[]; };
layout(std430, binding = 12) buffer BdA { float dAp[]; };
#if SNAP
layout(std430, binding = 13) readonly buffer Bgsn { float gsn[]; };
#endif

layout(push_constant) uniform PC {
    uint S, T, H, P, N, G;
    uint HB, PB, NHB, NPB, gx;
    uint NC, c0;
    uint o_x, o_dt, o_B, o_C, o_gy, o_lam, o_ck, o_dx, o_dA;
    uint o_A;
#if SNAP
    uint KS, o_gsn, sst;     // slots of g_snapshots this window adds, their offset, the slot stride in rows
#endif
} pc;

const uint NMAX = LN * NPL;                 // n slots per row in shared memory
const uint RED = 2 * ROWS * NMAX + ROWS;    // one token: [dC contributions | dB contributions | ddt]
shared float red[TBR * RED];                // TBR tokens per round of barriers

#if BSUM
void main() {
    Row r = row_of(pc.gx, pc.S, pc.H, pc.P, pc.G, pc.HB, pc.PB, pc.NHB, pc.NPB);
    uint i = r.i, h = r.h, p = r.p, g = r.g, lane = r.lane, row = r.row;
    bool live = r.live;
    float lam_c[NPL];
#if MAMBA1
    float Ar[NPL];
#else
    float Ah = live ? A[pc.o_A + h] : 0.0;
#endif
    [[unroll]] for (uint k = 0; k < NPL; ++k) {
        lam_c[k] = 0.0;
#if MAMBA1
        uint n = lane + k * LN;
        Ar[k] = live && n < pc.N ? A[pc.o_A + h * pc.N + n] : 0.0;
#endif
    }
    // Blocks of TB tokens from the end: the block's loads first (they do not depend on lam),
    // then its updates, last token first.
    for (uint e = pc.T; e > 0; e -= min(e, TB)) {
        float dv[TB], gv[TB];
        float Cv[TB][NPL];
#if SPREAD
        uint jl = lane % TB;                             // this lane's token of the block
        bool on_jl = live && jl < e;
        float sp_jl = on_jl ? softplus(dt[pc.o_dt + (i * pc.T + (on_jl ? e - 1 - jl : 0)) * pc.H + h]) : 0.0;
        uint first = gl_SubgroupInvocationID - lane;
#endif
        [[unroll]] for (uint j = 0; j < TB; ++j) {
            bool on_t = live && j < e;
            uint it = i * pc.T + (on_t ? e - 1 - j : 0);
#if SPREAD
            float spj = subgroupShuffle(sp_jl, first + j);
            dv[j] = on_t ? spj : 0.0;
#else
            dv[j] = on_t ? softplus(dt[pc.o_dt + it * pc.H + h]) : 0.0;
#endif
            gv[j] = on_t ? gy[pc.o_gy + (it * pc.H + h) * pc.P + p] : 0.0;
            uint bc = (it * pc.G + g) * pc.N;
            [[unroll]] for (uint k = 0; k < NPL; ++k) {
                uint n = lane + k * LN;
                Cv[j][k] = on_t && n < pc.N ? Cm[pc.o_C + bc + n] : 0.0;
            }
        }
        [[unroll]] for (uint j = 0; j < TB; ++j) {
            if (j < e) {                                     // uniform
#if !MAMBA1
                float a = exp(dv[j] * Ah);
#endif
                [[unroll]] for (uint k = 0; k < NPL; ++k) {
#if MAMBA1
                    float a = exp(dv[j] * Ar[k]);
#endif
                    lam_c[k] = a * (lam_c[k] + gv[j] * Cv[j][k]);
                }
            }
        }
    }
    [[unroll]] for (uint k = 0; k < NPL; ++k) {
        uint n = lane + k * LN;
        if (live && n < pc.N) lam_buf[pc.o_lam + row * pc.N + n] = lam_c[k];
    }
}
#else
void main() {
    Row r = row_of(pc.gx, pc.S, pc.H, pc.P, pc.G, pc.HB, pc.PB, pc.NHB, pc.NPB);
    uint i = r.i, h = r.h, p = r.p, g = r.g, lane = r.lane, row = r.row;
    bool live = r.live;
    uint slot = r.slot, hbk = r.hbk, pbk = r.pbk, tid = gl_LocalInvocationIndex;

    XF lam_c[NPL];                           // a_{t+1} * lam_{t+1}, carried backwards
#if MAMBA1
    float Ar[NPL];
    XF dA_acc[NPL];
#else
    float Ah = live ? A[pc.o_A + h] : 0.0;
    XF dA_acc = live ? dAp[pc.o_dA + row] : 0.0;   // (the windows after this one's, walked first)
#endif
    [[unroll]] for (uint k = 0; k < NPL; ++k) {
        uint n = lane + k * LN;
        bool on = live && n < pc.N;
        lam_c[k] = on ? lam_buf[pc.o_lam + row * pc.N + n] : 0.0;
#if MAMBA1
        Ar[k] = on ? A[pc.o_A + h * pc.N + n] : 0.0;
        dA_acc[k] = on ? dAp[pc.o_dA + row * pc.N + n] : 0.0;
#endif
    }

    uint n_chunks = (pc.T + K - 1) / K;
    for (uint cc = n_chunks; cc > 0; --cc) {
        uint c = cc - 1;
        uint t0 = c * K;
        uint nt = min(K, pc.T - t0);

#if SPREAD
        // The chunk's steps and their derivatives, one per token: lane j % LN of the row computes
        // token j's (in slot j / LN), the row's lanes read them by subgroupShuffle (the same bits).
        const uint KM = (K + LN - 1) / LN;
        float spv[KM], grv[KM];
        uint first = gl_SubgroupInvocationID - lane;      // the row's first lane in the subgroup
        [[unroll]] for (uint m = 0; m < KM; ++m) {
            uint j = lane + m * LN;
            bool on = live && j < nt;
            float z = on ? dt[pc.o_dt + (i * pc.T + t0 + min(j, nt - 1)) * pc.H + h] : 0.0;
            spv[m] = on ? softplus(z) : 0.0;
            grv[m] = on ? softplus_grad(z) : 0.0;
        }
#endif
        // Recompute the chunk's states from its checkpoint; keep each token's decay factors.
        float s0[NPL];
        XF hist[K][NPL];
#if MAMBA1
        float ah[K][NPL];
#else
        float ah[K];
#endif
        [[unroll]] for (uint k = 0; k < NPL; ++k) {
            uint n = lane + k * LN;
            s0[k] = (live && n < pc.N) ? ck[pc.o_ck + (row * pc.NC + pc.c0 + c) * pc.N + n] : 0.0;
        }
        [[unroll]] for (uint j = 0; j < K; ++j) {
            if (j < nt) {
                uint it = i * pc.T + t0 + j;
                XF d = 0.0, u = 0.0;
#if SPREAD
                d = subgroupShuffle(spv[j / LN], first + j % LN);
                if (live) u = x[pc.o_x + (it * pc.H + h) * pc.P + p] * d;
#else
                if (live) {
                    d = softplus(dt[pc.o_dt + it * pc.H + h]);
                    u = x[pc.o_x + (it * pc.H + h) * pc.P + p] * d;
                }
#endif
#if !MAMBA1
                float a = exp(d * Ah);
                ah[j] = a;
#endif
                uint bc = (it * pc.G + g) * pc.N;
                [[unroll]] for (uint k = 0; k < NPL; ++k) {
                    uint n = lane + k * LN;
                    float prev = j == 0 ? s0[k] : hist[j == 0 ? 0 : j - 1][k];
                    float Bn = (live && n < pc.N) ? Bm[pc.o_B + bc + n] : 0.0;
#if MAMBA1
                    float a = exp(d * Ar[k]);
                    ah[j][k] = a;
#endif
                    hist[j][k] = prev * a + Bn * u;
                }
            }
        }

        // Walk the chunk's tokens back, TBR tokens per round: each token leaves its channels'
        // contributions in its own slice of shared memory; one pair of barriers per round.
        [[unroll]] for (uint rr = K / TBR; rr > 0; --rr) {
            if ((rr - 1) * TBR < nt) {                       // uniform
                [[unroll]] for (uint q = TBR; q > 0; --q) {
                    uint j = (rr - 1) * TBR + (q - 1);
                    uint sl = (q - 1) * RED;
                    if (j < nt) {                            // uniform
                        uint it = i * pc.T + t0 + j;
                        float dtv = 0.0, xv = 0.0, gyv = 0.0;
                        if (live) {
#if !SPREAD
                            dtv = dt[pc.o_dt + it * pc.H + h];
#endif
                            xv = x[pc.o_x + (it * pc.H + h) * pc.P + p];
                            gyv = gy[pc.o_gy + (it * pc.H + h) * pc.P + p];
                        }
#if SPREAD
                        float d = subgroupShuffle(spv[j / LN], first + j % LN);
                        float dgrad = subgroupShuffle(grv[j / LN], first + j % LN);
#else
                        float d = live ? softplus(dtv) : 0.0;
#endif
                        XF u = xv * d;
#if !MAMBA1
                        float a = ah[j];
#endif
#if SNAP
                        uint snk = pc.T - 1u - (t0 + j);     // the state after this token: slot T - 1 - t
                        if (snk < pc.KS) {                   // uniform
                            [[unroll]] for (uint k = 0; k < NPL; ++k) {
                                uint n = lane + k * LN;
                                if (live && n < pc.N) lam_c[k] += gsn[pc.o_gsn + (snk * pc.sst + row) * pc.N + n];
                            }
                        }
#endif
                        uint bc = (it * pc.G + g) * pc.N;
                        XF gam = 0.0, qs = 0.0;
                        [[unroll]] for (uint k = 0; k < NPL; ++k) {
                            uint n = lane + k * LN;
                            bool on = live && n < pc.N;
                            float Bn = on ? Bm[pc.o_B + bc + n] : 0.0;
                            float Cn = on ? Cm[pc.o_C + bc + n] : 0.0;
                            float prev = j == 0 ? s0[k] : hist[j == 0 ? 0 : j - 1][k];
#if MAMBA1
                            float a = ah[j][k];
#endif
                            XF lam = lam_c[k] + gyv * Cn;
                            red[sl + slot * NMAX + n] = on ? gyv * hist[j][k] : 0.0;
                            red[sl + ROWS * NMAX + slot * NMAX + n] = on ? lam * u : 0.0;
                            gam += on ? lam * Bn : 0.0;   // an idle lane's lam is inf * 0 = nan when g_y is inf
                            XF qv = on ? lam * prev * a : 0.0;
#if MAMBA1
                            qs += qv * Ar[k];
                            dA_acc[k] += qv * d;
#else
                            qs += qv;
#endif
                            lam_c[k] = on ? a * lam : 0.0;
                        }
                        XF gamma = row_sum(gam);
                        XF qsum = row_sum(qs);
#if MAMBA1
                        XF dd = gamma * xv + qsum;
#else
                        XF dd = gamma * xv + qsum * Ah;
                        dA_acc += qsum * d;
#endif
                        if (lane == 0) {
                            if (live) dx[pc.o_dx + (it * pc.H + h) * pc.P + p] = gamma * d;
#if SPREAD
                            red[sl + 2 * ROWS * NMAX + slot] = live ? dd * dgrad : 0.0;
#else
                            red[sl + 2 * ROWS * NMAX + slot] = live ? dd * softplus_grad(dtv) : 0.0;
#endif
                        }
                    }
                }
                barrier();
                // Sum each token's contributions over this workgroup's channels, head by head,
                // channel by channel in order.
#if HSUM
                // Every head of the workgroup in one group: one d_C and one d_B partial per token and
                // block. The round's tokens x (d_C, d_B per n, d_dt per head) spread over the threads.
                if (i < pc.S) {
                    uint per = 2 * pc.N + pc.HB;
                    for (uint o = tid; o < TBR * per; o += WG) {
                        uint q1 = o / per, r2 = o % per;
                        uint j = (rr - 1) * TBR + q1;
                        if (j < nt) {
                            uint sl = q1 * RED;
                            uint it = i * pc.T + t0 + j;
                            if (r2 < 2 * pc.N) {
                                uint kind = r2 / pc.N, n = r2 % pc.N;        // 0: d_C, 1: d_B
                                float sum = 0.0;
                                for (uint hl2 = 0; hl2 < pc.HB; ++hl2)
                                    for (uint c2 = 0; c2 < pc.PB; ++c2)
                                        sum += red[sl + kind * ROWS * NMAX + (hl2 * pc.PB + c2) * NMAX + n];
                                uint o2 = ((it * pc.NHB + hbk) * pc.NPB + pbk) * pc.N + n;
                                if (kind == 0) {
                                    dCp[o2] = sum;
                                } else {
                                    dBp[o2] = sum;
                                }
                            } else {
                                uint hl2 = r2 - 2 * pc.N;
                                uint h2 = hbk * pc.HB + hl2;
                                if (h2 < pc.H) {
                                    float sum = 0.0;
                                    for (uint c2 = 0; c2 < pc.PB; ++c2)
                                        sum += red[sl + 2 * ROWS * NMAX + hl2 * pc.PB + c2];
                                    ddtp[(it * pc.H + h2) * pc.NPB + pbk] = sum;
                                }
                            }
                        }
                    }
                }
#else
                if (i < pc.S) {
                    [[unroll]] for (uint q = TBR; q > 0; --q) {
                        uint j = (rr - 1) * TBR + (q - 1);
                        uint sl = (q - 1) * RED;
                        if (j < nt) {
                            uint it = i * pc.T + t0 + j;
                            for (uint o = tid; o < pc.HB * pc.N; o += WG) {
                                uint hl2 = o / pc.N, n = o % pc.N;
                                uint h2 = hbk * pc.HB + hl2;
                                if (h2 < pc.H) {
                                    float sC = 0.0, sB = 0.0;
                                    for (uint c2 = 0; c2 < pc.PB; ++c2) {
                                        sC += red[sl + (hl2 * pc.PB + c2) * NMAX + n];
                                        sB += red[sl + ROWS * NMAX + (hl2 * pc.PB + c2) * NMAX + n];
                                    }
                                    uint o2 = ((it * pc.H + h2) * pc.NPB + pbk) * pc.N + n;
                                    dCp[o2] = sC;
                                    dBp[o2] = sB;
                                }
                            }
                            for (uint o = tid; o < pc.HB; o += WG) {
                                uint h2 = hbk * pc.HB + o;
                                if (h2 < pc.H) {
                                    float s = 0.0;
                                    for (uint c2 = 0; c2 < pc.PB; ++c2)
                                        s += red[sl + 2 * ROWS * NMAX + o * pc.PB + c2];
                                    ddtp[(it * pc.H + h2) * pc.NPB + pbk] = s;
                                }
                            }
                        }
                    }
                }
#endif
                barrier();
            }
        }
    }

#if SNAP
    if (pc.T < pc.KS) {                                  // uniform: slot T, the start state
        [[unroll]] for (uint k = 0; k < NPL; ++k) {
            uint n = lane + k * LN;
            if (live && n < pc.N) lam_c[k] += gsn[pc.o_gsn + (pc.T * pc.sst + row) * pc.N + n];
        }
    }
#endif
    [[unroll]] for (uint k = 0; k < NPL; ++k) {
        uint n = lane + k * LN;
        if (live && n < pc.N) {
            lam_buf[pc.o_lam + row * pc.N + n] = lam_c[k];
#if MAMBA1
            dAp[pc.o_dA + row * pc.N + n] = dA_acc[k];
#endif
        }
    }
#if !MAMBA1
    if (live && lane == 0) dAp[pc.o_dA + row] = dA_acc;
#endif
}
#endif
