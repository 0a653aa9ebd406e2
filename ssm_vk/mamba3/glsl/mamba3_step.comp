#version 450
// The Mamba-3 scan, forward, for one token (T = 1: a decode step; docs/SPEC.md section 14.2):
// one workgroup per (sequence i, head h, block of state rows), the state streamed through once.
// mamba3_scan.comp holds a state row in each invocation's registers across the tokens; with one
// token there is nothing to hold it for, and a decode step is all memory traffic (its state read
// and written once), so here the workgroup reads its block of rows into a tile in shared memory
// (consecutive invocations on consecutive entries, STEP_BATCH loads in flight each), updates the
// entries there and writes them out, and then one invocation per (rank r, row p) forms y from the
// tile in the order of mamba3_scan.comp (n = 0 .. N-1). The expressions are mamba3_scan.comp's, in
// its order: the token's angles, rotated keys and queries (mamba3_common.glsl),
// h = α h + β Σ_r v_prev^r k_prev^r
// + γ Σ_r v^r k^r (update), y^r = Σ_n h_n q^r_n.
//
// Bindings and push constants: mamba3_scan.comp's (the outputs 15-19; IP's bits as there: bit 1
// only with one block per head, every block reading θ and k_prev of the cache rows first).
// NPB: blocks per head, each of ceil(P / NPB) rows (the planner keeps that within ROWS_MAX).
// Defines: ND, MR (mamba3_common.glsl), STEP_TILE (floats of the state tile: ROWS_MAX rows of
// ND + 1, the padding putting consecutive rows' entries n in distinct banks). The workgroup
// size is STEP_WG (specialisation constant 0 set to it by the planner).

#define M3_CACHE_RW
#include "mamba3_common.glsl"

layout(std430, binding = 15) writeonly buffer By { float y_out[]; };
layout(std430, binding = 16) writeonly buffer Bth { float th_out[]; };
layout(std430, binding = 17) writeonly buffer Bh { float h_out[]; };
layout(std430, binding = 18) writeonly buffer Bk { float k_out[]; };
layout(std430, binding = 19) writeonly buffer Bv { float v_out[]; };

const uint RS = ND + 1u;                                   // a row's stride in the tile
const uint ROWS_MAX = STEP_TILE / RS > 0u ? STEP_TILE / RS : 1u;
const uint STEP_BATCH = 16u;                              // loads in flight per invocation

shared float st_sh[ROWS_MAX * RS];   // the block's updated rows
shared float v_sh[MR * ROWS_MAX];    // v^r = psi^r x of the block's rows
shared float vp_sh[MR * ROWS_MAX];   // v_prev^r of the block's rows (the cache's)

void main() {
    uint wg = gl_WorkGroupID.y * pc.gx + gl_WorkGroupID.x;
    if (wg >= pc.S * pc.H * pc.NPB) return;   // (the whole workgroup: no barrier is split)
    uint blk = wg % pc.NPB;
    uint h = (wg / pc.NPB) % pc.H;
    uint i = wg / (pc.NPB * pc.H);
    uint rb = (pc.P + pc.NPB - 1u) / pc.NPB;
    uint p0 = blk * rb;
    uint nrows = min(rb, pc.P - min(p0, pc.P));
    uint row = ids_in[i];
    uint lid = gl_LocalInvocationIndex;
    uint hs = i * pc.H + h;          // (T = 1: the token's (i, t, h) index is hs)
    uint rs = row * pc.H + h;
    uint ne = nrows * ND;
    uint sbase = (rs * pc.P + p0) * ND;
    uint hbase = (hs * pc.P + p0) * ND;
    bool hv_cache = (pc.IP & 1u) != 0u;

    // the block's entries into the tile, STEP_BATCH loads in flight per invocation before their
    // stores (each a row-major run: consecutive invocations on consecutive entries)
    for (uint e0 = lid; e0 < ne; e0 += STEP_BATCH * STEP_WG) {
        float v[STEP_BATCH];
        [[unroll]] for (uint u = 0; u < STEP_BATCH; ++u) {
            uint e = e0 + u * STEP_WG;
            v[u] = e < ne ? sh_in[sbase + e] : 0.0;
        }
        [[unroll]] for (uint u = 0; u < STEP_BATCH; ++u) {
            uint e = e0 + u * STEP_WG, pp = e / ND;
            if (e < ne) st_sh[pp * RS + e - pp * ND] = v[u];
        }
    }
    load_start(row, h);
    for (uint e = lid; e < MR * nrows; e += STEP_WG) {
        uint r = e / nrows, pp = e - r * nrows, p = p0 + pp;
        v_sh[r * ROWS_MAX + pp] = psi_in[(h * MR + r) * pc.P + p] * x_in[hs * pc.P + p];
        vp_sh[r * ROWS_MAX + pp] = sv_in[(rs * MR + r) * pc.P + p];
    }
    barrier();
    step_angles(i, h, 0u);
    barrier();
    make_kq(i, h, 0u);
    barrier();
    float dt = dt_in[hs], lam = lam_in[hs];
    float a = exp(dA_in[hs]);
    float beta = a * dt * (1.0 - lam);
    float gamma = lam * dt;
    for (uint e = lid; e < ne; e += STEP_WG) {
        uint pp = e / ND, n = e - pp * ND;
        float prev = 0.0, cur = 0.0;
        [[unroll]] for (uint r = 0; r < MR; ++r) {
            prev += vp_sh[r * ROWS_MAX + pp] * kp_sh[r * ND + n];
            cur += v_sh[r * ROWS_MAX + pp] * k_sh[r * ND + n];
        }
        float hn = update(st_sh[pp * RS + n], a, beta, gamma, prev, cur);
        st_sh[pp * RS + n] = hn;
        if (hv_cache) sh_in[sbase + e] = hn;
        else h_out[hbase + e] = hn;
    }
    barrier();
    for (uint e = lid; e < MR * nrows; e += STEP_WG) {
        uint r = e / nrows, pp = e - r * nrows, p = p0 + pp;
        float acc = 0.0;
        for (uint n = 0; n < ND; ++n) acc += st_sh[pp * RS + n] * q_sh[r * ND + n];
        y_out[((i * MR + r) * pc.H + h) * pc.P + p] = acc;
        float v = v_sh[r * ROWS_MAX + pp];
        if (hv_cache) sv_in[(rs * MR + r) * pc.P + p] = v;
        else v_out[(hs * MR + r) * pc.P + p] = v;
    }
    if (blk == 0u) {
        if ((pc.IP & 2u) != 0u) {
            for (uint j = lid; j < pc.F; j += STEP_WG) sth_in[rs * pc.F + j] = th_sh[j];
            for (uint e = lid; e < MN; e += STEP_WG) sk_in[rs * MN + e] = k_sh[e];
        } else {
            for (uint j = lid; j < pc.F; j += STEP_WG) th_out[hs * pc.F + j] = th_sh[j];
            for (uint e = lid; e < MN; e += STEP_WG) k_out[hs * MN + e] = k_sh[e];
        }
    }
}
