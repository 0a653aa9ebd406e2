#version 450
// Mamba-1 forward with time spread over a workgroup's threads (layout: m1_common.glsl). Three modes:
//
// MODE 0, the summary: each thread walks its slice's tokens from a zero state, keeping the
//   slice's part of the state z[n] (what the slice adds) and the sum D of its steps (its decay is
//   exp(D A[h, n])). The workgroup then composes its slices in order for each (channel, n):
//       pre_v = acc;   acc = exp(D_v A) acc + z_v        (acc = 0 before slice 0)
//   and writes each slice's pre_v and the sum of the D before it (agg) for the final pass; with
//   NCH > 1 also the chunk's contribution acc and decay (the product of the exp(D_v A)) for
//   ssm_scan_carry.comp. With ADJ (the backward's summary over time chunks) it also keeps the
//   slice's part of the adjoint, w[n] = sum_t (prod_{t' <= t} a_t'[n]) g_y_t C_t[n], composes
//   those in reverse slice order into the chunk's adjoint contribution, and writes no agg.
// MODE 1, the final pass: each thread starts from its slice's state, exp(pre_D A) s_c + pre_z
//   (s_c: the chunk's initial state -- the carry's, or with NCH = 1 the sequence's), walks its
//   tokens and writes y; with pc.final_state (NCH = 1), the last slice writes the final state.
// MODE 2, one pass (NCH = 1: a workgroup holds its channels' whole sequences): MODE 0's walk and
//   composition, then after a barrier MODE 1's walk from the slices' states in shared memory (no
//   agg): one dispatch instead of two, with MODE 0's and MODE 1's arithmetic.
//
// Bindings (0-4 in m1_common.glsl; float32 unless noted; o_* element offsets of the bound windows):
//   5 gy   (S, T, H)               readonly (ADJ); without ADJ, with pc.keep_step: the steps
//          softplus(dt) (S, T, H), written by the first walk over the tokens (MODE 0, MODE 2's
//          first) and read by the second (MODE 1, MODE 2's second) instead of dt (the accurate
//          form's step costs as much as a token's state updates here)
//   6 y    (S, T, H)               written (MODE 1 and 2)
//   7 init (S, H, N) or (S*NCH, H, N)   MODE 1 and 2: the initial states -- the sequences' (NCH = 1,
//          unless gather), overwritten with the final states when final_state and not scatter; or
//          every chunk's (NCH > 1, the carry's output)
//   8 agg  (S*NCH*NRB, NS, N + 1, CW)   per slice: pre_z[n], then pre_D (written by MODE 0, read by 1;
//          unused by MODE 2)
//   9 cb   (S*NCH, H, N)           MODE 0, NCH > 1: the chunk's contribution
//  10 cdec (S*NCH, H, N)           MODE 0, NCH > 1: the chunk's decay
//  11 cbl  (S*NCH, H, N)           MODE 0 with ADJ: the chunk's adjoint contribution
//  12 s    (R, H, N)               the state cache: initial states read from s[ids] when gather;
//                                  final states written there when scatter (MODE 1 and 2, NCH = 1)
//  13 ids  (S) uint                readonly, when gather
//  14 flag (uint)                  bit 0: a value that is not finite; bit 1: other subgroups than planned
// Push constants: PC below (ssm_vk/kernels.py M1_PUSH; TI: tokens per slice). Defines:
// m1_common.glsl's, MODE, ADJ.

#include "m1_common.glsl"

#ifndef ADJ
#define ADJ 0
#endif

#if ADJ
layout(std430, binding = 5) readonly buffer Bgy { float gy[]; };
#else
layout(std430, binding = 5) buffer Bstep { float dstep[]; };
#endif
layout(std430, binding = 6) writeonly buffer By { float y[]; };
layout(std430, binding = 7) buffer Binit { float init_st[]; };
layout(std430, binding = 8) buffer Bagg { float agg[]; };
layout(std430, binding = 9) writeonly buffer Bcb { float cb[]; };
layout(std430, binding = 10) writeonly buffer Bcdec { float cdec[]; };
layout(std430, binding = 11) writeonly buffer Bcbl { float cbl[]; };
layout(std430, binding = 12) buffer Bs { float s_in[]; };
layout(std430, binding = 13) readonly buffer Bids { uint ids[]; };
layout(std430, binding = 14) buffer Bflag { uint flag[]; };

layout(push_constant) uniform PC {
    uint S, T, H, G, NCH, NRB, gx, TI;
    uint o_x, o_dt, o_A, o_B, o_C, o_gy, o_y, o_init;
    uint gather, o_s, o_ids, scatter, final_state, keep_step;
} pc;

#if MODE != 1
shared float zs[NS * ND * CW];      // [slice][n][lane]
#if ADJ
shared float wsh[NS * ND * CW];
#elif SPS > 1
shared float Dp[NS * CW];           // [slice][lane]: the sum of the steps before the slice
#endif
shared float Ds[NS * CW];           // [slice][lane]
#endif

// Tokens per block of loads (TB, a define: default 8): a block's x and dt (this thread's) and its B
// and C (spread over the slice's lanes: lane l holds values k * CW + l of the block's TB x N,
// read by the slice's lanes through subgroupShuffle) are loaded together, so their latencies
// overlap; the loads of B and C are coalesced instead of a broadcast load per value and lane.
// Every lane of a subgroup runs the blocks and tokens of the subgroup's first slice (r.ntu), so
// the shuffles are uniform; a token past a lane's own slice (a slice at the end of T) loads
// dt = x = B = C = 0, a step that leaves the state as it is (exp(0 A) = 1), and writes no y.
#ifndef TB
#define TB 8
#endif
const uint KB = (TB * ND + CW - 1) / CW;

// The tokens of block j0 in a slice of nt tokens (0 past them: a slice shorter than its subgroup's
// first, SPS > 1).
uint block_tokens(uint nt, uint j0) {
    return SPS == 1 ? min(TB, nt - j0) : (nt > j0 ? min(TB, nt - j0) : 0u);
}

// The first token of block j0 of the slice, kept within T for the loads of a slice that ends
// before its subgroup's first (SPS > 1: the loads of its tokens past its end are not made).
uint block_t0(Slot r, uint j0) {
    return SPS == 1 ? r.t0 + j0 : min(r.t0 + j0, pc.T - 1u);
}

// The lane that holds value e of the slice's spread block (value k * CW + l on lane l of the slice).
uint src_lane(uint e) {
    return SPS == 1 ? e % CW : (gl_SubgroupInvocationID / CW) * CW + e % CW;
}

// ``again``: the second walk over these tokens (MODE 1, MODE 2's second), which reads the steps
// the first kept (pc.keep_step) instead of computing them.
void load_tokens(Slot r, uint j0, uint nb, bool again, out float dv[TB], out float uv[TB]) {
    uint bt0 = block_t0(r, j0);
    [[unroll]] for (uint j = 0; j < TB; ++j) {
        bool on = j < nb;
        uint t = (r.i * pc.T + bt0 + (on ? j : 0u)) * pc.H + r.h;
        float xv = on ? x[pc.o_x + t] : 0.0;
#if ADJ
        dv[j] = on ? softplus(dt[pc.o_dt + t]) : 0.0;
#else
        if (again && pc.keep_step != 0u) {             // uniform
            dv[j] = on ? dstep[t] : 0.0;
        } else {
            dv[j] = on ? softplus(dt[pc.o_dt + t]) : 0.0;
            if (!again && on && pc.keep_step != 0u) dstep[t] = dv[j];
        }
#endif
        uv[j] = xv * dv[j];
    }
}

void load_spread(Slot r, uint j0, uint nb, uint base, out float v[KB], bool is_c) {
    uint bt0 = block_t0(r, j0);
    [[unroll]] for (uint k = 0; k < KB; ++k) {
        uint e = k * CW + r.lane;
        uint tj = e / ND, n = e % ND;
        bool on = e < TB * ND && tj < nb;
        uint o = ((r.i * pc.T + bt0 + (on ? tj : 0u)) * pc.G + r.g) * ND + n;
        v[k] = on ? (is_c ? Cm[base + o] : Bm[base + o]) : 0.0;
    }
}

#if ADJ
void load_block(Slot r, uint j0, uint nb, out float dv[TB], out float uv[TB], out float gv[TB], out float vb[KB],
                out float vc[KB]) {
    load_tokens(r, j0, nb, false, dv, uv);
    uint bt0 = block_t0(r, j0);
    [[unroll]] for (uint j = 0; j < TB; ++j) {
        bool on = j < nb;
        gv[j] = on ? gy[pc.o_gy + (r.i * pc.T + bt0 + (on ? j : 0u)) * pc.H + r.h] : 0.0;
    }
    load_spread(r, j0, nb, pc.o_B, vb, false);
    load_spread(r, j0, nb, pc.o_C, vc, true);
}
#else
void load_b(Slot r, uint j0, uint nb, out float dv[TB], out float uv[TB], out float vb[KB]) {
    load_tokens(r, j0, nb, false, dv, uv);
    load_spread(r, j0, nb, pc.o_B, vb, false);
}

void load_bc(Slot r, uint j0, uint nb, out float dv[TB], out float uv[TB], out float vb[KB], out float vc[KB]) {
    load_tokens(r, j0, nb, true, dv, uv);
    load_spread(r, j0, nb, pc.o_B, vb, false);
    load_spread(r, j0, nb, pc.o_C, vc, true);
}
#endif

void main() {
    if (!subgroups_as_planned()) {
        if (gl_LocalInvocationIndex == 0) atomicOr(flag[0], 2u);
        return;
    }
    Slot r;
    if (!slot_of(r, pc.gx, pc.S, pc.T, pc.H, pc.G, pc.NCH, pc.NRB, pc.TI)) return;   // the whole workgroup
    uint wgid = (r.i * pc.NCH + r.c) * pc.NRB + r.rb;
    float Ar[ND];
    [[unroll]] for (uint n = 0; n < ND; ++n) Ar[n] = A[pc.o_A + r.h * ND + n];
    bool ok = true;

#if MODE != 1
    float z[ND];
#if ADJ
    float w[ND], P[ND];
#endif
    [[unroll]] for (uint n = 0; n < ND; ++n) {
        z[n] = 0.0;
#if ADJ
        w[n] = 0.0;
        P[n] = 1.0;
#endif
    }
    float D = 0.0;
    for (uint j0 = 0; j0 < r.ntu; j0 += TB) {         // uniform in a subgroup
        uint nb = block_tokens(r.nt, j0), nbu = SPS == 1 ? nb : min(TB, r.ntu - j0);
        float dv[TB], uv[TB], vb[KB];
#if ADJ
        float gv[TB], vc[KB];
        load_block(r, j0, nb, dv, uv, gv, vb, vc);
#else
        load_b(r, j0, nb, dv, uv, vb);
#endif
        [[unroll]] for (uint j = 0; j < TB; ++j) {
            if (j < nbu) {                             // uniform in a subgroup
                D += dv[j];
                [[unroll]] for (uint n = 0; n < ND; ++n) {
                    const uint e = j * ND + n;
                    float a = exp(dv[j] * Ar[n]);
                    z[n] = z[n] * a + subgroupShuffle(vb[e / CW], src_lane(e)) * uv[j];
#if ADJ
                    P[n] *= a;
                    w[n] += P[n] * (gv[j] * subgroupShuffle(vc[e / CW], src_lane(e)));
#endif
                }
            }
        }
    }
    uint me = r.slice * CW + r.lane;
    [[unroll]] for (uint n = 0; n < ND; ++n) {
        zs[(r.slice * ND + n) * CW + r.lane] = z[n];
#if ADJ
        wsh[(r.slice * ND + n) * CW + r.lane] = w[n];
#endif
    }
    Ds[me] = D;
    barrier();
    // Compose the slices of each (channel, n) in order; each thread takes some of the CW * ND chains.
    for (uint q = gl_LocalInvocationIndex; q < CW * ND; q += WG) {
        uint lane = q % CW, n = q / CW;
        uint h = r.rb * CW + lane;
        float An = A[pc.o_A + h * ND + n];
        float acc = 0.0, dec = 1.0, Dsum = 0.0;
        for (uint v = 0; v < NS; ++v) {
            float Dv = Ds[v * CW + lane];
            float e = exp(Dv * An);
            uint k = (v * ND + n) * CW + lane;
            float zv = zs[k];
            zs[k] = acc;                               // the state before slice v, from zero
#if !ADJ && SPS > 1
            if (n == 0u) Dp[v * CW + lane] = Dsum;     // the steps before slice v
#endif
            Dsum += Dv;
            acc = e * acc + zv;
            dec *= e;
        }
        if (pc.NCH > 1u) {
            uint o = ((r.i * pc.NCH + r.c) * pc.H + h) * ND + n;
            cb[o] = acc;
            cdec[o] = dec;
#if ADJ
            float accl = 0.0;
            for (uint v = NS; v > 0; --v) {
                float e = exp(Ds[(v - 1) * CW + lane] * An);
                accl = e * accl + wsh[((v - 1) * ND + n) * CW + lane];
            }
            cbl[o] = accl;
#endif
        }
    }
#if !ADJ
    barrier();
#if SPS > 1
    float preD = Dp[me];
#else
    float preD = 0.0;
    for (uint v = 0; v < r.slice; ++v) preD += Ds[v * CW + r.lane];
#endif
#endif
#if MODE == 0 && !ADJ
    uint base = (wgid * NS + r.slice) * (ND + 1);
    [[unroll]] for (uint n = 0; n < ND; ++n) agg[(base + n) * CW + r.lane] = zs[(r.slice * ND + n) * CW + r.lane];
    agg[(base + ND) * CW + r.lane] = preD;
#endif
#endif

#if MODE != 0   // the final walk
    float st[ND];
    uint row = r.i * pc.H + r.h;
#if MODE == 1
    uint base = (wgid * NS + r.slice) * (ND + 1);
    float preD = agg[(base + ND) * CW + r.lane];
#define PRE_Z(n) agg[(base + (n)) * CW + r.lane]
#else
#define PRE_Z(n) zs[(r.slice * ND + (n)) * CW + r.lane]
#endif
    uint src = pc.NCH > 1u ? (r.i * pc.NCH + r.c) * pc.H + r.h : row;
    uint srow = pc.gather != 0u ? ids[pc.o_ids + r.i] * pc.H + r.h : 0u;
    [[unroll]] for (uint n = 0; n < ND; ++n) {
        float s0 = (pc.gather != 0u && pc.NCH == 1u) ? s_in[pc.o_s + srow * ND + n]
                                                     : init_st[pc.o_init + src * ND + n];
        st[n] = exp(preD * Ar[n]) * s0 + PRE_Z(n);
        ok = ok && finite(st[n]);
    }
    // Every read of the chunk's initial state is done before the last slice writes the final
    // state over it (init or s[ids]: the same rows with NCH = 1).
    barrier();
    for (uint j0 = 0; j0 < r.ntu; j0 += TB) {         // uniform in a subgroup
        uint nb = block_tokens(r.nt, j0), nbu = SPS == 1 ? nb : min(TB, r.ntu - j0);
        float dv[TB], uv[TB], vb[KB], vc[KB];
        load_bc(r, j0, nb, dv, uv, vb, vc);
        [[unroll]] for (uint j = 0; j < TB; ++j) {
            if (j < nbu) {                             // uniform in a subgroup
                float acc = 0.0;
                [[unroll]] for (uint n = 0; n < ND; ++n) {
                    const uint e = j * ND + n;
                    float a = exp(dv[j] * Ar[n]);
                    st[n] = st[n] * a + subgroupShuffle(vb[e / CW], src_lane(e)) * uv[j];
                    acc += st[n] * subgroupShuffle(vc[e / CW], src_lane(e));
                }
                if (SPS == 1 || j < nb) {
                    y[pc.o_y + (r.i * pc.T + r.t0 + j0 + j) * pc.H + r.h] = acc;
                    ok = ok && finite(acc);
                }
            }
        }
    }
    if (pc.final_state != 0u && r.slice == NS - 1u) {
        [[unroll]] for (uint n = 0; n < ND; ++n) {
            if (pc.scatter != 0u) {
                s_in[pc.o_s + srow * ND + n] = st[n];
            } else {
                init_st[pc.o_init + row * ND + n] = st[n];
            }
            ok = ok && finite(st[n]);
        }
    }
#endif
    if (!ok) atomicOr(flag[0], 1u);
}
