#version 450
// Row additions for the state-cache gradient d_s (R, H, P, N): d_s[dst] += d_s0[src] for a list
// of (dst, src) row pairs in which every dst occurs once (one "layer" of duplicate ids; the host
// submits layers in sequence order, so duplicate ids add in order i = 0, 1, ...).
// Bindings: 0 src (S, L) readonly   1 dst (R, L)   2 pairs (n_pairs, 2) uint readonly
// Push constants: L (row length H*P*N), n_pairs, gx, o_src, o_dst (element offsets).

layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;

layout(std430, binding = 0) readonly buffer B0 { float src[]; };
layout(std430, binding = 1) buffer B1 { float dst[]; };
layout(std430, binding = 2) readonly buffer B2 { uint pairs[]; };

layout(push_constant) uniform PC { uint L, n_pairs, gx, o_src, o_dst; } pc;

void main() {
    uint e = (gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x) * WG + gl_LocalInvocationIndex;
    if (e >= pc.L * pc.n_pairs) return;
    uint k = e / pc.L, j = e % pc.L;
    uint d = pairs[2 * k], s = pairs[2 * k + 1];
    dst[pc.o_dst + d * pc.L + j] += src[pc.o_src + s * pc.L + j];
}
