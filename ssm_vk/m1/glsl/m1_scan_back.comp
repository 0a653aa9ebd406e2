#version 450
// Mamba-1 backward with time spread over a workgroup's threads (layout: m1_common.glsl). For one
// chunk of one sequence and RW channels:
//
// 1. Each thread (channel x slice of TI tokens) takes its tokens' steps d, u = x d and g_y once,
//    then, state value by state value, the slice's part of the state from zero (z) and of the
//    adjoint from zero (w = sum_t (prod_{t' <= t} a_t') g_y_t C_t: what the slice adds to the
//    adjoint it hands back, a_t0 lam_t0), and the sum D of its steps (its decay exp(D A)).
// 2. The workgroup composes the slices of each (channel, n) in one shared table, in two turns:
//    forwards from the chunk's initial state (the state before each slice, which each thread
//    then keeps in registers), then, its slots refilled with w, backwards from the adjoint after
//    the chunk's last token (the adjoint after each slice's last token). With NCH = 1 the
//    backward chain's end is d_s0 = a_0 lam_0, written over g_states in binding 7. (One table of
//    N floats per thread instead of two: a workgroup of twice the slices fits the same shared
//    memory.)
// 3. Each thread walks its slice back, TI tokens x NB state values at a time: the states
//    recomputed into registers, then lam_t = nu + g_y_t C_t (nu = a_{t+1} lam_{t+1}), the
//    contributions to d_C (g_y st_t) and d_B (lam u) summed over the subgroup's RW channels by a
//    fixed-order reduce-scatter of shuffles (one partial per token, channel block and n), gamma
//    and sum_n q A (its own sums over n), d_A per n (summed over the slices in shared memory,
//    in slice order, one partial per chunk); then d_x and d_dt of its tokens.
// No atomics but the flag: every output element has one writer and a fixed order of additions.
//
// Bindings (0-4 in m1_common.glsl; float32 unless noted; o_* element offsets of the bound windows):
//   5 gy   (S, T, H)            readonly
//   6 init (S, H, N)            the initial states (NCH = 1, unless gather), or
//          (S*NCH, H, N)        every chunk's initial state (NCH > 1: the forward carry's output)
//   7 adj  (S, H, N)            NCH = 1: in g_states, out d_s0;
//          (S*NCH, H, N)        NCH > 1: the adjoint arriving after each chunk (the reverse carry's)
//   8 s    (R, H, N)            readonly: the state cache, when gather (initial states s[ids])
//   9 ids  (S) uint             readonly, when gather
//  10 dx   (S, T, H)            written
//  11 ddt  (S, T, H)            written
//  12 dBp  (S, T, NRB, N)       written: d_B summed over a block's RW channels
//  13 dCp  (S, T, NRB, N)       written: d_C likewise
//  14 dAp  (S, H, NCH, N)       written: d_A summed over a chunk's tokens
//  15 flag (uint)               bit 0: a value that is not finite; bit 1: other subgroups than planned
// Push constants: PC below (ssm_vk/kernels.py M1_BACK_PUSH). Defines: m1_common.glsl's, TI (tokens
// per slice) and NB (state values per round of the walk back; divides ND).

#include "m1_common.glsl"

#if SPS != 1
#error "the backward holds one slice per subgroup (SPS = 1)"
#endif

layout(std430, binding = 5) readonly buffer Bgy { float gy[]; };
layout(std430, binding = 6) readonly buffer Binit { float init_st[]; };
layout(std430, binding = 7) buffer Badj { float adj[]; };
layout(std430, binding = 8) readonly buffer Bs { float s_in[]; };
layout(std430, binding = 9) readonly buffer Bids { uint ids[]; };
layout(std430, binding = 10) writeonly buffer Bdx { float dx[]; };
layout(std430, binding = 11) writeonly buffer Bddt { float ddt[]; };
layout(std430, binding = 12) writeonly buffer BdB { float dBp[]; };
layout(std430, binding = 13) writeonly buffer BdC { float dCp[]; };
layout(std430, binding = 14) writeonly buffer BdA { float dAp[]; };
layout(std430, binding = 15) buffer Bflag { uint flag[]; };

layout(push_constant) uniform PC {
    uint S, T, H, G, NCH, NRB, gx;
    uint o_x, o_dt, o_A, o_B, o_C, o_gy, o_init, o_adj, o_dx, o_ddt;
    uint gather, o_s, o_ids;
} pc;

// [slice][n][lane]: z, then the state before the slice; w, then the adjoint after the slice; d_A
shared float zs[NW * ND * RW];
shared float Ds[NW * RW];           // [slice][lane]

const uint V = 2 * TI * NB;         // values of one round of the reduce-scatter: d_C, then d_B
const uint KS = (TI * ND + RW - 1) / RW;   // values of the slice's B (and of its C) per lane

// Sums over the subgroup's RW lanes of each of the V values, in a fixed order (halving exchanges
// by subgroupShuffleXor, then a butterfly while lanes are left over). After it, with V >= RW lane
// l holds in v[0 .. V / RW) the sums of values l * V / RW + k; with V < RW, v[0] holds the sum of
// value l / (RW / V). Reached by every lane of the subgroup.
void reduce_scatter(inout float v[V], uint lane) {
    uint cnt = V;
    [[unroll]] for (uint m = RW / 2; m > 0; m >>= 1) {
        if (cnt > 1) {
            uint half_ = cnt / 2;
            bool up = (lane & m) != 0;
            [[unroll]] for (uint j = 0; j < V / 2; ++j) {
                if (j < half_) {
                    float keep = up ? v[j + half_] : v[j];
                    float send = up ? v[j] : v[j + half_];
                    v[j] = keep + subgroupShuffleXor(send, m);
                }
            }
            cnt = half_;
        } else {
            v[0] = v[0] + subgroupShuffleXor(v[0], m);
        }
    }
}

void main() {
    if (!subgroups_as_planned()) {
        if (gl_LocalInvocationIndex == 0) atomicOr(flag[0], 2u);
        return;
    }
    Slot r;
    if (!slot_of(r, pc.gx, pc.S, pc.T, pc.H, pc.G, pc.NCH, pc.NRB, TI)) return;   // the whole workgroup
    bool ok = true;
    uint lane = r.lane, slice = r.slice, h = r.h;

    // The slice's tokens: steps, inputs, g_y; its B and C spread over the subgroup's lanes (lane l
    // holds values k * RW + l of the slice's TI x N, read by every lane through subgroupShuffle:
    // coalesced loads, issued together, instead of a broadcast load per value and lane).
    float dv[TI], uv[TI], gv[TI], sg[TI];
    float D = 0.0;
    [[unroll]] for (uint j = 0; j < TI; ++j) {
        bool on = j < r.nt;                            // uniform in a subgroup
        uint o = (r.i * pc.T + r.t0 + (on ? j : 0u)) * pc.H + h;
        float z = on ? dt[pc.o_dt + o] : 0.0;
        float xv = on ? x[pc.o_x + o] : 0.0;
        gv[j] = on ? gy[pc.o_gy + o] : 0.0;
        float gr;
        float sp = softplus_with_grad(z, gr);
        dv[j] = on ? sp : 0.0;
        sg[j] = on ? gr : 0.0;
        uv[j] = xv * dv[j];
        D += dv[j];
    }
    float vb[KS], vc[KS];
    [[unroll]] for (uint k = 0; k < KS; ++k) {
        uint e = k * RW + lane;
        uint tj = e / ND, n = e % ND;
        bool on = e < TI * ND && tj < r.nt;
        uint o = ((r.i * pc.T + r.t0 + (on ? tj : 0u)) * pc.G + r.g) * ND + n;
        vb[k] = on ? Bm[pc.o_B + o] : 0.0;
        vc[k] = on ? Cm[pc.o_C + o] : 0.0;
    }

    // 1. The slice's parts of the state (into the table) and of the adjoint (kept until the
    // table is free for them), from zero.
    float wv[ND];
    [[unroll]] for (uint n = 0; n < ND; ++n) {
        float An = A[pc.o_A + h * ND + n];
        float z = 0.0, P = 1.0, w = 0.0;
        [[unroll]] for (uint j = 0; j < TI; ++j) {
            const uint e = j * ND + n;
            float a = exp(dv[j] * An);
            z = z * a + subgroupShuffle(vb[e / RW], e % RW) * uv[j];
            P *= a;
            w += P * (gv[j] * subgroupShuffle(vc[e / RW], e % RW));
        }
        zs[(slice * ND + n) * RW + lane] = z;
        wv[n] = w;
    }
    Ds[slice * RW + lane] = D;
    barrier();

    // 2. Compose the slices of each (channel, n): forwards for the states, then backwards for the
    // adjoint. The decays of the slices, exp(D A), are taken again in the second turn.
    for (uint q = gl_LocalInvocationIndex; q < RW * ND; q += WG) {
        uint ql = q % RW, n = q / RW;
        uint hh = r.rb * RW + ql;
        float An = A[pc.o_A + hh * ND + n];
        uint src = pc.NCH > 1u ? (r.i * pc.NCH + r.c) * pc.H + hh : r.i * pc.H + hh;
        float acc;
        if (pc.gather != 0u && pc.NCH == 1u) {
            acc = s_in[pc.o_s + (ids[pc.o_ids + r.i] * pc.H + hh) * ND + n];
        } else {
            acc = init_st[pc.o_init + src * ND + n];
        }
        [[unroll]] for (uint v = 0; v < NW; ++v) {
            uint k = (v * ND + n) * RW + ql;
            float zv = zs[k];
            zs[k] = acc;                               // the state before slice v
            acc = exp(Ds[v * RW + ql] * An) * acc + zv;
        }
        ok = ok && finite(acc);
    }
    barrier();
    float s0all[ND];                                   // the state before this slice
    [[unroll]] for (uint n = 0; n < ND; ++n) {
        uint k = (slice * ND + n) * RW + lane;         // this thread's own slots
        s0all[n] = zs[k];
        zs[k] = wv[n];
    }
    barrier();
    for (uint q = gl_LocalInvocationIndex; q < RW * ND; q += WG) {
        uint ql = q % RW, n = q / RW;
        uint hh = r.rb * RW + ql;
        float An = A[pc.o_A + hh * ND + n];
        uint src = pc.NCH > 1u ? (r.i * pc.NCH + r.c) * pc.H + hh : r.i * pc.H + hh;
        float lam = adj[pc.o_adj + src * ND + n];
        [[unroll]] for (uint v = NW; v > 0; --v) {
            uint k = ((v - 1) * ND + n) * RW + ql;
            float wv2 = zs[k];
            zs[k] = lam;                               // the adjoint after slice v - 1: a_{t+1} lam_{t+1}
            lam = exp(Ds[(v - 1) * RW + ql] * An) * lam + wv2;
        }
        if (pc.NCH == 1u) adj[pc.o_adj + src * ND + n] = lam;   // d_s0 = a_0 lam_0
        ok = ok && finite(lam);
    }
    barrier();

    // 3. The walk back, NB state values per round.
    float gam[TI], qa[TI];
    [[unroll]] for (uint j = 0; j < TI; ++j) {
        gam[j] = 0.0;
        qa[j] = 0.0;
    }
    [[unroll]] for (uint nb = 0; nb < ND / NB; ++nb) {
        float s0[NB], nu[NB], An[NB], dAk[NB];
        float hist[TI][NB], av[TI][NB], Bv[TI][NB];
        [[unroll]] for (uint k = 0; k < NB; ++k) {
            uint n = nb * NB + k;
            s0[k] = s0all[n];
            nu[k] = zs[(slice * ND + n) * RW + lane];
            An[k] = A[pc.o_A + h * ND + n];
            dAk[k] = 0.0;
        }
        [[unroll]] for (uint j = 0; j < TI; ++j) {
            bool on = j < r.nt;
            [[unroll]] for (uint k = 0; k < NB; ++k) {
                float a = exp(dv[j] * An[k]);
                const uint e = j * ND + nb * NB + k;
                float Bn = subgroupShuffle(vb[e / RW], e % RW);
                av[j][k] = a;
                Bv[j][k] = Bn;
                float prev = j == 0 ? s0[k] : hist[j == 0 ? 0 : j - 1][k];
                hist[j][k] = prev * a + Bn * uv[j];
            }
        }
        float vals[V];
        [[unroll]] for (uint jj = TI; jj > 0; --jj) {
            uint j = jj - 1;
            bool on = j < r.nt;
            [[unroll]] for (uint k = 0; k < NB; ++k) {
                const uint e = j * ND + nb * NB + k;
                float Cn = subgroupShuffle(vc[e / RW], e % RW);
                float lam = nu[k] + gv[j] * Cn;
                vals[j * NB + k] = gv[j] * hist[j][k];              // d_C
                vals[(TI + j) * NB + k] = lam * uv[j];              // d_B
                gam[j] += lam * Bv[j][k];
                float prev = j == 0 ? s0[k] : hist[j == 0 ? 0 : j - 1][k];
                float q = lam * prev * av[j][k];
                qa[j] += q * An[k];
                dAk[k] += on ? q * dv[j] : 0.0;
                nu[k] = av[j][k] * lam;
            }
        }
        reduce_scatter(vals, lane);
        if (V >= RW) {
            [[unroll]] for (uint k2 = 0; k2 < (V >= RW ? V / RW : 1); ++k2) {
                uint e = lane * (V / RW) + k2;
                uint kind = e / (TI * NB), j = (e / NB) % TI, k = e % NB;
                if (j < r.nt) {
                    uint o = ((r.i * pc.T + r.t0 + j) * pc.NRB + r.rb) * ND + nb * NB + k;
                    if (kind == 0) {
                        dCp[o] = vals[k2];
                    } else {
                        dBp[o] = vals[k2];
                    }
                    ok = ok && finite(vals[k2]);
                }
            }
        } else if (lane % (V >= RW ? 1 : RW / V) == 0) {
            uint e = lane / (V >= RW ? 1 : RW / V);
            uint kind = e / (TI * NB), j = (e / NB) % TI, k = e % NB;
            if (j < r.nt) {
                uint o = ((r.i * pc.T + r.t0 + j) * pc.NRB + r.rb) * ND + nb * NB + k;
                if (kind == 0) {
                    dCp[o] = vals[0];
                } else {
                    dBp[o] = vals[0];
                }
                ok = ok && finite(vals[0]);
            }
        }
        // This thread's d_A of these n, into its own slots (read above; no other thread reads them
        // before the barrier below).
        [[unroll]] for (uint k = 0; k < NB; ++k) zs[(slice * ND + nb * NB + k) * RW + lane] = dAk[k];
    }
    [[unroll]] for (uint j = 0; j < TI; ++j) {
        if (j < r.nt) {
            uint o = (r.i * pc.T + r.t0 + j) * pc.H + h;
            float xv = x[pc.o_x + o];
            float dxv = gam[j] * dv[j];
            float ddv = (gam[j] * xv + qa[j]) * sg[j];
            dx[pc.o_dx + o] = dxv;
            ddt[pc.o_ddt + o] = ddv;
            ok = ok && finite(dxv) && finite(ddv);
        }
    }
    barrier();
    // d_A of the chunk: the slices' sums added in slice order.
    for (uint q = gl_LocalInvocationIndex; q < RW * ND; q += WG) {
        uint ql = q % RW, n = q / RW;
        uint hh = r.rb * RW + ql;
        float s = 0.0;
        for (uint v = 0; v < NW; ++v) s += zs[(v * ND + n) * RW + ql];
        dAp[((r.i * pc.H + hh) * pc.NCH + r.c) * ND + n] = s;
        ok = ok && finite(s);
    }
    if (!ok) atomicOr(flag[0], 1u);
}
