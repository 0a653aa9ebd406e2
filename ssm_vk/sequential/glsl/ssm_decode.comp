#version 450
// Forward selective scan of one token (T = 1, Mamba-2: A per head): a decode step. A pass over
// the state rows, which the kernel reads and writes once each: the state in 16-byte loads and
// stores, and what a row shares with the other rows of its head -- the step softplus(dt), its
// decay exp(dt A) and the token's B and C -- computed or loaded once per row slot, not per row.
//
// Same bindings and push constants as ssm_scan.comp (the host records either alike); the
// differences: a workgroup holds one head (HB = 1) and a block of PB channels of it, and its
// ROWS = WG / LN row slots walk those channels, slot r taking channels r, r + ROWS, ... of the
// block; a row's LN lanes hold its state in NPL / 4 vec4 each, lane l the values 4 (l + k LN) + c
// (c < 4). The host plans this kernel only where T = 1, N % 4 == 0 and 4 LN NPL/4 >= N.
// Windows of the state arrays that do not start at a multiple of 4 floats (o_B, o_C, o_st, o_s)
// take the same four values by scalar loads and stores instead.
//
// Bindings (as ssm_scan.comp; float32 unless noted):
//   0 x   (S, 1, H, P)  1 dt (S, 1, H)  2 A (H, 1)  3 B (S, 1, G, N)  4 C (S, 1, G, N)  readonly
//   5 y   (S, 1, H, P)  written
//   6 st  (S, H, P, N)  read (initial state) and overwritten (final state)
//   7 ck  unused (the backward's checkpoints: never with this kernel)
//   8 s   (R, H, P, N)  the state cache, when pc.gather: read, and written when pc.scatter
//   9 ids (S) uint      when pc.gather
// Defines: common.glsl's (MAMBA1 = 0), NPL a multiple of 4.

#include "common.glsl"

#if MAMBA1 || (NPL % 4) != 0
#error "ssm_decode.comp: Mamba-2 (A per head) and NPL a multiple of 4 only"
#endif
const uint NV = NPL / 4;   // vec4 per lane

// 16-byte views of the state arrays and of B and C (the same buffers as common.glsl's and below)
layout(std430, binding = 3) readonly buffer BB4 { vec4 B4[]; };
layout(std430, binding = 4) readonly buffer BC4 { vec4 C4[]; };
layout(std430, binding = 5) writeonly buffer By { float y[]; };
layout(std430, binding = 6) buffer Bst { float st_buf[]; };
layout(std430, binding = 6) buffer Bst4 { vec4 st4[]; };
layout(std430, binding = 8) buffer Bs { float s_in[]; };
layout(std430, binding = 8) buffer Bs4 { vec4 s4[]; };
layout(std430, binding = 9) readonly buffer Bids { uint ids[]; };

layout(push_constant) uniform PC {
    uint S, T, H, P, N, G;
    uint HB, PB;             // HB = 1; channels per workgroup
    uint NHB, NPB;           // H, ceil(P / PB)
    uint gx;
    uint NC, c0;             // unused
    uint o_x, o_dt, o_B, o_C, o_y, o_st, o_ck;
    uint gather, o_s, o_ids;
    uint scatter;
    uint o_A;
} pc;

// Four consecutive floats from element e (a multiple of 4 when ``v4``).
vec4 ld_B(uint e, bool v4) { return v4 ? B4[e >> 2] : vec4(Bm[e], Bm[e + 1u], Bm[e + 2u], Bm[e + 3u]); }
vec4 ld_C(uint e, bool v4) { return v4 ? C4[e >> 2] : vec4(Cm[e], Cm[e + 1u], Cm[e + 2u], Cm[e + 3u]); }
vec4 ld_st(uint e, bool v4) {
    return v4 ? st4[e >> 2] : vec4(st_buf[e], st_buf[e + 1u], st_buf[e + 2u], st_buf[e + 3u]);
}
vec4 ld_s(uint e, bool v4) { return v4 ? s4[e >> 2] : vec4(s_in[e], s_in[e + 1u], s_in[e + 2u], s_in[e + 3u]); }
void st_st(uint e, vec4 v, bool v4) {
    if (v4) {
        st4[e >> 2] = v;
    } else {
        st_buf[e] = v.x; st_buf[e + 1u] = v.y; st_buf[e + 2u] = v.z; st_buf[e + 3u] = v.w;
    }
}
void st_s(uint e, vec4 v, bool v4) {
    if (v4) {
        s4[e >> 2] = v;
    } else {
        s_in[e] = v.x; s_in[e + 1u] = v.y; s_in[e + 2u] = v.z; s_in[e + 3u] = v.w;
    }
}

void main() {
    uint wg = gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x;
    uint pbk = wg % pc.NPB;
    uint h = (wg / pc.NPB) % pc.NHB;
    uint i = wg / (pc.NPB * pc.NHB);
    uint slot = row_slot(), lane = lane_id();
    bool head = i < pc.S && h < pc.H;                  // uniform over the workgroup
    uint g = head ? h / (pc.H / pc.G) : 0u;
    bool v4 = ((pc.o_B | pc.o_C | pc.o_st | pc.o_s) & 3u) == 0u;

    // What the head's rows share: the step, its decay, the token's B and C.
    float dv = head ? softplus(dt[pc.o_dt + i * pc.H + h]) : 0.0;
    float a = exp(dv * (head ? A[pc.o_A + h] : 0.0));
    vec4 Bv[NV], Cv[NV];
    uint bc = (i * pc.G + g) * pc.N;
    [[unroll]] for (uint k = 0; k < NV; ++k) {
        uint n = 4u * (lane + k * LN);
        bool on = head && n < pc.N;
        Bv[k] = on ? ld_B(pc.o_B + bc + n, v4) : vec4(0.0);
        Cv[k] = on ? ld_C(pc.o_C + bc + n, v4) : vec4(0.0);
    }
    uint src0 = pc.gather != 0u ? ((head ? ids[pc.o_ids + i] : 0u) * pc.H + h) * pc.P
                                : (i * pc.H + h) * pc.P;   // row of channel 0 in s, or in st

    // The block's channels, ROWS at a time (a bound uniform over the workgroup: row_sum may
    // hold barriers).
    uint p_end = min(pbk * pc.PB + pc.PB, pc.P);
    for (uint p0 = pbk * pc.PB; p0 < p_end; p0 += ROWS) {
        uint p = p0 + slot;
        bool live = head && p < p_end;
        uint row = (i * pc.H + h) * pc.P + p;            // in (S, H, P): x, y, st
        float u = (live ? x[pc.o_x + row] : 0.0) * dv;
        vec4 st[NV];
        float acc = 0.0;
        [[unroll]] for (uint k = 0; k < NV; ++k) {
            uint n = 4u * (lane + k * LN);
            bool on = live && n < pc.N;
            if (pc.gather != 0u) {                       // uniform
                st[k] = on ? ld_s(pc.o_s + (src0 + p) * pc.N + n, v4) : vec4(0.0);
            } else {
                st[k] = on ? ld_st(pc.o_st + row * pc.N + n, v4) : vec4(0.0);
            }
        }
        [[unroll]] for (uint k = 0; k < NV; ++k) {
            if (4u * (lane + k * LN) < pc.N) {           // slots past N stay 0 (no 0 * inf)
                st[k] = st[k] * a + Bv[k] * u;
                acc += st[k].x * Cv[k].x;
                acc += st[k].y * Cv[k].y;
                acc += st[k].z * Cv[k].z;
                acc += st[k].w * Cv[k].w;
            }
        }
        float yv = row_sum(acc);
        if (live && lane == 0u) y[pc.o_y + row] = yv;
        [[unroll]] for (uint k = 0; k < NV; ++k) {
            uint n = 4u * (lane + k * LN);
            if (live && n < pc.N) {
                if (pc.scatter != 0u) {                  // uniform
                    st_s(pc.o_s + (src0 + p) * pc.N + n, st[k], v4);
                } else {
                    st_st(pc.o_st + row * pc.N + n, st[k], v4);
                }
            }
        }
    }
}
