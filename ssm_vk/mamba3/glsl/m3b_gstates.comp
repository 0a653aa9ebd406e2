#version 450
// The chunked Mamba-3 backward, per (sequence i, chunk c, head h) and 64 x 64 tile of (p, n): the
// chunk's own part of the cotangent of the state it receives,
//     Y_c[p, n] = Σ_t Σ_r din_t g_y_t^r[p] q_t^r[n],   din_t = exp(ℓ_0 + ... + ℓ_t),
// into gz (ssm_ref/mamba3_chunked_back.py, step 1): a product of P x N over the chunk's Lc M rows
// (t, r), in row order (m3c_tile.glsl). m3b_gpass.comp then runs the pass over the chunks. The flag
// for a g_y that is not finite (every entry of g_y is read here).
//
// Bindings and push constants: m3b_common.glsl's. Grid: S * NC * H * ceil(P / 64) * ceil(N / 64).

#include "m3b_common.glsl"
#include "m3c_tile.glsl"

shared float din_sh[TILE];   // din_t
shared float ell_sh[TILE];

// This invocation's entries of the slice of rows b0 .. b0 + KS - 1 (b = t M + r): din_t g_y_t^r[p]
// for the channels p0 .. p0 + 63 and q_t^r[n] for the entries n0 .. n0 + 63 (index-major).
void fetch(uint i, uint h, uint t0, uint rows, uint p0, uint n0, uint b0, out float va[PER], out float vb[PER]) {
    uint kn = min(KS, rows - b0);
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + 256u * j;
        uint k = e / TILE, col = e % TILE;
        va[j] = 0.0;
        vb[j] = 0.0;
        if (k < kn) {
            uint b = b0 + k;
            uint t = b / pc.M, r = b % pc.M;
            uint p = p0 + col;
            if (p < pc.P) {
                float g = gy_in[(((i * pc.T + t0 + t) * pc.M + r) * pc.H + h) * pc.P + p];
                guard(g);
                va[j] = din_sh[t] * g;
            }
            uint n = n0 + col;
            if (n < pc.N) vb[j] = qr[qk_row(i, h, t0 + t, r) * pc.N + n];
        }
    }
}

void main() {
    uint PT = (pc.P + TILE - 1u) / TILE, NT = (pc.N + TILE - 1u) / TILE;
    uint wg = wg_index();
    if (wg >= pc.S * pc.NC * pc.H * PT * NT) return;
    uint nt = wg % NT;
    uint pt = (wg / NT) % PT;
    uint h = (wg / (NT * PT)) % pc.H;
    uint c = (wg / (NT * PT * pc.H)) % pc.NC;
    uint i = wg / (NT * PT * pc.H * pc.NC);
    uint tid = gl_LocalInvocationIndex;
    uint t0 = c * pc.L;
    uint Lc = min(pc.L, pc.T - t0);
    uint rows = Lc * pc.M;
    uint p0 = pt * TILE, n0 = nt * TILE;

    if (tid < Lc) ell_sh[tid] = dA_in[(i * pc.T + t0 + tid) * pc.H + h];
    barrier();
    if (tid < Lc) {
        float s = 0.0;
        for (uint u = 0u; u <= tid; ++u) s += ell_sh[u];
        din_sh[tid] = exp(s);
    }
    barrier();

    float acc[4][4];
    tile_zero(acc);
    float va[PER], vb[PER];
    fetch(i, h, t0, rows, p0, n0, 0u, va, vb);
    for (uint b0 = 0u; b0 < rows; b0 += KS) {
        put_cols(va, vb);
        barrier();
        if (b0 + KS < rows) fetch(i, h, t0, rows, p0, n0, b0 + KS, va, vb);
        tile_mma(acc, min(KS, rows - b0));
        barrier();
    }

    uint r0 = 4u * tile_ty(), c0 = 4u * tile_tx();
    // (conditions, not `continue`: the loops must unroll, or acc is indexed at run time)
    [[unroll]] for (uint u = 0u; u < 4u; ++u) {
        uint p = p0 + r0 + u;
        [[unroll]] for (uint v = 0u; v < 4u; ++v) {
            uint n = n0 + c0 + v;
            if (p < pc.P && n < pc.N) {
                gz[(((i * pc.H + h) * pc.NC + c) * pc.P + p) * pc.N + n] = acc[u][v];
                guard(acc[u][v]);
            }
        }
    }
}
