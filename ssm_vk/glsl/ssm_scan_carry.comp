#version 450
// The middle pass of the forward parallel over time. Each sequence's T tokens are cut into NCH
// chunks of T / NCH tokens, which the first and last passes (ssm_scan.comp) treat as sequences
// i * NCH + c of their own. The first pass (SUMMARY) started every chunk from zero and left what
// the chunk adds to the state (b) and the decay it applies to the state it receives (dec). Here,
// for every state element (i, h, p, n), chunk after chunk:
//     init_c = s;   s = dec_c * s + b_c          (s starts as the sequence's initial state)
// init_c overwrites b_c (the last pass starts chunk c from it); the last s is the sequence's
// final state. Any b_c, dec_c or s that is not finite raises the flag: the host then recomputes
// the call token by token, so that inf and nan follow the sequential rules of docs/SPEC.md.
//
// Bindings (float32 unless noted; element offsets o_* as the host bound them):
//   0 dec (S * NCH, H, KA)      readonly (KA = N for Mamba-1, else 1)
//   1 b   (S * NCH, H, P, N)    read, then overwritten with init
//   2 st  (S, H, P, N)          the initial states (unless gather), overwritten with the final
//   3 s   (R, H, P, N)          readonly: the state cache, when gather
//   4 ids (S) uint              readonly: its rows, when gather
//   5 flag (uint)               set to 1 on a value that is not finite
// With REVERSE the same runs backwards in time, for the backward parallel over time: b holds
// each chunk's adjoint contribution (ssm_scan_back.comp's BSUM), st the adjoint after the last
// token (g_states) and then d_s0; for c = NCH - 1 down to 0: init_c = s; s = dec_c * s + b_c.
// Push constants: see PC (the order of ssm_vk/kernels.py CARRY_PUSH). Defines: WG, MAMBA1,
// REVERSE (0/1).

#extension GL_EXT_control_flow_attributes : enable

#ifndef REVERSE
#define REVERSE 0
#endif
const uint CU = 8;   // chunks per block of loads

layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;

layout(std430, binding = 0) readonly buffer Bdec { float dec[]; };
layout(std430, binding = 1) buffer Bb { float b[]; };
layout(std430, binding = 2) buffer Bst { float st[]; };
layout(std430, binding = 3) readonly buffer Bs { float s_in[]; };
layout(std430, binding = 4) readonly buffer Bids { uint ids[]; };
layout(std430, binding = 5) buffer Bflag { uint flag[]; };

layout(push_constant) uniform PC {
    uint S, H, P, N, NCH, gx;
    uint gather, o_s, o_ids, o_st;
} pc;

#include "math.glsl"   // finite()

void main() {
    uint e = (gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x) * WG + gl_LocalInvocationIndex;
    uint row = pc.H * pc.P * pc.N;
    if (e >= pc.S * row) return;
    uint i = e / row, r = e % row;
    uint h = r / (pc.P * pc.N), n = r % pc.N;
    float s = pc.gather != 0u ? s_in[pc.o_s + ids[pc.o_ids + i] * row + r] : st[pc.o_st + e];
    bool ok = true;
    // CU chunks at a time: their loads first, issued together, then the chain through them (a
    // store of init_c may alias a later load of b as far as the compiler knows, which would make
    // every step wait for its own loads).
    for (uint q0 = 0; q0 < pc.NCH; q0 += CU) {
        float av[CU], addv[CU];
        [[unroll]] for (uint u = 0; u < CU; ++u) {
            uint q = min(q0 + u, pc.NCH - 1u);
            uint v = i * pc.NCH + (REVERSE != 0 ? pc.NCH - 1u - q : q);   // the chunk as a sequence of the other passes
#if MAMBA1
            av[u] = dec[(v * pc.H + h) * pc.N + n];
#else
            av[u] = dec[v * pc.H + h];
#endif
            addv[u] = b[v * row + r];
        }
        [[unroll]] for (uint u = 0; u < CU; ++u) {
            if (q0 + u < pc.NCH) {
                uint q = q0 + u;
                uint v = i * pc.NCH + (REVERSE != 0 ? pc.NCH - 1u - q : q);
                b[v * row + r] = s;
                s = av[u] * s + addv[u];
                ok = ok && finite(av[u]) && finite(addv[u]) && finite(s);
            }
        }
    }
    st[pc.o_st + e] = s;
    if (!ok) atomicOr(flag[0], 1u);
}
