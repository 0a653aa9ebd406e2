// Shared helpers of the scan kernels. Letters as in docs/SPEC.md:
//   N d_state · P head_dim · H n_head · G n_group · T tokens · S sequences · K checkpoint chunk
//
// Lane layout (all scan kernels): a state row (i, h, p) of N floats is held by LN lanes (LN a
// power of two, at most the subgroup size); lane l holds n = l, l + LN, ... (NPL values). A
// workgroup holds ROWS = WG / LN rows: HB heads x PB channels of one sequence.
//
// Defines (set by ssm_vk/kernels.py):
//   WG            threads per workgroup (also local_size_x)
//   LN            lanes per row (power of two)
//   NPL           state values per lane = ceil(N / LN)
//   USE_SUBGROUP  1: reduce a row with subgroupClusteredAdd (needs LN <= subgroup size)
//                 0: reduce through shared memory (any device)
//   MAMBA1        1: A is (H, N); 0: A is (H, 1)

#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#extension GL_KHR_shader_subgroup_clustered : enable
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;

const uint ROWS = WG / LN;

// softplus(z) = z if z > 20 else log(1 + exp(z)), in float32 (not log1p: SCAN.md numerics).
float softplus(float z) {
    return z > 20.0 ? z : log(1.0 + exp(min(z, 20.0)));
}

// d softplus / dz: 1 on the identity branch, sigmoid(z) on the log branch.
float softplus_grad(float z) {
    return z > 20.0 ? 1.0 : 1.0 / (1.0 + exp(-z));
}

#if USE_SUBGROUP
// Row slot and lane from the subgroup ids, so clusters of LN lanes never straddle subgroups.
uint row_slot() { return gl_SubgroupID * (gl_SubgroupSize / LN) + gl_SubgroupInvocationID / LN; }
uint lane_id()  { return gl_SubgroupInvocationID % LN; }

// Sum of v over the LN lanes of this row; every lane of the row gets the sum.
float row_sum(float v) { return subgroupClusteredAdd(v, LN); }
#else
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
#endif
