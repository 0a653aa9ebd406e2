// Shared helpers of the scan kernels. Letters as in docs/SPEC.md:
//   N d_state · P head_dim · H n_head · G n_group · T tokens · S sequences · K checkpoint chunk
//
// Lane layout (all scan kernels): a state row (i, h, p) of N floats is held by LN lanes (LN a
// power of two, at most the subgroup size); lane l holds n = l, l + LN, ... (NPL values). A
// workgroup holds ROWS = WG / LN rows: HB heads x PB channels of one sequence.
//
// Defines (set by ssm_vk/specs.py):
//   WG            threads per workgroup (also local_size_x)
//   LN            lanes per row (power of two)
//   NPL           state values per lane = ceil(N / LN)
//   ROW_SUM       how a row's LN lanes are summed: 0 shared memory (any device),
//                 1 subgroupClusteredAdd, 2 subgroupShuffleXor butterfly, 3 subgroupAdd (LN equal
//                 to the subgroup size); ssm_vk/plan.py picks by what the device offers
//   MAMBA1        1: A is (H, N); 0: A is (H, 1)

#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#extension GL_KHR_shader_subgroup_clustered : enable
#extension GL_KHR_shader_subgroup_shuffle : enable
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;

const uint ROWS = WG / LN;

#include "math.glsl"

#if ROW_SUM == 0
// Shared memory (any device).
uint row_slot() { return gl_LocalInvocationIndex / LN; }
uint lane_id()  { return gl_LocalInvocationIndex % LN; }

shared float red_row[WG];

// Tree sum over the LN lanes of each row through shared memory (fixed order). Must be reached
// by every invocation of the workgroup (it has barriers).
float row_sum(float v) {
    uint me = gl_LocalInvocationIndex;
    uint base = me - (me % LN);
    red_row[me] = v;
    barrier();
    [[unroll]] for (uint w = LN / 2; w > 0; w >>= 1) {
        if ((me % LN) < w) red_row[me] += red_row[me + w];
        barrier();
    }
    float s = red_row[base];
    barrier();
    return s;
}
#else
// Subgroup operations. Rows are laid out from the subgroup ids so that the LN lanes of a row
// never straddle two subgroups (LN <= subgroup size, both powers of two).
uint row_slot() { return gl_SubgroupID * (gl_SubgroupSize / LN) + gl_SubgroupInvocationID / LN; }
uint lane_id()  { return gl_SubgroupInvocationID % LN; }

#if ROW_SUM == 1
// Clustered add: one instruction per row.
float row_sum(float v) { return subgroupClusteredAdd(v, LN); }
#elif ROW_SUM == 2
// Butterfly over the row's lanes. At every step a lane and its partner add the same two values
// (in swapped order, which is exact), so every lane of the row ends with the same sum.
float row_sum(float v) {
    [[unroll]] for (uint m = 1; m < LN; m <<= 1) v += subgroupShuffleXor(v, m);
    return v;
}
#else
// ROW_SUM == 3: a row is the whole subgroup (LN == subgroup size).
float row_sum(float v) { return subgroupAdd(v); }
#endif
#endif
