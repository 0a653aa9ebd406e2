#version 450
// Fixed-order sums for the Mamba-3 backward (mamba3_scan_back.comp's parts):
//   out[o_out + a * INNER + b] = Σ_{k < K} in[o_in + (a * K + k) * INNER + b],  k in order,
// for every output element o = a * INNER + b < n_out: the per-head d_B / d_C slabs summed over
// each group's H/G heads (K = H/G, INNER = N), the per-sequence d_B_bias / d_C_bias / d_psi
// parts summed over the sequences (K = S, INNER = n_out). One invocation per output element.
//
// Bindings: 0 in (float32, read)  1 out (float32, written).
// Push constants (uint32, this order): n_out, INNER, K, gx, o_in, o_out.
// Defines: WG (threads per workgroup).

layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;

layout(std430, binding = 0) readonly buffer Bin { float in_[]; };
layout(std430, binding = 1) writeonly buffer Bout { float out_[]; };

layout(push_constant) uniform PC {
    uint n_out, INNER, K, gx, o_in, o_out;
} pc;

void main() {
    uint o = (gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x) * WG + gl_LocalInvocationIndex;
    if (o >= pc.n_out) return;
    uint a = o / pc.INNER, b = o % pc.INNER;
    float s = 0.0;
    for (uint k = 0; k < pc.K; ++k) s += in_[pc.o_in + (a * pc.K + k) * pc.INNER + b];
    out_[pc.o_out + o] = s;
}
