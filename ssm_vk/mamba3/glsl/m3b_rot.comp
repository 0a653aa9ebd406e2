#version 450
// The chunked Mamba-3 backward, per (sequence i, chunk c, head h): the adjoint of the rotation
// (ssm_ref/mamba3_chunked_back.py, step 2's end, and step 3's suffix sums).
//
// MODE 0 (push constant mode): θ_t recomputed as m3c_prep.comp MODE 1 computes it (θ_in from ang,
// the chunk's running sum of dθ in token order, mod 2π; sincos_f32), then for every token t and
// rank r the cotangents g_k, g_q of the rotated key and query (m3b_chunk.comp's, in gqk) turned back,
//     (g_a, g_b) -> (g_a cos + g_b sin, g_b cos - g_a sin)   on the pairs, as they are elsewhere,
// into the per-head d_B, d_C (summed over a group's heads by mamba3_reduce.comp), and the angle
// cotangent a_t[j] = Σ_r (g_b u_a - g_a u_b) over the rotated keys and queries u, into d_dtheta.
// Then, the token loop done, the chunk's sums over its tokens (token order): of g_k, g_q turned
// back (its part of d_B_bias, d_C_bias, into parts) and of a_t (into gang, for m3b_angle.comp).
// MODE 1: d_dθ_t = g + a_{Lc-1} + ... + a_t, from the cotangent g of the chunk's last angle that
// m3b_angle.comp left in gang, each pair by one invocation.
// The flag for a g_k, g_q turned back or a d_dθ that is not finite.
//
// Bindings and push constants: m3b_common.glsl's. Workgroup: 128 invocations (F <= 128).

#include "m3b_common.glsl"
#include "mamba3_sincos.glsl"

layout(local_size_x = 128, local_size_y = 1, local_size_z = 1) in;

const uint TBK = 8u;      // tokens whose angles are in shared memory at a time
const uint FMAX = 128u;   // the most pairs (N <= 256)

shared float th_sh[TBK * FMAX];   // the block's dθ, then θ_t (token-major)
shared float cs_sh[TBK * FMAX];
shared float sn_sh[TBK * FMAX];

void main() {
    uint wg = wg_index();
    if (wg >= pc.S * pc.NC * pc.H) return;
    uint h = wg % pc.H;
    uint c = (wg / pc.H) % pc.NC;
    uint i = wg / (pc.H * pc.NC);
    uint hs = i * pc.H + h;
    uint tid = gl_LocalInvocationIndex;
    uint t0 = c * pc.L;
    uint Lc = min(pc.L, pc.T - t0);
    uint at = gang_at() + (hs * pc.NC + c) * pc.F;   // this chunk's entries of gang

    if (pc.mode == 1u) {
        if (tid < pc.F) {
            float g = gz[at + tid];
            for (uint uu = Lc; uu > 0u; --uu) {
                uint o = ((i * pc.T + t0 + uu - 1u) * pc.H + h) * pc.F + tid;
                g = g + dth_out[o];
                dth_out[o] = g;
                guard(g);
            }
        }
        return;
    }

    uint half_n = pc.N / 2u;
    uint rest = pc.N - 2u * pc.F;                 // entries not in a pair, per token and rank
    uint MN = pc.M * pc.N;
    uint gk0 = gk_at();
    float th_in = tid < pc.F ? ang[(hs * pc.NC + c) * pc.F + tid] : 0.0;
    float s = 0.0;
    for (uint u0 = 0u; u0 < Lc; u0 += TBK) {
        uint nb = min(TBK, Lc - u0);
        for (uint e = tid; e < nb * pc.F; e += gl_WorkGroupSize.x) {
            uint u = e / pc.F, j = e % pc.F;
            th_sh[e] = dth_in[((i * pc.T + t0 + u0 + u) * pc.H + h) * pc.F + j];
        }
        barrier();
        if (tid < pc.F) {   // the running sum, serial per pair (as m3c_prep.comp)
            for (uint u = 0u; u < nb; ++u) {
                s += th_sh[u * pc.F + tid];
                float a = th_in + s;
                th_sh[u * pc.F + tid] = a - TWO_PI * floor(a / TWO_PI);
            }
        }
        barrier();
        for (uint e = tid; e < nb * pc.F; e += gl_WorkGroupSize.x) {
            vec2 sc = sincos_f32(th_sh[e]);
            sn_sh[e] = sc.x;
            cs_sh[e] = sc.y;
        }
        barrier();
        // the pairs: one item per (token, pair), its ranks in order (a_t[j] sums them)
        for (uint e = tid; e < nb * pc.F; e += gl_WorkGroupSize.x) {
            uint u = e / pc.F, j = e % pc.F;
            uint t = t0 + u0 + u;
            uint na = pc.halved != 0u ? j : 2u * j;
            uint nb_ = pc.halved != 0u ? j + half_n : 2u * j + 1u;
            float cs = cs_sh[e], sn = sn_sh[e];
            float a = 0.0;
            for (uint r = 0u; r < pc.M; ++r) {
                uint row = qk_row(i, h, t, r) * pc.N;
                uint o = (((i * pc.T + t) * pc.M + r) * pc.H + h) * pc.N;
                float ga = gqk[gk0 + row + na], gb = gqk[gk0 + row + nb_];
                float ka = kr[row + na], kb = kr[row + nb_];
                float ba = ga * cs + gb * sn, bb = gb * cs - ga * sn;
                dB_out[o + na] = ba;
                dB_out[o + nb_] = bb;
                guard(ba); guard(bb);
                a += gb * ka - ga * kb;
                float qa_ = gqk[row + na], qb_ = gqk[row + nb_];
                float qa = qr[row + na], qb = qr[row + nb_];
                float ca = qa_ * cs + qb_ * sn, cb = qb_ * cs - qa_ * sn;
                dC_out[o + na] = ca;
                dC_out[o + nb_] = cb;
                guard(ca); guard(cb);
                a += qb_ * qa - qa_ * qb;
            }
            dth_out[((i * pc.T + t) * pc.H + h) * pc.F + j] = a;
        }
        // the entries outside the pairs pass as they are
        for (uint e = tid; e < nb * pc.M * rest; e += gl_WorkGroupSize.x) {
            uint w = e % rest;
            uint r = (e / rest) % pc.M;
            uint u = e / (rest * pc.M);
            uint t = t0 + u0 + u;
            uint n = pc.halved != 0u ? (w < half_n - pc.F ? pc.F + w : w + 2u * pc.F) : w + 2u * pc.F;
            uint row = qk_row(i, h, t, r) * pc.N;
            uint o = (((i * pc.T + t) * pc.M + r) * pc.H + h) * pc.N;
            float gb = gqk[gk0 + row + n], gc = gqk[row + n];
            dB_out[o + n] = gb;
            dC_out[o + n] = gc;
            guard(gb); guard(gc);
        }
        barrier();
    }
    memoryBarrierBuffer();
    barrier();
    // The chunk's sums over its tokens, in token order.
    uint LP = 2u * MN + pc.M * pc.P;
    uint pat = ((i * pc.NC + c) * pc.H + h) * LP;
    for (uint e = tid; e < MN; e += gl_WorkGroupSize.x) {
        uint r = e / pc.N, n = e % pc.N;
        float sb = 0.0, sc = 0.0;
        // eight tokens' values read before they are added (one wait for eight loads), in token order
        uint o0 = (((i * pc.T + t0) * pc.M + r) * pc.H + h) * pc.N + n, ostep = pc.M * pc.H * pc.N;
        for (uint u8 = 0u; u8 < Lc; u8 += 8u) {
            float bv[8], cv[8];
            [[unroll]] for (uint j = 0u; j < 8u; ++j) {
                bool in_ = u8 + j < Lc;
                bv[j] = in_ ? dB_out[o0 + (u8 + j) * ostep] : 0.0;
                cv[j] = in_ ? dC_out[o0 + (u8 + j) * ostep] : 0.0;
            }
            [[unroll]] for (uint j = 0u; j < 8u; ++j) {
                if (u8 + j < Lc) {
                    sb += bv[j];
                    sc += cv[j];
                }
            }
        }
        part[pat + e] = sb;
        part[pat + MN + e] = sc;
    }
    if (tid < pc.F) {
        float sa = 0.0;
        uint a0 = ((i * pc.T + t0) * pc.H + h) * pc.F + tid, astep = pc.H * pc.F;
        for (uint u8 = 0u; u8 < Lc; u8 += 8u) {
            float av[8];
            [[unroll]] for (uint j = 0u; j < 8u; ++j) av[j] = u8 + j < Lc ? dth_out[a0 + (u8 + j) * astep] : 0.0;
            [[unroll]] for (uint j = 0u; j < 8u; ++j) {
                if (u8 + j < Lc) sa += av[j];
            }
        }
        gz[at + tid] = sa;
    }
}
