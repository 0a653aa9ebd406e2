// softplus and its derivative, shared by the sequential (common.glsl) and chunked
// (chunk_common.glsl) kernels.

// softplus(z) = z if z > 20 else log(1 + exp(z)), in float32 (not log1p: docs/SPEC.md section 8).
// No min(z, 20) to guard exp: min() with a nan operand is undefined in SPIR-V (lavapipe returns
// 20, so softplus(nan) was 20 and a nan step gave its head finite, wrong results). The test is
// written so that nan takes the identity branch and stays nan without relying on exp and log to
// carry it (Vulkan does not promise nan propagation); the log branch only sees z <= 20.
float softplus(float z) {
    return z <= 20.0 ? log(1.0 + exp(z)) : z;
}

// d softplus / dz: 1 on the identity branch, sigmoid(z) on the log branch.
float softplus_grad(float z) {
    return z > 20.0 ? 1.0 : 1.0 / (1.0 + exp(-z));
}
