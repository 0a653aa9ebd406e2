#version 450
// The chunked Mamba-3 backward's pass over the chunks' angle cotangents, back from the last, per
// (sequence i, head h), one invocation per pair j (ssm_ref/mamba3_chunked_back.py, step 3): from
// g = g_theta, for each chunk c from the last: its sum Σ_t a_t (m3b_rot.comp MODE 0, in gang) is
// replaced by g, the cotangent of its last angle from the later chunks, and g += that sum; the start
// angle's gradient d0_theta = g. (m3b_rot.comp MODE 1 then adds g to the chunk's suffix sums.)
//
// Bindings and push constants: m3b_common.glsl's. Workgroup: 64 invocations; grid
// S * H * ceil(F / 64).

#include "m3b_common.glsl"

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

void main() {
    uint blocks = (pc.F + 63u) / 64u;
    uint wg = wg_index();
    if (wg >= pc.S * pc.H * blocks) return;
    uint j = (wg % blocks) * 64u + gl_LocalInvocationIndex;
    uint h = (wg / blocks) % pc.H;
    uint i = wg / (blocks * pc.H);
    if (j >= pc.F) return;
    uint hs = i * pc.H + h;
    float g = gs_in[hs * pc.F + j];
    guard(g);
    uint at = gang_at() + hs * pc.NC * pc.F + j;
    for (uint cc = pc.NC; cc > 0u; --cc) {
        uint c = cc - 1u;
        float s = gz[at + c * pc.F];
        gz[at + c * pc.F] = g;
        g = g + s;
    }
    d0_out[hs * pc.F + j] = g;
    guard(g);
}
