// Shared parts of the chunked Mamba-3 forward (m3c_prep.comp, m3c_angle.comp, m3c_states.comp,
// m3c_pass.comp, m3c_y.comp; the math: ssm_ref/mamba3_chunked.py, docs/SPEC.md section 14.7):
// the bindings, the push constants, the chunk of a workgroup, the non-finite flag and the
// 64 x 64 tile of the matrix products. Letters as in docs/SPEC.md section 14: S sequences,
// T tokens, H heads, P channels per head, N state size, G groups, M rank, F rotated pairs,
// R cache rows; L tokens per chunk (the last chunk of a sequence may be shorter, Lc), NC chunks
// per sequence (ceil(T / L)).
//
// Every size is a push constant: one SPIR-V module per kernel serves every N, M, P and chunk
// length (no define, no specialisation constant). The planner keeps L M <= 64 (the rows of a
// chunk's products: one tile), N <= 256 (F <= 128: m3c_prep's angle table) and a device with
// 256-invocation workgroups and the shared memory the kernels declare.
//
// Bindings (float32 unless noted; every array whole, from element 0):
//   0 x (S,T,H,P)  1 dt (S,T,H)  2 dA (S,T,H)  3 lam (S,T,H)  4 B (S,T,M,G,N)  5 C (S,T,M,G,N)
//   6 B_bias (H,M,N)  7 C_bias (H,M,N)  8 dtheta (S,T,H,F)  9 psi (H,M,P)
//   10 s_theta (R,H,F)  11 s_h (R,H,P,N)  12 s_k (R,H,M,N)  13 s_v (R,H,M,P)  14 ids (S) uint
//   outputs: 15 y (S,T,M,H,P)  16 theta (S,H,F)  17 h (S,H,P,N)  18 k (S,H,M,N)  19 v (S,H,M,P)
//   scratch: 20 qr (S,H,T,M,N) the rotated, biased queries  21 kr (S,H,T,M,N) the keys
//            22 hz (S,H,NC,P,N) each chunk's own state contribution Z_c (m3c_states), replaced
//               by the state the chunk receives, H'_in (m3c_pass)
//            23 dch (S,H,NC) each chunk's decay exp(ℓ_0 + ... + ℓ_{Lc-1})
//            24 ang (S,H,NC,F) each chunk's angle sums (m3c_prep MODE 0), replaced by the
//               angles it starts from, θ_in (m3c_angle)
//   25 flag (uint) set to 1 when an input, a table or an output is not finite: the host then
//      recomputes the call on the token-sequential kernels (whose inf and nan follow the spec)
// Push constants (uint32, this order): S, T, H, P, G, F, R, N, M, L, NC, halved (1: pairs
// (j, j + N/2); 0: pairs (2j, 2j + 1)), gx (the dispatch's workgroups along x: the grid is
// flattened), mode (m3c_prep: 0 angle sums, 1 rotation and tables).

#extension GL_EXT_control_flow_attributes : enable

#include "mamba3_inputs.glsl"
layout(std430, binding = 15) writeonly buffer By { float y_out[]; };
layout(std430, binding = 16) writeonly buffer Bth { float th_out[]; };
layout(std430, binding = 17) writeonly buffer Bh { float h_out[]; };
layout(std430, binding = 18) writeonly buffer Bk { float k_out[]; };
layout(std430, binding = 19) writeonly buffer Bv { float v_out[]; };
layout(std430, binding = 20) buffer Bqr { float qr[]; };
layout(std430, binding = 21) buffer Bkr { float kr[]; };
layout(std430, binding = 22) buffer Bhz { float hz[]; };
layout(std430, binding = 23) buffer Bdch { float dch[]; };
layout(std430, binding = 24) buffer Bang { float ang[]; };
layout(std430, binding = 25) buffer Bflag { uint flag[]; };

#include "m3_chunks.glsl"
