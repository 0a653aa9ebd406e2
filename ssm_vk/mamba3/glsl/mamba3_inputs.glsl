// Mamba-3's inputs, bindings 0-14 of both families' kernels (mamba3_common.glsl, m3c_common.glsl),
// in the declaration's order (ssm_ref/ops.py MAMBA3; ssm_vk/mamba3/mamba3_specs.py INPUTS): x, dt,
// dA, lam, B, C, the biases, dtheta, psi, the four start-state caches and the ids (cache rows).

layout(std430, binding = 0) readonly buffer Bx { float x_in[]; };
layout(std430, binding = 1) readonly buffer Bdt { float dt_in[]; };
layout(std430, binding = 2) readonly buffer BdA { float dA_in[]; };
layout(std430, binding = 3) readonly buffer Blam { float lam_in[]; };
layout(std430, binding = 4) readonly buffer BB { float B_in[]; };
layout(std430, binding = 5) readonly buffer BC { float C_in[]; };
layout(std430, binding = 6) readonly buffer BBb { float Bb_in[]; };
layout(std430, binding = 7) readonly buffer BCb { float Cb_in[]; };
layout(std430, binding = 8) readonly buffer Bdth { float dth_in[]; };
layout(std430, binding = 9) readonly buffer Bpsi { float psi_in[]; };
// The token-sequential forward (M3_CACHE_RW defined) may write a decode step's final state into
// the cache rows in place (update_cache=True; mamba3_scan.comp's IP): its caches are read-write.
#ifdef M3_CACHE_RW
#define M3_CACHE_ACCESS
#else
#define M3_CACHE_ACCESS readonly
#endif
layout(std430, binding = 10) M3_CACHE_ACCESS buffer Bsth { float sth_in[]; };
layout(std430, binding = 11) M3_CACHE_ACCESS buffer Bsh { float sh_in[]; };
layout(std430, binding = 12) M3_CACHE_ACCESS buffer Bsk { float sk_in[]; };
layout(std430, binding = 13) M3_CACHE_ACCESS buffer Bsv { float sv_in[]; };
layout(std430, binding = 14) readonly buffer Bids { uint ids_in[]; };
