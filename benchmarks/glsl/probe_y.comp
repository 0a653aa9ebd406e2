#version 450
// Probe, not a scan kernel (benchmarks/vk_split_probe.py): the chunked Mamba-2 forward's output
// (chunk_gemm_y.comp in float32) on the matrix units from operands split once (probe_split.comp),
// per (sequence s, chunk c, head h), CL x P:
//   y[t][p] = sum_{s' <= t} mcb[t][s'] u[s'][p]  +  din[t] sum_n C[t][n] hs[p][n]
// each product as lo hi + hi lo + hi hi per 16 of its contraction (TERMS 3; TERMS 1: hi hi) into
// float32, then times its two exponents; the 16-token blocks of mcb above the diagonal skipped
// (zero). A subgroup per 16 tokens (rows), its P / 16 tiles of each product in accumulators; both
// through shared memory, where the second's rows are scaled by din (a matrix sum of cooperative
// matrices crashes glslc's optimizer, shaderc 2023.2). Defines: WG (32 CL / 16), CL, P, N,
// TERMS. Bindings: 0 mcb_hi, 1 mcb_lo (S NCH H, CL, CL), 2 u_hi, 3 u_lo (S, T, H, P), 4 C_hi,
// 5 C_lo (S, T, G, N), 6 hs_hi, 7 hs_lo (S NCH H, P, N), 8 e_mcb, 9 e_u, 10 e_C, 11 e_hs, 12 din
// (S, T, H), 13 y (S, T, H, P).
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : enable
layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = 0) readonly buffer B0 { float16_t mhi[]; };
layout(std430, binding = 1) readonly buffer B1 { float16_t mlo[]; };
layout(std430, binding = 2) readonly buffer B2 { float16_t uhi[]; };
layout(std430, binding = 3) readonly buffer B3 { float16_t ulo[]; };
layout(std430, binding = 4) readonly buffer B4 { float16_t chi[]; };
layout(std430, binding = 5) readonly buffer B5 { float16_t clo[]; };
layout(std430, binding = 6) readonly buffer B6 { float16_t hhi[]; };
layout(std430, binding = 7) readonly buffer B7 { float16_t hlo[]; };
layout(std430, binding = 8) readonly buffer B8 { int em[]; };
layout(std430, binding = 9) readonly buffer B9 { int eu[]; };
layout(std430, binding = 10) readonly buffer B10 { int ec[]; };
layout(std430, binding = 11) readonly buffer B11 { int eh[]; };
layout(std430, binding = 12) readonly buffer B12 { float din[]; };
layout(std430, binding = 13) writeonly buffer B13 { float y[]; };
layout(push_constant) uniform PC { uint S, T, H, G, NCH; } pc;

#define F16M fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define F32M fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
const uint NP = P / 16u;
shared float st1[CL * P], st2[CL * P];   // the two products, row-major, scaled: y = st1 + din st2 by rows

void main() {
    uint wid = gl_WorkGroupID.x, sg = gl_SubgroupID, tid = gl_LocalInvocationIndex;
    uint h = wid % pc.H, c = (wid / pc.H) % pc.NCH, s = wid / (pc.H * pc.NCH);
    uint g = h / (pc.H / pc.G);
    uint blk = (s * pc.NCH + c) * pc.H + h, gblk = (s * pc.NCH + c) * pc.G + g;
    uint tok0 = s * pc.T + c * CL;
    uint t0 = 16u * sg;                                   // this subgroup's rows
    uint su = pc.H * P, sc = pc.G * N;
    uint om = blk * CL * CL + t0 * CL, ou = (tok0 * pc.H + h) * P, oc = (tok0 + t0) * sc + g * N;
    uint oh = blk * P * N;
    F32M a1[NP], a2[NP];
    [[unroll]] for (uint j = 0u; j < NP; ++j) { a1[j] = F32M(0.0); a2[j] = F32M(0.0); }
    for (uint k = 0u; k <= sg; ++k) {                     // mcb's blocks on and below the diagonal
        F16M ah, al;
        coopMatLoadNV(ah, mhi, om + 16u * k, CL, false);
#if TERMS == 3
        coopMatLoadNV(al, mlo, om + 16u * k, CL, false);
#endif
        [[unroll]] for (uint j = 0u; j < NP; ++j) {
            F16M bh, bl;
            coopMatLoadNV(bh, uhi, ou + 16u * k * su + 16u * j, su, false);
#if TERMS == 3
            coopMatLoadNV(bl, ulo, ou + 16u * k * su + 16u * j, su, false);
            a1[j] = coopMatMulAddNV(al, bh, a1[j]);
            a1[j] = coopMatMulAddNV(ah, bl, a1[j]);
#endif
            a1[j] = coopMatMulAddNV(ah, bh, a1[j]);
        }
    }
    for (uint k = 0u; k < N / 16u; ++k) {
        F16M ah, al;
        coopMatLoadNV(ah, chi, oc + 16u * k, sc, false);
#if TERMS == 3
        coopMatLoadNV(al, clo, oc + 16u * k, sc, false);
#endif
        [[unroll]] for (uint j = 0u; j < NP; ++j) {
            F16M bh, bl;                                  // hsᵀ: (n, p) at p N + n, column-major
            coopMatLoadNV(bh, hhi, oh + 16u * j * N + 16u * k, N, true);
#if TERMS == 3
            coopMatLoadNV(bl, hlo, oh + 16u * j * N + 16u * k, N, true);
            a2[j] = coopMatMulAddNV(al, bh, a2[j]);
            a2[j] = coopMatMulAddNV(ah, bl, a2[j]);
#endif
            a2[j] = coopMatMulAddNV(ah, bh, a2[j]);
        }
    }
    float s1 = ldexp(1.0, -(em[blk] + eu[blk])), s2 = ldexp(1.0, -(ec[gblk] + eh[blk]));
    [[unroll]] for (uint j = 0u; j < NP; ++j) {
        a1[j] = a1[j] * s1;
        a2[j] = a2[j] * s2;
        coopMatStoreNV(a1[j], st1, t0 * P + 16u * j, P, false);
        coopMatStoreNV(a2[j], st2, t0 * P + 16u * j, P, false);
    }
    barrier();
    for (uint e = tid; e < CL * P; e += WG) {
        uint t = e / P;
        y[(tok0 + t) * su + h * P + e % P] = st1[e] + din[(tok0 + t) * pc.H + h] * st2[e];
    }
}
