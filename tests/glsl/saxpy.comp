#version 450
// Test kernel of the Vulkan runtime tests (tests/vk): y = a*x + SCALE*y + OFFSET, and the sum of
// the new y of each subgroup.
//   bindings:  0 x (float[n], read)   1 y (float[n], read/write)   2 sums (float[], one per subgroup)
//   push:      uint n; float a;       (8 bytes)
//   spec:      0, 1, 2 workgroup size; 3 SCALE (float)
//   defines:   OFFSET (float literal, default 0.0)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_GOOGLE_include_directive : require
#include "test_common.glsl"

layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(constant_id = 3) const float SCALE = 1.0;
#ifndef OFFSET
#define OFFSET 0.0
#endif

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) buffer Y { float y[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Sums { float sums[]; };
layout(push_constant) uniform Push { uint n; float a; } p;

void main() {
    uint i = gl_GlobalInvocationID.x;
    float v = 0.0;
    if (i < p.n) {
        v = axpby(p.a, x[i], SCALE, y[i]) + OFFSET;
        y[i] = v;
    }
    float s = subgroupAdd(v);
    if (subgroupElect()) {
        sums[gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID] = s;
    }
}
