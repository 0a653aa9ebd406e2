#version 450
// Bandwidth probe, not a scan kernel: dst <- src, vec4 elements, a grid-stride loop over n of
// them. Bytes moved = 2 * 16 * n (read + write). Bindings: 0 src, 1 dst. Push constants: n, total
// invocations.
layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = 0) readonly buffer Bs { vec4 src[]; };
layout(std430, binding = 1) writeonly buffer Bd { vec4 dst[]; };
layout(push_constant) uniform PC { uint n, stride; } pc;

void main() {
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += pc.stride) dst[i] = src[i];
}
