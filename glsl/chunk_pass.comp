#version 450
// The pass over chunks (sequential in c, one thread per state element (i, h, p, n)):
// MODE 0 (forward):  hs[c] holds the chunk's own contribution Z_c on entry; leaves the chunk's
//                    incoming state:  H_0 = st;  H_{c+1} = dch_c * H_c + Z_c;  st <- H_NCH.
// MODE 1 (backward): gs[c] holds Y_c = sum_r din_r g_y_r (x) C_r on entry; leaves G_c, the
//                    gradient of the state after chunk c:  G_{NCH-1} = st (g_states);
//                    G_{c-1} = dch_c * G_c + Y_c;  st <- G_{-1} (= d_s0).
// Bindings and push constants: glsl/chunk_common.glsl. Defines: chunk_common's, MODE.

#include "chunk_common.glsl"

void main() {
    uint e = wg_index() * WG + gl_LocalInvocationIndex;
    uint row = pc.H * PD * ND;
    if (e >= pc.S * row) return;
    uint i = e / row, rem = e % row;
    uint h = rem / (PD * ND);
    float v = st[pc.o_st + e];
#if MODE == 0
    for (uint c = 0; c < pc.NCH; ++c) {
        uint at = (i * pc.NCH + c) * row + rem;
        float z = hs[at];
        hs[at] = v;
        v = dec[head_mat(i, c, h) * DEC + 2u * CL] * v + z;
    }
#else
    for (uint c = pc.NCH; c > 0u; --c) {
        uint at = (i * pc.NCH + c - 1u) * row + rem;
        float y = gs[at];
        gs[at] = v;
        v = dec[head_mat(i, c - 1u, h) * DEC + 2u * CL] * v + y;
    }
#endif
    st[pc.o_st + e] = v;
}
