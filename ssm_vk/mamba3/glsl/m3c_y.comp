#version 450
// The chunked Mamba-3 forward's output, per (sequence i, chunk c, head h) and 64 channels of
// the head (ssm_ref/mamba3_chunked.py): the chunk's rows a = t M + r (Lc M <= 64, one tile),
//     A[a, b]   = W[t, s] (q_t^r · k_s^r')  for s <= t (b = s M + r'), 0 above the diagonal,
//     W[t, s]   = exp(ℓ_{s+1} + ... + ℓ_t) (γ_s + [s < t] σ_s),
//     y_t^r[p]  = Σ_b A[a, b] v_s^r'[p]  +  din_t Σ_n H'_in[p, n] q_t^r[n],
//     din_t     = exp(ℓ_0 + ... + ℓ_t),  v_s^r' = psi^r' ⊙ x_s,
// three products of the tile (m3c_tile.glsl): Q Kᵀ over N (A kept in shared memory), A V over
// the chunk's rows, Q H'_inᵀ over N, each in index order. H'_in is what m3c_pass.comp left in hz.
// The flag for a y that is not finite.
//
// Bindings and push constants: m3c_common.glsl's. Grid: S * NC * H * ceil(P / 64).

#include "m3c_common.glsl"
#include "m3c_tile.glsl"

shared vec4 a4[TILE * SROW];      // A transposed: A[a][b] at (b, a), a row's four entries in a vec4
shared float ell_sh[TILE];        // ℓ_s
shared float gam_sh[TILE];        // γ_s
shared float sig_sh[TILE];        // σ_s
shared float din_sh[TILE];        // din_t

// This invocation's entries (row, k0 + k) of Q and K (the chunk's rows from qk0 in qr, kr).
void fetch_qk(uint qk0, uint rows, uint k0, out float qa[PER], out float ka[PER]) {
    uint kn = min(KS, pc.N - k0);
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + 256u * j;
        uint a = e / KS, k = e % KS;
        qa[j] = 0.0;
        ka[j] = 0.0;
        if (k < kn && a < rows) {
            uint at = qk0 + a * pc.N + k0 + k;
            qa[j] = qr[at];
            ka[j] = kr[at];
        }
    }
}

// This invocation's entries (row, k0 + k) of Q and of H'_in (rows p0 + row, from (hat + p) N in hz).
void fetch_qh(uint qk0, uint hat, uint rows, uint p0, uint k0, out float qa[PER], out float hv[PER]) {
    uint kn = min(KS, pc.N - k0);
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + 256u * j;
        uint col = e / KS, k = e % KS;
        qa[j] = 0.0;
        hv[j] = 0.0;
        if (k < kn) {
            if (col < rows) qa[j] = qr[qk0 + col * pc.N + k0 + k];
            uint p = p0 + col;
            if (p < pc.P) hv[j] = hz[(hat + p) * pc.N + k0 + k];
        }
    }
}

// This invocation's entries (b0 + k, p0 + col) of V, v_s^r'[p] = psi^r'[p] x_s[p] (b = s M + r'),
// index-major: neighbours read neighbouring channels.
void fetch_v(uint i, uint h, uint t0, uint rows, uint p0, uint b0, out float vv[PER]) {
    uint kn = min(KS, rows - b0);
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + 256u * j;
        uint k = e / TILE, p = p0 + e % TILE;
        vv[j] = 0.0;
        if (k < kn && p < pc.P) {
            uint s = (b0 + k) / pc.M, r = (b0 + k) % pc.M;
            vv[j] = psi_in[(h * pc.M + r) * pc.P + p] * x_in[((i * pc.T + t0 + s) * pc.H + h) * pc.P + p];
        }
    }
}

// Entry (a, b) of the block: whether it is below the diagonal (s <= t, both rows in the chunk),
// and then its weight's factor f = exp(ℓ_{s+1} + ... + ℓ_t) (γ_s + [s < t] σ_s), the range summed
// on from where the row before left it (seg: ℓ_{s+1} .. ℓ_upto).
bool w_factor(uint a, uint b, uint s, uint rows, inout float seg, inout uint upto, out float f) {
    uint t = a / pc.M;
    f = 0.0;
    if (!(a < rows && b < rows && s <= t)) return false;
    for (; upto < t; ++upto) seg += ell_sh[upto + 1u];
    f = exp(seg) * (gam_sh[s] + (s < t ? sig_sh[s] : 0.0));
    return true;
}

void main() {
    uint PT = (pc.P + TILE - 1u) / TILE;
    uint wg = wg_index();
    if (wg >= pc.S * pc.NC * pc.H * PT) return;
    uint pt = wg % PT;
    uint h = (wg / PT) % pc.H;
    uint c = (wg / (PT * pc.H)) % pc.NC;
    uint i = wg / (PT * pc.H * pc.NC);
    uint tid = gl_LocalInvocationIndex;
    uint t0 = c * pc.L;
    uint Lc = min(pc.L, pc.T - t0);
    uint rows = Lc * pc.M;
    uint p0 = pt * TILE;
    uint hs = i * pc.H + h;
    uint r0 = 4u * tile_ty(), c0 = 4u * tile_tx();

    if (tid < Lc) {
        uint th_ = (i * pc.T + t0 + tid) * pc.H + h;
        ell_sh[tid] = dA_in[th_];
        gam_sh[tid] = lam_in[th_] * dt_in[th_];
        sig_sh[tid] = tid + 1u < Lc ? dt_in[th_ + pc.H] * (1.0 - lam_in[th_ + pc.H]) : 0.0;
    }
    barrier();
    if (tid < Lc) {
        float s = 0.0;
        for (uint u = 0u; u <= tid; ++u) s += ell_sh[u];
        din_sh[tid] = exp(s);
    }

    // A = W ⊙ (Q Kᵀ): the chunk's rows against its rows, over N. A block wholly above the
    // diagonal (its first column's token after its last row's) is masked: it skips the products
    // (its entries are zeros below, whatever acc holds).
    bool above = c0 / pc.M > (r0 + 3u) / pc.M;
    float acc[4][4];
    tile_zero(acc);
    uint qk0 = qk_row(i, h, t0, 0u) * pc.N;   // the chunk's first row of qr, kr
    float va[PER], vb[PER];
    fetch_qk(qk0, rows, 0u, va, vb);
    for (uint k0 = 0u; k0 < pc.N; k0 += KS) {
        put_rows(va, vb);
        barrier();
        if (k0 + KS < pc.N) fetch_qk(qk0, rows, k0 + KS, va, vb);
        if (!above) tile_mma(acc, min(KS, pc.N - k0));
        barrier();
    }
    // W[t, s]: for each column s, its rows' ranges ℓ_{s+1} .. ℓ_t summed in token order, the
    // block's rows in turn (each range the last one and the tokens after it); column b's four
    // rows in one 16-byte store. Written out per column and row (W_COLUMN, w_factor) rather than
    // as loops: glslc does not unroll a loop around the data-dependent walk of the range, and a
    // loop left rolled indexes acc at run time (off registers, on most GPUs).
#define W_ROW(u, v, comp) if (w_factor(r0 + u, b, s, rows, seg, upto, f)) w.comp = acc[u][v] * f;
#define W_COLUMN(v) { \
        uint b = c0 + v, s = b / pc.M; \
        float seg = 0.0, f; \
        uint upto = s; \
        vec4 w = vec4(0.0); \
        W_ROW(0u, v, x) W_ROW(1u, v, y) W_ROW(2u, v, z) W_ROW(3u, v, w) \
        a4[b * SROW + r0 / 4u] = w; \
    }
    W_COLUMN(0u) W_COLUMN(1u) W_COLUMN(2u) W_COLUMN(3u)
#undef W_COLUMN
#undef W_ROW
    barrier();

    // A V over the chunk's rows (A's slices read where they lie). The columns b of A past the
    // block's last token are zero (s > t): each invocation stops at its last token's column, and
    // a warp (16 rows, m3c_tile.glsl) at its last row's -- over the warps, 5/8 of the products.
    tile_zero(acc);
    uint ty = tile_ty(), tx = tile_tx();
    uint bmax = min(rows, ((r0 + 3u) / pc.M + 1u) * pc.M);
    fetch_v(i, h, t0, rows, p0, 0u, va);
    for (uint b0 = 0u; b0 < rows; b0 += KS) {
        uint kn = min(KS, rows - b0);
        [[unroll]] for (uint j = 0u; j < PER; ++j) {
            uint e = tid + 256u * j;
            stage_b(e / TILE, e % TILE, va[j]);
        }
        barrier();
        if (b0 + KS < rows) fetch_v(i, h, t0, rows, p0, b0 + KS, va);
        uint kend = bmax > b0 ? min(kn, bmax - b0) : 0u;
        for (uint k = 0u; k < kend; ++k) {
            vec4 a = a4[(b0 + k) * SROW + ty];
            vec4 bv = bs4[k * SLICE + tx];
            [[unroll]] for (uint u = 0u; u < 4u; ++u) {
                [[unroll]] for (uint v = 0u; v < 4u; ++v) acc[u][v] += a[u] * bv[v];
            }
        }
        barrier();
    }

    // Q H'_inᵀ over N.
    float acc2[4][4];
    tile_zero(acc2);
    uint hat = (hs * pc.NC + c) * pc.P;
    fetch_qh(qk0, hat, rows, p0, 0u, va, vb);
    for (uint k0 = 0u; k0 < pc.N; k0 += KS) {
        put_rows(va, vb);
        barrier();
        if (k0 + KS < pc.N) fetch_qh(qk0, hat, rows, p0, k0 + KS, va, vb);
        tile_mma(acc2, min(KS, pc.N - k0));
        barrier();
    }

    // (conditions, not `continue`: the loops must unroll, or acc and acc2 are indexed at run time)
    [[unroll]] for (uint u = 0u; u < 4u; ++u) {
        uint a = r0 + u;
        uint t = a / pc.M, r = a % pc.M;
        [[unroll]] for (uint v = 0u; v < 4u; ++v) {
            uint p = p0 + c0 + v;
            if (a < rows && p < pc.P) {
                float y = acc[u][v] + din_sh[t] * acc2[u][v];
                y_out[(((i * pc.T + t0 + t) * pc.M + r) * pc.H + h) * pc.P + p] = y;
                guard(y);
            }
        }
    }
}
