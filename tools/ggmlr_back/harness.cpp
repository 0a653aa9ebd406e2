// Runs ggmlR's CPU SSM_SCAN_BACK kernel on caller-owned float32 arrays, the way ggml's CPU backend
// (built with OpenMP) runs an op: nth OpenMP threads, each calling the op with its own ith, and
// ggml_barrier() an OpenMP barrier. The kernel, ggml_compute_forward_ssm_scan_back, is ggmlR's
// (src/ggml-cpu/ops-ssm.cpp of https://github.com/Zabis13/ggmlR), compiled unchanged beside this
// file by tools/build_ggmlr_back.sh; it is not part of this repository.
//
// Glossary: N d_state, P head_dim, H n_head, G n_group, T tokens, S sequences, R cache rows.
// Tensors, as ggml lists dimensions (fastest first; docs/SPEC.md section 2): s (N,P,H,R),
// x (P,H,T,S), dt (H,T,S), A (1,H) for Mamba-2 or (N,H) for Mamba-1, B and C (N,G,T,S), ids (S)
// int32; grad: the packed forward layout (g_y then g_states), out: the packed backward layout
// d_s0 | d_x | d_dt | d_A | d_B | d_C (docs/SPEC.md section 7). All contiguous.
#include "ggml.h"
#include "ggml-cpu-impl.h"
#include "shim.h"

#include <omp.h>

#include <chrono>
#include <cstdint>
#include <cstring>

// ggmlR's op. It has C++ linkage here: upstream's ops.h, which the build compiles against, does
// not declare it inside its extern "C" block.
void ggml_compute_forward_ssm_scan_back(const ggml_compute_params * params, ggml_tensor * dst);

// The library is linked with -Bsymbolic, so the op's calls bind to this definition and not to
// libggml-cpu's (which needs a ggml threadpool). ggml's own OpenMP build does the same thing.
extern "C" void ggml_barrier(struct ggml_threadpool * tp) {
    (void) tp;
#pragma omp barrier
}

#define SSM_GGMLR_STUB(name) \
    void name(const ggml_compute_params *, ggml_tensor *) { GGML_ABORT(#name " is not part of the ggmlR harness"); }
SSM_GGMLR_MISSING_OPS(SSM_GGMLR_STUB)
#undef SSM_GGMLR_STUB

namespace {

void set_tensor(ggml_tensor & t, ggml_type type, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3,
                const void * data) {
    std::memset(&t, 0, sizeof t);
    t.type = type;
    const int64_t ne[4] = {ne0, ne1, ne2, ne3};
    t.nb[0] = ggml_type_size(type);
    for (int i = 0; i < 4; ++i) {
        t.ne[i] = ne[i];
        if (i > 0) {
            t.nb[i] = t.nb[i - 1] * ne[i - 1];
        }
    }
    t.data = const_cast<void *>(data);
}

}  // namespace

// dims: N, P, H, G, T, S, R; a_n: A's fastest extent (1 for Mamba-2, N for Mamba-1).
// Returns 0 and the seconds of the threaded region in *seconds, or 1 for dimensions the op cannot
// take (nothing is run then).
extern "C" int ssm_ggmlr_scan_back(const int64_t * dims, int64_t a_n, const float * s, const float * x,
                                   const float * dt, const float * A, const float * B, const float * C,
                                   const int32_t * ids, const float * grad, float * out, int nth,
                                   double * seconds) {
    const int64_t N = dims[0], P = dims[1], H = dims[2], G = dims[3], T = dims[4], S = dims[5], R = dims[6];
    for (int i = 0; i < 7; ++i) {
        if (dims[i] < 1) {
            return 1;
        }
    }
    if (H % G != 0 || (a_n != 1 && a_n != N) || nth < 1) {
        return 1;
    }
    for (int64_t i = 0; i < S; ++i) {
        if (ids[i] < 0 || ids[i] >= R) {
            return 1;
        }
    }
    const int64_t n_out = S * H * P * N + S * T * H * P + S * T * H + a_n * H + 2 * S * T * G * N;
    ggml_tensor ts, tx, tdt, tA, tB, tC, tids, tgrad, dst;
    set_tensor(ts, GGML_TYPE_F32, N, P, H, R, s);
    set_tensor(tx, GGML_TYPE_F32, P, H, T, S, x);
    set_tensor(tdt, GGML_TYPE_F32, H, T, S, 1, dt);
    set_tensor(tA, GGML_TYPE_F32, a_n, H, 1, 1, A);
    set_tensor(tB, GGML_TYPE_F32, N, G, T, S, B);
    set_tensor(tC, GGML_TYPE_F32, N, G, T, S, C);
    set_tensor(tids, GGML_TYPE_I32, S, 1, 1, 1, ids);
    set_tensor(tgrad, GGML_TYPE_F32, S * T * H * P + S * H * P * N, 1, 1, 1, grad);
    set_tensor(dst, GGML_TYPE_F32, n_out, 1, 1, 1, out);
    ggml_tensor * srcs[8] = {&ts, &tx, &tdt, &tA, &tB, &tC, &tids, &tgrad};
    for (int i = 0; i < 8; ++i) {
        dst.src[i] = srcs[i];
    }
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(nth)
    {
        ggml_compute_params params;
        std::memset(&params, 0, sizeof params);
        params.ith = omp_get_thread_num();
        params.nth = omp_get_num_threads();
        ggml_compute_forward_ssm_scan_back(&params, &dst);
    }
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return 0;
}
