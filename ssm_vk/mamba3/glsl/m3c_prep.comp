#version 450
// The chunked Mamba-3 forward, per (sequence i, chunk c, head h): the angles and the rotated
// keys and queries of the chunk's tokens, and the chunk's decay (m3c_common.glsl).
//
// MODE 0 (push constant mode): the chunk's angle sums P_{Lc-1} = dθ_0 + ... + dθ_{Lc-1} (in
// token order from 0), one invocation per pair, into ang (m3c_angle.comp then turns them into
// each chunk's θ_in).
// MODE 1: θ_t = (θ_in + P_t) mod 2π for every token of the chunk (P_t summed as in MODE 0, so
// the last token's angle is the next chunk's θ_in bit for bit), their cos and sin (sincos_f32,
// as the token-sequential kernels), then the biased, rotated k_t^r, q_t^r into kr, qr (every
// entry of a pair by one invocation, which reads both members); dch = exp(ℓ_0 + ... + ℓ_{Lc-1});
// the flag for any input of the chunk that is not finite (dt, dA, λ, and through k, q: B, C, the
// biases, dθ) or a decay that overflows.
// Tokens are taken TBK at a time: their dθ (read together), cos and sin in shared memory.
//
// Bindings and push constants: m3c_common.glsl's. Workgroup: 128 invocations (F <= 128).

#include "m3c_common.glsl"
#include "mamba3_sincos.glsl"

layout(local_size_x = 128, local_size_y = 1, local_size_z = 1) in;

const uint TBK = 8u;      // tokens whose angles are in shared memory at a time
const uint FMAX = 128u;   // the most pairs (N <= 256)

shared float dth_sh[TBK * FMAX];   // the block's dθ (token-major), read from global memory together
shared float cs_sh[TBK * FMAX];
shared float sn_sh[TBK * FMAX];
shared float ell_sh[64];           // the chunk's ℓ (Lc <= 64)

// The dθ of tokens u0 .. u0 + nb - 1 of the chunk into dth_sh (a barrier after it is the caller's).
void stage_dtheta(uint i, uint h, uint t0, uint u0, uint nb) {
    for (uint e = gl_LocalInvocationIndex; e < nb * pc.F; e += gl_WorkGroupSize.x) {
        uint u = e / pc.F, j = e % pc.F;
        dth_sh[e] = dth_in[((i * pc.T + t0 + u0 + u) * pc.H + h) * pc.F + j];
    }
}

void main() {
    uint wg = wg_index();
    if (wg >= pc.S * pc.NC * pc.H) return;   // (the whole workgroup)
    uint h = wg % pc.H;
    uint c = (wg / pc.H) % pc.NC;
    uint i = wg / (pc.H * pc.NC);
    uint tid = gl_LocalInvocationIndex;
    uint t0 = c * pc.L;
    uint Lc = min(pc.L, pc.T - t0);
    uint at = ((i * pc.H + h) * pc.NC + c) * pc.F;   // this chunk's entries of ang

    if (pc.mode == 0u) {
        float s = 0.0;
        for (uint u0 = 0u; u0 < Lc; u0 += TBK) {
            uint nb = min(TBK, Lc - u0);
            stage_dtheta(i, h, t0, u0, nb);
            barrier();
            if (tid < pc.F) {
                for (uint u = 0u; u < nb; ++u) s += dth_sh[u * pc.F + tid];
            }
            barrier();
        }
        if (tid < pc.F) {
            ang[at + tid] = s;
            guard(s);
        }
        return;
    }

    // The chunk's decay, and the per-token inputs checked.
    for (uint u = tid; u < Lc; u += gl_WorkGroupSize.x) {
        uint th_ = (i * pc.T + t0 + u) * pc.H + h;
        float l = dA_in[th_];
        ell_sh[u] = l;
        guard(dt_in[th_]);
        guard(lam_in[th_]);
        guard(l);
        guard(exp(l));
    }
    barrier();
    if (tid == 0u) {
        float s = 0.0;
        for (uint u = 0u; u < Lc; ++u) s += ell_sh[u];
        float e = exp(s);
        dch[(i * pc.H + h) * pc.NC + c] = e;
        guard(e);
    }

    uint g = h / (pc.H / pc.G);
    uint half_n = pc.N / 2u;
    uint per = pc.N - pc.F;                         // items per token and rank: the pairs, then the rest
    float th_in = tid < pc.F ? ang[at + tid] : 0.0;
    float s = 0.0;
    for (uint u0 = 0u; u0 < Lc; u0 += TBK) {
        uint nb = min(TBK, Lc - u0);
        stage_dtheta(i, h, t0, u0, nb);
        barrier();
        if (tid < pc.F) {   // the running sum, serial per pair: θ_t in place of dθ_t
            for (uint u = 0u; u < nb; ++u) {
                s += dth_sh[u * pc.F + tid];
                float a = th_in + s;
                dth_sh[u * pc.F + tid] = a - TWO_PI * floor(a / TWO_PI);
            }
        }
        barrier();
        for (uint e = tid; e < nb * pc.F; e += gl_WorkGroupSize.x) {   // their sin and cos, all at once
            vec2 sc = sincos_f32(dth_sh[e]);
            sn_sh[e] = sc.x;
            cs_sh[e] = sc.y;
        }
        barrier();
        uint total = nb * pc.M * per;
        for (uint e = tid; e < total; e += gl_WorkGroupSize.x) {
            uint w = e % per;
            uint r = (e / per) % pc.M;
            uint u = e / (per * pc.M);
            uint t = t0 + u0 + u;
            uint base = (((i * pc.T + t) * pc.M + r) * pc.G + g) * pc.N;
            uint bb = (h * pc.M + r) * pc.N;
            uint row = qk_row(i, h, t, r) * pc.N;
            if (w < pc.F) {
                uint na = pc.halved != 0u ? w : 2u * w;
                uint nb_ = pc.halved != 0u ? w + half_n : 2u * w + 1u;
                float cs = cs_sh[u * pc.F + w], sn = sn_sh[u * pc.F + w];
                float ka = B_in[base + na] + Bb_in[bb + na], kb = B_in[base + nb_] + Bb_in[bb + nb_];
                float qa = C_in[base + na] + Cb_in[bb + na], qb = C_in[base + nb_] + Cb_in[bb + nb_];
                float k0 = ka * cs - kb * sn, k1 = ka * sn + kb * cs;
                float q0 = qa * cs - qb * sn, q1 = qa * sn + qb * cs;
                kr[row + na] = k0;
                kr[row + nb_] = k1;
                qr[row + na] = q0;
                qr[row + nb_] = q1;
                guard(k0); guard(k1); guard(q0); guard(q1);
            } else {
                uint w2 = w - pc.F;
                uint n = pc.halved != 0u ? (w2 < half_n - pc.F ? pc.F + w2 : w2 + 2u * pc.F) : w2 + 2u * pc.F;
                float kn = B_in[base + n] + Bb_in[bb + n], qn = C_in[base + n] + Cb_in[bb + n];
                kr[row + n] = kn;
                qr[row + n] = qn;
                guard(kn); guard(qn);
            }
        }
        barrier();
    }
}
