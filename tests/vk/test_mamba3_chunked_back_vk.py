"""The chunked Mamba-3 backward on the Vulkan device (ssm_vk/mamba3/glsl/m3b_*.comp after the
forward's own m3c_prep, m3c_angle, m3c_states, m3c_pass; the matrix form of
ssm_ref/mamba3_chunked_back.py): drawn problems of several chunks (the last one partial, S > 1 with
ids, G > 1, SISO and MIMO, F = 0 to N/2, both rotations) against the float64 reference
ssm_ref.mamba3_scan_back within the op's float32 tolerance; bit-identical reruns; the chunked and
the token-sequential backward agree; a non-finite call recomputed token by token; the planner's
choice.

The chunked backward takes sequences of M3_CHUNK_BWD_MIN_T tokens or more (default 64 on a GPU,
128 on lavapipe): these tests set the knobs (ssm_vk.config.configure) to run it on short
sequences in short chunks. Every test runs under the validation layer (tests/conftest.py fails a
test on any message)."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from mamba3_chunks import GPU, INPUTS, args_of, chunked_cases, reruns

import ssm_vk
from ssm_ref import ops
from ssm_ref.mamba3_checks import M3Dims, check_mamba3_backward
from ssm_ref.testing import mamba3_cases
from ssm_ref.testing.properties.generic import GENERIC
from ssm_ref.tolerance import MAMBA3_F32_TOL, compare, scaled
from ssm_vk import config, mamba3_api, registry
from ssm_vk.engine import engine_of
from ssm_vk.mamba3 import mamba3_chunked_planner, mamba3_chunked_specs

pytestmark = pytest.mark.vulkan

OP = ops.get("mamba3_scan")
TOL = OP.tol()
WHERE = re.compile(r"Vulkan\d+")
GRADS = ("d_x", "d_dt", "d_dA", "d_lam", "d_B", "d_C", "d_B_bias", "d_C_bias", "d_dtheta", "d_psi", "d_s_theta",
         "d_s_h", "d_s_k", "d_s_v")
FEW = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def _chunked(L: int):
    """The knobs that send every backward to the chunked kernels, in chunks of ``L`` tokens."""
    return config.configure(tune={"M3_CHUNK": L, "M3_CHUNK_BWD_MIN_T": 1})


def _token():
    return config.configure(tune={"M3_CHUNK": 0})


def _family(case) -> str:
    a = args_of(case)
    p = check_mamba3_backward(*(a[k] for k in INPUTS), rotation=a["rotation"], dtype=np.float32)
    return mamba3_api.decide("mamba3_scan_back", p.dims, rotation=a["rotation"]).planned.first.family.name


def _fits() -> bool:
    """Whether this device takes the chunked backward (its limits read, not assumed)."""
    info = ssm_vk.runtime.get_context().info
    return (min(info.max_workgroup_invocations, info.max_workgroup_size[0]) >= mamba3_chunked_planner.CHUNK_WG
            and info.max_shared_memory >= mamba3_chunked_planner.CHUNK_BWD_SHARED
            and info.max_storage_buffers_per_stage >= mamba3_chunked_planner.CHUNK_BWD_BINDINGS)


@pytest.fixture(scope="module")
def fit():
    """Skips a test on a device that lacks the chunked backward's limits."""
    if not _fits():
        pytest.skip("this device lacks the chunked backward's limits (workgroup, shared memory, storage buffers)")


@given(lc=chunked_cases())
@FEW
def test_drawn_problems_meet_the_float64_reference(fit, lc):
    """Every gradient within the op's tolerance of the float64 reference, on the chunked backward
    (the plan asserted), computed on the device by its own kernels (no recompute)."""
    L, case = lc
    before = reruns()
    with _chunked(L):
        assert _family(case) == "mamba3_chunked"
        assert GENERIC["oracle_backward"].check(ssm_vk, case, TOL)
        assert WHERE.fullmatch(ssm_vk.mamba3_scan_back(**args_of(case), **case.cotangents).where)
    assert reruns() == before


@pytest.mark.parametrize("rotation", ["interleaved", "halved"])
def test_several_tiles_of_channels_and_state(fit, rotation):
    """P = 70 and N = 72: two 64-wide tiles of each, MIMO rank 2, F = N/2."""
    case = mamba3_cases.make_case(7, S=1, T=9, H=2, P=70, N=72, G=1, M=2, F=36, ids="identity", rotation=rotation)
    with _chunked(4):
        assert _family(case) == "mamba3_chunked"
        assert GENERIC["oracle_backward"].check(ssm_vk, case, TOL)


def test_default_chunk_length_over_long_decays(fit):
    """The planner's own chunk length (64 tokens, SISO) over 150 tokens of decays near 1, the last
    chunk partial."""
    case = mamba3_cases.make_case(5, S=1, T=150, H=2, P=4, N=8, G=1, F=2, ids="permutation", regime="long_decay")
    before = reruns()
    with config.configure(tune={"M3_CHUNK_BWD_MIN_T": 1}):
        assert _family(case) == "mamba3_chunked"
        assert GENERIC["oracle_backward"].check(ssm_vk, case, TOL)
    assert reruns() == before


def test_reruns_are_bit_identical(fit):
    """The same backward twice, and again after the recorded sequences are dropped: the same bits
    (d_B, d_C summed over a group's heads, the biases over sequences and chunks, in fixed orders)."""
    case = mamba3_cases.make_case(11, S=2, T=11, H=4, P=5, N=8, G=2, M=2, F=2, ids="duplicates")
    with _chunked(3):
        runs = [ssm_vk.mamba3_scan_back(**args_of(case), **case.cotangents) for _ in range(2)]
        engine_of(ssm_vk.runtime.get_context()).clear()
        runs.append(ssm_vk.mamba3_scan_back(**args_of(case), **case.cotangents))
    for r in runs[1:]:
        for name in GRADS:
            assert np.asarray(r[name]).tobytes() == np.asarray(runs[0][name]).tobytes(), name


def test_the_default_tiles_of_the_two_halves_meet_the_float64_reference(fit):
    """At the planner's 64-token chunk with P = 64 and N = 128 (every row of the 64 x 64 tiles, the
    products' slices read ahead), the chunk kernel's second half reading the first's per-token sums
    back from d_step's planes: every gradient within the op's tolerance of float64."""
    case = mamba3_cases.make_case(9, S=1, T=150, H=2, P=64, N=128, G=1, F=32, ids="identity")
    with config.configure(tune={"M3_CHUNK_BWD_MIN_T": 1}):
        assert _family(case) == "mamba3_chunked"
        assert GENERIC["oracle_backward"].check(ssm_vk, case, TOL)


@pytest.mark.parametrize("M", [None, 3])
def test_chunked_and_token_sequential_backwards_agree(fit, M):
    """The two families' backwards of one case within the op's tolerance of each other."""
    case = mamba3_cases.make_case(13, S=2, T=14, H=2, P=3, N=8, G=1, M=M, F=2, ids="duplicates",
                                  rotation="halved" if M else "interleaved")
    with _chunked(4):
        assert _family(case) == "mamba3_chunked"
        c = ssm_vk.mamba3_scan_back(**args_of(case), **case.cotangents)
    with _token():
        assert _family(case) == "mamba3"
        s = ssm_vk.mamba3_scan_back(**args_of(case), **case.cotangents)
    tol = scaled(MAMBA3_F32_TOL, case.dims["T"])
    for name in GRADS:
        if c[name] is None:
            assert s[name] is None
            continue
        cmp = compare(name, c[name], s[name].astype(np.float64), tol[name])
        assert cmp.ok, cmp.message()
    assert not np.array_equal(c.d_x, s.d_x)   # (two computations: the chunked one did run)


@pytest.mark.parametrize("where, value", [("x", np.nan), ("dA", np.inf), ("g_y", np.inf), ("g_h", np.nan),
                                          ("s_h", np.nan)])
def test_nonfinite_calls_are_recomputed_token_by_token(fit, where, value):
    """An input or a cotangent that is not finite: the chunked kernels flag the call and the
    token-sequential backward computes it, so the gradients are its own bit for bit."""
    case = mamba3_cases.make_case(17, S=2, T=9, H=2, P=3, N=4, G=1, F=1, ids="permutation")
    args, cot = args_of(case), dict(case.cotangents)
    src = cot if where.startswith("g_") else args
    bad = np.array(src[where], copy=True)
    if where.startswith("s_"):
        bad[args["ids"][0]].flat[0] = value
    else:
        bad.reshape(-1)[bad.size // 2] = value
    src[where] = bad
    before = reruns()
    with _chunked(4):
        c = ssm_vk.mamba3_scan_back(**args, **cot)
    assert reruns() == before + 1
    with _token():
        s = ssm_vk.mamba3_scan_back(**args, **cot)
    assert not all(np.isfinite(s[n]).all() for n in GRADS if s[n] is not None)
    for name in GRADS:
        assert np.asarray(c[name]).tobytes() == np.asarray(s[name]).tobytes(), name


def _d(S=1, T=64, H=2, P=64, N=128, G=1, M=1, F=32, mimo=False) -> M3Dims:
    return M3Dims(S=S, T=T, H=H, P=P, N=N, G=G, M=M, F=F, R=S, mimo=mimo)


def _plan(d, lim=GPU, knobs=None):
    return registry.plan(d, lim, True, config.DEFAULTS if knobs is None else knobs, op="mamba3_scan")


def test_the_planner_takes_long_backwards_on_a_gpu():
    """From CHUNK_BWD_MIN_T tokens a GPU's backward is chunked (its recompute the token-sequential
    plan); shorter ones, the invariant mode and devices without the shared memory or 32 storage
    buffers per stage are token by token; a CPU device's threshold is CHUNK_BWD_MIN_T_CPU."""
    T0 = mamba3_chunked_planner.CHUNK_BWD_MIN_T
    fp = _plan(_d(T=T0))
    assert fp.family.name == "mamba3_chunked" and fp.plan.L == 64
    assert fp.rerun is not None and fp.rerun.family.name == "mamba3"
    names = {s.name for s in registry.kernels_needed(_d(T=T0), fp, True)}
    assert names >= {"m3c_prep", "m3c_pass", "m3b_chunk", "m3b_rot", "m3b_angle", "mamba3_reduce", "mamba3_scan_back"}
    assert "m3c_y" not in names
    assert _plan(_d(T=T0 - 1)).family.name == "mamba3"
    assert _plan(_d(T=T0), knobs=config.DEFAULTS.invariant_twin()).family.name == "mamba3"
    assert _plan(_d(T=T0), lim=replace(GPU, max_shared_memory=24 << 10)).family.name == "mamba3"
    assert _plan(_d(T=T0), lim=replace(GPU, max_storage_buffers_per_stage=31)).family.name == "mamba3"
    assert _plan(_d(T=T0), knobs=config.DEFAULTS.with_knobs(M3_CHUNK=0)).family.name == "mamba3"
    cpu = replace(GPU, device_type="cpu")
    T1 = mamba3_chunked_planner.CHUNK_BWD_MIN_T_CPU
    assert _plan(_d(T=T1 - 1), lim=cpu).family.name == "mamba3"
    assert _plan(_d(T=T1), lim=cpu).family.name == "mamba3_chunked"
    assert _plan(_d(T=8), knobs=config.DEFAULTS.with_knobs(M3_CHUNK_BWD_MIN_T=8)).family.name == "mamba3_chunked"


def test_the_packaged_matrix_holds_six_backward_modules():
    """The chunked backward's own kernels (the chunk kernel's two halves apart) are one SPIR-V
    module each for every N, M, P and L."""
    names = [name for name, _ in registry.matrix([GPU], [16, 32, 64, 128, 256], op="mamba3_scan")
             if name.startswith("m3b_")]
    assert sorted(names) == sorted(s.name for s in mamba3_chunked_specs.packaged([GPU], [128], (), (), None)
                                   if s.name.startswith("m3b_"))
    assert len(names) == 6


def test_device_arrays_and_a_prepared_call_give_the_host_call_bits(fit):
    """DeviceArray inputs and cotangents (the gradients DeviceArrays), a repeat (the kept replay)
    and a prepared backward on the chunked kernels: the host call's gradients bit for bit, a
    cotangent None zeros on the device."""
    case = mamba3_cases.make_case(29, S=2, T=10, H=2, P=3, N=8, G=1, M=2, F=2, R=3, ids="unused")
    args, cot = args_of(case), dict(case.cotangents)
    cot["g_v"] = None
    with _chunked(4):
        host = ssm_vk.mamba3_scan_back(**args, **cot)
        dev = {k: ssm_vk.to_device(v) for k, v in {**args, **cot}.items()
               if k not in ("ids", "rotation") and v is not None}
        dev["rotation"] = args["rotation"]
        for _ in range(2):
            g = ssm_vk.mamba3_scan_back(**dev, ids=args["ids"])
            for name in GRADS:
                assert g[name].numpy().tobytes() == np.asarray(host[name]).tobytes(), name
        call = ssm_vk.prepare_mamba3_scan_back(**dev, ids=args["ids"])
        try:
            g = call.run()
            for name in GRADS:
                assert g[name].numpy().tobytes() == np.asarray(host[name]).tobytes(), name
        finally:
            call.close()
