// The 64 x 64 tile of the chunked Mamba-3 products (m3c_states.comp, m3c_y.comp, the backward's):
// 256 invocations, each the 4 x 4 block of rows 4 ty .. 4 ty + 3 and columns 4 tx .. 4 tx + 3.
// Each 32 invocations (a warp on most GPUs) hold a 16 x 32 region, 4 ty by 8 tx (tile_ty,
// tile_tx): a slice's step reads 4 + 8 vec4 (against 2 + 16 for a 2 x 16 region), and the regions
// wholly above a chunk's diagonal (rows 0-31 against columns 32-63) are whole warps, which skip
// their masked products together. A contraction runs KS indices at a time through
// shared memory, the left operand's slice as (k, row), the right's as (k, col) (stage_a, stage_b), each
// product added in index order (fixed: reruns are bit-identical).

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

const uint TILE = 64u;
const uint KS = 16u;
// vec4s per index k of a slice, and per row of a kernel's 64 x 64 matrix in shared memory (SROW):
// one vec4 more than the 16 a row needs. Unpadded, the 16 k of a row-major staging (put_rows)
// and the 16 columns of a block store fall on one shared-memory bank (a 16-way conflict on every
// store); padded, they spread over the banks. Where values go only: the sums are unchanged.
const uint SLICE = TILE / 4u + 1u;
const uint SROW = TILE / 4u + 1u;

// (vec4: an invocation reads its four rows, or columns, of a slice in one 16-byte load)
shared vec4 as4[KS * SLICE];
shared vec4 bs4[KS * SLICE];

uint tile_ty() { return (gl_LocalInvocationIndex / 64u) * 4u + (gl_LocalInvocationIndex % 32u) / 8u; }
uint tile_tx() { return ((gl_LocalInvocationIndex / 32u) % 2u) * 8u + gl_LocalInvocationIndex % 8u; }

// Entry (k, row) of the left slice, (k, col) of the right one.
void stage_a(uint k, uint row, float v) { as4[k * SLICE + row / 4u][row % 4u] = v; }
void stage_b(uint k, uint col, float v) { bs4[k * SLICE + col / 4u][col % 4u] = v; }

// Each invocation stages PER entries of a slice: e = invocation + j 256 (j < PER), either row-major
// (row e / KS, index e % KS: neighbours read along a row of a row-major operand) or index-major
// (index e / TILE, column e % TILE: neighbours read neighbouring columns). The entries of the next
// slice are read into registers before the products of the current one (their loads overlap).
const uint PER = KS * TILE / 256u;

void put_rows(float va[PER], float vb[PER]) {
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + 256u * j;
        stage_a(e % KS, e / KS, va[j]);
        stage_b(e % KS, e / KS, vb[j]);
    }
}

void put_cols(float va[PER], float vb[PER]) {
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + 256u * j;
        stage_a(e / TILE, e % TILE, va[j]);
        stage_b(e / TILE, e % TILE, vb[j]);
    }
}

// acc += as_slice[0..kn)ᵀ bs_slice[0..kn) for this invocation's block (after a barrier that covers
// the slices' stores).
void tile_mma(inout float acc[4][4], uint kn) {
    uint ty = tile_ty(), tx = tile_tx();
    for (uint k = 0u; k < kn; ++k) {
        vec4 a = as4[k * SLICE + ty];
        vec4 b = bs4[k * SLICE + tx];
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
