#version 450
// Two products of the chunked Mamba-2 forward (ssm_ref/chunked.py) on the matrix units, as
// accurate as float32: the chunk states ZF and the output Y of chunk_gemm.comp, for devices whose
// DeviceInfo.matrix_f16 is set (VK_NV_cooperative_matrix: 16 x 16 x 16 float16 products summed in
// float32).
//
//   MODE 2  ZF  hs[p][n] = sum_s (dout_s d_s x_s[p]) B_s[n]                       (P x N, K = CL)
//   MODE 4  Y   y[t][p]  = sum_s mcb[t][s] (d_s x_s[p]) + sum_n (din_t C_t[n]) hs[p][n]
//                                                                     (CL x P, K = CL + N)
//
// Y is one product of the row [mcb[t] | din_t C_t] by the column [u[., p] ; hs[p]]: mcb is 0 above
// the diagonal and past the chunk's end (chunk_decay.comp writes it so), and its tiles that lie
// wholly above the diagonal are left out.
//
// Each float32 operand value v is split in two float16 values, v s = hi + lo / 2048 (hi: v s cut
// to float16, lo: the rest to float16; split()), where s = 2^-e is a power of two per row of the
// left operand and per column of the right one that brings the row's (column's) largest magnitude
// into [1/2, 1) -- for Y per part of the contraction (its tokens, N), each part summed apart. The three products 2048 hi.hi' + hi.lo' + lo.hi' are summed on
// the matrix units in float32 (lo.lo' lies below float32's rounding), and the tile is scaled
// back by 2^(e_row + e_col - 11) on its way out. The sum's error relative to float64 is that of a
// float32 sum, about 1e-6 of (the row's largest value) (the column's largest value) times the
// terms; a value below about 2^-35 of its row's (column's) largest is lost, as it is below
// float32's rounding of the sum. A value that is not finite makes its whole row or column nan
// (its split or its scale is nan), and Y raises the flag: the host recomputes the call with the
// token-sequential kernels (chunk_common.glsl, binding 18), as for the float32 kernels.
//
// A workgroup of NSG subgroups computes an RB x CBK tile of one (sequence, chunk, head) matrix:
// first every slice of both operands into registers, read once, and the rows' and columns' largest
// magnitudes over the whole contraction (the bits of |v|: a maximum over the lanes that hold a
// row, then one shared-memory atomicMax per row and lane group), then KS-long slices split into shared memory
// (16-byte stores, eight float16 values each) and multiplied, each subgroup TPS 16 x 16 tiles of
// one row of tiles; the tiles go through shared memory to be scaled back and written 16 bytes at
// a time. Fixed orders throughout: reruns give the same bits.
//
// Defines: chunk_common's, MODE, SGS (the device's subgroup size; WG = NSG * SGS), RB, CBK (the
// tile, multiples of 16 that divide the matrix), KS (the slice: a multiple of 16 dividing CL and,
// for Y, N). Bindings and push constants: glsl/chunk_common.glsl.

#extension GL_EXT_control_flow_attributes : enable
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "chunk_common.glsl"

#if MODE != 2 && MODE != 4
#error "MODE 2 (ZF) or 4 (Y)"
#endif
const uint NSG = WG / SGS;
const uint RT = RB / 16u, CT = CBK / 16u;
const uint TPS = RT * CT / NSG;              // tiles per subgroup, in one row of tiles
#if RB % 16 != 0 || CBK % 16 != 0 || KS % 16 != 0 || CL % KS != 0 || WG % SGS != 0
#error "RB, CBK and KS multiples of 16; KS divides CL; WG a multiple of SGS"
#endif
#if (RB / 16) * (CBK / 16) % (WG / SGS) != 0 || (RB / 16) * (CBK / 16) / (WG / SGS) > CBK / 16 || (CBK / 16) % ((RB / 16) * (CBK / 16) / (WG / SGS)) != 0
#error "the tiles split evenly over the subgroups, each taking part of one row of tiles"
#endif

#if MODE == 2
const uint ROWS = PD, COLS = ND, K2 = 0u;
#else
#if ND % KS != 0 || RB != CL
#error "KS divides N; Y's tile holds the chunk's rows"
#endif
const uint ROWS = CL, COLS = PD, K2 = ND;
#endif
const uint NS1 = CL / KS, NSL = NS1 + K2 / KS;   // slices: over the chunk's tokens, then over N

// Shared memory, in 16-byte units (eight float16 values) for the operands' slices; rows padded by
// eight values so that the matrix loads of consecutive rows fall in distinct banks.
#if MODE == 2
const uint AROWS = KS, ASTR = RB + 8u;        // A's slice as [token][p]: A (p x token) column-major
#else
const uint AROWS = RB, ASTR = KS + 8u;        // [t][k]: row-major
#endif
const uint BSTR = CBK + 8u;                   // [k][col]: row-major (ZF; Y over the tokens)
const uint BTSTR = KS + 8u;                   // [col][k]: column-major (Y over N: hs rows run along n)
const uint BSZ1 = KS * BSTR, BSZ2 = MODE == 4 ? CBK * BTSTR : 0u;
const uint BSZ = (BSZ1 > BSZ2 ? BSZ1 : BSZ2) / 8u;
shared uvec4 sAh[AROWS * ASTR / 8u], sAl[AROWS * ASTR / 8u];
shared uvec4 sBh[BSZ], sBl[BSZ];
const uint OSTR = CBK + 4u;
shared float sOut[RB * OSTR];                 // the tile, before it is scaled back
// Y's two parts of the contraction (over the chunk's tokens, over N) take scales of their own, and
// accumulators of their own: its rows' largest values often lie in one part (M o CB), its
// columns' in the other (hs).
const uint NSEG = MODE == 4 ? 2u : 1u;
shared uint rmax[NSEG * RB], cmax[NSEG * CBK]; // bits of the largest |v| of each row (column), per part
shared float rsc[NSEG * RB], csc[NSEG * CBK];  // their scales 2^-e
shared int rex[NSEG * RB], cex[NSEG * CBK];    // ... and exponents e
shared float sd[CL], sdi[CL], sdo[CL];        // d_t = softplus(dt), din_t, dout_t

// 16-byte views of the inputs and tables the slices are read from (chunk_common's bindings)
layout(std430, binding = 0) readonly buffer Bx4 { vec4 x4[]; };
layout(std430, binding = 3) readonly buffer BB4 { vec4 b4[]; };
layout(std430, binding = 4) readonly buffer BC4 { vec4 c4[]; };
layout(std430, binding = 6) buffer Bhs4 { vec4 hs4[]; };
layout(std430, binding = 9) buffer Bmcb4 { vec4 mcb4[]; };
layout(std430, binding = 13) buffer Bout4 { vec4 outv4[]; };

#define F16M fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define F32M fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>

uint i, c, h, g, Lc, hmat, r0, c0;
bool ax, ab, ac;           // the call's offsets of x, B, C are multiples of 4: 16-byte loads

uint tk(uint t) { return tok(i, c, min(t, Lc - 1u)); }

vec4 x_at(uint at) { return ax ? x4[at >> 2] : vec4(x[at], x[at + 1u], x[at + 2u], x[at + 3u]); }
vec4 b_at(uint at) { return ab ? b4[at >> 2] : vec4(Bm[at], Bm[at + 1u], Bm[at + 2u], Bm[at + 3u]); }
vec4 c_at(uint at) { return ac ? c4[at >> 2] : vec4(Cm[at], Cm[at + 1u], Cm[at + 2u], Cm[at + 3u]); }

// e with m = 2^e f, f in [1/2, 1), for the bits of m >= 0 (0 for m = 0), kept where 2^-e is a
// normal float32.
int exp_of(uint bits) {
    int e;
    frexp(uintBitsToFloat(bits), e);
    return bits == 0u ? 0 : clamp(e, -125, 126);
}

// A unit is eight consecutive values of one operand along its contiguous direction in memory.
// Each function gives unit u of slice j: its values (v0, v1), the first row (column) they scale
// by (``at``; ``per8``: the eight values have rows (columns) at .. at + 7, else all ``at``), and
// its 16-byte slot in the slice's shared array.
const uint NUA = KS * RB / 8u;                // units of A per slice
const uint NUB1 = KS * CBK / 8u;             // ... of B (both of Y's parts alike)

#if MODE == 2
// A = (dout_s d_s x_s[p]) over p (rows) and the chunk's tokens s
void a_unit(uint j, uint u, out vec4 v0, out vec4 v1, out uint at, out bool per8, out uint slot, bool load) {
    uint kt = u / (RB / 8u), q = u % (RB / 8u);
    uint s = j * KS + kt, p = r0 + q * 8u;
    uint xa = pc.o_x + (tk(s) * pc.H + h) * PD + p;
    float w = s < Lc ? sd[s] * sdo[s] : 0.0;
    v0 = load && s < Lc ? x_at(xa) * w : vec4(0.0);
    v1 = load && s < Lc ? x_at(xa + 4u) * w : vec4(0.0);
    at = q * 8u; per8 = true; slot = kt * (ASTR / 8u) + q;
}
// B = B_s[n] over the tokens s and n (columns)
void b_unit(uint j, uint u, out vec4 v0, out vec4 v1, out uint at, out bool per8, out uint slot, bool load) {
    uint kt = u / (CBK / 8u), q = u % (CBK / 8u);
    uint s = j * KS + kt;
    uint ba = pc.o_B + (tk(s) * pc.G + g) * ND + c0 + q * 8u;
    v0 = load && s < Lc ? b_at(ba) : vec4(0.0);
    v1 = load && s < Lc ? b_at(ba + 4u) : vec4(0.0);
    at = q * 8u; per8 = true; slot = kt * (BSTR / 8u) + q;
}
#else
// A = [mcb[t] | din_t C_t] over t (rows) and the tokens, then n
void a_unit(uint j, uint u, out vec4 v0, out vec4 v1, out uint at, out bool per8, out uint slot, bool load) {
    uint t = u / (KS / 8u), q = u % (KS / 8u);
    if (j < NS1) {                            // mcb: 0 above the diagonal and past the chunk
        uint ma = (hmat * CL * CL + t * CL + j * KS + q * 8u) >> 2;
        v0 = load ? mcb4[ma] : vec4(0.0);
        v1 = load ? mcb4[ma + 1u] : vec4(0.0);
    } else {
        uint ca = pc.o_C + (tk(t) * pc.G + g) * ND + (j - NS1) * KS + q * 8u;
        float w = t < Lc ? sdi[t] : 0.0;
        v0 = load && t < Lc ? c_at(ca) * w : vec4(0.0);
        v1 = load && t < Lc ? c_at(ca + 4u) * w : vec4(0.0);
    }
    at = t; per8 = false; slot = t * (ASTR / 8u) + q;
}
// B = [u[., p] ; hs[p]] over the tokens, then n, and p (columns)
void b_unit(uint j, uint u, out vec4 v0, out vec4 v1, out uint at, out bool per8, out uint slot, bool load) {
    if (j < NS1) {                            // u_s[p] = d_s x_s[p], stored [s][p]
        uint kt = u / (CBK / 8u), q = u % (CBK / 8u);
        uint s = j * KS + kt;
        uint xa = pc.o_x + (tk(s) * pc.H + h) * PD + c0 + q * 8u;
        float w = s < Lc ? sd[s] : 0.0;
        v0 = load && s < Lc ? x_at(xa) * w : vec4(0.0);
        v1 = load && s < Lc ? x_at(xa + 4u) * w : vec4(0.0);
        at = q * 8u; per8 = true; slot = kt * (BSTR / 8u) + q;
    } else {                                  // hs[p][n], stored [p][n]
        uint pl = u / (KS / 8u), q = u % (KS / 8u);
        uint ha = (hmat * PD * ND + (c0 + pl) * ND + (j - NS1) * KS + q * 8u) >> 2;
        v0 = load ? hs4[ha] : vec4(0.0);
        v1 = load ? hs4[ha + 1u] : vec4(0.0);
        at = pl; per8 = false; slot = pl * (BTSTR / 8u) + q;
    }
}
#endif

// The operands, loaded once: unit k of slice j of this thread is u = lid + k WG.
const uint UA = (NUA + WG - 1u) / WG, UB = (NUB1 + WG - 1u) / WG;
vec4 ra0[NSL * UA], ra1[NSL * UA], rb0[NSL * UB], rb1[NSL * UB];

// The largest of ``m`` over the lanes whose units scale by the same row (column): every
// ``period``-th lane for units along the rows (eight rows each, repeating every ``period`` units),
// else runs of ``period`` lanes (one row per run).
uint lanes_max(uint m, uint period, bool strided) {
    if (strided) {
        [[unroll]] for (uint x = period; x < SGS; x <<= 1) m = max(m, subgroupShuffleXor(m, x));
    } else {
        [[unroll]] for (uint x = 1u; x < period; x <<= 1) m = max(m, subgroupShuffleXor(m, x));
    }
    return m;
}

// Fold the eight values' magnitudes (``per8``: eight rows) or their largest (one row) into
// rmax / cmax from the lanes that hold them.
void note8(bool rows, uint at, uint period, bool on, uvec4 m0, uvec4 m1) {
    uint lane = gl_SubgroupInvocationID;
    [[unroll]] for (uint q = 0; q < 4u; ++q) {
        uint a = lanes_max(m0[q], period, true), b = lanes_max(m1[q], period, true);
        if (on && lane < period) {
            if (rows) { atomicMax(rmax[at + q], a); atomicMax(rmax[at + 4u + q], b); }
            else { atomicMax(cmax[at + q], a); atomicMax(cmax[at + 4u + q], b); }
        }
    }
}
void note1(bool rows, uint at, uint period, bool on, uint m) {
    m = lanes_max(m, period, false);
    if (on && gl_SubgroupInvocationID % period == 0u) {
        if (rows) atomicMax(rmax[at], m); else atomicMax(cmax[at], m);
    }
}
uvec4 mag(vec4 v) { return floatBitsToUint(abs(v)); }
uint mag1(vec4 v0, vec4 v1) { uvec4 m = max(mag(v0), mag(v1)); return max(max(m.x, m.y), max(m.z, m.w)); }

// w = hi + lo / 2048 for the eight scaled values w = v s, packed as float16 pairs. hi is w cut to
// a float16 value: to 11 significant bits by an integer mask, or below float16's normal range
// (2^-14) to a multiple of 2^-24 (a conversion to float16 and back instead could be folded away by
// the compiler), so that w - hi is exact in float32 and lo holds it to 11 bits or to 2^-24 / 2048.
vec4 hi_part(vec4 w) {
    vec4 m = uintBitsToFloat(floatBitsToUint(w) & 0xFFFFE000u);
    vec4 sub = trunc(w * 16777216.0) * (1.0 / 16777216.0);
    return mix(m, sub, lessThan(abs(w), vec4(1.0 / 16384.0)));
}
void split(vec4 v0, vec4 v1, vec4 s0, vec4 s1, out uvec4 hi, out uvec4 lo) {
    vec4 w0 = v0 * s0, w1 = v1 * s1;
    vec4 m0 = hi_part(w0), m1 = hi_part(w1);
    f16vec4 h0 = f16vec4(m0), h1 = f16vec4(m1);
    f16vec4 l0 = f16vec4((w0 - m0) * 2048.0), l1 = f16vec4((w1 - m1) * 2048.0);
    hi = uvec4(packFloat2x16(h0.xy), packFloat2x16(h0.zw), packFloat2x16(h1.xy), packFloat2x16(h1.zw));
    lo = uvec4(packFloat2x16(l0.xy), packFloat2x16(l0.zw), packFloat2x16(l1.xy), packFloat2x16(l1.zw));
}

void scales(bool rows, uint at, bool per8, out vec4 s0, out vec4 s1) {
    if (per8) {
        [[unroll]] for (uint q = 0; q < 4u; ++q) {
            s0[q] = rows ? rsc[at + q] : csc[at + q];
            s1[q] = rows ? rsc[at + 4u + q] : csc[at + 4u + q];
        }
    } else {
        s0 = vec4(rows ? rsc[at] : csc[at]);
        s1 = s0;
    }
}

// Slice j from the registers into shared memory, split.
void stage(uint j) {
    uint lid = gl_LocalInvocationIndex;
    [[unroll]] for (uint k = 0; k < UA; ++k) {
        uint u = lid + k * WG;
        if (u < NUA) {
            vec4 v0, v1, s0, s1; uint at, slot; bool per8;
            uvec4 hi, lo;
            a_unit(j, u, v0, v1, at, per8, slot, false);
            scales(true, (j < NS1 ? 0u : RB) + at, per8, s0, s1);
            split(ra0[j * UA + k], ra1[j * UA + k], s0, s1, hi, lo);
            sAh[slot] = hi; sAl[slot] = lo;
        }
    }
    [[unroll]] for (uint k = 0; k < UB; ++k) {
        uint u = lid + k * WG;
        if (u < NUB1) {
            vec4 v0, v1, s0, s1; uint at, slot; bool per8;
            uvec4 hi, lo;
            b_unit(j, u, v0, v1, at, per8, slot, false);
            scales(false, (j < NS1 ? 0u : CBK) + at, per8, s0, s1);
            split(rb0[j * UB + k], rb1[j * UB + k], s0, s1, hi, lo);
            sBh[slot] = hi; sBl[slot] = lo;
        }
    }
}

void main() {
    const uint NRB = ROWS / RB, NCB = COLS / CBK;
    uint wg = wg_index();
    if (wg >= pc.S * pc.NCH * pc.H * NRB * NCB) return;     // uniform over the workgroup
    uint bat = wg / (NRB * NCB), rem = wg % (NRB * NCB);
    r0 = (rem / NCB) * RB;
    c0 = (rem % NCB) * CBK;
    i = bat / (pc.NCH * pc.H);
    c = (bat / pc.H) % pc.NCH;
    h = bat % pc.H;
    g = h / (pc.H / pc.G);
    Lc = chunk_len(c);
    hmat = head_mat(i, c, h);
    ax = (pc.o_x & 3u) == 0u;
    ab = (pc.o_B & 3u) == 0u;
    ac = (pc.o_C & 3u) == 0u;
    uint lid = gl_LocalInvocationIndex;
    for (uint t = lid; t < CL; t += WG) {
        bool on = t < Lc;
        sd[t] = on ? softplus(dt[pc.o_dt + tk(t) * pc.H + h]) : 0.0;
        sdi[t] = on ? dec[hmat * DEC + t] : 0.0;
        sdo[t] = on ? dec[hmat * DEC + CL + t] : 0.0;
    }
    for (uint r = lid; r < NSEG * RB; r += WG) rmax[r] = 0u;
    for (uint q = lid; q < NSEG * CBK; q += WG) cmax[q] = 0u;
    barrier();

    // Every slice of both operands into registers, and the rows' and columns' largest magnitudes
    // over the whole contraction.
    [[unroll]] for (uint k = 0; k < UA; ++k) {
        uint u = lid + k * WG;
        bool on = u < NUA;
        uvec4 m0 = uvec4(0u), m1 = uvec4(0u);
        uint at = 0u, m2 = 0u;
        [[unroll]] for (uint j = 0; j < NSL; ++j) {
            vec4 v0 = vec4(0.0), v1 = vec4(0.0); uint slot; bool per8;
            if (on) a_unit(j, u, v0, v1, at, per8, slot, true);
            ra0[j * UA + k] = v0; ra1[j * UA + k] = v1;
            if (j < NS1) { m0 = max(m0, mag(v0)); m1 = max(m1, mag(v1)); }
            else m2 = max(m2, mag1(v0, v1));
        }
#if MODE == 2
        note8(true, at, RB / 8u, on, m0, m1);
#else
        note1(true, at, KS / 8u, on, max(max(max(m0.x, m0.y), max(m0.z, m0.w)), max(max(m1.x, m1.y), max(m1.z, m1.w))));
        note1(true, RB + at, KS / 8u, on, m2);
#endif
    }
    [[unroll]] for (uint k = 0; k < UB; ++k) {
        uint u = lid + k * WG;
        bool on = u < NUB1;
        uvec4 m0 = uvec4(0u), m1 = uvec4(0u);
        uint m2 = 0u, at = 0u, at2 = 0u;
        [[unroll]] for (uint j = 0; j < NSL; ++j) {
            vec4 v0 = vec4(0.0), v1 = vec4(0.0); uint slot, a; bool per8;
            if (on) b_unit(j, u, v0, v1, a, per8, slot, true);
            rb0[j * UB + k] = v0; rb1[j * UB + k] = v1;
            if (j < NS1) { m0 = max(m0, mag(v0)); m1 = max(m1, mag(v1)); at = a; }
            else { m2 = max(m2, mag1(v0, v1)); at2 = a; }
        }
        note8(false, at, CBK / 8u, on, m0, m1);
#if MODE == 4
        note1(false, CBK + at2, KS / 8u, on, m2);
#endif
    }
    barrier();
    for (uint r = lid; r < NSEG * RB; r += WG) { int e = exp_of(rmax[r]); rex[r] = e; rsc[r] = ldexp(1.0, -e); }
    for (uint q = lid; q < NSEG * CBK; q += WG) { int e = exp_of(cmax[q]); cex[q] = e; csc[q] = ldexp(1.0, -e); }
    barrier();

    uint tile0 = gl_SubgroupID * TPS;
    uint rt = tile0 / CT, ct0 = tile0 % CT;
    F32M acc[NSEG * TPS];
    [[unroll]] for (uint q = 0; q < NSEG * TPS; ++q) acc[q] = F32M(0.0);
    [[unroll]] for (uint j = 0; j < NSL; ++j) {     // unrolled: the registers' indices are constants
        if (j > 0u) barrier();                 // every subgroup has read the slice before
        stage(j);
        barrier();
        [[unroll]] for (uint kk = 0; kk < KS / 16u; ++kk) {
#if MODE == 4
            if (j < NS1 && (j * KS) / 16u + kk > rt) continue;   // above the diagonal: mcb is 0
            const bool bcol = j >= NS1;
#else
            const bool bcol = false;
#endif
            F16M ah, al, a2;
#if MODE == 2
            coopMatLoadNV(ah, sAh, (kk * 16u * ASTR + rt * 16u) / 8u, ASTR / 8u, true);
            coopMatLoadNV(al, sAl, (kk * 16u * ASTR + rt * 16u) / 8u, ASTR / 8u, true);
#else
            coopMatLoadNV(ah, sAh, (rt * 16u * ASTR + kk * 16u) / 8u, ASTR / 8u, false);
            coopMatLoadNV(al, sAl, (rt * 16u * ASTR + kk * 16u) / 8u, ASTR / 8u, false);
#endif
            a2 = ah * float16_t(2048.0);
            [[unroll]] for (uint q = 0; q < TPS; ++q) {
                uint ct = ct0 + q;
                F16M bh, bl;
                if (bcol) {
                    coopMatLoadNV(bh, sBh, (ct * 16u * BTSTR + kk * 16u) / 8u, BTSTR / 8u, true);
                    coopMatLoadNV(bl, sBl, (ct * 16u * BTSTR + kk * 16u) / 8u, BTSTR / 8u, true);
                } else {
                    coopMatLoadNV(bh, sBh, (kk * 16u * BSTR + ct * 16u) / 8u, BSTR / 8u, false);
                    coopMatLoadNV(bl, sBl, (kk * 16u * BSTR + ct * 16u) / 8u, BSTR / 8u, false);
                }
                uint aq = (bcol ? TPS : 0u) + q;
                acc[aq] = coopMatMulAddNV(a2, bh, acc[aq]);
                acc[aq] = coopMatMulAddNV(ah, bl, acc[aq]);
                acc[aq] = coopMatMulAddNV(al, bh, acc[aq]);
            }
        }
    }

    // Epilogue: the tiles through shared memory, scaled back by 2^(e_row + e_col - 11) (in two
    // steps, so that no intermediate overflows or underflows where the result does not), Y's two
    // parts one after the other.
    const uint EPT = (RB * CBK / 4u + WG - 1u) / WG;    // 16-byte groups of the tile per thread
    vec4 res[EPT];
    [[unroll]] for (uint seg = 0; seg < NSEG; ++seg) {
        if (seg > 0u) barrier();              // the first part read out
        [[unroll]] for (uint q = 0; q < TPS; ++q)
            coopMatStoreNV(acc[seg * TPS + q], sOut, rt * 16u * OSTR + (ct0 + q) * 16u, OSTR, false);
        barrier();
        [[unroll]] for (uint k = 0; k < EPT; ++k) {
            uint e = lid + k * WG;
            if (e < RB * CBK / 4u) {
                uint r = e / (CBK / 4u), col = (e % (CBK / 4u)) * 4u;
                [[unroll]] for (uint q = 0; q < 4u; ++q) {
                    int E = rex[seg * RB + r] + cex[seg * CBK + col + q] - 11;
                    float v = ldexp(ldexp(sOut[r * OSTR + col + q], E / 2), E - E / 2);
                    res[k][q] = seg == 0u ? v : res[k][q] + v;
                }
            }
        }
    }
    [[unroll]] for (uint k = 0; k < EPT; ++k) {
        uint e = lid + k * WG;
        if (e >= RB * CBK / 4u) break;
        uint r = e / (CBK / 4u), col = (e % (CBK / 4u)) * 4u;
        vec4 v = res[k];
#if MODE == 2
        hs4[(hmat * PD * ND + (r0 + r) * ND + c0 + col) >> 2] = v;
#else
        if (r < Lc) {
            uint at = pc.o_out + (tk(r) * pc.H + h) * PD + c0 + col;
            if ((at & 3u) == 0u) {
                outv4[at >> 2] = v;
            } else {
                outv[at] = v.x; outv[at + 1u] = v.y; outv[at + 2u] = v.z; outv[at + 3u] = v.w;
            }
            if (any(not(lessThanEqual(abs(v), vec4(3.4028234664e38))))) atomicOr(flag[0], 1u);
        }
#endif
    }
}
