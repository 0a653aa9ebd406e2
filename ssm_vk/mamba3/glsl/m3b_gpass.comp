#version 450
// The chunked Mamba-3 backward's pass over the chunks, back from the last, per (sequence i, head h),
// one invocation per state entry (p, n) (ssm_ref/mamba3_chunked_back.py, step 1): from G = g_h,
// for each chunk c from the last
//     G_out(c) = G;   G = dch_c G + Y_c      (G'_in(c): the cotangent of the state chunk c receives)
// Y_c is read from gz and replaced by G_out(c) (what m3b_chunk.comp reads); the start state's
// d0_h = G'_in(0) into d_start. The flag for a g_h or a G that is not finite.
//
// Bindings and push constants: m3b_common.glsl's. Workgroup: 256 invocations; grid
// S * H * ceil(P N / 256).

#include "m3b_common.glsl"

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

void main() {
    uint PN = pc.P * pc.N;
    uint blocks = (PN + 255u) / 256u;
    uint wg = wg_index();
    if (wg >= pc.S * pc.H * blocks) return;
    uint blk = wg % blocks;
    uint h = (wg / blocks) % pc.H;
    uint i = wg / (blocks * pc.H);
    uint hs = i * pc.H + h;
    uint e = blk * 256u + gl_LocalInvocationIndex;
    if (e >= PN) return;
    float G = gs_in[plane_h() + hs * PN + e];
    guard(G);
    // Chunk c - 1's Y and decay are read while chunk c is computed (their loads do not wait on
    // the chain of G), as m3c_pass.comp does going forward.
    uint base = hs * pc.NC;
    float Yn = gz[(base + pc.NC - 1u) * PN + e], dn = dch[base + pc.NC - 1u];
    for (uint cc = pc.NC; cc > 0u; --cc) {
        uint c = cc - 1u;
        float Y = Yn, d = dn;
        if (c > 0u) {
            Yn = gz[(base + c - 1u) * PN + e];
            dn = dch[base + c - 1u];
        }
        gz[(base + c) * PN + e] = G;
        G = d * G + Y;
    }
    d0_out[plane_h() + hs * PN + e] = G;
    guard(G);
}
