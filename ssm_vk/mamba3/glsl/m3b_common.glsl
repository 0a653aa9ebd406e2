// Shared parts of the chunked Mamba-3 backward (m3b_gstates.comp, m3b_gpass.comp, m3b_chunk.comp,
// m3b_rot.comp, m3b_angle.comp; the math: ssm_ref/mamba3_chunked_back.py): the bindings, the push
// constants (m3c_common.glsl's block), the chunk of a workgroup and the non-finite flag. Letters as
// in docs/SPEC.md section 14; L tokens per chunk (the last one may be shorter, Lc), NC chunks per
// sequence. The forward's own kernels (m3c_prep, m3c_angle, m3c_states, m3c_pass) run first and
// leave the chunks' tables: qr, kr, hz (H'_in), dch, ang (θ_in).
//
// Bindings (float32 unless noted; every array whole, from element 0; 32 in all, a device's
// minimum maxPerStageDescriptorStorageBuffers is what the planner checks):
//   0-14 the inputs (mamba3_inputs.glsl)
//   15 g_y (S,T,M,H,P)   16 g_state: g_theta (S,H,F) | g_h (S,H,P,N) | g_k (S,H,M,N) | g_v (S,H,M,P)
//   17 d_x (S,T,H,P)     18 d_step: d_dt | d_dA | d_lam, each (S,T,H)     19 d_dtheta (S,T,H,F)
//   20 d_B per head (S,T,M,H,N)   21 d_C per head (S,T,M,H,N)
//   22 parts (S,NC,H, 2MN + MP): d_B_bias (M,N) | d_C_bias (M,N) | d_psi (M,P) of one chunk
//   23 d_start: the start state's gradients, laid out as binding 16
//   24 qr (S,H,T,M,N)  25 kr  26 hz (S,H,NC,P,N): H'_in  27 dch (S,H,NC)  28 ang (S,H,NC,F): θ_in
//   29 flag (uint)
//   30 gz: G (S,H,NC,P,N) -- each chunk's Y_c (m3b_gstates), replaced by G_out, the cotangent of
//      the state it passes on (m3b_gpass) -- | gang (S,H,NC,F): each chunk's angle cotangent sum
//      (m3b_rot), replaced by the cotangent of its last angle from the later chunks (m3b_angle)
//   31 gqk: g_q (S,H,T,M,N) | g_k (S,H,T,M,N), the cotangents of the rotated queries and keys
// Push constants: m3c_common.glsl's (S, T, H, P, G, F, R, N, M, L, NC, halved, gx, mode).

#extension GL_EXT_control_flow_attributes : enable

#include "mamba3_inputs.glsl"
layout(std430, binding = 15) readonly buffer Bgy { float gy_in[]; };
layout(std430, binding = 16) readonly buffer Bgs { float gs_in[]; };
layout(std430, binding = 17) writeonly buffer Bdx { float dx_out[]; };
#if defined(SPLIT) && SPLIT == 2
layout(std430, binding = 18) buffer Bd3 { float d3_out[]; };   // (read back by m3b_chunk.comp's second half)
#else
layout(std430, binding = 18) writeonly buffer Bd3 { float d3_out[]; };
#endif
layout(std430, binding = 19) buffer Bdtho { float dth_out[]; };
layout(std430, binding = 20) buffer BdB { float dB_out[]; };
layout(std430, binding = 21) buffer BdC { float dC_out[]; };
layout(std430, binding = 22) writeonly buffer Bpart { float part[]; };
layout(std430, binding = 23) buffer Bd0 { float d0_out[]; };
layout(std430, binding = 24) readonly buffer Bqr { float qr[]; };
layout(std430, binding = 25) readonly buffer Bkr { float kr[]; };
layout(std430, binding = 26) readonly buffer Bhz { float hz[]; };
layout(std430, binding = 27) readonly buffer Bdch { float dch[]; };
layout(std430, binding = 28) readonly buffer Bang { float ang[]; };
layout(std430, binding = 29) buffer Bflag { uint flag[]; };
layout(std430, binding = 30) buffer Bgz { float gz[]; };
layout(std430, binding = 31) buffer Bgqk { float gqk[]; };

#include "m3_chunks.glsl"

// The planes of g_state and d_start (element offsets): θ, h, k, v.
uint plane_h() { return pc.S * pc.H * pc.F; }
uint plane_k() { return plane_h() + pc.S * pc.H * pc.P * pc.N; }
uint plane_v() { return plane_k() + pc.S * pc.H * pc.M * pc.N; }
// The angle part of gz, after the chunks' G.
uint gang_at() { return pc.S * pc.H * pc.NC * pc.P * pc.N; }
// The g_k half of gqk.
uint gk_at() { return pc.S * pc.H * pc.T * pc.M * pc.N; }
