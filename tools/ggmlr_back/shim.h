// Force-included (-include) before ggmlR's src/ggml-cpu/ops-ssm.cpp by tools/build_ggmlr_back.sh.
//
// ggmlR split upstream's ops.cpp into several files and declares, in its own ops.h, the
// elementwise ops that upstream keeps static in ops.cpp. ops-ssm.cpp dispatches to ten of them
// (from ggml_compute_forward_unary and _glu, which the backward never calls); upstream's headers,
// which we compile against, do not declare them. These declarations let the file compile as it
// is; harness.cpp defines them as aborting stubs. Same signature as every ggml CPU op.
#pragma once

struct ggml_compute_params;
struct ggml_tensor;

#define SSM_GGMLR_MISSING_OPS(X) \
    X(ggml_compute_forward_gelu) X(ggml_compute_forward_gelu_erf) X(ggml_compute_forward_gelu_quick) \
    X(ggml_compute_forward_silu) X(ggml_compute_forward_reglu) X(ggml_compute_forward_geglu) \
    X(ggml_compute_forward_swiglu) X(ggml_compute_forward_swiglu_oai) X(ggml_compute_forward_geglu_erf) \
    X(ggml_compute_forward_geglu_quick)

#define SSM_GGMLR_DECLARE(name) void name(const struct ggml_compute_params * params, struct ggml_tensor * dst);
SSM_GGMLR_MISSING_OPS(SSM_GGMLR_DECLARE)
#undef SSM_GGMLR_DECLARE
