#version 450
// The chunked Mamba-3 backward, per (sequence i, chunk c, head h): the chunk's own gradients given
// G_out (the cotangent of the state it passes on, gz), G'_in (of the state it receives: gz of
// chunk c - 1, or d0_h for chunk 0) and H'_in (hz) -- ssm_ref/mamba3_chunked_back.py, step 2.
// The chunk's rows a = t M + r (Lc M <= 64: one tile of m3c_tile.glsl; b = s M + r' likewise):
//     S = Q Kᵀ (over N), GV = g_Y Vᵀ (over P), both in registers; D[t, s] = exp(ℓ_{s+1} + ... + ℓ_t),
//     W = D (γ_s + [s < t] σ_s) (zero above the diagonal);
//     gWD[t, s] = D[t, s] Σ_{r,r'} S ⊙ GV, its column suffix sums (the decays' and the weights' sums);
//     g_v = (W ⊙ S)ᵀ g_Y + wout ⊙ (K G_outᵀ)  -> d_x = Σ_r psi^r ⊙ g_v^r, the chunk's part of d_psi;
//     g_k = (W ⊙ GV)ᵀ Q + wout ⊙ (V G_out),  g_q = (W ⊙ GV) K + din ⊙ (g_Y H'_in)  -> gqk
//     (W ⊙ GV in shared memory row-major for g_k, then transposed for g_q: both read it as vec4);
//     gdin_t, b_s (those products' second parts dotted with q, k by rows), <G_out, H'_in>,
//     gσ_in = Σ_r v_inᵀ G'_in k_in  -> d_dt, d_dA, d_lam of the chunk's tokens;
//     chunk 0: the start state's d0_k = σ_in G'_inᵀ v_in, d0_v = σ_in G'_in k_in.
// σ is extended (σ_{Lc-1}: the next chunk's Δ_0 (1 - λ_0), 0 in the last chunk), wout_s =
// exp(ℓ_{s+1} + ... + ℓ_{Lc-1}) (γ_s + σ_s); the last chunk's last token adds g_k, g_v. Every
// sum in a fixed order (rows, then tiles in order; the reductions over invocations in index order).
// The flag for a result that is not finite.
//
// SPLIT (a define, 1 or 2): the two halves of it as two kernels, run one after the other, each
// holding fewer registers than the whole did (145 and 157 on an H100, against 169: the two take
// 0.96 of its time at (8, 2048), docs/KERNELS.md): 1 computes S and GV, gWD and its sums, and g_v
// (d_x, d_psi's part), and leaves the per-token sums Σ gWD in d_step's three planes; 2 computes
// GV again, g_k, g_q and the rest, reading those sums back.
//
// Bindings and push constants: m3b_common.glsl's. Grid: S * NC * H.

#if !defined(SPLIT) || (SPLIT != 1 && SPLIT != 2)
#error "m3b_chunk.comp is compiled as its first or its second half: SPLIT 1 or 2"
#endif
#include "m3b_common.glsl"
#include "m3c_tile.glsl"

shared vec4 sm4[TILE * SROW];        // a 64 x 64 matrix, row-major: M[a][b] at (a, b / 4), b % 4
shared float ell_sh[TILE];
shared float gam_sh[TILE];
shared float sig_sh[TILE];           // σ_s, extended
shared float din_sh[TILE];
shared float dout_sh[TILE];
shared float colsum_sh[TILE];        // Σ_{t >= s} gWD[t, s]
shared float colstr_sh[TILE];        // Σ_{t > s} gWD[t, s]
shared float qu_sh[TILE];            // Σ_{t >= u > s} gWD[t, s] (γ_s + σ_s)
shared float rowq_sh[TILE];          // per row a: (g_Y H'_in)[a] · q[a], then per token gdin_t
shared float rowk_sh[TILE];          // per row b: (V G_out)[b] · k[b], then per token b_s
shared float sc_sh[2];               // <G_out, H'_in>, gσ_in

float sm_get(uint a, uint b) { return sm4[a * SROW + b / 4u][b % 4u]; }
void sm_set(uint a, uint b, float v) { sm4[a * SROW + b / 4u][b % 4u] = v; }
// as4 (the left operand's slice) as 1024 floats, between products: the reductions over invocations
float fs_get(uint k) { return as4[k / 4u][k % 4u]; }
void fs_set(uint k, float v) { as4[k / 4u][k % 4u] = v; }

// Write this invocation's 4 x 4 block of ``m`` into sm4.
void sm_put(float m[4][4]) {
    uint r0 = 4u * tile_ty(), c0 = 4u * tile_tx();
    [[unroll]] for (uint u = 0u; u < 4u; ++u) sm4[(r0 + u) * SROW + c0 / 4u] = vec4(m[u][0], m[u][1], m[u][2], m[u][3]);
}

// The block's rows' partial sums over its 4 columns (part[u]: row 4 ty + u) summed over the 16
// invocations of each row in column order, added to rowq_sh / rowk_sh (every invocation reaches it).
void row_sums(float part[4], uint rows, bool into_q) {
    uint ty = tile_ty(), tx = tile_tx();
    barrier();   // (as4 free: the product's last slice read)
    [[unroll]] for (uint u = 0u; u < 4u; ++u) fs_set((4u * ty + u) * 16u + tx, part[u]);
    barrier();
    uint a = gl_LocalInvocationIndex;
    if (a < rows) {
        float s = 0.0;
        for (uint x = 0u; x < 16u; ++x) s += fs_get(a * 16u + x);
        if (into_q) rowq_sh[a] += s; else rowk_sh[a] += s;
    }
    barrier();
}

// Entry (a, b) of the block (b's token s): D = exp(ℓ_{s+1} + ... + ℓ_t) and W = D (γ_s + [s < t] σ_s)
// below the diagonal, both 0 above it; the range summed on from where the row before left it
// (seg: ℓ_{s+1} .. ℓ_upto).
void dw_of(uint a, uint b, uint s, uint rows, inout float seg, inout uint upto, out float d, out float w) {
    uint t = a / pc.M;
    d = 0.0;
    w = 0.0;
    if (a < rows && b < rows && s <= t) {
        for (; upto < t; ++upto) seg += ell_sh[upto + 1u];
        d = exp(seg);
        w = d * (gam_sh[s] + (s < t ? sig_sh[s] : 0.0));
    }
}

// Entry e = (t, u) of the tokens' gWD: the chunk's rows of tokens t and u summed over the ranks
// (0 past the chunk's Lc x Lc).
float gw_at(uint e, uint LL, uint Lc) {
    float s = 0.0;
    if (e < LL) {
        uint t = e / Lc, u = e % Lc;
        for (uint r = 0u; r < pc.M; ++r) {
            for (uint q = 0u; q < pc.M; ++q) s += sm_get(t * pc.M + r, u * pc.M + q);
        }
    }
    return s;
}

uint gy_at(uint i, uint h, uint t, uint r) { return (((i * pc.T + t) * pc.M + r) * pc.H + h) * pc.P; }
float vval(uint i, uint h, uint t, uint r, uint p) {
    return psi_in[(h * pc.M + r) * pc.P + p] * x_in[((i * pc.T + t) * pc.H + h) * pc.P + p];
}

// ---- the slices of the products' contractions ----
// Each loop below reads the next slice's entries into registers (fetch_*: an invocation's PER
// entries, va the left operand's, vb the right's) before the products of the current one, so that
// their loads overlap those products, and stores them (put_*) once the current slice is read.
// Where values go only: the products' order is unchanged.
void put_b_cols(float vb[PER]) {
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + 256u * j;
        stage_b(e / TILE, e % TILE, vb[j]);
    }
}
// the left operand row-major (row e / KS, index e % KS), the right one index-major
void put_mixed(float va[PER], float vb[PER]) {
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + 256u * j;
        stage_a(e % KS, e / KS, va[j]);
        stage_b(e / TILE, e % TILE, vb[j]);
    }
}
// S = Q Kᵀ: q and k of the chunk's rows at indices k0 .. (row-major)
void fetch_qk(uint qk0, uint rows, uint k0, out float va[PER], out float vb[PER]) {
    uint kn = min(KS, pc.N - k0);
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + 256u * j;
        uint a = e / KS, k = e % KS;
        va[j] = 0.0;
        vb[j] = 0.0;
        if (k < kn && a < rows) {
            va[j] = qr[qk0 + a * pc.N + k0 + k];
            vb[j] = kr[qk0 + a * pc.N + k0 + k];
        }
    }
}
// GV = g_Y Vᵀ: g_Y and V of the chunk's rows at channels k0 .. (row-major)
void fetch_gyv(uint i, uint h, uint t0, uint rows, uint k0, out float va[PER], out float vb[PER]) {
    uint kn = min(KS, pc.P - k0);
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + 256u * j;
        uint a = e / KS, k = e % KS;
        va[j] = 0.0;
        vb[j] = 0.0;
        if (k < kn && a < rows) {
            uint t = a / pc.M, r = a % pc.M;
            va[j] = gy_in[gy_at(i, h, t0 + t, r) + k0 + k];
            vb[j] = vval(i, h, t0 + t, r, k0 + k);
        }
    }
}
// g_v's first part: g_Y of rows a0 .. at channels p0 .. (index-major)
void fetch_gy_cols(uint i, uint h, uint t0, uint rows, uint a0, uint p0, out float vb[PER]) {
    uint kn = min(KS, rows - a0);
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + 256u * j, k = e / TILE, col = e % TILE;
        uint a = a0 + k, p = p0 + col;
        vb[j] = 0.0;
        if (k < kn && p < pc.P) vb[j] = gy_in[gy_at(i, h, t0 + a / pc.M, a % pc.M) + p];
    }
}
// g_v's second part, K G_outᵀ: k of the rows and G_out's rows p0 .. at indices k0 .. (row-major)
void fetch_kgz(uint qk0, uint gat, uint rows, uint p0, uint k0, out float va[PER], out float vb[PER]) {
    uint kn = min(KS, pc.N - k0);
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + 256u * j;
        uint rr = e / KS, k = e % KS;
        va[j] = 0.0;
        vb[j] = 0.0;
        if (k < kn) {
            if (rr < rows) va[j] = kr[qk0 + rr * pc.N + k0 + k];
            if (p0 + rr < pc.P) vb[j] = gz[gat + (p0 + rr) * pc.N + k0 + k];
        }
    }
}
// g_k's and g_q's first parts: q (from_q) or k of rows a0 .. at entries n0 .. (index-major)
void fetch_qk_cols(bool from_q, uint qk0, uint rows, uint a0, uint n0, out float vb[PER]) {
    uint kn = min(KS, rows - a0);
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + 256u * j, k = e / TILE, col = e % TILE;
        uint at = qk0 + (a0 + k) * pc.N + n0 + col;
        vb[j] = 0.0;
        if (k < kn && n0 + col < pc.N) vb[j] = from_q ? qr[at] : kr[at];
    }
}
// g_k's second part, V G_out (from_v) or g_q's, g_Y H'_in: V or g_Y of the rows at channels k0 ..
// (row-major), G_out or H'_in at channels k0 .., entries n0 .. (index-major)
void fetch_vgz(bool from_v, uint i, uint h, uint t0, uint rows, uint gat, uint n0, uint k0, out float va[PER],
               out float vb[PER]) {
    uint kn = min(KS, pc.P - k0);
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + 256u * j;
        uint b = e / KS, k = e % KS;
        va[j] = 0.0;
        if (k < kn && b < rows) {
            uint t = t0 + b / pc.M, r = b % pc.M;
            va[j] = from_v ? vval(i, h, t, r, k0 + k) : gy_in[gy_at(i, h, t, r) + k0 + k];
        }
        uint kk = e / TILE, col = e % TILE;
        vb[j] = 0.0;
        if (kk < kn && n0 + col < pc.N) vb[j] = from_v ? gz[gat + (k0 + kk) * pc.N + n0 + col]
                                                       : hz[gat + (k0 + kk) * pc.N + n0 + col];
    }
}

void main() {
    uint wg = wg_index();
    if (wg >= pc.S * pc.NC * pc.H) return;
    uint h = wg % pc.H;
    uint c = (wg / pc.H) % pc.NC;
    uint i = wg / (pc.H * pc.NC);
    uint hs = i * pc.H + h;
    uint tid = gl_LocalInvocationIndex;
    uint t0 = c * pc.L;
    uint Lc = min(pc.L, pc.T - t0);
    uint rows = Lc * pc.M;
    bool last = c + 1u == pc.NC;
    uint ty = tile_ty(), tx = tile_tx();
    uint r0 = 4u * ty, c0 = 4u * tx;
    uint PN = pc.P * pc.N;
    uint gat = (hs * pc.NC + c) * PN;        // G_out of this chunk in gz; H'_in in hz
    uint qk0 = qk_row(i, h, t0, 0u) * pc.N;  // the chunk's first row of qr, kr, gqk

    // ---- the per-token tables ----
    if (tid < Lc) {
        uint th_ = (i * pc.T + t0 + tid) * pc.H + h;
        ell_sh[tid] = dA_in[th_];
        gam_sh[tid] = lam_in[th_] * dt_in[th_];
        float sg = 0.0;
        if (tid + 1u < Lc || !last) sg = dt_in[th_ + pc.H] * (1.0 - lam_in[th_ + pc.H]);
        sig_sh[tid] = sg;
    }
    if (tid < TILE) { rowq_sh[tid] = 0.0; rowk_sh[tid] = 0.0; }
    barrier();
    if (tid < Lc) {
        float s = 0.0;
        for (uint u = 0u; u <= tid; ++u) s += ell_sh[u];
        din_sh[tid] = exp(s);
        float so = 0.0;
        for (uint u = Lc - 1u; u > tid; --u) so += ell_sh[u];
        dout_sh[tid] = exp(so);
#if SPLIT == 2
        uint th2 = (i * pc.T + t0 + tid) * pc.H + h, STH2 = pc.S * pc.T * pc.H;
        colsum_sh[tid] = d3_out[th2];
        colstr_sh[tid] = d3_out[STH2 + th2];
        qu_sh[tid] = d3_out[2u * STH2 + th2];
#endif
    }
    barrier();

    // ---- S = Q Kᵀ over N, GV = g_Y Vᵀ over P (registers) ----
    // An invocation's block lies wholly above the diagonal (s > t for all its entries: masked) when
    // its first column's token follows its last row's: it skips the products. The transposed
    // products' contractions run only over the rows that can be unmasked for the block's rows:
    // a >= alo (token(a) >= token(r0): g_v, g_k) or b < bhi (token(b) <= token(r0 + 3): g_q).
    bool above = c0 / pc.M > (r0 + 3u) / pc.M;
    uint alo = (r0 / pc.M) * pc.M;
    uint bhi = ((r0 + 3u) / pc.M + 1u) * pc.M;
    float accS[4][4], accG[4][4];
    tile_zero(accS);
    tile_zero(accG);
    float va[PER], vb[PER];
#if SPLIT == 1
    fetch_qk(qk0, rows, 0u, va, vb);
    for (uint k0 = 0u; k0 < pc.N; k0 += KS) {
        put_rows(va, vb);
        barrier();
        if (k0 + KS < pc.N) fetch_qk(qk0, rows, k0 + KS, va, vb);
        else fetch_gyv(i, h, t0, rows, 0u, va, vb);   // (GV's first slice)
        if (!above) tile_mma(accS, min(KS, pc.N - k0));
        barrier();
    }
#else
    fetch_gyv(i, h, t0, rows, 0u, va, vb);
#endif
    for (uint k0 = 0u; k0 < pc.P; k0 += KS) {
        put_rows(va, vb);
        barrier();
        if (k0 + KS < pc.P) fetch_gyv(i, h, t0, rows, k0 + KS, va, vb);
        if (!above) tile_mma(accG, min(KS, pc.P - k0));
        barrier();
    }

    // ---- D and W of the block (as m3c_y.comp: each column's range summed in token order) ----
    // (written out per column and row, DW_COLUMN and dw_of, rather than as loops: glslc does not
    // unroll a loop around the data-dependent walk of the range, and a loop left rolled indexes
    // Dm and Wm at run time, off registers on most GPUs)
    float Dm[4][4], Wm[4][4];
#define DW_COLUMN(v) { \
        uint b = c0 + v, s = b / pc.M; \
        float seg = 0.0; \
        uint upto = s; \
        dw_of(r0 + 0u, b, s, rows, seg, upto, Dm[0][v], Wm[0][v]); \
        dw_of(r0 + 1u, b, s, rows, seg, upto, Dm[1][v], Wm[1][v]); \
        dw_of(r0 + 2u, b, s, rows, seg, upto, Dm[2][v], Wm[2][v]); \
        dw_of(r0 + 3u, b, s, rows, seg, upto, Dm[3][v], Wm[3][v]); \
    }
    DW_COLUMN(0u) DW_COLUMN(1u) DW_COLUMN(2u) DW_COLUMN(3u)
#undef DW_COLUMN

#if SPLIT == 1
    // ---- gWD = D Σ_{r,r'} S ⊙ GV, its column suffix sums, and the per-token sums ----
    float X[4][4];
    [[unroll]] for (uint u = 0u; u < 4u; ++u) {
        [[unroll]] for (uint v = 0u; v < 4u; ++v) X[u][v] = Dm[u][v] != 0.0 ? (accS[u][v] * accG[u][v]) * Dm[u][v] : 0.0;
    }
    sm_put(X);
    barrier();
    // (gw's entries written out, GW4, rather than a loop: see DW_COLUMN)
    float gw[16];
    uint LL = Lc * Lc;
#define GW4(j) gw[j] = gw_at(tid + 256u * j, LL, Lc); gw[j + 1u] = gw_at(tid + 256u * (j + 1u), LL, Lc); \
        gw[j + 2u] = gw_at(tid + 256u * (j + 2u), LL, Lc); gw[j + 3u] = gw_at(tid + 256u * (j + 3u), LL, Lc);
    GW4(0u) GW4(4u) GW4(8u) GW4(12u)
#undef GW4
    barrier();
    [[unroll]] for (uint j = 0u; j < 16u; ++j) {
        uint e = tid + 256u * j;
        if (e < LL) sm_set(e / Lc, e % Lc, gw[j]);
    }
    barrier();
    if (tid < Lc) {   // column s = tid: suffix sums from the last token
        float s = 0.0;
        for (uint t = Lc; t > tid; --t) {
            s += sm_get(t - 1u, tid);
            sm_set(t - 1u, tid, s);
        }
    }
    barrier();
    if (tid < Lc) {
        colsum_sh[tid] = sm_get(tid, tid);
        colstr_sh[tid] = tid + 1u < Lc ? sm_get(tid + 1u, tid) : 0.0;
        float q = 0.0;
        for (uint s = 0u; s < tid; ++s) q += (gam_sh[s] + sig_sh[s]) * sm_get(tid, s);
        qu_sh[tid] = q;
    }
    barrier();
#endif

    // ---- W ⊙ S and W ⊙ GV ----
    [[unroll]] for (uint u = 0u; u < 4u; ++u) {
        [[unroll]] for (uint v = 0u; v < 4u; ++v) {
            accS[u][v] = Wm[u][v] != 0.0 ? accS[u][v] * Wm[u][v] : 0.0;
            accG[u][v] = Wm[u][v] != 0.0 ? accG[u][v] * Wm[u][v] : 0.0;
        }
    }

    uint MN = pc.M * pc.N;
#if SPLIT == 1
    // ---- g_v per tile of 64 channels: (W ⊙ S)ᵀ g_Y + wout ⊙ (K G_outᵀ); d_x, d_psi's part ----
    uint LP = 2u * MN + pc.M * pc.P;
    uint pat = ((i * pc.NC + c) * pc.H + h) * LP;
    for (uint p0 = 0u; p0 < pc.P; p0 += TILE) {
        sm_put(accS);
        float acc[4][4], acc2[4][4];
        tile_zero(acc);
        tile_zero(acc2);
        fetch_gy_cols(i, h, t0, rows, 0u, p0, vb);
        for (uint a0 = 0u; a0 < rows; a0 += KS) {
            uint kn = min(KS, rows - a0);
            put_b_cols(vb);
            barrier();
            if (a0 + KS < rows) fetch_gy_cols(i, h, t0, rows, a0 + KS, p0, vb);
            else fetch_kgz(qk0, gat, rows, p0, 0u, va, vb);   // (the second part's first slice)
            for (uint k = alo > a0 ? min(alo - a0, kn) : 0u; k < kn; ++k) {
                vec4 av = sm4[(a0 + k) * SROW + ty];   // A[a][b] for the block's rows b
                vec4 bv = bs4[k * SLICE + tx];
                [[unroll]] for (uint u = 0u; u < 4u; ++u) {
                    [[unroll]] for (uint v = 0u; v < 4u; ++v) acc[u][v] += av[u] * bv[v];
                }
            }
            barrier();
        }
        for (uint k0 = 0u; k0 < pc.N; k0 += KS) {
            put_rows(va, vb);
            barrier();
            if (k0 + KS < pc.N) fetch_kgz(qk0, gat, rows, p0, k0 + KS, va, vb);
            tile_mma(acc2, min(KS, pc.N - k0));
            barrier();
        }
        [[unroll]] for (uint u = 0u; u < 4u; ++u) {
            uint b = r0 + u;
            uint s = b / pc.M, r = b % pc.M;
            [[unroll]] for (uint v = 0u; v < 4u; ++v) {
                uint p = p0 + c0 + v;
                float g = 0.0;
                if (b < rows && p < pc.P) {
                    g = acc[u][v] + dout_sh[s] * (gam_sh[s] + sig_sh[s]) * acc2[u][v];
                    if (last && s + 1u == Lc) g += gs_in[plane_v() + (hs * pc.M + r) * pc.P + p];
                }
                acc[u][v] = g;
            }
        }
        barrier();
        sm_put(acc);   // g_v's tile: rows b, channels p0 + column
        barrier();
        for (uint e = tid; e < Lc * TILE; e += 256u) {
            uint t = e / TILE, col = e % TILE, p = p0 + col;
            if (p >= pc.P) continue;
            float s = 0.0;
            for (uint r = 0u; r < pc.M; ++r) s += psi_in[(h * pc.M + r) * pc.P + p] * sm_get(t * pc.M + r, col);
            dx_out[((i * pc.T + t0 + t) * pc.H + h) * pc.P + p] = s;
            guard(s);
        }
        for (uint e = tid; e < pc.M * TILE; e += 256u) {
            uint r = e / TILE, col = e % TILE, p = p0 + col;
            if (p >= pc.P) continue;
            float s = 0.0;
            // x of eight tokens read before their products (one wait for eight loads, not eight
            // waits: these invocations walk the chunk alone); the sum in token order as before
            uint xat = ((i * pc.T + t0) * pc.H + h) * pc.P + p, xstep = pc.H * pc.P;
            for (uint t8 = 0u; t8 < Lc; t8 += 8u) {
                float xv[8];
                [[unroll]] for (uint j = 0u; j < 8u; ++j) xv[j] = t8 + j < Lc ? x_in[xat + (t8 + j) * xstep] : 0.0;
                [[unroll]] for (uint j = 0u; j < 8u; ++j) {
                    if (t8 + j < Lc) s += sm_get((t8 + j) * pc.M + r, col) * xv[j];
                }
            }
            part[pat + 2u * MN + r * pc.P + p] = s;
        }
        barrier();
    }

    // ---- the per-token sums for the second half, in d_step's planes (which it then writes) ----
    if (tid < Lc) {
        uint th1 = (i * pc.T + t0 + tid) * pc.H + h, STH1 = pc.S * pc.T * pc.H;
        d3_out[th1] = colsum_sh[tid];
        d3_out[STH1 + th1] = colstr_sh[tid];
        d3_out[2u * STH1 + th1] = qu_sh[tid];
    }
#else
    // ---- g_k per tile of 64 state entries, from W ⊙ GV (row-major in sm4: its columns b read as vec4) ----
    sm_put(accG);
    barrier();
    uint gk0 = gk_at();
    for (uint n0 = 0u; n0 < pc.N; n0 += TILE) {
        // g_k = (W ⊙ GV)ᵀ Q + wout ⊙ (V G_out)
        float acc[4][4], acc2[4][4];
        tile_zero(acc);
        tile_zero(acc2);
        fetch_qk_cols(true, qk0, rows, 0u, n0, vb);
        for (uint a0 = 0u; a0 < rows; a0 += KS) {
            uint kn = min(KS, rows - a0);
            put_b_cols(vb);
            barrier();
            if (a0 + KS < rows) fetch_qk_cols(true, qk0, rows, a0 + KS, n0, vb);
            else fetch_vgz(true, i, h, t0, rows, gat, n0, 0u, va, vb);   // (the second part's first slice)
            for (uint k = alo > a0 ? min(alo - a0, kn) : 0u; k < kn; ++k) {
                vec4 av = sm4[(a0 + k) * SROW + ty];
                vec4 bv = bs4[k * SLICE + tx];
                [[unroll]] for (uint u = 0u; u < 4u; ++u) {
                    [[unroll]] for (uint v = 0u; v < 4u; ++v) acc[u][v] += av[u] * bv[v];
                }
            }
            barrier();
        }
        for (uint k0 = 0u; k0 < pc.P; k0 += KS) {
            put_mixed(va, vb);
            barrier();
            if (k0 + KS < pc.P) fetch_vgz(true, i, h, t0, rows, gat, n0, k0 + KS, va, vb);
            tile_mma(acc2, min(KS, pc.P - k0));
            barrier();
        }
        float part4[4];
        [[unroll]] for (uint u = 0u; u < 4u; ++u) {
            uint b = r0 + u;
            uint s = b / pc.M, r = b % pc.M;
            part4[u] = 0.0;
            [[unroll]] for (uint v = 0u; v < 4u; ++v) {
                uint n = n0 + c0 + v;
                if (b < rows && n < pc.N) {
                    part4[u] += acc2[u][v] * kr[qk0 + b * pc.N + n];
                    float g = acc[u][v] + dout_sh[s] * (gam_sh[s] + sig_sh[s]) * acc2[u][v];
                    if (last && s + 1u == Lc) g += gs_in[plane_k() + (hs * pc.M + r) * pc.N + n];
                    gqk[gk0 + qk0 + b * pc.N + n] = g;
                    guard(g);
                }
            }
        }
        row_sums(part4, rows, false);
    }

    // ---- g_q per tile, from W ⊙ GV transposed (its rows a read as vec4) ----
    barrier();
    [[unroll]] for (uint v = 0u; v < 4u; ++v) sm4[(c0 + v) * SROW + r0 / 4u] = vec4(accG[0][v], accG[1][v], accG[2][v], accG[3][v]);
    barrier();
    for (uint n0 = 0u; n0 < pc.N; n0 += TILE) {
        // g_q = (W ⊙ GV) K + din ⊙ (g_Y H'_in)
        float acc[4][4], acc2[4][4];
        tile_zero(acc);
        tile_zero(acc2);
        fetch_qk_cols(false, qk0, rows, 0u, n0, vb);
        for (uint b0 = 0u; b0 < rows; b0 += KS) {
            uint kn = min(KS, rows - b0);
            put_b_cols(vb);
            barrier();
            if (b0 + KS < rows) fetch_qk_cols(false, qk0, rows, b0 + KS, n0, vb);
            else fetch_vgz(false, i, h, t0, rows, gat, n0, 0u, va, vb);   // (the second part's first slice)
            uint kend = bhi > b0 ? min(bhi - b0, kn) : 0u;
            for (uint k = 0u; k < kend; ++k) {
                vec4 av = sm4[(b0 + k) * SROW + ty];   // (W ⊙ GV)[a][b0 + k] for the block's rows a
                vec4 bv = bs4[k * SLICE + tx];
                [[unroll]] for (uint u = 0u; u < 4u; ++u) {
                    [[unroll]] for (uint v = 0u; v < 4u; ++v) acc[u][v] += av[u] * bv[v];
                }
            }
            barrier();
        }
        for (uint k0 = 0u; k0 < pc.P; k0 += KS) {
            put_mixed(va, vb);
            barrier();
            if (k0 + KS < pc.P) fetch_vgz(false, i, h, t0, rows, gat, n0, k0 + KS, va, vb);
            tile_mma(acc2, min(KS, pc.P - k0));
            barrier();
        }
        float part4[4];
        [[unroll]] for (uint u = 0u; u < 4u; ++u) {
            uint a = r0 + u;
            part4[u] = 0.0;
            [[unroll]] for (uint v = 0u; v < 4u; ++v) {
                uint n = n0 + c0 + v;
                if (a < rows && n < pc.N) {
                    part4[u] += acc2[u][v] * qr[qk0 + a * pc.N + n];
                    float g = acc[u][v] + din_sh[a / pc.M] * acc2[u][v];
                    gqk[qk0 + a * pc.N + n] = g;
                    guard(g);
                }
            }
        }
        row_sums(part4, rows, true);
    }

    // ---- <G_out, H'_in> and gσ_in = <G'_in, Σ_r v_in k_inᵀ>, each summed in a fixed order ----
    uint row = ids_in[i];
    float s1 = 0.0, s2 = 0.0;
    for (uint e = tid; e < PN; e += 256u) {
        uint p = e / pc.N, n = e % pc.N;
        s1 += gz[gat + e] * hz[gat + e];
        float gi = c > 0u ? gz[gat - PN + e] : d0_out[plane_h() + hs * PN + e];
        float kv = 0.0;
        for (uint r = 0u; r < pc.M; ++r) {
            float vin = c > 0u ? vval(i, h, t0 - 1u, r, p) : sv_in[((row * pc.H + h) * pc.M + r) * pc.P + p];
            float kin = c > 0u ? kr[qk_row(i, h, t0 - 1u, r) * pc.N + n] : sk_in[((row * pc.H + h) * pc.M + r) * pc.N + n];
            kv += vin * kin;
        }
        s2 += gi * kv;
    }
    fs_set(tid, s1);
    fs_set(256u + tid, s2);
    barrier();
    if (tid < 2u) {
        float s = 0.0;
        for (uint x = 0u; x < 256u; ++x) s += fs_get(tid * 256u + x);
        sc_sh[tid] = s;
    }
    barrier();
    // per token: gdin_t and b_s (the rows' sums over the ranks)
    if (tid < Lc) {
        float bq = 0.0, bk = 0.0;
        for (uint r = 0u; r < pc.M; ++r) {
            bq += rowq_sh[tid * pc.M + r];
            bk += rowk_sh[tid * pc.M + r];
        }
        fs_set(512u + tid, bq);   // gdin_t
        fs_set(576u + tid, bk);   // b_s
    }
    barrier();
    if (tid < Lc) {
        uint u = tid;
        float dA = qu_sh[u];
        float sb = 0.0;
        for (uint s = 0u; s < u; ++s) sb += fs_get(576u + s) * (dout_sh[s] * (gam_sh[s] + sig_sh[s]));
        float sd = 0.0;
        for (uint t = u; t < Lc; ++t) sd += fs_get(512u + t) * din_sh[t];
        uint th_ = (i * pc.T + t0 + u) * pc.H + h;
        dA = dA + sb + sd + sc_sh[0] * dch[hs * pc.NC + c];
        float bu = fs_get(576u + u);
        float ggam = colsum_sh[u] + bu * dout_sh[u];
        float gsp = u == 0u ? sc_sh[1] : colstr_sh[u - 1u] + fs_get(576u + u - 1u) * dout_sh[u - 1u];
        float dt = dt_in[th_], lam = lam_in[th_];
        float ddt = ggam * lam + gsp * (1.0 - lam);
        float dlam = ggam * dt - gsp * dt;
        uint STH = pc.S * pc.T * pc.H;
        d3_out[th_] = ddt;
        d3_out[STH + th_] = dA;
        d3_out[2u * STH + th_] = dlam;
        guard(ddt); guard(dA); guard(dlam);
    }

    // ---- chunk 0: the start state's k and v gradients ----
    if (c == 0u) {
        uint th0 = (i * pc.T) * pc.H + h;
        float sin_ = dt_in[th0] * (1.0 - lam_in[th0]);
        for (uint e = tid; e < MN; e += 256u) {
            uint r = e / pc.N, n = e % pc.N;
            float s = 0.0;
            for (uint p = 0u; p < pc.P; ++p)
                s += d0_out[plane_h() + hs * PN + p * pc.N + n] * sv_in[((row * pc.H + h) * pc.M + r) * pc.P + p];
            s = sin_ * s;
            d0_out[plane_k() + hs * MN + e] = s;
            guard(s);
        }
        for (uint e = tid; e < pc.M * pc.P; e += 256u) {
            uint r = e / pc.P, p = e % pc.P;
            float s = 0.0;
            for (uint n = 0u; n < pc.N; ++n)
                s += d0_out[plane_h() + hs * PN + p * pc.N + n] * sk_in[((row * pc.H + h) * pc.M + r) * pc.N + n];
            s = sin_ * s;
            d0_out[plane_v() + hs * pc.M * pc.P + e] = s;
            guard(s);
        }
    }
#endif
}
