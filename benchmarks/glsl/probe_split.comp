#version 450
// Probe, not a scan kernel (benchmarks/vk_split_probe.py): operands of the chunked Mamba-2
// forward's products split once for the matrix units, as ssm_ref/precision.py specifies. One
// workgroup per block of R rows of W entries; each block gets one exponent e (its largest finite
// |entry| scaled into [2^14, 2^15)) and float16 parts hi = f16(v 2^e), lo = f16(v 2^e - hi),
// written where the float32 values lie. Block k, row t, entry j:
//   TOKENS 1  (s, c, hh) = k as (S, NCH, WD); the value at ((s T + c R + t) WD + hh) W + j (x, B:
//             rows are a chunk's tokens), times w[(s T + c R + t) WD + hh] when WEIGHT (w x)
//   TOKENS 0  a block of R W consecutive values, row-major (mcb, the chunk states)
// Defines: WG (256), R, W, TOKENS, WEIGHT. Bindings: 0 v, 1 w, 2 hi, 3 lo, 4 e.
// Push constants: S, T, WD, NCH (TOKENS 1).
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = 0) readonly buffer Bv { float vv[]; };
layout(std430, binding = 1) readonly buffer Bw { float wv[]; };
layout(std430, binding = 2) writeonly buffer Bh { float16_t vhi[]; };
layout(std430, binding = 3) writeonly buffer Bl { float16_t vlo[]; };
layout(std430, binding = 4) writeonly buffer Be { int ev[]; };
layout(push_constant) uniform PC { uint S, T, WD, NCH; } pc;

shared float red[WG];

uint k_, s_, c_, hh_;
uint at(uint q) {            // entry q (row q / W) of block k_
#if TOKENS
    return ((s_ * pc.T + c_ * R + q / W) * pc.WD + hh_) * W + q % W;
#else
    return k_ * R * W + q;
#endif
}
float val(uint q) {
#if WEIGHT
    return wv[((s_ * pc.T + c_ * R + q / W) * pc.WD + hh_)] * vv[at(q)];
#else
    return vv[at(q)];
#endif
}

void main() {
    uint t = gl_LocalInvocationIndex;
    k_ = gl_WorkGroupID.x;
    hh_ = k_ % pc.WD;
    c_ = (k_ / pc.WD) % pc.NCH;
    s_ = k_ / (pc.WD * pc.NCH);
    uint n = R * W;
    float m = 0.0;
    for (uint q = t; q < n; q += WG) {
        float v = val(q);
        if (!isinf(v) && !isnan(v)) m = max(m, abs(v));
    }
    red[t] = m;
    barrier();
    for (uint h2 = WG / 2u; h2 > 0u; h2 >>= 1u) {
        if (t < h2) red[t] = max(red[t], red[t + h2]);
        barrier();
    }
    int ex;
    frexp(red[0], ex);
    int e = red[0] == 0.0 ? 0 : 15 - ex;
    if (t == 0u) ev[k_] = e;
    for (uint q = t; q < n; q += WG) {
        float sv = ldexp(val(q), e);
        float16_t hi = float16_t(sv);
        vhi[at(q)] = hi;
        vlo[at(q)] = (isinf(sv) || isnan(sv)) ? float16_t(0.0) : float16_t(sv - float(hi));
    }
}
