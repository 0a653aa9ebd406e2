#version 450
// Probe, not a scan kernel (benchmarks/vk_split_probe.py): the chunked Mamba-2 forward's chunk
// states hs[s, c, h] (P x N) = sum over the chunk's tokens t of A[t, :]ᵀ B[t, :] (A = w x, the
// product chunk_gemm_zf.comp computes in float32) on the matrix units from operands split once
// (probe_split.comp): per 16 tokens lo_a hi_b + hi_a lo_b + hi_a hi_b (TERMS 3; TERMS 1: hi_a hi_b)
// into float32, then times 2^-(e_a + e_b). Read straight from memory: no shared memory, no barrier.
// One workgroup per (s, c, h), a subgroup per 16 rows (p) of the P x N result, its N / 16 tiles
// in accumulators. VK_NV_cooperative_matrix (glslc of Debian 12 compiles it; the KHR form is the
// same structure). Defines: WG (32 x P / 16), CL (a multiple of 16, dividing T), P, N, TERMS.
// Bindings: 0 a_hi, 1 a_lo (S, T, H, P), 2 b_hi, 3 b_lo (S, T, G, N), 4 e_a, 5 e_b, 6 hs.
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : enable
layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = 0) readonly buffer Bah { float16_t ahi[]; };
layout(std430, binding = 1) readonly buffer Bal { float16_t alo[]; };
layout(std430, binding = 2) readonly buffer Bbh { float16_t bhi[]; };
layout(std430, binding = 3) readonly buffer Bbl { float16_t blo[]; };
layout(std430, binding = 4) readonly buffer Bea { int ea[]; };
layout(std430, binding = 5) readonly buffer Beb { int eb[]; };
layout(std430, binding = 6) writeonly buffer Bh { float hs[]; };
layout(push_constant) uniform PC { uint S, T, H, G, NCH; } pc;

#define F16M fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define F32M fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
const uint NT = N / 16u;

void main() {
    uint wid = gl_WorkGroupID.x, sg = gl_SubgroupID;
    uint h = wid % pc.H, c = (wid / pc.H) % pc.NCH, s = wid / (pc.H * pc.NCH);
    uint g = h / (pc.H / pc.G);
    uint p0 = 16u * sg;
    uint tok0 = s * pc.T + c * CL;
    uint sa = pc.H * P, sb = pc.G * N;                   // strides between tokens
    uint oa = (tok0 * pc.H + h) * P + p0, ob = (tok0 * pc.G + g) * N;
    F32M acc[NT];
    [[unroll]] for (uint j = 0u; j < NT; ++j) acc[j] = F32M(0.0);
    for (uint k = 0u; k < CL / 16u; ++k) {
        F16M ah, al;
        coopMatLoadNV(ah, ahi, oa + 16u * k * sa, sa, true);     // (p, t) at t sa + p: column-major
#if TERMS == 3
        coopMatLoadNV(al, alo, oa + 16u * k * sa, sa, true);
#endif
        [[unroll]] for (uint j = 0u; j < NT; ++j) {
            F16M bh, bl;
            coopMatLoadNV(bh, bhi, ob + 16u * k * sb + 16u * j, sb, false);
#if TERMS == 3
            coopMatLoadNV(bl, blo, ob + 16u * k * sb + 16u * j, sb, false);
            acc[j] = coopMatMulAddNV(al, bh, acc[j]);
            acc[j] = coopMatMulAddNV(ah, bl, acc[j]);
#endif
            acc[j] = coopMatMulAddNV(ah, bh, acc[j]);
        }
    }
    float scale = ldexp(1.0, -(ea[(s * pc.NCH + c) * pc.H + h] + eb[(s * pc.NCH + c) * pc.G + g]));
    uint oh = ((s * pc.NCH + c) * pc.H + h) * P * N + p0 * N;
    [[unroll]] for (uint j = 0u; j < NT; ++j) {
        acc[j] = acc[j] * scale;
        coopMatStoreNV(acc[j], hs, oh + 16u * j, N, false);
    }
}
