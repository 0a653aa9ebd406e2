#version 450
// The chunk states hs[p][n] = sum_s dout_s u_s[p] B_s[n] (P x N) of each (sequence, chunk, head):
// segment 1 only, unmasked. The GEMM engine, its defines and what a product defines:
// glsl/chunk_gemm.glsl.
#define ROWS PD
#define COLS ND
#define K1 CL
#define MASK 0u
#define K2 0
#define A1_RF true
#define B1_CF true
#define A1(r, k) ((k < Lc && r < PD) ? u_of(k, r) * sdo[k] : 0.0)
#define B1(k, cc) ((k < Lc && cc < ND) ? B_of(k, cc) : 0.0)
#define STORE1(r, cc, v, sum) if (r < PD && cc < ND) hs[hmat * PD * ND + r * ND + cc] = v;
#define STORE4(r, cc, v, sum) if (r < PD && cc < ND) hs4[(hmat * PD * ND + r * ND + cc) >> 2] = v;
#include "chunk_gemm.glsl"

void main() {
    GEMM_BEGIN
    set_head(hb);
    fetch1_any(0u);
    segment1(rlo, rhi, tr, tc, false);
    GEMM_EPILOGUE
}
