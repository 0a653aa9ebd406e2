// Shared declarations of the chunked (matrix-form) Mamba-2 kernels, glsl/chunk_*.comp.
// The math is ssm_ref/chunked.py's; docs/KERNELS.md "Chunked kernels" says how it is cut up.
// Letters: N d_state · P head_dim · H n_head · G n_group · T tokens · S sequences ·
// CL chunk length (L in the docs) · NCH chunks per sequence = ceil(T / CL).
//
// Defines (ssm_vk/specs.py chunk_spec): WG threads per workgroup, CL, PD = P, ND = N (sizes are
// compile-time so that the loops unroll and the tiles fit registers), plus each kernel's own.
//
// Bindings: every chunk kernel sees the same table (unused ones are bound to a dummy); indices
// are relative to the window the host bound (sequences [0, S), tokens [0, T)), plus o_* offsets.
//    0 x   (S, T, H, P)    1 dt (S, T, H)    2 A (H)    3 B (S, T, G, N)    4 C (S, T, G, N)
//    5 gy  (S, T, H, P)    the backward's g_y
//    6 hs  (S, NCH, H, P, N)   chunk states: Z (chunk's own contribution), then H_c (incoming)
//    7 gs  (S, NCH, H, P, N)   the backward's mirror: Y_c, then G_c (dL/dstate after the chunk)
//    8 cb  (S, NCH, G, CL, CL) C_t . B_s
//    9 mcb (S, NCH, H, CL, CL) M[t, s] * cb[t, s] (s <= t; 0 above)
//   10 gu  (S, NCH, H, CL, CL) g_y_t . u_s
//   11 mgu (S, NCH, H, CL, CL) M[t, s] * gu[t, s]
//   12 dec (S, NCH, H, 2 CL + 1) din[CL], dout[CL], dch
//   13 out                 y, d_x (S, T, H, P); d_B, d_C (S, T, G, N)
//   14 sm  (S, T, H, NSM)  per-token scalars of the backward (slots below)
//   15 st  (S, H, P, N)    forward: initial state in, final state out; backward: g_states in,
//                          d_s0 out
//   16 ddtp (S, T, H)      d_dt (chunk_finish writes it, at offset o_st)
//   17 dAp (S, H, NCHA)    per-chunk parts of d_A (a token window's at its first chunk, o_out)
//   18 flag (uint)         set to 1 when any output is not finite: the host then recomputes the
//                          call with the token-sequential kernels (their inf/nan follow docs/SPEC.md;
//                          the matrix form's sums can turn an inf into nan and back)

#include "math.glsl"

layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;

layout(std430, binding = 0) readonly buffer Bx { float x[]; };
layout(std430, binding = 1) readonly buffer Bdt { float dt[]; };
layout(std430, binding = 2) readonly buffer BA { float A[]; };
layout(std430, binding = 3) readonly buffer BB { float Bm[]; };
layout(std430, binding = 4) readonly buffer BC { float Cm[]; };
layout(std430, binding = 5) readonly buffer Bgy { float gy[]; };
layout(std430, binding = 6) buffer Bhs { float hs[]; };
layout(std430, binding = 7) buffer Bgs { float gs[]; };
layout(std430, binding = 8) buffer Bcb { float cb[]; };
layout(std430, binding = 9) buffer Bmcb { float mcb[]; };
layout(std430, binding = 10) buffer Bgu { float gu[]; };
layout(std430, binding = 11) buffer Bmgu { float mgu[]; };
layout(std430, binding = 12) buffer Bdec { float dec[]; };
layout(std430, binding = 13) buffer Bout { float outv[]; };
layout(std430, binding = 14) buffer Bsm { float sm[]; };
layout(std430, binding = 15) buffer Bst { float st[]; };
layout(std430, binding = 16) buffer Bddtp { float ddtp[]; };
layout(std430, binding = 17) buffer BdAp { float dAp[]; };
layout(std430, binding = 18) buffer Bflag { uint flag[]; };

layout(push_constant) uniform PC {
    uint S, T, H, G;   // window sequences and tokens; heads and groups
    uint NCH;          // chunks per sequence: ceil(T / CL)
    uint gx;           // workgroups along x (the grid is 2-D when it must be)
    uint o_x, o_dt, o_B, o_C, o_gy, o_out, o_st;
    uint o_A;          // element offset of A in its binding
    uint NCHA;         // chunks per sequence in dAp: NCH, or all of a sequence's token windows'
} pc;

// Slots of sm: 0 the in-chunk part of the decay gradient (sum of W over r >= t > s);
// 1, 2 Gam . x (two column blocks of P); 3, 4 beta; 5 .. 8 alpha (four column blocks of N);
// 9, 10 <G_c, H_c> (two column blocks of P; at the chunk's first token only).
const uint SM_W = 0u, SM_GX = 1u, SM_BETA = 3u, SM_ALPHA = 5u, SM_GH = 9u, NSM = 12u;
const uint DEC = 2u * CL + 1u;

// Raise the flag for a value that is not finite (nan fails the comparison too). Rare: the
// atomic runs only then.
void guard(float v) {
    if (!finite(v)) atomicOr(flag[0], 1u);
}

uint wg_index() { return gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x; }

// Tokens in chunk c (the last chunk may be short).
uint chunk_len(uint c) { return min(uint(CL), pc.T - c * CL); }

// (i, t) of chunk c, local token t, in (S, T) of the window.
uint tok(uint i, uint c, uint t) { return i * pc.T + c * CL + t; }

uint head_mat(uint i, uint c, uint h) { return (i * pc.NCH + c) * pc.H + h; }   // (S, NCH, H)
uint group_mat(uint i, uint c, uint g) { return (i * pc.NCH + c) * pc.G + g; }  // (S, NCH, G)
