#version 450
// The Mamba-3 scan, backward, token by token (docs/SPEC.md section 14.5): one workgroup per
// (sequence i, head h) holding every channel of the head (one invocation per channel p: P <= the
// workgroup size), which walks the tokens forward once, storing each token's keys and angles and
// the state at every K-th token (a checkpoint) in the work buffer, then back, segment by segment
// of K tokens from the last: each row recomputes its states of the segment from its checkpoint,
// then the tokens are walked back carrying the cotangents of h (a row per invocation, in
// registers), of k and θ (shared) and of v (per row). Each token back: g_h += Σ_r g_y^r q^rᵀ;
// the per-row parts of g_q, of the k and k_prev cotangents and of g_α, g_β, g_γ into the work
// buffer, summed over the rows in row order (fixed: bit-identical reruns); the step's
// gradients; the adjoint of the rotation (g_k, g_q back to B and C per head, the angles' part);
// then g_h *= α and the previous token's k, v cotangents carried on.
// Per-head d_B / d_C slabs and per-sequence d_B_bias / d_C_bias / d_psi parts are written here
// and summed in a fixed order by mamba3_reduce.comp; each sequence's start-state gradients are
// written as they are (the host adds them into the cache rows by ids).
//
// Bindings: mamba3_common.glsl's 0-14, then
//   15 g_y (S,T,M,H,P)   16 g_state: g_theta (S,H,F) | g_h (S,H,P,N) | g_k (S,H,M,N) | g_v (S,H,M,P)
//   17 d_x (S,T,H,P)     18 d_step: d_dt | d_dA | d_lam, each (S,T,H)     19 d_dtheta (S,T,H,F)
//   20 d_B per head (S,T,M,H,N)   21 d_C per head (S,T,M,H,N)
//   22 parts (S,H, 2MN + MP): d_B_bias (M,N) | d_C_bias (M,N) | d_psi (M,P) of sequence i
//   23 d_start: the start state's gradients, laid out as binding 16
//   24 work: checkpoints h_{sK-1} (S,H,NSEG,P,N) | a segment's states (S,H,K+1,P,N) |
//      k_t (S,H,T+1,M,N) | θ_t (S,H,T,F) | row parts (S,H,P,3MN+3);  NSEG = ceil(T / K)
// Push constants: mamba3_common.glsl's (NPB = 1; K >= 1; IP = 0). Defines: ND, MR. Specialisation
// constant 0: the workgroup size (>= P).

#include "mamba3_common.glsl"

layout(std430, binding = 15) readonly buffer Bgy { float gy_in[]; };
layout(std430, binding = 16) readonly buffer Bgs { float gs_in[]; };
layout(std430, binding = 17) writeonly buffer Bdx { float dx_out[]; };
layout(std430, binding = 18) writeonly buffer Bd3 { float d3_out[]; };
layout(std430, binding = 19) writeonly buffer Bdtho { float dth_out[]; };
layout(std430, binding = 20) writeonly buffer BdB { float dB_out[]; };
layout(std430, binding = 21) writeonly buffer BdC { float dC_out[]; };
layout(std430, binding = 22) buffer Bpart { float part[]; };
layout(std430, binding = 23) writeonly buffer Bd0 { float d0_out[]; };
layout(std430, binding = 24) buffer Bwork { float work[]; };

const uint L = 3u * MN + 3u;     // a row's parts: g_q, k's, k_prev's (MN each), g_α, g_β, g_γ
shared float gk_sh[MN];          // the cotangent of k_t (then of k_{t-1})
shared float gth_sh[NF];         // the cotangent of θ_t
shared float red_sh[L];          // the row parts, summed

void main() {
    uint wg = gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x;
    if (wg >= pc.S * pc.H) return;
    uint h = wg % pc.H;
    uint i = wg / pc.H;
    uint hs = i * pc.H + h;
    uint p = gl_LocalInvocationIndex;
    uint me = gl_LocalInvocationIndex, NT = gl_WorkGroupSize.x;
    bool live = p < pc.P;
    uint row = ids_in[i];
    uint T1 = pc.T + 1u;
    uint PN = pc.P * ND;
    // the work buffer's parts (element offsets)
    uint NSEG = (pc.T + pc.K - 1u) / pc.K;
    uint oSeg = pc.S * pc.H * NSEG * PN;
    uint oK = oSeg + pc.S * pc.H * (pc.K + 1u) * PN;
    uint oTh = oK + pc.S * pc.H * T1 * MN;
    uint oRed = oTh + pc.S * pc.H * pc.T * pc.F;
    // the planes of g_state / d_start
    uint pTh = 0u, pH = pc.S * pc.H * pc.F, pK = pH + pc.S * pc.H * PN, pV = pK + pc.S * pc.H * MN;
    uint STH = pc.S * pc.T * pc.H;
    uint LP = 2u * MN + MR * pc.P;

    // ---- the walk forward: every token's state, keys and angles stored ----
    float hr[ND];
    load_start(row, h);
    [[unroll]] for (uint n = 0; n < ND; ++n) hr[n] = live ? sh_in[((row * pc.H + h) * pc.P + p) * ND + n] : 0.0;
    float vp[MR];
    [[unroll]] for (uint r = 0; r < MR; ++r) vp[r] = live ? sv_in[((row * pc.H + h) * MR + r) * pc.P + p] : 0.0;
    for (uint e = me; e < MN; e += NT) work[oK + hs * T1 * MN + e] = kp_sh[e];
    for (uint e = me; e < LP; e += NT) part[hs * LP + e] = 0.0;
    memoryBarrierBuffer();
    barrier();
    for (uint t = 0; t < pc.T; ++t) {
        if (live && t % pc.K == 0u) {   // a checkpoint: the state before token t
            [[unroll]] for (uint n = 0; n < ND; ++n) work[((hs * NSEG + t / pc.K) * pc.P + p) * ND + n] = hr[n];
        }
        step_angles(i, h, t);
        barrier();
        make_kq(i, h, t);
        barrier();
        uint th_ = (i * pc.T + t) * pc.H + h;
        float dt = dt_in[th_], lam = lam_in[th_];
        float a = exp(dA_in[th_]);
        float beta = a * dt * (1.0 - lam);
        float gamma = lam * dt;
        for (uint j = me; j < pc.F; j += NT) work[oTh + (hs * pc.T + t) * pc.F + j] = th_sh[j];
        for (uint e = me; e < MN; e += NT) work[oK + (hs * T1 + t + 1u) * MN + e] = k_sh[e];
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
            [[unroll]] for (uint r = 0; r < MR; ++r) vp[r] = v[r];
        }
        barrier();
        for (uint e = me; e < MN; e += NT) kp_sh[e] = k_sh[e];
        barrier();
    }

    // ---- the walk back ----
    float gh[ND];
    float gv[MR];
    [[unroll]] for (uint n = 0; n < ND; ++n) gh[n] = live ? gs_in[pH + (hs * pc.P + p) * ND + n] : 0.0;
    [[unroll]] for (uint r = 0; r < MR; ++r) gv[r] = live ? gs_in[pV + (hs * MR + r) * pc.P + p] : 0.0;
    for (uint e = me; e < MN; e += NT) gk_sh[e] = gs_in[pK + hs * MN + e];
    for (uint j = me; j < pc.F; j += NT) gth_sh[j] = gs_in[pTh + hs * pc.F + j];
    memoryBarrierBuffer();
    barrier();
    for (uint sg = NSEG; sg > 0u; --sg) {
    uint t0 = (sg - 1u) * pc.K, t1 = min(pc.T, t0 + pc.K);
    uint seg = oSeg + (hs * (pc.K + 1u)) * PN;   // the segment's states: h_{t0-1} .. h_{t1-1}
    if (live) {   // this row's states of the segment, from its checkpoint (its own rows only: no barrier)
        float vr[MR];
        [[unroll]] for (uint n = 0; n < ND; ++n) {
            hr[n] = work[((hs * NSEG + sg - 1u) * pc.P + p) * ND + n];
            work[seg + p * ND + n] = hr[n];
        }
        [[unroll]] for (uint r = 0; r < MR; ++r) {
            vr[r] = t0 > 0u ? psi_in[(h * MR + r) * pc.P + p] * x_in[((i * pc.T + t0 - 1u) * pc.H + h) * pc.P + p]
                            : sv_in[((row * pc.H + h) * MR + r) * pc.P + p];
        }
        for (uint t = t0; t < t1; ++t) {
            uint th_ = (i * pc.T + t) * pc.H + h;
            float dt = dt_in[th_], lam = lam_in[th_];
            float a = exp(dA_in[th_]);
            float beta = a * dt * (1.0 - lam);
            float gamma = lam * dt;
            float xv = x_in[th_ * pc.P + p];
            float v[MR];
            [[unroll]] for (uint r = 0; r < MR; ++r) v[r] = psi_in[(h * MR + r) * pc.P + p] * xv;
            uint kq = oK + (hs * T1 + t) * MN;   // k_{t-1}, then k_t at kq + MN
            [[unroll]] for (uint n = 0; n < ND; ++n) {
                float prev = 0.0, cur = 0.0;
                [[unroll]] for (uint r = 0; r < MR; ++r) {
                    prev += vr[r] * work[kq + r * ND + n];
                    cur += v[r] * work[kq + MN + r * ND + n];
                }
                hr[n] = update(hr[n], a, beta, gamma, prev, cur);
                work[seg + ((t - t0 + 1u) * pc.P + p) * ND + n] = hr[n];
            }
            [[unroll]] for (uint r = 0; r < MR; ++r) vr[r] = v[r];
        }
    }
    for (uint tt = t1; tt > t0; --tt) {
        uint t = tt - 1u;
        for (uint j = me; j < pc.F; j += NT) {
            float ang = work[oTh + (hs * pc.T + t) * pc.F + j];
            th_sh[j] = ang;
            vec2 sc = sincos_f32(ang);
            sn_sh[j] = sc.x;
            cs_sh[j] = sc.y;
        }
        for (uint e = me; e < MN; e += NT) kp_sh[e] = work[oK + (hs * T1 + t) * MN + e];
        barrier();
        make_kq(i, h, t);
        barrier();
        uint th_ = (i * pc.T + t) * pc.H + h;
        float dt = dt_in[th_], lam = lam_in[th_];
        float a = exp(dA_in[th_]);
        float beta = a * dt * (1.0 - lam);
        float gamma = lam * dt;
        float gvp[MR];
        if (live) {
            float xv = x_in[th_ * pc.P + p];
            float v[MR], vq[MR], gyr[MR];
            [[unroll]] for (uint r = 0; r < MR; ++r) {
                float ps = psi_in[(h * MR + r) * pc.P + p];
                v[r] = ps * xv;
                vq[r] = t > 0u ? ps * x_in[(th_ - pc.H) * pc.P + p] : sv_in[((row * pc.H + h) * MR + r) * pc.P + p];
                gyr[r] = gy_in[(((i * pc.T + t) * MR + r) * pc.H + h) * pc.P + p];
            }
            uint rb = oRed + (hs * pc.P + p) * L;
            uint hn = seg + ((t - t0 + 1u) * pc.P + p) * ND;   // h_t's row
            uint hp = seg + ((t - t0) * pc.P + p) * ND;        // h_{t-1}'s row
            float ga = 0.0, gb = 0.0, gg = 0.0;
            float gkv[MR], gkp[MR];
            [[unroll]] for (uint r = 0; r < MR; ++r) { gkv[r] = 0.0; gkp[r] = 0.0; }
            [[unroll]] for (uint n = 0; n < ND; ++n) {
                float add = 0.0;
                [[unroll]] for (uint r = 0; r < MR; ++r) add += gyr[r] * q_sh[r * ND + n];
                float g = gh[n] + add;
                gh[n] = g;
                float hnow = work[hn + n];
                float prev = 0.0, cur = 0.0;
                [[unroll]] for (uint r = 0; r < MR; ++r) {
                    prev += vq[r] * kp_sh[r * ND + n];
                    cur += v[r] * k_sh[r * ND + n];
                    work[rb + r * ND + n] = hnow * gyr[r];
                    work[rb + MN + r * ND + n] = g * v[r];
                    work[rb + 2u * MN + r * ND + n] = g * vq[r];
                    gkv[r] += g * k_sh[r * ND + n];
                    gkp[r] += g * kp_sh[r * ND + n];
                }
                ga += g * work[hp + n];
                gb += g * prev;
                gg += g * cur;
            }
            work[rb + 3u * MN] = ga;
            work[rb + 3u * MN + 1u] = gb;
            work[rb + 3u * MN + 2u] = gg;
            float dx = 0.0;
            [[unroll]] for (uint r = 0; r < MR; ++r) {
                gv[r] = gv[r] + gamma * gkv[r];
                gvp[r] = beta * gkp[r];
                float ps = psi_in[(h * MR + r) * pc.P + p];
                dx += gv[r] * ps;
                part[hs * LP + 2u * MN + r * pc.P + p] += gv[r] * xv;
            }
            dx_out[th_ * pc.P + p] = dx;
        }
        memoryBarrierBuffer();
        barrier();
        // the rows' parts, summed in row order
        for (uint c = me; c < L; c += NT) {
            float s = 0.0;
            for (uint q = 0; q < pc.P; ++q) s += work[oRed + (hs * pc.P + q) * L + c];
            red_sh[c] = s;
        }
        barrier();
        float g_alpha = red_sh[3u * MN], g_beta = red_sh[3u * MN + 1u], g_gamma = red_sh[3u * MN + 2u];
        if (me == 0u) {
            g_alpha = g_alpha + g_beta * dt * (1.0 - lam);
            d3_out[th_] = g_beta * a * (1.0 - lam) + g_gamma * lam;          // d_dt
            d3_out[STH + th_] = g_alpha * a;                                 // d_dA
            d3_out[2u * STH + th_] = g_gamma * dt - g_beta * a * dt;         // d_lam
        }
        for (uint e = me; e < MN; e += NT) gk_sh[e] = gk_sh[e] + gamma * red_sh[MN + e];
        barrier();
        // the adjoint of the rotation: B, C per head; the angles' part
        for (uint e = me; e < MN; e += NT) {
            uint r = e / ND, n = e % ND;
            bool first;
            uint o;
            int j = pair_of(n, first, o);
            float gk = gk_sh[e], gq = red_sh[e];
            float gkb = gk, gqb = gq;
            if (j >= 0) {
                float c = cs_sh[j], s = sn_sh[j];
                float gko = gk_sh[r * ND + o], gqo = red_sh[r * ND + o];
                gkb = first ? gk * c + gko * s : gk * c - gko * s;
                gqb = first ? gq * c + gqo * s : gq * c - gqo * s;
            }
            uint at = (((i * pc.T + t) * MR + r) * pc.H + h) * ND + n;
            dB_out[at] = gkb;
            dC_out[at] = gqb;
            part[hs * LP + e] += gkb;
            part[hs * LP + MN + e] += gqb;
        }
        for (uint j = me; j < pc.F; j += NT) {
            uint na = pc.halved != 0u ? j : 2u * j;
            uint nb = pc.halved != 0u ? j + ND / 2u : 2u * j + 1u;
            float acc = 0.0;
            [[unroll]] for (uint r = 0; r < MR; ++r) {
                float angk = gk_sh[r * ND + nb] * k_sh[r * ND + na] - gk_sh[r * ND + na] * k_sh[r * ND + nb];
                float angq = red_sh[r * ND + nb] * q_sh[r * ND + na] - red_sh[r * ND + na] * q_sh[r * ND + nb];
                acc += angk + angq;
            }
            float g = gth_sh[j] + acc;
            gth_sh[j] = g;
            dth_out[((i * pc.T + t) * pc.H + h) * pc.F + j] = g;
        }
        barrier();
        for (uint e = me; e < MN; e += NT) gk_sh[e] = beta * red_sh[2u * MN + e];
        if (live) {
            [[unroll]] for (uint n = 0; n < ND; ++n) gh[n] = a * gh[n];
            [[unroll]] for (uint r = 0; r < MR; ++r) gv[r] = gvp[r];
        }
        barrier();
    }
    }

    // ---- the start state's gradients ----
    for (uint j = me; j < pc.F; j += NT) d0_out[pTh + hs * pc.F + j] = gth_sh[j];
    for (uint e = me; e < MN; e += NT) d0_out[pK + hs * MN + e] = gk_sh[e];
    if (live) {
        [[unroll]] for (uint n = 0; n < ND; ++n) d0_out[pH + (hs * pc.P + p) * ND + n] = gh[n];
        [[unroll]] for (uint r = 0; r < MR; ++r) d0_out[pV + (hs * MR + r) * pc.P + p] = gv[r];
    }
}
