#version 450
// Second stage of the backward: fixed-order sums of the partials that ssm_scan_back.comp wrote.
//
// MODE 0 (per window): d_B, d_C (S, T, G, N) = sums over the H/G heads of each group and the
//   NPB channel blocks (h outer, block inner); d_dt (S, T, H) = sum over channel blocks. With
//   HS > 1 each d_B partial already holds the sum of HS heads of a group (the backward's HSUM,
//   the chunked DB's HPART): the partials are (S, T, H / HS, NPB, N) and the sum runs over the
//   group's H / G / HS. HSC: the same for d_C.
//   Bindings: 0 dBp (S,T,H/HS,NPB,N)  1 dCp (S,T,H/HSC,NPB,N)  2 ddtp (S,T,H,NPB)  3 dB  4 dC  5 ddt
//   With NODT, d_dt is left alone (its kernel wrote it whole: m1_scan_back.comp).
// MODE 1 (once per window of sequences, in order): d_A (H, KA) (+)= sum over the window's
//   sequences i (outer) and channels p (inner) of dAp (S, H, P, KA); ``acc`` = 0 for the first
//   window (assign), 1 after (add).   Bindings: 0 dAp (the window's rows)  3 dA
//   With SEQSUM (the invariant mode): each sequence's channels summed on their own (from 0), and
//   those sums added to d_A one sequence at a time (the first window's first taken as it is), so
//   d_A is the sequences' own d_A added in sequence order, whatever the windows.
// MODE 2 (the chunked backward's fold, before d_B and d_C): M o GU (S, T, H, N) -- T the chunks,
//   N = CL * CL -- summed over each group's heads, in head order, into the slot of the group's
//   first head, in place (that head's d_B / d_C then take the chunk's own tokens once for the
//   group).   Bindings: 0 mgu
// One invocation per output element; no atomics. Push constants: PC (ssm_vk/specs.py RED_PUSH).

#extension GL_EXT_control_flow_attributes : enable
layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;

#if MODE == 2
layout(std430, binding = 0) buffer B0 { float dBp[]; };
#else
layout(std430, binding = 0) readonly buffer B0 { float dBp[]; };
#endif
layout(std430, binding = 1) readonly buffer B1 { float dCp[]; };
layout(std430, binding = 2) readonly buffer B2 { float ddtp[]; };
layout(std430, binding = 3) buffer B3 { float dB[]; };
layout(std430, binding = 4) writeonly buffer B4 { float dC[]; };
layout(std430, binding = 5) writeonly buffer B5 { float ddt[]; };

layout(push_constant) uniform PC {
    uint S, T, H, P, N, G, NPB, KA;
    uint gx;
    uint o_0, o_3, o_4, o_5;     // element offsets of bindings 0, 3, 4, 5 (1, 2 are scratch at 0)
    uint acc;                    // MODE 1: add to d_A instead of assigning
    uint HS, HSC;                // MODE 0: heads per d_B, d_C partial (1, the backward's HB, HPART)
} pc;

#if MODE == 0
float part(uint which, uint i) { return which == 0u ? dBp[i] : dCp[i]; }

// The sum over a group's partials (h, b) in order, hs heads per partial (d_B: which 0, d_C: 1).
// RU terms are loaded together before they are added: the same sum, with the loads' latencies
// overlapped (a few thousand outputs of 192 terms each were latency-bound).
float group_sum(uint which, uint it, uint gg, uint n, uint hs) {
    uint qpg = pc.H / pc.G / hs;                 // partials per group
    uint nq = qpg * pc.NPB;
    uint base = pc.o_0 + (it * (pc.H / hs) + gg * qpg) * pc.NPB * pc.N + n;   // (h, b) = (0, 0)
    const uint RU = 8;
    float s = 0.0;
    uint k0 = 0;
    for (; k0 + RU <= nq; k0 += RU) {
        float v[RU];
        [[unroll]] for (uint u = 0; u < RU; ++u) v[u] = part(which, base + (k0 + u) * pc.N);
        [[unroll]] for (uint u = 0; u < RU; ++u) s += v[u];
    }
    for (; k0 < nq; ++k0) s += part(which, base + k0 * pc.N);
    return s;
}
#endif

void main() {
    uint e = (gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x) * WG + gl_LocalInvocationIndex;
#if MODE == 0
    uint n_bc = pc.S * pc.T * pc.G * pc.N;
    if (e < n_bc) {
        uint n = e % pc.N;
        uint itg = e / pc.N;
        uint gg = itg % pc.G;
        uint it = itg / pc.G;
        float sB = group_sum(0u, it, gg, n, pc.HS);
        float sC = group_sum(1u, it, gg, n, pc.HSC);
        dB[pc.o_3 + e] = sB;
        dC[pc.o_4 + e] = sC;
    }
#ifndef NODT
    uint n_dt = pc.S * pc.T * pc.H;
    if (e < n_dt) {
        float s = 0.0;
        for (uint b = 0; b < pc.NPB; ++b) s += ddtp[e * pc.NPB + b];
        ddt[pc.o_5 + e] = s;
    }
#endif
#elif MODE == 2
    if (e < pc.S * pc.T * pc.G * pc.N) {
        uint n = e % pc.N, itg = e / pc.N;
        uint hpg = pc.H / pc.G;
        uint base = pc.o_0 + ((itg / pc.G) * pc.H + (itg % pc.G) * hpg) * pc.N + n;   // the first head's
        float s = 0.0;
        const uint RU = 8;     // loads issued together, as above
        uint k0 = 0;
        for (; k0 + RU <= hpg; k0 += RU) {
            float v[RU];
            [[unroll]] for (uint u = 0; u < RU; ++u) v[u] = dBp[base + (k0 + u) * pc.N];
            [[unroll]] for (uint u = 0; u < RU; ++u) s += v[u];
        }
        for (; k0 < hpg; ++k0) s += dBp[base + k0 * pc.N];
        dBp[base] = s;
    }
#else
    uint n_a = pc.H * pc.KA;
    if (e < n_a) {
        uint k = e % pc.KA, h = e / pc.KA;
#ifdef SEQSUM
        float s = pc.acc != 0 ? dB[pc.o_3 + e] : 0.0;
        for (uint i = 0; i < pc.S; ++i) {
            float si = 0.0;
            for (uint p = 0; p < pc.P; ++p)
                si += dBp[pc.o_0 + ((i * pc.H + h) * pc.P + p) * pc.KA + k];
            s = (pc.acc == 0 && i == 0) ? si : s + si;
        }
        dB[pc.o_3 + e] = s;
#else
        float s = 0.0;
        for (uint i = 0; i < pc.S; ++i)
            for (uint p = 0; p < pc.P; ++p)
                s += dBp[pc.o_0 + ((i * pc.H + h) * pc.P + p) * pc.KA + k];
        dB[pc.o_3 + e] = pc.acc != 0 ? dB[pc.o_3 + e] + s : s;
#endif
    }
#endif
}
