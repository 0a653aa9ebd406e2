#version 450
// Last step of the chunked backward, one workgroup per (i, c, h): the decay gradient
//   Q_t = sm[t, SM_W] + sum_{r >= t} alpha_r + sum_{s < t} beta_s + dch * <G_c, H_c>
// then  d_dt[i, t, h] = (Gam_t . x_t + A[h] Q_t) * softplus'(dt_t)  (binding ddtp) and
//       dAp[i, h, c]  = sum_t d_t Q_t        (ssm_ref/chunked.py backward).
// Bindings and push constants: glsl/chunk_common.glsl. Defines: chunk_common's, NBP and NBN (the
// column blocks of P and N whose partial sums sm holds).

#extension GL_EXT_control_flow_attributes : enable
#include "chunk_common.glsl"

shared float al[CL], be[CL], dq[CL];

void main() {
    uint wg = wg_index();
    if (wg >= pc.S * pc.NCH * pc.H) return;             // uniform over the workgroup
    uint i = wg / (pc.NCH * pc.H);
    uint c = (wg / pc.H) % pc.NCH;
    uint h = wg % pc.H;
    uint Lc = chunk_len(c);
    uint hm = head_mat(i, c, h);
    uint lid = gl_LocalInvocationIndex;

    // <G_c, H_c>: GAM's sums over its column blocks of P (at the chunk's first token).
    float ghc = 0.0;
    [[unroll]] for (uint k = 0; k < NBP; ++k) ghc += sm[(tok(i, c, 0u) * pc.H + h) * NSM + SM_GH + k];
    float gam = dec[hm * DEC + 2u * CL] * ghc;

    for (uint t = lid; t < CL; t += WG) {
        float a = 0.0, b = 0.0;
        if (t < Lc) {
            uint at = (tok(i, c, t) * pc.H + h) * NSM;
            [[unroll]] for (uint k = 0; k < NBN; ++k) a += sm[at + SM_ALPHA + k];
            [[unroll]] for (uint k = 0; k < NBP; ++k) b += sm[at + SM_BETA + k];
        }
        al[t] = a;
        be[t] = b;
    }
    barrier();
    float Ah = A[pc.o_A + h];
    for (uint t = lid; t < CL; t += WG) {
        float q = 0.0;
        if (t < Lc) {
            uint it = tok(i, c, t) * pc.H + h;
            q = sm[it * NSM + SM_W];
            for (uint r = t; r < Lc; ++r) q += al[r];
            for (uint s = 0; s < t; ++s) q += be[s];
            q += gam;
            float gxv = 0.0;
            [[unroll]] for (uint k = 0; k < NBP; ++k) gxv += sm[it * NSM + SM_GX + k];
            float z = dt[pc.o_dt + it];
            float g_dt = (gxv + Ah * q) * softplus_grad(z);
            ddtp[pc.o_st + it] = g_dt;                 // o_st: d_dt's window offset
            guard(g_dt);
            q *= softplus(z);
        }
        dq[t] = q;
    }
    barrier();
    if (lid == 0u) {
        float s = 0.0;
        for (uint t = 0; t < Lc; ++t) s += dq[t];
        dAp[pc.o_out + (i * pc.H + h) * pc.NCHA + c] = s;   // o_out: dAp's window offset
        guard(s);
    }
}
