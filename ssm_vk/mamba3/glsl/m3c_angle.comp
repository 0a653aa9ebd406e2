#version 450
// The chunked Mamba-3 forward's pass over the chunks' angles, per (sequence i, head h), one
// invocation per pair j: θ_in of chunk 0 is the start row s_theta[ids[i]]; of chunk c + 1,
// (θ_in + P_{Lc-1}) mod 2π -- m3c_prep's last angle of chunk c, the same operations on the same
// numbers. Each chunk's angle sums in ang are replaced by its θ_in; the last chunk's end is
// the final θ (theta). (m3c_common.glsl.)
//
// Bindings and push constants: m3c_common.glsl's. Workgroup: 64 invocations; grid
// S * H * ceil(F / 64).

#include "m3c_common.glsl"

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

void main() {
    uint blocks = (pc.F + 63u) / 64u;
    uint wg = wg_index();
    if (wg >= pc.S * pc.H * blocks) return;
    uint j = (wg % blocks) * 64u + gl_LocalInvocationIndex;
    uint h = (wg / blocks) % pc.H;
    uint i = wg / (blocks * pc.H);
    if (j >= pc.F) return;
    float th = sth_in[(ids_in[i] * pc.H + h) * pc.F + j];
    guard(th);
    uint at = (i * pc.H + h) * pc.NC * pc.F + j;
    for (uint c = 0u; c < pc.NC; ++c) {
        float s = ang[at + c * pc.F];
        ang[at + c * pc.F] = th;
        float a = th + s;
        th = a - TWO_PI * floor(a / TWO_PI);
    }
    th_out[(i * pc.H + h) * pc.F + j] = th;
}
