// What the chunked Mamba-3 kernels share, forward (m3c_common.glsl) and backward (m3b_common.glsl),
// included after their bindings (the flag binding named ``flag``): the push constants, the chunk a
// workgroup takes (the grid flattened along x, gx wide), the non-finite flag (nan fails the
// comparison too; the atomic runs only then: the host then computes the call again token by
// token) and the row of token t of sequence i, head h and rank r in the rotated queries and keys
// (S,H,T,M,N) row-major (the backward's halves of gqk alike).

layout(push_constant) uniform PC {
    uint S, T, H, P, G, F, R, N, M, L, NC, halved, gx, mode;
} pc;

const float TWO_PI = 6.28318530717958647692;

uint wg_index() { return gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x; }

void guard(float v) {
    if (!(abs(v) <= 3.4028234664e38)) atomicOr(flag[0], 1u);
}

uint qk_row(uint i, uint h, uint t, uint r) { return ((i * pc.H + h) * pc.T + t) * pc.M + r; }
