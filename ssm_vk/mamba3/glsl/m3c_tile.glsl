// The 64 x 64 tile of the chunked Mamba-3 products (m3c_states.comp, m3c_y.comp): 256
// invocations, each the 4 x 4 block of rows 4 ty .. 4 ty + 3 and columns 4 tx .. 4 tx + 3
// (ty = invocation / 16, tx = invocation % 16); a contraction runs KS indices at a time through
// shared memory, the left operand's slice in as_sh[k][row], the right's in bs_sh[k][col], each
// product added in index order (fixed: reruns are bit-identical).

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

const uint TILE = 64u;
const uint KS = 16u;

shared float as_sh[KS * TILE];
shared float bs_sh[KS * TILE];

uint tile_tx() { return gl_LocalInvocationIndex % 16u; }
uint tile_ty() { return gl_LocalInvocationIndex / 16u; }

// acc += as_sh[0..kn)ᵀ bs_sh[0..kn) for this invocation's block (after a barrier that covers the
// slices' stores).
void tile_mma(inout float acc[4][4], uint kn) {
    uint r0 = 4u * tile_ty(), c0 = 4u * tile_tx();
    for (uint k = 0u; k < kn; ++k) {
        float a[4], b[4];
        [[unroll]] for (uint u = 0u; u < 4u; ++u) {
            a[u] = as_sh[k * TILE + r0 + u];
            b[u] = bs_sh[k * TILE + c0 + u];
        }
        [[unroll]] for (uint u = 0u; u < 4u; ++u) {
            [[unroll]] for (uint v = 0u; v < 4u; ++v) acc[u][v] += a[u] * b[v];
        }
    }
}

void tile_zero(out float acc[4][4]) {
    [[unroll]] for (uint u = 0u; u < 4u; ++u) {
        [[unroll]] for (uint v = 0u; v < 4u; ++v) acc[u][v] = 0.0;
    }
}
