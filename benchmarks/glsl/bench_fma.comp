#version 450
// Throughput probe, not a scan kernel: 8 independent FMA chains per invocation, ITERS rounds,
// one store per invocation so nothing is optimised away. FLOPs = invocations * ITERS * 8 * 2.
// Bindings: 0 out (one float per invocation). Push constants: iters, gx.
layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = 0) writeonly buffer Bo { float outv[]; };
layout(push_constant) uniform PC { uint iters, gx; } pc;

void main() {
    uint id = (gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x) * WG + gl_LocalInvocationIndex;
    float a0 = float(id) * 1e-7, a1 = a0 + 1.0, a2 = a0 + 2.0, a3 = a0 + 3.0;
    float a4 = a0 + 4.0, a5 = a0 + 5.0, a6 = a0 + 6.0, a7 = a0 + 7.0;
    const float m = 0.9999, c = 1e-4;
    for (uint i = 0; i < pc.iters; ++i) {
        a0 = fma(a0, m, c); a1 = fma(a1, m, c); a2 = fma(a2, m, c); a3 = fma(a3, m, c);
        a4 = fma(a4, m, c); a5 = fma(a5, m, c); a6 = fma(a6, m, c); a7 = fma(a7, m, c);
    }
    outv[id] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}
