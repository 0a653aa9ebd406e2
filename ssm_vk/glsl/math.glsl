// The step softplus(dt) and its derivative, shared by the sequential (common.glsl) and chunked
// (chunk_common.glsl) kernels. Which form: the specialisation constant SOFTPLUS (the call's
// dt_softplus; docs/SPEC.md section 8), set when the pipeline is made, so one SPIR-V module
// serves every form:
//   0  ggml's  z if z > 20 else log(1 + exp(z))   (the default: bit-compatible with ggml)
//   1  z if z > 20 else log1p(exp(z)), computed accurately (below)
//   2  none: dt is the step itself
layout(constant_id = 3) const int SOFTPLUS = 0;

// Whether v is finite: false for inf and for nan (which fails every comparison).
bool finite(float v) { return abs(v) <= 3.4028234664e38; }

// The accurate form's helpers are written with `precise` multiplies and adds, no fma(): Mesa's
// lavapipe (22.3) evaluated fma(-n, LN2_LO, t) with an error of 3e-6 where separate operations are
// exact to an ulp, and `precise` keeps compilers from reassociating or contracting them.

// log1p(e) for e in [0, 1], to a few ulp: 2 atanh(w) with w = e / (2 + e) in [0, 1/3], its odd
// series to w^17 (the first term left out is below 2^-27 of the sum), taken as e * 2s / (2 + e)
// so that no intermediate is smaller than e (a device that flushes subnormals keeps every e that
// is normal). Not log(1 + e), whose absolute error near 1 is what makes the ggml form inaccurate
// for small e; GLSL has no log1p.
float log1p_small(float e) {
    precise float w = e / (2.0 + e);
    precise float w2 = w * w;
    precise float s = 1.0 / 17.0;
    s = s * w2 + 1.0 / 15.0;
    s = s * w2 + 1.0 / 13.0;
    s = s * w2 + 1.0 / 11.0;
    s = s * w2 + 1.0 / 9.0;
    s = s * w2 + 1.0 / 7.0;
    s = s * w2 + 1.0 / 5.0;
    s = s * w2 + 1.0 / 3.0;
    s = s * w2 + 1.0;
    precise float q = 2.0 * s / (2.0 + e);
    return e * q;
}

// exp(x) for x <= 0 to a few ulp wherever the result is normal: x = n ln2 + r with |r| <= ln2/2
// (Cody and Waite's two-part ln2: n * LN2_HI and x - n * LN2_HI are exact), exp(r) by its Taylor
// series to r^8/8! (the rest is below 2^-28), then 2^n. GLSL's exp may be off by (3 + 2|x|) ulp
// (Vulkan's bound; lavapipe's is by 4e-6 at x = -87), which would carry into the step.
float exp_nonpositive(float x) {
    if (x < -104.0) {
        return 0.0;     // (also -inf) below every subnormal
    }
    const float LN2_HI = 0.693145751953125;        // 16 significant bits
    const float LN2_LO = 1.4286068203094173e-06;   // ln 2 - LN2_HI
    float n = round(x * 1.4426950408889634);
    precise float t = x - n * LN2_HI;
    precise float r = t - n * LN2_LO;
    precise float p = 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    int k = int(n);
    if (k < -100) {          // 2^k as one normal float: take 2^-24 out first
        p *= 5.9604644775390625e-08;
        k += 24;
    }
    return p * intBitsToFloat((k + 127) << 23);
}

// softplus(z) = z if z > 20 else the form's log branch, in float32.
// No min(z, 20) to guard exp: min() with a nan operand is undefined in SPIR-V (lavapipe returns
// 20, so softplus(nan) was 20 and a nan step gave its head finite, wrong results). The test is
// written so that nan takes the identity branch and stays nan without relying on exp and log to
// carry it (Vulkan does not promise nan propagation); the log branch only sees z <= 20.
// The accurate form: softplus(z) = max(z, 0) + log1p(exp(-|z|)), exp's argument never positive.
float softplus(float z) {
    if (SOFTPLUS == 2) {
        return z;
    }
    if (SOFTPLUS == 1) {
        return z <= 20.0 ? (z > 0.0 ? z : 0.0) + log1p_small(exp_nonpositive(-abs(z))) : z;
    }
    return z <= 20.0 ? log(1.0 + exp(z)) : z;
}

// d softplus / dz: 1 on the identity branch (and for no softplus), sigmoid(z) on the log branch
// of either form (the derivative of the formula, not of its rounding).
float softplus_grad(float z) {
    if (SOFTPLUS == 2) {
        return 1.0;
    }
    if (SOFTPLUS == 1) {   // sigmoid(z) from exp(-|z|) <= 1: as accurate as the step
        if (z > 20.0) {
            return 1.0;
        }
        float e = exp_nonpositive(-abs(z));
        return z > 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
    }
    return z > 20.0 ? 1.0 : 1.0 / (1.0 + exp(-z));
}

// softplus(z) and, in ``grad``, its derivative, as the two functions above give them (the same
// bits), the accurate form's exp(-|z|) taken once for both.
float softplus_with_grad(float z, out float grad) {
    if (SOFTPLUS == 1 && z <= 20.0) {
        float e = exp_nonpositive(-abs(z));
        grad = z > 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
        return (z > 0.0 ? z : 0.0) + log1p_small(e);
    }
    grad = softplus_grad(z);
    return softplus(z);
}
