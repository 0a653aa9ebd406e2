#version 450
// The chunked Mamba-3 forward's pass over the chunks, per (sequence i, head h), one invocation
// per state entry (p, n) (m3c_common.glsl): from H = the start row s_h[ids[i]], for each chunk
// c in order
//     H'_in = H + Δ_{t0} (1 - λ_{t0}) Σ_r v_in^r[p] k_in^r[n]     (the previous token's β term)
//     H     = dch_c H'_in + Z_c
// where k_in, v_in are the last token's of chunk c - 1 (k from kr, v = psi ⊙ x), or the start
// rows s_k, s_v for chunk 0. Z_c is read from hz and replaced by H'_in (what m3c_y.comp reads).
// The final state: h = H; k and v of the last token, written by the first block of each
// (sequence, head). The flag for a start state or a state that is not finite.
//
// Bindings and push constants: m3c_common.glsl's. Workgroup: 256 invocations; grid
// S * H * ceil(P N / 256).

#include "m3c_common.glsl"

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

// Chunk c's part of the pass for entry (p, n): Z_c, its decay, the β weight of its first token and
// Σ_r v_in^r[p] k_in^r[n] (the previous chunk's last token, or the start rows for chunk 0).
void load_chunk(uint i, uint h, uint row, uint p, uint n, uint c, out float Z, out float d, out float beta0,
                out float kv) {
    uint hs = i * pc.H + h;
    uint t0 = c * pc.L;
    uint th_ = (i * pc.T + t0) * pc.H + h;
    Z = hz[((hs * pc.NC + c) * pc.P + p) * pc.N + n];
    d = dch[hs * pc.NC + c];
    beta0 = dt_in[th_] * (1.0 - lam_in[th_]);
    kv = 0.0;
    for (uint r = 0u; r < pc.M; ++r) {
        float vin, kin;
        if (c == 0u) {
            vin = sv_in[((row * pc.H + h) * pc.M + r) * pc.P + p];
            kin = sk_in[((row * pc.H + h) * pc.M + r) * pc.N + n];
        } else {
            vin = psi_in[(h * pc.M + r) * pc.P + p] * x_in[((i * pc.T + t0 - 1u) * pc.H + h) * pc.P + p];
            kin = kr[qk_row(i, h, t0 - 1u, r) * pc.N + n];
        }
        kv += vin * kin;
    }
}

void main() {
    uint PN = pc.P * pc.N;
    uint blocks = (PN + 255u) / 256u;
    uint wg = wg_index();
    if (wg >= pc.S * pc.H * blocks) return;
    uint blk = wg % blocks;
    uint h = (wg / blocks) % pc.H;
    uint i = wg / (blocks * pc.H);
    uint row = ids_in[i];
    uint hs = i * pc.H + h;
    uint e = blk * 256u + gl_LocalInvocationIndex;

    if (blk == 0u) {   // the last token's k and v: the final state's parts
        uint tl = pc.T - 1u;
        for (uint q = gl_LocalInvocationIndex; q < pc.M * pc.N; q += 256u) {
            float kv = kr[qk_row(i, h, tl, q / pc.N) * pc.N + q % pc.N];
            k_out[hs * pc.M * pc.N + q] = kv;
        }
        for (uint q = gl_LocalInvocationIndex; q < pc.M * pc.P; q += 256u) {
            uint r = q / pc.P, p = q % pc.P;
            float vv = psi_in[(h * pc.M + r) * pc.P + p] * x_in[((i * pc.T + tl) * pc.H + h) * pc.P + p];
            v_out[hs * pc.M * pc.P + q] = vv;
            guard(vv);
        }
    }
    if (e >= PN) return;
    uint p = e / pc.N, n = e % pc.N;
    float H = sh_in[((row * pc.H + h) * pc.P + p) * pc.N + n];
    // Chunk c's inputs are read while chunk c - 1 is computed (their loads do not wait on the
    // chain of H): Z_c, dch_c, Δ_{t0} (1 - λ_{t0}), Σ_r v_in^r[p] k_in^r[n].
    float Zn = 0.0, dn = 0.0, bn = 0.0, kvn = 0.0;
    load_chunk(i, h, row, p, n, 0u, Zn, dn, bn, kvn);
    for (uint c = 0u; c < pc.NC; ++c) {
        float Z = Zn, d = dn, beta0 = bn, kv = kvn;
        if (c + 1u < pc.NC) load_chunk(i, h, row, p, n, c + 1u, Zn, dn, bn, kvn);
        float Hp = H + beta0 * kv;
        hz[((hs * pc.NC + c) * pc.P + p) * pc.N + n] = Hp;
        guard(Hp);
        H = d * Hp + Z;
    }
    h_out[(hs * pc.P + p) * pc.N + n] = H;
    guard(H);
}
