#version 450
// The Mamba-3 scan, forward, token by token (docs/SPEC.md section 14.2): one workgroup per
// (sequence i, head h, block of channels), one invocation per channel p of the block, which
// holds its state row h[p, :] (N values) in registers across every token; the angles, the
// token's rotated keys and queries and the previous token's keys in shared memory; v_{t-1}^r[p]
// in registers. Each token: θ_t and its cos, sin; k_t, q_t (bias, then rotation); the row's
// update h = α h + β Σ_r v_{t-1}^r k_{t-1}^r + γ Σ_r v_t^r k_t^r; y_t^r[p] = h · q^r.
// At the end the final state: θ and k by the block-0 workgroup, h and v by each row.
// The state rows travel between memory and registers through shared memory (stage_in,
// stage_out): an invocation's own row is N consecutive floats, so row-per-invocation loads
// would touch one cache line per invocation and entry; in the tiles consecutive invocations
// touch consecutive entries of a row instead. Only where the values travel changes: the bits
// are those of the direct loads and stores.
//
// Bindings: mamba3_common.glsl's 0-14, then (written)
//   15 y (S,T,M,H,P)  16 theta (S,H,F)  17 h (S,H,P,N)  18 k (S,H,M,N)  19 v (S,H,M,P)
// Push constants: mamba3_common.glsl's (S, T, H, P, G, F, R, gx, NPB, halved, K, IP).
// IP bit 0: h and v go into the cache rows ids[i] (bindings 11, 13) in place of 17, 19 (only this
// workgroup reads or writes its rows of them; the ids are distinct); bit 1: θ and k into rows
// ids[i] of 10, 12 in place of 16, 18 (every block of (i, h) reads them at the start: the host
// sets it only with one block, NPB = 1). A decode step's update_cache then needs no copy.
// Defines: ND, MR (mamba3_common.glsl), STG_BATCH (loads in flight per invocation in stage_in:
// M3_STAGE). Specialisation constant 0: the workgroup size.

#define M3_STAGE
#define M3_CACHE_RW
#include "mamba3_common.glsl"

layout(std430, binding = 15) writeonly buffer By { float y_out[]; };
layout(std430, binding = 16) writeonly buffer Bth { float th_out[]; };
layout(std430, binding = 17) writeonly buffer Bh { float h_out[]; };
layout(std430, binding = 18) writeonly buffer Bk { float k_out[]; };
layout(std430, binding = 19) writeonly buffer Bv { float v_out[]; };

// STAGE_PIECES(F): F(c) for the first column c of each piece of STG_W = 32 columns below ND,
// written out up to ND = 256 (the packaged N); beyond, a loop (hr then indexed at run time).
#if ND > 256
#define STAGE_PIECES(F) for (uint stage_c = 0u; stage_c < ND; stage_c += STG_W) F(stage_c)
#else
#define STAGE_PIECES(F) F(0u) STAGE_P1(F) STAGE_P2(F) STAGE_P3(F) STAGE_P4(F) STAGE_P5(F) STAGE_P6(F) STAGE_P7(F)
#if ND > 32
#define STAGE_P1(F) F(32u)
#else
#define STAGE_P1(F)
#endif
#if ND > 64
#define STAGE_P2(F) F(64u)
#else
#define STAGE_P2(F)
#endif
#if ND > 96
#define STAGE_P3(F) F(96u)
#else
#define STAGE_P3(F)
#endif
#if ND > 128
#define STAGE_P4(F) F(128u)
#else
#define STAGE_P4(F)
#endif
#if ND > 160
#define STAGE_P5(F) F(160u)
#else
#define STAGE_P5(F)
#endif
#if ND > 192
#define STAGE_P6(F) F(192u)
#else
#define STAGE_P6(F)
#endif
#if ND > 224
#define STAGE_P7(F) F(224u)
#else
#define STAGE_P7(F)
#endif
#endif

void main() {
    uint wg = gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x;
    if (wg >= pc.S * pc.H * pc.NPB) return;   // (the whole workgroup: no barrier is split)
    uint blk = wg % pc.NPB;
    uint h = (wg / pc.NPB) % pc.H;
    uint i = wg / (pc.NPB * pc.H);
    uint p = blk * gl_WorkGroupSize.x + gl_LocalInvocationIndex;
    bool live = p < pc.P;
    uint row = ids_in[i];

    // The block's rows p0 .. p0 + nrows - 1 (the live ones) are nrows * ND consecutive floats of
    // the cache at element sbase, and of the output at hbase.
    uint lid = gl_LocalInvocationIndex;
    uint p0 = blk * gl_WorkGroupSize.x;
    uint nrows = min(gl_WorkGroupSize.x, pc.P - min(p0, pc.P));
    uint sbase = ((row * pc.H + h) * pc.P + p0) * ND;

    float hr[ND];
    float vp[MR];
    load_start(row, h);
    [[unroll]] for (uint n = 0; n < ND; ++n) hr[n] = 0.0;
    // stage_in: per piece of STG_W columns and per tile of STG_R rows, the workgroup reads the
    // tile row by row into q_sh, then each invocation whose row is in the tile takes its piece.
    // The pieces are written out by the preprocessor (STAGE_PIECES: a piece's first column a
    // constant), not looped over: glslc leaves a loop around the tiles' loops rolled, and hr
    // indexed at run time would leave registers for memory on most GPUs.
#define STAGE_IN(c) { \
        uint w = min(STG_W, ND - c); \
        for (uint r0 = 0; r0 < gl_WorkGroupSize.x; r0 += STG_R) { \
            uint nr = min(STG_R, nrows - min(r0, nrows)); \
            /* STG_BATCH loads in flight before their stores (a workgroup of a few warps hides \
               little of one load's wait) */ \
            for (uint e0 = lid; e0 < nr * w; e0 += STG_BATCH * gl_WorkGroupSize.x) { \
                float v[STG_BATCH]; \
                [[unroll]] for (uint u = 0; u < STG_BATCH; ++u) { \
                    uint e = e0 + u * gl_WorkGroupSize.x, rr = e / w, j = e - rr * w; \
                    v[u] = e < nr * w ? sh_in[sbase + (r0 + rr) * ND + c + j] : 0.0; \
                } \
                [[unroll]] for (uint u = 0; u < STG_BATCH; ++u) { \
                    uint e = e0 + u * gl_WorkGroupSize.x, rr = e / w, j = e - rr * w; \
                    if (e < nr * w) q_sh[rr * STG_S + j] = v[u]; \
                } \
            } \
            barrier(); \
            if (live && lid - r0 < STG_R) {   /* (unsigned: lid < r0 wraps above STG_R) */ \
                [[unroll]] for (uint j = 0; j < STG_W; ++j) { \
                    if (c + j < ND) hr[c + j] = q_sh[(lid - r0) * STG_S + j]; \
                } \
            } \
            barrier(); \
        } \
    }
    STAGE_PIECES(STAGE_IN)
#undef STAGE_IN
    [[unroll]] for (uint r = 0; r < MR; ++r) vp[r] = live ? sv_in[((row * pc.H + h) * MR + r) * pc.P + p] : 0.0;
    barrier();

    for (uint t = 0; t < pc.T; ++t) {
        step_angles(i, h, t);
        barrier();
        make_kq(i, h, t);
        barrier();
        uint th_ = (i * pc.T + t) * pc.H + h;
        float dt = dt_in[th_], lam = lam_in[th_];
        float a = exp(dA_in[th_]);
        float beta = a * dt * (1.0 - lam);
        float gamma = lam * dt;
        if (live) {
            float xv = x_in[th_ * pc.P + p];
            float v[MR];
            [[unroll]] for (uint r = 0; r < MR; ++r) v[r] = psi_in[(h * MR + r) * pc.P + p] * xv;
            [[unroll]] for (uint n = 0; n < ND; ++n) {
                float prev = 0.0, cur = 0.0;
                [[unroll]] for (uint r = 0; r < MR; ++r) {
                    prev += vp[r] * kp_sh[r * ND + n];
                    cur += v[r] * k_sh[r * ND + n];
                }
                hr[n] = update(hr[n], a, beta, gamma, prev, cur);
            }
            [[unroll]] for (uint r = 0; r < MR; ++r) {
                float acc = 0.0;
                [[unroll]] for (uint n = 0; n < ND; ++n) acc += hr[n] * q_sh[r * ND + n];
                y_out[(((i * pc.T + t) * MR + r) * pc.H + h) * pc.P + p] = acc;
                vp[r] = v[r];
            }
        }
        barrier();
        for (uint e = gl_LocalInvocationIndex; e < MN; e += gl_WorkGroupSize.x) kp_sh[e] = k_sh[e];
        barrier();
    }

    uint hs = i * pc.H + h;
    uint rs = row * pc.H + h;
    bool hv_cache = (pc.IP & 1u) != 0u;
    if (blk == 0u) {
        if ((pc.IP & 2u) != 0u) {
            for (uint j = lid; j < pc.F; j += gl_WorkGroupSize.x) sth_in[rs * pc.F + j] = th_sh[j];
            for (uint e = lid; e < MN; e += gl_WorkGroupSize.x) sk_in[rs * MN + e] = kp_sh[e];
        } else {
            for (uint j = lid; j < pc.F; j += gl_WorkGroupSize.x) th_out[hs * pc.F + j] = th_sh[j];
            for (uint e = lid; e < MN; e += gl_WorkGroupSize.x) k_out[hs * MN + e] = kp_sh[e];
        }
    }
    if (live) {
        [[unroll]] for (uint r = 0; r < MR; ++r) {
            if (hv_cache) sv_in[(rs * MR + r) * pc.P + p] = vp[r];
            else v_out[(hs * MR + r) * pc.P + p] = vp[r];
        }
    }
    // stage_out: stage_in in reverse (q_sh is free: the last token's barrier is behind).
    uint hbase = (hs * pc.P + p0) * ND;
#define STAGE_OUT(c) { \
        uint w = min(STG_W, ND - c); \
        for (uint r0 = 0; r0 < gl_WorkGroupSize.x; r0 += STG_R) { \
            if (live && lid - r0 < STG_R) { \
                [[unroll]] for (uint j = 0; j < STG_W; ++j) { \
                    if (c + j < ND) q_sh[(lid - r0) * STG_S + j] = hr[c + j]; \
                } \
            } \
            barrier(); \
            uint nr = min(STG_R, nrows - min(r0, nrows)); \
            for (uint e = lid; e < nr * w; e += gl_WorkGroupSize.x) { \
                uint rr = e / w, j = e - rr * w; \
                float hv = q_sh[rr * STG_S + j]; \
                if (hv_cache) sh_in[sbase + (r0 + rr) * ND + c + j] = hv; \
                else h_out[hbase + (r0 + rr) * ND + c + j] = hv; \
            } \
            barrier(); \
        } \
    }
    STAGE_PIECES(STAGE_OUT)
#undef STAGE_OUT
}
