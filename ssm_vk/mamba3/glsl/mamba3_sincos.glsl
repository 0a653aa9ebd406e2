// sincos_f32: the angles' sine and cosine, shared by the token-sequential Mamba-3 kernels
// (mamba3_common.glsl) and the chunked ones (m3c_common.glsl), so both turn keys and queries
// by the same numbers.

// (sin x, cos x) in float32 within about 2 ulp on every device, whatever its own sin and cos (a
// GPU's are often approximations): x = j π/4 + r, |r| <= π/4, with π/4 in three parts
// (Cody-Waite) and Cephes sinf/cosf's minimax polynomials on r; the octant j picks the
// polynomial and the signs (as ssm_fast.mathf.sincos_f32). Exact reduction up to |x| = 8192 (the
// angles are in [0, 2π]); beyond it, and for inf and nan, nan.
vec2 sincos_f32(float x) {
    float ax = abs(x);
    if (!(ax <= 8192.0)) return vec2(uintBitsToFloat(0x7fc00000u));
    int j = int(ax * 1.27323954473516);
    j = (j + 1) & -2;                        // the even octant nearest below-or-at: r in [-π/4, π/4]
    float y = float(j);
    float r = ax - y * 0.78515625;
    r = r - y * 2.4187564849853515625e-4;
    r = r - y * 3.77489497744594108e-8;
    float z = r * r;
    float ps = ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * r + r;
    float pc = ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z - 0.5 * z + 1.0;
    j = j & 7;
    bool swap = (j & 2) != 0;                // octants 2, 6: sin and cos polynomials trade places
    float sn = swap ? pc : ps;
    float cs = swap ? ps : pc;
    if ((j >= 4) != (x < 0.0)) sn = -sn;
    if (j == 2 || j == 4) cs = -cs;
    return vec2(sn, cs);
}
