// Shared parts of the Mamba-1 kernels that spread time over a workgroup's threads (m1_scan.comp,
// m1_scan_back.comp). Letters as in docs/SPEC.md:
//   N d_state · H channels (Mamba-1's heads, P = 1) · G groups · T tokens · S sequences
//
// Layout: a workgroup holds CW consecutive channels h of one sequence and one time chunk of
// L = NW * SPS * TI tokens, cut into NW * SPS slices of TI tokens. A subgroup (RW lanes: the
// subgroup size) holds SPS consecutive slices, each on CW = RW / SPS consecutive lanes, one channel
// per lane (SPS = 1: one slice per subgroup, one channel per lane). A thread is one channel x one
// slice and keeps all N state values of its channel in registers, so the sums over n (y, the
// gradient's row sums) are its own, and the B and C of a token are the same for the CW lanes of a
// slice (loaded once, spread over those lanes and read through shuffles).
// Slices compose through shared memory in slice order; chunks (NCH > 1) through
// ssm_scan_carry.comp, between a summary pass and the final one.
//
// Defines (set by ssm_vk/kernels.py): RW (lanes per subgroup, the subgroup size the plan was
// made for), NW (subgroups per workgroup), SPS (slices per subgroup, a power of two dividing RW;
// default 1; the backward takes 1), ND (= N). Tokens per slice: ti below (the backward's define
// TI, the forward's push constant).
// Workgroups enumerate (sequence i, chunk c, channel block rb), rb fastest, over a grid gx wide.

#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_shuffle : enable
#extension GL_EXT_control_flow_attributes : enable

#ifndef SPS
#define SPS 1
#endif

layout(local_size_x = RW * NW, local_size_y = 1, local_size_z = 1) in;

const uint WG = RW * NW;
const uint CW = RW / SPS;      // channels per workgroup = lanes per slice
const uint NS = NW * SPS;      // slices per workgroup

#include "math.glsl"

// Bindings 0-4, the same in both kernels (float32; indices relative to the element offsets o_*):
// x (S, T, H), dt (S, T, H), A (H, N), B and C (S, T, G, N).
layout(std430, binding = 0) readonly buffer Bx { float x[]; };
layout(std430, binding = 1) readonly buffer Bdt { float dt[]; };
layout(std430, binding = 2) readonly buffer BA { float A[]; };
layout(std430, binding = 3) readonly buffer BB { float Bm[]; };
layout(std430, binding = 4) readonly buffer BC { float Cm[]; };

// The thread's place: sequence i, chunk c, channel block rb; channel h and its group g; lane
// (= h - rb * CW: the lane within its slice) and slice; the slice's first token t0 and its number
// of tokens nt (0 past T); ntu, the tokens of the subgroup's first slice (its most: the loops over
// tokens run that far in every lane of the subgroup, so their shuffles are uniform).
struct Slot {
    uint i, c, rb, h, g, lane, slice, t0, nt, ntu;
};

// The slot of this thread, or false for a workgroup past the problem (the grid is rounded up) and
// for subgroups other than the plan's (then every thread of the workgroup returns, and the host
// is told through the flag's bit 2: it recomputes the call with the token-sequential kernels).
bool slot_of(out Slot r, uint gx, uint S, uint T, uint H, uint G, uint NCH, uint NRB, uint ti) {
    uint wg = gl_WorkGroupID.y * gx + gl_WorkGroupID.x;
    r.rb = wg % NRB;
    r.c = (wg / NRB) % NCH;
    r.i = wg / (NRB * NCH);
    // (with SPS = 1 the subgroup's slice, so that the compiler sees the loops over tokens uniform)
    r.lane = SPS == 1 ? gl_SubgroupInvocationID : gl_SubgroupInvocationID % CW;
    r.slice = SPS == 1 ? gl_SubgroupID : gl_SubgroupID * SPS + gl_SubgroupInvocationID / CW;
    r.h = r.rb * CW + r.lane;
    r.g = r.h / (H / G);
    r.t0 = (r.c * NS + r.slice) * ti;
    r.nt = r.t0 < T ? min(ti, T - r.t0) : 0u;
    uint t0u = (r.c * NS + gl_SubgroupID * SPS) * ti;
    r.ntu = SPS == 1 ? r.nt : (t0u < T ? min(ti, T - t0u) : 0u);
    return r.i < S;
}

bool subgroups_as_planned() { return gl_SubgroupSize == RW && gl_NumSubgroups == NW; }
