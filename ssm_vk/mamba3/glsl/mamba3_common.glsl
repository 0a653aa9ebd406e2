// Shared parts of the token-sequential Mamba-3 kernels (mamba3_scan.comp, mamba3_scan_back.comp):
// the inputs' bindings 0-14, the push constants, the pair of a rotated entry, the rotation of
// a token's biased keys and queries. Letters as in docs/SPEC.md section 14: S sequences,
// T tokens, H heads, P channels per head, N state size, G groups, M rank, F rotated pairs,
// R cache rows.
//
// Layout: one invocation per state row p of a head (its N values in registers); the token's
// rotated keys and queries, the previous token's keys and the angles in shared memory, made by
// the workgroup's invocations together (entries strided over the workgroup).
//
// Defines (ssm_vk/mamba3/mamba3_specs.py):
//   ND  the state size N (register rows, shared arrays)
//   MR  the rank M (1: SISO)
// The workgroup size is specialisation constant 0 (local_size_x_id): the planner's, from the
// device's limits.
//
// Bindings 0-14 (float32 unless noted; every array whole, from element 0):
//   0 x (S,T,H,P)  1 dt (S,T,H)  2 dA (S,T,H)  3 lam (S,T,H)  4 B (S,T,M,G,N)  5 C (S,T,M,G,N)
//   6 B_bias (H,M,N)  7 C_bias (H,M,N)  8 dtheta (S,T,H,F)  9 psi (H,M,P)
//   10 s_theta (R,H,F)  11 s_h (R,H,P,N)  12 s_k (R,H,M,N)  13 s_v (R,H,M,P)  14 ids (S) uint
// Push constants (uint32, this order): S, T, H, P, G, F, R, gx, NPB (channel blocks per head),
// halved (1: pairs (j, j + N/2), 0: pairs (2j, 2j + 1)), K (the backward's tokens per segment;
// the forward: unused), IP (the forward's final state written into the cache rows ids[i] in
// place rather than into its outputs: bit 0 h and v, bit 1 θ and k; the backward: 0).

#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x_id = 0, local_size_y = 1, local_size_z = 1) in;

#include "mamba3_inputs.glsl"

layout(push_constant) uniform PC {
    uint S, T, H, P, G, F, R, gx, NPB, halved, K, IP;
} pc;

const uint MN = MR * ND;
const uint NF = ND / 2 + 1;   // room for the F <= N/2 angles
const float TWO_PI = 6.28318530717958647692;

shared float th_sh[NF];      // θ of the token
shared float cs_sh[NF];      // cos θ_j
shared float sn_sh[NF];      // sin θ_j
// The forward (M3_STAGE defined) also moves the state rows between memory and registers through
// q_sh, free before the first token and after the last: tiles of STG_R rows x STG_W columns at a
// stride of STG_S floats (odd: a column's entries fall in distinct banks). 64 rows where the
// kernel's shared memory then stays within 16 KiB (Vulkan's least maxComputeSharedMemorySize),
// else 32 (N = 256 at rank 4 takes about what it did without the tiles).
#ifdef M3_STAGE
const uint STG_W = 32u;
const uint STG_S = STG_W + 1u;
const uint STG_R = (3u * NF + 2u * MN + 64u * STG_S) * 4u <= 16384u ? 64u : 32u;
const uint QN = MN > STG_R * STG_S ? MN : STG_R * STG_S;
#else
const uint QN = MN;
#endif

shared float k_sh[MN];       // the token's keys k^r (biased, rotated)
shared float q_sh[QN];       // the token's queries q^r (entries 0..MN)
shared float kp_sh[MN];      // the previous token's keys

// Entry n's rotated pair: its angle's index j (-1: n passes through), whether n is the pair's
// first member (a), and the other member's index.
int pair_of(uint n, out bool first, out uint other) {
    first = false;
    other = n;
    if (pc.halved != 0u) {
        uint half_n = ND / 2u;
        if (n < pc.F) { first = true; other = n + half_n; return int(n); }
        if (n >= half_n && n - half_n < pc.F) { other = n - half_n; return int(n - half_n); }
        return -1;
    }
    uint j = n >> 1u;
    if (j < pc.F) { first = (n & 1u) == 0u; other = n ^ 1u; return int(j); }
    return -1;
}

// Rot(θ) of entry n of u, whose own value is u_n and whose pair's other member is u_o:
// (u_a, u_b) -> (u_a cos - u_b sin, u_a sin + u_b cos).
float rotated(uint n, float u_n, float u_o, int j, bool first) {
    if (j < 0) return u_n;
    float c = cs_sh[j], s = sn_sh[j];
    return first ? u_n * c - u_o * s : u_o * s + u_n * c;
}

#include "mamba3_sincos.glsl"

// θ_t = (θ_{t-1} + dθ_t) mod 2π and its cos, sin, for sequence i, head h, token t (every
// invocation must reach it; a barrier after it is the caller's).
void step_angles(uint i, uint h, uint t) {
    for (uint j = gl_LocalInvocationIndex; j < pc.F; j += gl_WorkGroupSize.x) {
        float a = th_sh[j] + dth_in[((i * pc.T + t) * pc.H + h) * pc.F + j];
        a = a - TWO_PI * floor(a / TWO_PI);
        th_sh[j] = a;
        vec2 sc = sincos_f32(a);
        sn_sh[j] = sc.x;
        cs_sh[j] = sc.y;
    }
}

// The token's rotated keys and queries into k_sh, q_sh (after step_angles and a barrier).
void make_kq(uint i, uint h, uint t) {
    uint g = h / (pc.H / pc.G);
    for (uint e = gl_LocalInvocationIndex; e < MN; e += gl_WorkGroupSize.x) {
        uint r = e / ND, n = e % ND;
        bool first;
        uint o;
        int j = pair_of(n, first, o);
        uint base = (((i * pc.T + t) * MR + r) * pc.G + g) * ND;
        uint bb = (h * MR + r) * ND;
        float kn = B_in[base + n] + Bb_in[bb + n];
        float qn = C_in[base + n] + Cb_in[bb + n];
        float ko = B_in[base + o] + Bb_in[bb + o];
        float qo = C_in[base + o] + Cb_in[bb + o];
        k_sh[e] = rotated(n, kn, ko, j, first);
        q_sh[e] = rotated(n, qn, qo, j, first);
    }
}

// One row's state update h = α h + β Σ_r v_{t-1}^r k_{t-1}^r + γ Σ_r v^r k^r at entry n (the
// forward, the backward's walk forward and its recompute of a segment: one expression).
float update(float h, float a, float beta, float gamma, float prev, float cur) {
    return a * h + beta * prev + gamma * cur;
}

// The start state's angles and keys (rows ids[i]) into th_sh, kp_sh.
void load_start(uint row, uint h) {
    for (uint j = gl_LocalInvocationIndex; j < pc.F; j += gl_WorkGroupSize.x) {
        th_sh[j] = sth_in[(row * pc.H + h) * pc.F + j];
    }
    for (uint e = gl_LocalInvocationIndex; e < MN; e += gl_WorkGroupSize.x) {
        kp_sh[e] = sk_in[(row * pc.H + h) * MN + e];
    }
}
