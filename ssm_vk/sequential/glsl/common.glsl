// Shared helpers of the token-sequential scan kernels (ssm_scan.comp, ssm_scan_back.comp): their
// common bindings, the row an invocation holds, the row sums. Letters as in docs/SPEC.md:
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
//   EXACT         1: the invariant mode's kernels: the values declared XF (the state, its updates,
//                 the carried adjoint, the sums of a token) are `precise`, so no compiler contracts
//                 their multiplies and adds into fma -- every kernel and every unrolled copy of a
//                 token's step rounds them alike (the checkpoint pass and the backward's recompute
//                 give the forward's states bit for bit). 0 (default): plain floats.

#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#extension GL_KHR_shader_subgroup_clustered : enable
#extension GL_KHR_shader_subgroup_shuffle : enable
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;

#ifndef EXACT
#define EXACT 0
#endif
#if EXACT
#define XF precise float
#else
#define XF float
#endif

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

// Bindings 0-4, the same in both kernels (float32; indices relative to the element offsets o_*
// of the window the host bound): x (S, T, H, P), dt (S, T, H), A (H, 1) or (H, N),
// B and C (S, T, G, N). Each kernel declares its own from binding 5 on.
layout(std430, binding = 0) readonly buffer Bx { float x[]; };
layout(std430, binding = 1) readonly buffer Bdt { float dt[]; };
layout(std430, binding = 2) readonly buffer BA { float A[]; };
layout(std430, binding = 3) readonly buffer BB { float Bm[]; };
layout(std430, binding = 4) readonly buffer BC { float Cm[]; };

// The state row an invocation works on. Workgroups enumerate (sequence i, head block, channel
// block), the channel block fastest, over a grid gx wide; a workgroup's row slots are HB heads
// x PB channels. ``live``: the row exists (slots past the problem idle, with zeros); ``g`` the
// group of head h; ``row`` the index of (i, h, p) in (S, H, P); ``slot`` the row's slot in the
// workgroup, ``hbk`` and ``pbk`` the workgroup's head and channel blocks.
struct Row {
    uint i, h, p, g, lane, row, slot, hbk, pbk;
    bool live;
};

Row row_of(uint gx, uint S, uint H, uint P, uint G, uint HB, uint PB, uint NHB, uint NPB) {
    Row r;
    uint wg = gl_WorkGroupID.y * gx + gl_WorkGroupID.x;
    r.pbk = wg % NPB;
    r.hbk = (wg / NPB) % NHB;
    r.i = wg / (NPB * NHB);
    r.slot = row_slot();
    r.lane = lane_id();
    uint hl = r.slot / PB, pl = r.slot % PB;
    r.h = r.hbk * HB + hl;
    r.p = r.pbk * PB + pl;
    r.live = r.i < S && hl < HB && r.h < H && r.p < P;
    r.g = r.live ? r.h / (H / G) : 0u;
    r.row = (r.i * H + r.h) * P + r.p;
    return r;
}
