#version 450
// The chunked Mamba-3 forward, per (sequence i, chunk c, head h) and 64 x 64 tile of (p, n):
// the chunk's own contribution to the state it passes on,
//     Z_c[p, n] = Σ_s Σ_r (w_s psi^r[p] x_s[p]) k_s^r[n],   w_s = W[Lc-1, s]
//              = exp(ℓ_{Lc-1} + ... + ℓ_{s+1}) (γ_s + [s < Lc-1] σ_s),
// γ_s = λ_s Δ_s, σ_s = Δ_{s+1} (1 - λ_{s+1}) (ssm_ref/mamba3_chunked.py), into hz: a product
// of P x N over the chunk's Lc M rows (s, r), in row order (m3c_tile.glsl). Also the flag for
// x or psi not finite.
//
// Bindings and push constants: m3c_common.glsl's. Grid: S * NC * H * ceil(P / 64) * ceil(N / 64).

#include "m3c_common.glsl"
#include "m3c_tile.glsl"

shared float w_sh[TILE];     // w_s
shared float ell_sh[TILE];   // ℓ_s
shared float gam_sh[TILE];   // γ_s
shared float sig_sh[TILE];   // σ_s

// This invocation's entries of the slice of rows b0 .. b0 + KS - 1 (b = s M + r): w_s psi^r[p] x_s[p]
// for the channels p0 .. p0 + 63 and k_s^r[n] for the state entries n0 .. n0 + 63 (index-major:
// neighbours read neighbouring channels and entries). x and psi checked.
void fetch(uint i, uint h, uint t0, uint rows, uint p0, uint n0, uint b0, out float va[PER], out float vb[PER]) {
    uint kn = min(KS, rows - b0);
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + 256u * j;
        uint k = e / TILE, col = e % TILE;
        va[j] = 0.0;
        vb[j] = 0.0;
        if (k < kn) {
            uint b = b0 + k;
            uint s = b / pc.M, r = b % pc.M;
            uint p = p0 + col;
            if (p < pc.P) {
                float xv = x_in[((i * pc.T + t0 + s) * pc.H + h) * pc.P + p];
                float ps = psi_in[(h * pc.M + r) * pc.P + p];
                guard(xv);
                guard(ps);
                va[j] = w_sh[s] * (ps * xv);
            }
            uint n = n0 + col;
            if (n < pc.N) vb[j] = kr[qk_row(i, h, t0 + s, r) * pc.N + n];
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

    if (tid < Lc) {
        uint th_ = (i * pc.T + t0 + tid) * pc.H + h;
        ell_sh[tid] = dA_in[th_];
        gam_sh[tid] = lam_in[th_] * dt_in[th_];
        sig_sh[tid] = tid + 1u < Lc ? dt_in[th_ + pc.H] * (1.0 - lam_in[th_ + pc.H]) : 0.0;
    }
    barrier();
    if (tid < Lc) {
        float seg = 0.0;
        for (uint u = Lc - 1u; u > tid; --u) seg += ell_sh[u];
        w_sh[tid] = exp(seg) * (gam_sh[tid] + sig_sh[tid]);
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
            if (p < pc.P && n < pc.N) hz[(((i * pc.H + h) * pc.NC + c) * pc.P + p) * pc.N + n] = acc[u][v];
        }
    }
}
