#version 450
// Throughput and accuracy probe, not a scan kernel: float32 products out[b] = A[b] . B[b] (A: 64 x
// KD, B: KD x 64, both row-major, batch b = workgroup) on the matrix units, each operand split
// into two float16 parts: a = (hi + lo / 2048) / s with s a power of two per 16-row block of A
// (16-column block of B) over all of KD, so that |a s| < 1 (a first pass over the operands finds
// the blocks' largest values). 2048 hi.hi + hi.lo + lo.hi is taken on the matrix units into one
// float32 sum per block (no sums of matrices: Debian 12's glslc -O crashes on them) and scaled
// back as it is stored. TERMS = 1 takes hi.hi alone (plain float16 products, for comparison).
// ROWSCALE = 1: a scale per row of A and per column of B instead (the tile then goes through
// shared memory to be scaled back).
// Four subgroups (WG = 4 * SGS), each a 32 x 32 quarter of the tile as 2 x 2 16 x 16 blocks.
// Bindings: 0 A, 1 B, 2 out. Push constants: batch.
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_control_flow_attributes : enable
layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = 0) readonly buffer Ba { vec4 a4[]; };
layout(std430, binding = 1) readonly buffer Bb { vec4 b4[]; };
layout(std430, binding = 2) writeonly buffer Bo { float outv[]; };
layout(push_constant) uniform PC { uint batch; } pc;

#if WG != 4 * SGS
#error "four subgroups"
#endif
const uint KS = 32u, NSL = KD / KS;
const uint AST = KS + 8u;        // row stride (halves) of A's slice in shared memory
const uint BST = 64u + 8u;       // row stride of B's slice
shared float16_t ahi[64 * AST], alo[64 * AST], bhi[KS * BST], blo[KS * BST];
shared uint amax[4], bmax[4];   // float bits of the largest |value| per block

#define F16M fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define F32M fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>

// A slice: 64 rows x 32 k = 512 vec4; thread t takes vec4s t + WG * i (row (t + WG i) / 8).
const uint NA = 512u / WG, NB = 512u / WG;   // B slice: 32 k x 64 cols = 512 vec4 (row k, 16 per row)
vec4 fa[NA], fb[NB];

float scale_of(uint bits) {    // 2^-e with max = m 2^e, m in [0.5, 1): |value * scale| < 1
    int e;
    frexp(uintBitsToFloat(bits), e);
    return bits == 0u ? 1.0 : ldexp(1.0, -e);
}

// x = hi + lo / 2048: hi is x cut to float16's 11 significant bits with integer operations (a
// conversion there and back could be folded away by a compiler), lo the rest, exact in float32.
void split(vec4 x, out f16vec4 h, out f16vec4 l) {
    vec4 hm = uintBitsToFloat(floatBitsToUint(x) & 0xFFFFE000u);
    h = f16vec4(hm);
    l = f16vec4((x - hm) * 2048.0);
}

#if ROWSCALE
shared uint rmax[64], cmax[64];   // per row of A, per column of B
shared float ep[64 * 64];         // the tile, before its rows and columns are scaled back
#define SA(i, r) scale_of(rmax[r])
#define SB4(c4) vec4(scale_of(cmax[c4 * 4u]), scale_of(cmax[c4 * 4u + 1u]), scale_of(cmax[c4 * 4u + 2u]), scale_of(cmax[c4 * 4u + 3u]))
#else
#define SA(i, r) sa[i]
#define SB4(c4) sb
#endif

void main() {
    uint b = gl_WorkGroupID.x, t = gl_LocalInvocationIndex, sg = gl_SubgroupID;
    uint sr = sg >> 1, sc = sg & 1u;
    if (t < 4u) { amax[t] = 0u; bmax[t] = 0u; }
#if ROWSCALE
    for (uint r = t; r < 64u; r += WG) { rmax[r] = 0u; cmax[r] = 0u; }
#endif
    barrier();
    // the blocks' largest values: A's row block of vec4 v is v / 128 (one per subgroup of 32 or
    // more); B's column block is (v % 16) / 4
    vec4 ma[NA], mb = vec4(0.0);
    [[unroll]] for (uint i = 0; i < NA; ++i) ma[i] = vec4(0.0);
    for (uint sl = 0; sl < NSL; ++sl) {
        [[unroll]] for (uint i = 0; i < NA; ++i) {
            uint v = t + WG * i, r = v / 8u, k4 = v % 8u;
            ma[i] = max(ma[i], abs(a4[(b * 64u * KD + r * KD + sl * KS) / 4u + k4]));
        }
        [[unroll]] for (uint i = 0; i < NB; ++i) {
            uint v = t + WG * i, k = v / 16u, c4 = v % 16u;
            mb = max(mb, abs(b4[(b * KD * 64u + (sl * KS + k) * 64u) / 4u + c4]));
        }
    }
#if ROWSCALE
    [[unroll]] for (uint i = 0; i < NA; ++i)
        atomicMax(rmax[(t + WG * i) / 8u], floatBitsToUint(max(max(ma[i].x, ma[i].y), max(ma[i].z, ma[i].w))));
    [[unroll]] for (uint q = 0; q < 4; ++q) atomicMax(cmax[(t % 16u) * 4u + q], floatBitsToUint(mb[q]));
#else
    [[unroll]] for (uint i = 0; i < NA; ++i) {
        float mx = subgroupMax(max(max(ma[i].x, ma[i].y), max(ma[i].z, ma[i].w)));
        if (subgroupElect()) atomicMax(amax[(t + WG * i) / 128u], floatBitsToUint(mx));
    }
    atomicMax(bmax[(t % 16u) / 4u], floatBitsToUint(max(max(mb.x, mb.y), max(mb.z, mb.w))));
#endif
    barrier();
    float sa[NA], sb = scale_of(bmax[(t % 16u) / 4u]);
    [[unroll]] for (uint i = 0; i < NA; ++i) sa[i] = scale_of(amax[(t + WG * i) / 128u]);
    F32M acc[2][2];
    [[unroll]] for (uint i = 0; i < 2; ++i) [[unroll]] for (uint j = 0; j < 2; ++j) acc[i][j] = F32M(0.0);
    for (uint sl = 0; sl < NSL; ++sl) {
        [[unroll]] for (uint i = 0; i < NA; ++i) {
            uint v = t + WG * i, r = v / 8u, k4 = v % 8u;
            fa[i] = a4[(b * 64u * KD + r * KD + sl * KS) / 4u + k4];
        }
        [[unroll]] for (uint i = 0; i < NB; ++i) {
            uint v = t + WG * i, k = v / 16u, c4 = v % 16u;
            fb[i] = b4[(b * KD * 64u + (sl * KS + k) * 64u) / 4u + c4];
        }
        if (sl > 0u) barrier();      // the slice before has been read
        [[unroll]] for (uint i = 0; i < NA; ++i) {
            uint v = t + WG * i, r = v / 8u, k4 = v % 8u;
            vec4 x = fa[i] * SA(i, r);
            f16vec4 h, l;
            split(x, h, l);
            [[unroll]] for (uint q = 0; q < 4; ++q) {
                ahi[r * AST + k4 * 4u + q] = h[q];
                alo[r * AST + k4 * 4u + q] = l[q];
            }
        }
        [[unroll]] for (uint i = 0; i < NB; ++i) {
            uint v = t + WG * i, k = v / 16u, c4 = v % 16u;
            vec4 x = fb[i] * SB4(c4);
            f16vec4 h, l;
            split(x, h, l);
            [[unroll]] for (uint q = 0; q < 4; ++q) {
                bhi[k * BST + c4 * 4u + q] = h[q];
                blo[k * BST + c4 * 4u + q] = l[q];
            }
        }
        barrier();
        [[unroll]] for (uint kk = 0; kk < KS; kk += 16u) {
            F16M ah[2], al[2], bh[2], bl[2];
            [[unroll]] for (uint i = 0; i < 2; ++i) {
                uint r = sr * 32u + i * 16u;
                coopMatLoadNV(ah[i], ahi, r * AST + kk, AST, false);
                coopMatLoadNV(al[i], alo, r * AST + kk, AST, false);
                uint c = sc * 32u + i * 16u;
                coopMatLoadNV(bh[i], bhi, kk * BST + c, BST, false);
                coopMatLoadNV(bl[i], blo, kk * BST + c, BST, false);
            }
            [[unroll]] for (uint i = 0; i < 2; ++i) {
#if TERMS > 1
                F16M ah2 = ah[i] * float16_t(2048.0);
#else
                F16M ah2 = ah[i];
#endif
                [[unroll]] for (uint j = 0; j < 2; ++j) {
                    acc[i][j] = coopMatMulAddNV(ah2, bh[j], acc[i][j]);
#if TERMS > 1
                    acc[i][j] = coopMatMulAddNV(ah[i], bl[j], acc[i][j]);
                    acc[i][j] = coopMatMulAddNV(al[i], bh[j], acc[i][j]);
#endif
                }
            }
        }
    }
#if ROWSCALE
    [[unroll]] for (uint i = 0; i < 2; ++i) [[unroll]] for (uint j = 0; j < 2; ++j)
        coopMatStoreNV(acc[i][j], ep, (sr * 32u + i * 16u) * 64u + sc * 32u + j * 16u, 64u, false);
    barrier();
    for (uint e = t; e < 1024u; e += WG) {       // vec4 e of the tile: row e / 16
        uint r = e / 16u, c4 = e % 16u;
        vec4 v = vec4(ep[e * 4u], ep[e * 4u + 1u], ep[e * 4u + 2u], ep[e * 4u + 3u]);
        vec4 inv = 1.0 / (scale_of(rmax[r]) * SB4(c4) * (TERMS > 1 ? 2048.0 : 1.0));
        v *= inv;
        outv[b * 4096u + e * 4u] = v.x; outv[b * 4096u + e * 4u + 1u] = v.y;
        outv[b * 4096u + e * 4u + 2u] = v.z; outv[b * 4096u + e * 4u + 3u] = v.w;
    }
#else
    [[unroll]] for (uint i = 0; i < 2; ++i) [[unroll]] for (uint j = 0; j < 2; ++j) {
        float inv = 1.0 / (scale_of(amax[sr * 2u + i]) * scale_of(bmax[sc * 2u + j]) * (TERMS > 1 ? 2048.0 : 1.0));
        acc[i][j] = acc[i][j] * inv;
        coopMatStoreNV(acc[i][j], outv, b * 4096u + (sr * 32u + i * 16u) * 64u + sc * 32u + j * 16u, 64u, false);
    }
#endif
}
