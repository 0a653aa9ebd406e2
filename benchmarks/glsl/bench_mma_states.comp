#version 450
// Probe, not a scan kernel: the chunked Mamba-2 forward's chunk states (chunk_gemm.comp's ZF) on
// the matrix units, error-compensated as in bench_mma.comp. For sequence s, chunk c, head h:
//   hs[s, c, h][p][n] = sum over the chunk's tokens t of (w[t, h] x[t, h, p]) B[t, g, n]
// (w: the per-token factor, dout d in the scan), x (S T, H, P), w (S T, H), B (S T, G, N) row-major,
// hs (S NCH H, P, N). Each 16-row block of the left operand (16 values of p) and 16-column block of
// B is scaled by a power of two over the chunk's tokens (a first pass finds their largest values),
// split into float16 hi + lo / 2048, and 2048 hi.hi + hi.lo + lo.hi is summed on the matrix units
// into float32. Tokens past the sequence's end count as 0.
// Defines: WG (= 4 subgroups), CL (chunk), P = 64, N = 128, TERMS (1: hi.hi alone), KEEP (1: the
// first pass keeps every slice in registers for the second, instead of loading them again).
// Bindings: 0 x, 1 w, 2 B, 3 hs. Push constants: S, T, H, G, NCH.
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : enable
layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = 0) readonly buffer Bx { vec4 x4[]; };
layout(std430, binding = 1) readonly buffer Bw { float wv[]; };
layout(std430, binding = 2) readonly buffer BB { vec4 b4[]; };
layout(std430, binding = 3) writeonly buffer Bh { float hs[]; };
layout(push_constant) uniform PC { uint S, T, H, G, NCH; } pc;

#if P != 64 || N != 128
#error "P = 64, N = 128"
#endif
const uint KS = 32u, NSL = CL / KS;
const uint AST = P + 8u, BST = N + 8u;          // row strides (halves) of the staged slices
shared float16_t ahi[KS * AST], alo[KS * AST], bhi[KS * BST], blo[KS * BST];   // [token][p], [token][n]
shared uint amax[P / 16u], bmax[N / 16u];

#define F16M fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define F32M fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>

const uint NA = KS * P / 4u / WG, NB = KS * N / 4u / WG;   // vec4s per thread per slice
#if KEEP
vec4 fa[NSL][NA], fb[NSL][NB];
#define FA(sl, i) fa[sl][i]
#define FB(sl, i) fb[sl][i]
#else
vec4 fa[1][NA], fb[1][NB];
#define FA(sl, i) fa[0][i]
#define FB(sl, i) fb[0][i]
#endif

int exp_of(uint bits) {        // e with max = m 2^e, m in [0.5, 1); 0 for 0
    int e;
    frexp(uintBitsToFloat(bits), e);
    return bits == 0u ? 0 : clamp(e, -125, 126);
}

void split(vec4 v, out f16vec4 h, out f16vec4 l) {
    vec4 hm = uintBitsToFloat(floatBitsToUint(v) & 0xFFFFE000u);
    h = f16vec4(hm);
    l = f16vec4((v - hm) * 2048.0);
}

uint seq, ch, head, grp, t0, Lc;

// slice sl: vec4 v of A is token v / 16, p = 4 (v % 16); of B token v / 32, n = 4 (v % 32)
void fetch(uint sl, uint t) {
    [[unroll]] for (uint i = 0; i < NA; ++i) {
        uint v = t + WG * i, k = sl * KS + v / 16u;
        uint tok = seq * pc.T + t0 + min(k, Lc - 1u);
        vec4 xv = x4[(tok * pc.H + head) * (P / 4u) + v % 16u] * wv[tok * pc.H + head];
        FA(sl, i) = k < Lc ? xv : vec4(0.0);
    }
    [[unroll]] for (uint i = 0; i < NB; ++i) {
        uint v = t + WG * i, k = sl * KS + v / 32u;
        uint tok = seq * pc.T + t0 + min(k, Lc - 1u);
        vec4 bv = b4[(tok * pc.G + grp) * (N / 4u) + v % 32u];
        FB(sl, i) = k < Lc ? bv : vec4(0.0);
    }
}

void main() {
    uint wid = gl_WorkGroupID.x, t = gl_LocalInvocationIndex, sg = gl_SubgroupID;
    head = wid % pc.H;
    ch = (wid / pc.H) % pc.NCH;
    seq = wid / (pc.H * pc.NCH);
    grp = head / (pc.H / pc.G);
    t0 = ch * CL;
    Lc = min(CL, pc.T - t0);
    uint sr = sg >> 1, sc = sg & 1u;           // subgroup's 32 x 64 quarter: rows sr * 32, cols sc * 64
    if (t < P / 16u) amax[t] = 0u;
    if (t < N / 16u) bmax[t] = 0u;
    barrier();
    vec4 ma = vec4(0.0), mb = vec4(0.0);       // a thread's p (n) are the same in every slice
    [[unroll]] for (uint sl = 0; sl < NSL; ++sl) {
        fetch(sl, t);
        [[unroll]] for (uint i = 0; i < NA; ++i) ma = max(ma, abs(FA(sl, i)));
        [[unroll]] for (uint i = 0; i < NB; ++i) mb = max(mb, abs(FB(sl, i)));
    }
    atomicMax(amax[(t % 16u) / 4u], floatBitsToUint(max(max(ma.x, ma.y), max(ma.z, ma.w))));
    atomicMax(bmax[(t % 32u) / 4u], floatBitsToUint(max(max(mb.x, mb.y), max(mb.z, mb.w))));
    barrier();
    float sa = ldexp(1.0, -exp_of(amax[(t % 16u) / 4u])), sb = ldexp(1.0, -exp_of(bmax[(t % 32u) / 4u]));
    F32M acc[2][4];
    [[unroll]] for (uint i = 0; i < 2; ++i) [[unroll]] for (uint j = 0; j < 4; ++j) acc[i][j] = F32M(0.0);
    [[unroll]] for (uint sl = 0; sl < NSL; ++sl) {
#if !KEEP
        fetch(sl, t);
#endif
        if (sl > 0u) barrier();               // the slice before has been read
        [[unroll]] for (uint i = 0; i < NA; ++i) {
            uint v = t + WG * i, k = v / 16u, p4 = v % 16u;
            f16vec4 h, l;
            split(FA(sl, i) * sa, h, l);
            [[unroll]] for (uint q = 0; q < 4; ++q) { ahi[k * AST + p4 * 4u + q] = h[q]; alo[k * AST + p4 * 4u + q] = l[q]; }
        }
        [[unroll]] for (uint i = 0; i < NB; ++i) {
            uint v = t + WG * i, k = v / 32u, n4 = v % 32u;
            f16vec4 h, l;
            split(FB(sl, i) * sb, h, l);
            [[unroll]] for (uint q = 0; q < 4; ++q) { bhi[k * BST + n4 * 4u + q] = h[q]; blo[k * BST + n4 * 4u + q] = l[q]; }
        }
        barrier();
        [[unroll]] for (uint kk = 0; kk < KS; kk += 16u) {
            F16M ah[2], al[2];
            [[unroll]] for (uint i = 0; i < 2; ++i) {
                uint r = sr * 32u + i * 16u;
                coopMatLoadNV(ah[i], ahi, kk * AST + r, AST, true);
                coopMatLoadNV(al[i], alo, kk * AST + r, AST, true);
            }
            [[unroll]] for (uint j = 0; j < 4; ++j) {
                F16M bh, bl;
                uint c = sc * 64u + j * 16u;
                coopMatLoadNV(bh, bhi, kk * BST + c, BST, false);
                coopMatLoadNV(bl, blo, kk * BST + c, BST, false);
                [[unroll]] for (uint i = 0; i < 2; ++i) {
#if TERMS > 1
                    acc[i][j] = coopMatMulAddNV(ah[i] * float16_t(2048.0), bh, acc[i][j]);
                    acc[i][j] = coopMatMulAddNV(ah[i], bl, acc[i][j]);
                    acc[i][j] = coopMatMulAddNV(al[i], bh, acc[i][j]);
#else
                    acc[i][j] = coopMatMulAddNV(ah[i], bh, acc[i][j]);
#endif
                }
            }
        }
    }
    uint base = wid * P * N;
    [[unroll]] for (uint i = 0; i < 2; ++i) [[unroll]] for (uint j = 0; j < 4; ++j) {
        int e = exp_of(amax[sr * 2u + i]) + exp_of(bmax[sc * 4u + j]) - (TERMS > 1 ? 11 : 0);
        acc[i][j] = acc[i][j] * ldexp(1.0, e / 2) * ldexp(1.0, e - e / 2);
        coopMatStoreNV(acc[i][j], hs, base + (sr * 32u + i * 16u) * N + sc * 64u + j * 16u, N, false);
    }
}
