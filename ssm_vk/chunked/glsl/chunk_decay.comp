#version 450
// The decays of one (sequence, chunk, head), and the masked matrices built from them
// (ssm_ref/chunked.py chunk_tables). One workgroup per (i, c, h):
//   dec[.]     din_t = exp(la_0 + .. + la_t), dout_s = exp(la_{s+1} + .. + la_{Lc-1}),
//              dch = exp(la_0 + .. + la_{Lc-1}),   la_t = softplus(dt_t) * A[h]
//   mcb[t][s]  = M[t, s] * cb[t][s] for s <= t < Lc, else 0;  M[t, s] = exp(la_{s+1} + .. + la_t)
// MODE 1 (backward) also:
//   mgu[t][s]  = M[t, s] * gu[t][s] (same mask)
//   sm[t, SM_W] = sum over r >= t > s of mgu[r][s] * cb[r][s]   (the in-chunk decay gradient)
// Every exponent is a sum over its own token range, in token order: no differences of running
// sums (no cancellation; a -inf or nan log-decay only reaches the ranges that hold it).
// KEPT = 1 (backward after its forward): mcb is the forward's, bound as it left it; not written.
// MODE 0 with KEPT (the backward's walk to its token windows' starts): the decays alone, cb unread.
// Bindings and push constants: glsl/chunk_common.glsl. Defines: chunk_common's, MODE, KEPT.

#extension GL_EXT_control_flow_attributes : enable
#include "chunk_common.glsl"

const uint NBK = WG >= CL ? WG / CL : 1u;   // pieces per column of M
const uint BSZ = (CL + NBK - 1u) / NBK;       // rows per piece

shared float la[CL];
#if MODE == 1
shared float W[CL][CL + 1u];
#endif

void main() {
    uint wg = wg_index();
    if (wg >= pc.S * pc.NCH * pc.H) return;             // uniform over the workgroup
    uint i = wg / (pc.NCH * pc.H);
    uint c = (wg / pc.H) % pc.NCH;
    uint h = wg % pc.H;
    uint g = h / (pc.H / pc.G);
    uint Lc = chunk_len(c);
    uint hm = head_mat(i, c, h), gm = group_mat(i, c, g);
    uint lid = gl_LocalInvocationIndex;
    float Ah = A[pc.o_A + h];
    for (uint t = lid; t < CL; t += WG)
        la[t] = t < Lc ? softplus(dt[pc.o_dt + tok(i, c, t) * pc.H + h]) * Ah : 0.0;
    barrier();
    for (uint t = lid; t <= CL; t += WG) {
        if (t < CL) {
            float a = 0.0, b = 0.0;
            for (uint r = 0; r <= t; ++r) a += la[r];
            for (uint r = t + 1u; r < Lc; ++r) b += la[r];
            dec[hm * DEC + t] = t < Lc ? exp(a) : 0.0;
            dec[hm * DEC + CL + t] = t < Lc ? exp(b) : 0.0;
        } else {
            float a = 0.0;
            for (uint r = 0; r < Lc; ++r) a += la[r];
            dec[hm * DEC + 2u * CL] = exp(a);
        }
    }
    // M by column pieces: thread (s, b) walks rows t of piece b of column s downwards, carrying
    // seg(t, s) = la_{s+1} + .. + la_t; consecutive threads hold consecutive columns, so each
    // step's writes (one row) are contiguous.
    for (uint e = lid; e < CL * NBK; e += WG) {
        uint s = e % CL, b = e / CL;
        uint t0 = b * BSZ;
        float seg = 0.0;
        for (uint r = s + 1u; r < t0; ++r) seg += la[r];        // seg(t0 - 1, s)
        for (uint k = 0; k < BSZ && t0 + k < CL; ++k) {
            uint t = t0 + k;
            if (t > s) seg += la[t];                              // seg(t, s); 0 at t == s
            uint at = t * CL + s;
            bool on = s <= t && t < Lc;
            float m = exp(seg);
#if MODE == 1 || !KEPT
            float cbv = cb[gm * CL * CL + at];   // (the token windows' starts, MODE 0 with KEPT: not read)
#endif
#if !KEPT
            mcb[hm * CL * CL + at] = on ? m * cbv : 0.0;
#endif
#if MODE == 1
            float mg = on ? m * gu[hm * CL * CL + at] : 0.0;
            mgu[hm * CL * CL + at] = mg;
            W[t][s] = (on && s < t) ? mg * cbv : 0.0;
#endif
        }
    }
#if MODE == 1
    barrier();
    // Column suffix sums: W[t][s] <- sum_{r >= t} W[r][s] (s < t), r from the far end.
    for (uint s = lid; s < CL; s += WG) {
        float acc = 0.0;
        for (uint r = Lc; r > s + 1u; --r) {
            acc += W[r - 1u][s];
            W[r - 1u][s] = acc;
        }
    }
    barrier();
    for (uint t = lid; t < Lc; t += WG) {
        float q = 0.0;
        for (uint s = 0; s < t; ++s) q += W[t][s];
        sm[(tok(i, c, t) * pc.H + h) * NSM + SM_W] = q;
    }
#endif
}
