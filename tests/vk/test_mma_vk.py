"""The chunked forward's products on the float16 matrix units (ssm_vk/glsl/chunk_mma.comp): the
chunk states and y, error-compensated, on a device whose context enabled them (an NVIDIA GPU
through VK_NV_cooperative_matrix). Against the float64 oracle over drawn shapes (partial last
chunks, several sequences and groups, both chunk lengths, rows whose scales differ by many
orders of magnitude), bit-identical reruns, the float32 kernels' results under the knob MMA=0,
inputs off 16-byte offsets, and non-finite inputs, which must come out as the token-sequential
kernels give them.

Devices without the matrix units (lavapipe among them) plan none of this: tests/test_chunk_plan.py
checks that on their limits, and these tests say so and stop.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from problems import make_problem
from registry import F32_TOL, Backend, assert_close, oracle_back, oracle_scan

import ssm_ref
import ssm_vk
from ssm_ref.tolerance import scaled
from ssm_vk import config
from ssm_vk import engine as vk_engine
from ssm_vk import plan as vplan
from ssm_vk import runtime as rt
from ssm_vk.plan import Limits

pytestmark = pytest.mark.vulkan
OUTPUTS = ("y", "states", *ssm_ref.GRAD_NAMES)


@pytest.fixture
def mma(monkeypatch, knobs):
    """The chunked kernels forced (CHUNK_MIN_T=1) with chunks of ``force(CL)`` tokens, on a device
    whose context has the matrix units."""
    ctx = rt.get_context()
    if not ctx.matrix_units:
        pytest.skip(f"{ctx.info.name}: no float16 matrix units enabled (DeviceInfo.matrix_f16 "
                    f"{ctx.info.matrix_f16}); tests/test_chunk_plan.py covers their planning")
    monkeypatch.delenv("SSM_VK_TUNE", raising=False)

    def force(CL: int = 64, **more) -> None:
        knobs(**{"CHUNK": CL, "CHUNK_MIN_T": 1, "MMA": 1, **more})

    force()
    yield force
    vk_engine.clear()


def _limits():
    ctx = rt.get_context()
    return Limits.of(ctx.info, matrix=ctx.matrix_units)


def _dims(case):
    return ssm_ref.check_forward(**case.args()).dims


def _ran(case, backward: bool):
    ctx = rt.get_context()
    return vk_engine.engine_of(ctx).workspace(_dims(case), backward, _limits(), config.settings()).plan


def _run(case, inputs=None):
    args = case.args() if inputs is None else inputs
    r = ssm_vk.ssm_scan(**args)
    g = ssm_vk.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states)
    assert r.where.startswith("Vulkan") and g.where == r.where, (r.where, g.where)
    return {"y": r.y, "states": r.states, **g.as_dict()}


def _check(case, label: str, mma_on: bool = True) -> dict:
    for backward in (False, True):
        cp = vplan.plan(_dims(case), _limits(), backward).chunked
        assert cp is not None and cp.mma == mma_on, (label, backward, cp)
    got = _run(case)
    for backward in (False, True):
        assert _ran(case, backward).chunked.mma == mma_on, (label, backward)
    o = oracle_scan(**case.args())
    og = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    want = {"y": o.y, "states": o.states, **og.as_dict()}
    vk = Backend(name="ssm_vk", module=ssm_vk, where=r"Vulkan\d+", tol=scaled(F32_TOL, case.dims["T"]))
    for k in OUTPUTS:
        assert got[k].dtype == np.float32, k
        assert_close(vk, k, got[k], want[k], label=label)
    return got


SHAPES = st.fixed_dictionaries(dict(
    seed=st.integers(0, 2**31 - 1), S=st.integers(1, 3), T=st.integers(1, 200), G=st.sampled_from((1, 2)),
    k=st.integers(1, 3), P=st.sampled_from((16, 32, 64, 128)), N=st.sampled_from((32, 64, 128, 256)),
    CL=st.sampled_from((32, 64)), regime=st.sampled_from(("typical", "wide_dt", "small_A", "long_decay"))))


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=SHAPES)
def test_drawn_shapes_match_the_float64_oracle(mma, shape):
    mma(shape["CL"])
    case = make_problem(shape["seed"], S=shape["S"], T=shape["T"], H=shape["G"] * shape["k"], P=shape["P"],
                        N=shape["N"], G=shape["G"], regime=shape["regime"])
    _check(case, label=str(shape))


def test_rows_and_columns_far_apart_in_scale(mma):
    # One scale per row and column of each product: a head whose x is 1e-20 of its neighbour's,
    # a state column of B at 1e15, tokens of C at 1e-12 -- each still to float32's accuracy.
    case = make_problem(11, S=2, T=150, H=4, P=32, N=64, G=2)
    a = case.inputs
    a["x"][:, :, 1] *= 1e-20
    a["x"][:, :, 2, :5] *= 1e12
    a["B"][..., 7] *= 1e15
    a["C"][:, ::3] *= 1e-12
    _check(case, label="scales")


def test_reruns_are_bit_identical_and_mma_0_runs_the_float32_kernels(mma):
    case = make_problem(3, S=2, T=257, H=4, P=64, N=128, G=1)
    first = _check(case, "first")
    again = _run(case)
    for k in OUTPUTS:
        assert np.array_equal(first[k], again[k]), k
    mma(64, MMA=0)
    off = _check(case, "MMA=0", mma_on=False)
    assert not all(np.array_equal(first[k], off[k]) for k in ("y", "states")), \
        "MMA=0 gave the same bits: the matrix units did not run"


def _device(v, pad: int = 0):
    """``v`` on the device, as a view ``pad`` floats into a larger array when ``pad``."""
    if v is None or v.dtype != np.float32:
        return v
    if not pad:
        return ssm_vk.to_device(v)
    flat = np.concatenate([np.full(pad, 1e30, np.float32), v.ravel(), np.full(3, -1e30, np.float32)])
    return ssm_vk.to_device(flat).view(pad, v.shape)


@pytest.mark.parametrize("pad", [1, 2, 3])
def test_inputs_off_16_byte_offsets_give_the_same_bits(mma, pad):
    # x, B and C as views ``pad`` floats into larger device arrays: the kernels' element loads.
    case = make_problem(5, S=2, T=100, H=2, P=32, N=64, G=1, ids="identity")
    args = case.args()
    want = ssm_vk.ssm_scan(**{k: _device(v) for k, v in args.items()})
    got = ssm_vk.ssm_scan(**{k: _device(v, pad if k in ("x", "B", "C") else 0) for k, v in args.items()})
    assert got.where.startswith("Vulkan") and _ran(case, False).chunked.mma
    for k in ("y", "states"):
        assert np.array_equal(getattr(got, k).numpy(), getattr(want, k).numpy()), k


@pytest.mark.parametrize("where, value", [("x", np.nan), ("B", np.inf), ("C", -np.inf), ("dt", np.inf)])
def test_non_finite_inputs_come_out_as_the_token_sequential_kernels_give_them(mma, knobs, where, value):
    case = make_problem(8, S=2, T=130, H=2, P=32, N=64, G=1)
    case.inputs[where].reshape(-1)[case.inputs[where].size // 3] = value
    got = ssm_vk.ssm_scan(**case.args())
    assert _ran(case, False).chunked.mma
    knobs(CHUNK=0)
    vk_engine.clear()
    want = ssm_vk.ssm_scan(**case.args())
    for k in ("y", "states"):
        g, w = getattr(got, k), getattr(want, k)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=k)
        np.testing.assert_array_equal(np.isinf(g), np.isinf(w), err_msg=k)
        fin = np.isfinite(w)
        np.testing.assert_array_equal(g[fin], w[fin], err_msg=k)
