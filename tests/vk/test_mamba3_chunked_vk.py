"""The chunked Mamba-3 forward on the Vulkan device (ssm_vk/mamba3/glsl/m3c_*.comp, the matrix form of
ssm_ref/mamba3_chunked.py): drawn problems of several chunks (the last one partial, S > 1 with ids, G > 1,
SISO and MIMO, F = 0 to N/2, both rotations) against the float64 reference ssm_ref.mamba3_scan within the
op's float32 tolerance; bit-identical reruns; the chunked and the token-sequential plans agree; inf and nan
recomputed token by token; update_cache; and the planner's choice (ssm_vk.registry.plan for op
"mamba3_scan", the family's name in mamba3_api.decide's plan).

The chunked kernels take sequences of M3_CHUNK_MIN_T tokens or more (default 64 on a GPU, 128 on lavapipe):
these tests set the knobs (ssm_vk.config.configure) to run them on short sequences
in short chunks. Every test runs under the validation layer (tests/conftest.py fails a test on any
message)."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from mamba3_chunks import GPU, INPUTS, args_of, chunked_cases, reruns

import ssm_vk
from ssm_ref import ops
from ssm_ref.mamba3_checks import M3Dims, check_mamba3_forward
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
OUTPUTS = ("y", "theta", "h", "k", "v")
FEW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def _chunked(L: int):
    """The knobs that send every forward to the chunked kernels, in chunks of ``L`` tokens."""
    return config.configure(tune={"M3_CHUNK": L, "M3_CHUNK_MIN_T": 1})


def _family(case) -> str:
    a = args_of(case)
    p = check_mamba3_forward(*(a[k] for k in INPUTS), rotation=a["rotation"], dtype=np.float32)
    return mamba3_api.decide("mamba3_scan", p.dims, rotation=a["rotation"]).planned.first.family.name


@given(lc=chunked_cases())
@FEW
def test_drawn_problems_meet_the_float64_reference(lc):
    """y and the four final state parts within the op's tolerance of the float64 reference, on the
    chunked kernels (the plan asserted), computed on the device."""
    L, case = lc
    before = reruns()
    with _chunked(L):
        assert _family(case) == "mamba3_chunked"
        assert GENERIC["oracle_forward"].check(ssm_vk, case, TOL)
        assert WHERE.fullmatch(ssm_vk.mamba3_scan(**args_of(case)).where)
    assert reruns() == before   # (finite: the chunked kernels' own results)


@pytest.mark.parametrize("rotation", ["interleaved", "halved"])
def test_several_tiles_of_channels_and_state(rotation):
    """P = 70 and N = 72: two 64-wide tiles of each (the tiles' edges), MIMO rank 2, F = N/2."""
    case = mamba3_cases.make_case(7, S=1, T=9, H=2, P=70, N=72, G=1, M=2, F=36, ids="identity", rotation=rotation)
    with _chunked(4):
        assert _family(case) == "mamba3_chunked"
        assert GENERIC["oracle_forward"].check(ssm_vk, case, TOL)


@pytest.mark.parametrize("M", [None, 3])
def test_default_chunk_length_over_long_decays(M):
    """The planner's own chunk length (64 / M tokens: 64 SISO, 21 at rank 3) over 150 tokens of
    decays near 1 (the state sums every token), the last chunk partial."""
    case = mamba3_cases.make_case(5, S=2, T=150, H=2, P=4, N=8, G=1, M=M, F=2, ids="permutation",
                                  regime="long_decay")
    before = reruns()
    with config.configure(tune={"M3_CHUNK_MIN_T": 1}):
        assert _family(case) == "mamba3_chunked"
        assert GENERIC["oracle_forward"].check(ssm_vk, case, TOL)
    assert reruns() == before


def test_reruns_are_bit_identical():
    """The same call twice, and again after the kept calls are dropped (a new recording): the same bits."""
    case = mamba3_cases.make_case(11, S=2, T=11, H=4, P=5, N=8, G=2, M=2, F=2, ids="permutation")
    with _chunked(3):
        runs = [ssm_vk.mamba3_scan(**args_of(case)) for _ in range(2)]
        engine_of(ssm_vk.runtime.get_context()).clear()   # (the workspaces and their recorded sequences)
        runs.append(ssm_vk.mamba3_scan(**args_of(case)))
    for r in runs[1:]:
        for name in OUTPUTS:
            assert getattr(r, name).tobytes() == getattr(runs[0], name).tobytes(), name


def _on_circle(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """``got`` moved by whole turns next to ``want`` (angles compare on the circle)."""
    two_pi = 2 * np.pi
    return want + (got.astype(np.float64) - want + np.pi) % two_pi - np.pi


@pytest.mark.parametrize("M", [None, 3])
def test_chunked_and_token_sequential_plans_agree(M):
    """The two families' forwards of one case within the op's tolerance of each other."""
    case = mamba3_cases.make_case(13, S=2, T=14, H=2, P=3, N=8, G=1, M=M, F=2, ids="duplicates",
                                  rotation="halved" if M else "interleaved")
    with _chunked(4):
        assert _family(case) == "mamba3_chunked"
        c = ssm_vk.mamba3_scan(**args_of(case))
    with config.configure(tune={"M3_CHUNK": 0}):
        assert _family(case) == "mamba3"
        s = ssm_vk.mamba3_scan(**args_of(case))
    tol = scaled(MAMBA3_F32_TOL, case.dims["T"])
    for name in OUTPUTS:
        got, want = getattr(c, name), getattr(s, name).astype(np.float64)
        if name == "theta":
            got = _on_circle(got, want)
        cmp = compare(name, got, want, tol[name])
        assert cmp.ok, cmp.message()
    assert not np.array_equal(c.y, s.y)   # (two computations: the chunked one did run)


@pytest.mark.parametrize("where, value", [("x", np.nan), ("dA", np.inf), ("B", -np.inf), ("s_h", np.nan)])
def test_nonfinite_calls_are_recomputed_token_by_token(where, value):
    """An input that is not finite: the chunked kernels flag the call and the token-sequential
    kernels compute it, so the result is theirs bit for bit (inf and nan where the spec puts them)."""
    case = mamba3_cases.make_case(17, S=2, T=9, H=2, P=3, N=4, G=1, F=1, ids="permutation")
    args = args_of(case)
    bad = np.array(args[where], copy=True)
    if where.startswith("s_"):   # (a row the call reads)
        bad[args["ids"][0]].flat[0] = value
    else:
        bad.reshape(-1)[bad.size // 2] = value
    args[where] = bad
    before = reruns()
    with _chunked(4):
        c = ssm_vk.mamba3_scan(**args)
    assert reruns() == before + 1
    with config.configure(tune={"M3_CHUNK": 0}):
        s = ssm_vk.mamba3_scan(**args)
    assert not all(np.isfinite(getattr(s, n)).all() for n in OUTPUTS)
    for name in OUTPUTS:
        assert getattr(c, name).tobytes() == getattr(s, name).tobytes(), name


def test_update_cache_writes_the_final_states():
    """update_cache=True on the chunked kernels: the four cache rows ids hold the call's final
    states (those of update_cache=False), the other rows untouched."""
    case = mamba3_cases.make_case(19, S=2, T=10, H=2, P=3, N=8, G=2, M=2, F=2, R=4, ids="unused")
    args = args_of(case)
    with _chunked(4):
        r = ssm_vk.mamba3_scan(**args)
        caches = {k: np.array(args[k], copy=True) for k in ("s_theta", "s_h", "s_k", "s_v")}
        u = ssm_vk.mamba3_scan(**{**args, **caches}, update_cache=True)
    assert u.theta is None and u.y.tobytes() == r.y.tobytes()
    ids = np.asarray(args["ids"])
    rest = np.setdiff1d(np.arange(4), ids)
    for k, name in (("s_theta", "theta"), ("s_h", "h"), ("s_k", "k"), ("s_v", "v")):
        assert caches[k][ids].tobytes() == getattr(r, name).tobytes(), k
        assert np.array_equal(caches[k][rest], args[k][rest]), k


@pytest.mark.parametrize("prepared", [False, True])
def test_flagged_update_on_device_caches_reads_the_caches_as_they_were(prepared):
    """A non-finite input under update_cache=True with DeviceArray caches: the chunked call is
    flagged before any cache row is written, so the token-sequential recompute starts from the
    caches as they were -- the rows equal a token-sequential update's bit for bit, plain and
    prepared."""
    case = mamba3_cases.make_case(23, S=2, T=9, H=2, P=3, N=4, G=1, F=1, R=3, ids="unused")
    args = args_of(case)
    args["x"] = np.array(args["x"], copy=True)
    args["x"][1, 4, 0, 0] = np.inf
    names = ("s_theta", "s_h", "s_k", "s_v")

    def update(tune, prep):
        with config.configure(tune=tune):
            dev = {k: ssm_vk.to_device(v) for k, v in args.items() if k not in ("ids", "rotation") and v is not None}
            dev["rotation"] = args["rotation"]
            if prep:
                call = ssm_vk.prepare_mamba3_scan(**dev, ids=args["ids"], update_cache=True)
                y = call.run().y.numpy()
                call.close()
            else:
                y = ssm_vk.mamba3_scan(**dev, ids=args["ids"], update_cache=True).y.numpy()
            return y, {k: dev[k].numpy() for k in names}

    before = reruns()
    y_c, c = update({"M3_CHUNK": 4, "M3_CHUNK_MIN_T": 1}, prepared)
    assert reruns() == before + 1
    y_s, s = update({"M3_CHUNK": 0}, False)
    assert y_c.tobytes() == y_s.tobytes()
    for k in names:
        assert c[k].tobytes() == s[k].tobytes(), k


def _d(S=1, T=64, H=2, P=64, N=128, G=1, M=1, F=32, mimo=False) -> M3Dims:
    return M3Dims(S=S, T=T, H=H, P=P, N=N, G=G, M=M, F=F, R=S, mimo=mimo)


def _plan(d, lim=GPU, backward=False, knobs=None):
    return registry.plan(d, lim, backward, config.DEFAULTS if knobs is None else knobs, op="mamba3_scan")


def test_the_planner_takes_long_forwards_on_a_gpu():
    """From CHUNK_MIN_T tokens a GPU's forward is chunked (chunks of 64 / M tokens, its recompute
    the token-sequential plan); shorter ones, the invariant mode, ranks above 64, N
    above 256 and devices without 256-invocation workgroups or the shared memory are token by token;
    a CPU device's threshold is CHUNK_MIN_T_CPU."""
    T0 = mamba3_chunked_planner.CHUNK_MIN_T
    fp = _plan(_d(T=T0))
    assert fp.family.name == "mamba3_chunked" and fp.plan.L == 64 and fp.plan.NC == T0 // 64
    assert fp.rerun is not None and fp.rerun.family.name == "mamba3"
    assert {s.name for s in registry.kernels_needed(_d(T=T0), fp, False)} >= {"m3c_y", "mamba3_scan"}
    mimo = _plan(_d(T=T0 + 1, M=4, mimo=True)).plan
    assert (mimo.L, mimo.NC) == (16, -(-(T0 + 1) // 16))
    assert _plan(_d(T=T0 - 1)).family.name == "mamba3"
    assert _plan(_d(T=T0 - 1), backward=True).family.name == "mamba3"   # (the backward: test_mamba3_chunked_back_vk.py)
    assert _plan(_d(T=T0), knobs=config.DEFAULTS.invariant_twin()).family.name == "mamba3"
    assert _plan(_d(T=T0, M=65, mimo=True)).family.name == "mamba3"
    assert _plan(_d(T=T0, N=258)).family.name == "mamba3"
    assert _plan(_d(T=T0), lim=replace(GPU, max_workgroup_invocations=128)).family.name == "mamba3"
    assert _plan(_d(T=T0), lim=replace(GPU, max_shared_memory=16 << 10)).family.name == "mamba3"
    cpu = replace(GPU, device_type="cpu")
    T1 = mamba3_chunked_planner.CHUNK_MIN_T_CPU
    assert _plan(_d(T=T1 - 1), lim=cpu).family.name == "mamba3"
    assert _plan(_d(T=T1), lim=cpu).family.name == "mamba3_chunked"
    assert _plan(_d(T=8), lim=cpu, knobs=config.DEFAULTS.with_knobs(M3_CHUNK_MIN_T=8)).family.name == "mamba3_chunked"
    assert _plan(_d(T=T0), knobs=config.DEFAULTS.with_knobs(M3_CHUNK=0)).family.name == "mamba3"


def test_the_device_decision_names_the_chunked_family():
    """What mamba3_api.decide plans on this device: the chunked family where the knobs send the call
    there, within the device's own limits (its shared memory and workgroup size read, not assumed)."""
    case = mamba3_cases.make_case(23, S=1, T=6, H=2, P=3, N=8, G=1, F=2)
    info = ssm_vk.runtime.get_context().info
    fits = (min(info.max_workgroup_invocations, info.max_workgroup_size[0]) >= mamba3_chunked_planner.CHUNK_WG
            and info.max_shared_memory >= mamba3_chunked_planner.CHUNK_SHARED)
    with _chunked(2):
        assert _family(case) == ("mamba3_chunked" if fits else "mamba3")
    assert _family(case) == "mamba3"   # (T = 6: short of the defaults)


def test_the_packaged_matrix_holds_five_chunked_modules():
    """The chunked kernels are one SPIR-V module each for every N, M, P and chunk length."""
    names = [name for name, _ in registry.matrix([GPU], [16, 32, 64, 128, 256], op="mamba3_scan")
             if name.startswith("m3c_")]
    assert sorted(names) == sorted(s.name for s in mamba3_chunked_specs.packaged([GPU], [128], (), (), None)
                                   if s.name.startswith("m3c_"))
    assert len(names) == 5
