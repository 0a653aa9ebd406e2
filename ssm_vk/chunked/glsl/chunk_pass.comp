#version 450
// The pass over chunks (sequential in c, one thread per state element (i, h, p, n)):
// MODE 0 (forward):  hs[c] holds the chunk's own contribution Z_c on entry; leaves the chunk's
//                    incoming state:  H_0 = st;  H_{c+1} = dch_c * H_c + Z_c;  st <- H_NCH.
// MODE 1 (backward): gs[c] holds Y_c = sum_r din_r g_y_r (x) C_r on entry; leaves G_c, the
//                    gradient of the state after chunk c:  G_{NCH-1} = st (g_states);
//                    G_{c-1} = dch_c * G_c + Y_c;  st <- G_{-1} (= d_s0).
// Bindings and push constants: glsl/chunk_common.glsl. Defines: chunk_common's, MODE, PB.

#extension GL_EXT_control_flow_attributes : enable
#include "chunk_common.glsl"

void main() {
    uint e = wg_index() * WG + gl_LocalInvocationIndex;
    uint row = pc.H * PD * ND;
    if (e >= pc.S * row) return;
    uint i = e / row, rem = e % row;
    uint h = rem / (PD * ND);
    float v = st[pc.o_st + e];
    // Chunks go in batches of PB: the batch's loads do not depend on the carried value, so they
    // are issued together; then the batch's updates run in order.
    for (uint c0 = 0; c0 < pc.NCH; c0 += PB) {
        float z[PB], a[PB];
        [[unroll]] for (uint k = 0; k < PB; ++k) {
#if MODE == 0
            uint c = min(c0 + k, pc.NCH - 1u);
#else
            uint c = pc.NCH - 1u - min(c0 + k, pc.NCH - 1u);     // backwards in time
#endif
            uint at = (i * pc.NCH + c) * row + rem;
            z[k] = MODE == 0 ? hs[at] : gs[at];
            a[k] = dec[head_mat(i, c, h) * DEC + 2u * CL];
        }
        [[unroll]] for (uint k = 0; k < PB; ++k) {
            if (c0 + k < pc.NCH) {
#if MODE == 0
                uint c = c0 + k;
                hs[(i * pc.NCH + c) * row + rem] = v;
#else
                uint c = pc.NCH - 1u - (c0 + k);
                gs[(i * pc.NCH + c) * row + rem] = v;
#endif
                v = a[k] * v + z[k];
            }
        }
    }
    st[pc.o_st + e] = v;
    guard(v);
}
