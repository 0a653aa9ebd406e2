"""The precision setting (docs/SPEC.md section 15, PyTorch's names): every call of ssm_vk, its
prepare_* and supports(), and the bridges' ssm_scan and mamba3_scan take ``precision`` -- "highest",
"high" or "medium" -- and refuse anything else with a ValueError naming it. No kernel runs on the
matrix units yet, so every backend computes at "highest": a call asking for "high" or "medium"
gives the bits of the default call, its result's ``precision`` (and the bridges' last_where) says
"highest", and ssm_vk's supports() says what such a call computes instead."""

from __future__ import annotations

import numpy as np
import pytest
from optional import need
from problems import make_problem
from registry import BACKENDS

import ssm_ref
import ssm_vk
from ssm_ref.precision import PRECISIONS
from ssm_ref.testing import mamba3_cases

BAD = ["fast", "HIGH", "float32", "", 1, None, b"high"]
SCAN_IN = ("s", "x", "dt", "A", "B", "C")


def _scan_case(seed: int = 0):
    case = make_problem(np.random.default_rng(seed), S=2, T=6, H=2, P=4, N=4, G=1, ids="permutation", variant="mamba2")
    return {k: case.inputs[k] for k in (*SCAN_IN, "ids")}, {"g_y": case.g_y, "g_states": case.g_states}


def _m3_case(seed: int = 0):
    case = mamba3_cases.make_case(seed, S=2, T=5, H=2, P=4, N=8, G=1, F=2, R=3, ids="permutation")
    return {**case.args(), **case.keywords}, dict(case.cotangents)


def _bits(r, names) -> list:
    out = []
    for k in names:
        a = r[k] if hasattr(r, "keys") else getattr(r, k)
        out.append(None if a is None else np.asarray(a.numpy() if hasattr(a, "numpy") and not isinstance(a, np.ndarray)
                                                     else a).tobytes())
    return out


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_every_backends_results_say_highest(backend):
    kw, cot = _scan_case(1)
    m = backend.module
    assert m.ssm_scan(**kw).precision == "highest"
    assert m.ssm_scan_back(**kw, **cot).precision == "highest"
    if hasattr(m, "mamba3_scan"):
        args, m3cot = _m3_case(1)
        assert m.mamba3_scan(**args).precision == "highest"
        assert m.mamba3_scan_back(**args, **m3cot).precision == "highest"


@pytest.mark.vulkan
@pytest.mark.parametrize("precision", PRECISIONS)
def test_ssm_vk_computes_highest_whatever_is_asked(precision):
    kw, cot = _scan_case(2)
    args, m3cot = _m3_case(2)
    calls = [
        (ssm_vk.ssm_scan, kw, ("y", "states")),
        (ssm_vk.ssm_scan_back, {**kw, **cot}, ssm_ref.GRAD_NAMES),
        (ssm_vk.mamba3_scan, args, ("y", "theta", "h", "k", "v")),
        (ssm_vk.mamba3_scan_back, {**args, **m3cot}, ssm_ref.ops.get("mamba3_scan").grad_names),
    ]
    for fn, a, names in calls:
        got, want = fn(**a, precision=precision), fn(**a)
        assert got.precision == "highest" and got.where == want.where
        assert _bits(got, names) == _bits(want, names), fn.__name__
    for op, a in (("ssm_scan", kw), ("mamba3_scan_back", args)):
        sup, plain = ssm_vk.supports(op, **a, precision=precision), ssm_vk.supports(op, **a)
        assert sup.ok == plain.ok
        said = f"precision {precision!r} computes as 'highest'"
        assert (said in sup.reason) == (precision != "highest"), sup.reason
    dev = {k: ssm_vk.to_device(v) if k in SCAN_IN else v for k, v in kw.items()}
    run = ssm_vk.prepare_scan(**dev, precision=precision).run()
    assert run.precision == "highest" and _bits(run, ("y",)) == _bits(ssm_vk.ssm_scan(**kw), ("y",))


@pytest.mark.vulkan
@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_ssm_vk_refuses_another_precision_naming_it(bad):
    kw, cot = _scan_case(3)
    args, m3cot = _m3_case(3)
    dev = {k: ssm_vk.to_device(v) if k in SCAN_IN else v for k, v in kw.items()}
    m3dev = {k: ssm_vk.to_device(v) if isinstance(v, np.ndarray) and v.dtype == np.float32 else v
             for k, v in args.items()}
    calls = [
        lambda: ssm_vk.ssm_scan(**kw, precision=bad),
        lambda: ssm_vk.ssm_scan_back(**kw, **cot, precision=bad),
        lambda: ssm_vk.supports("ssm_scan_back", **kw, precision=bad),
        lambda: ssm_vk.prepare_scan(**dev, precision=bad),
        lambda: ssm_vk.prepare_scan_back(**dev, precision=bad),
        lambda: ssm_vk.mamba3_scan(**args, precision=bad),
        lambda: ssm_vk.mamba3_scan_back(**args, **m3cot, precision=bad),
        lambda: ssm_vk.supports("mamba3_scan", **args, precision=bad),
        lambda: ssm_vk.prepare_mamba3_scan(**m3dev, precision=bad),
        lambda: ssm_vk.prepare_mamba3_scan_back(**m3dev, precision=bad),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=r"^precision: expected one of"):
            call()


def test_the_torch_bridge_takes_torchs_names_and_reports_highest():
    torch = need("torch")
    import ssm_torch

    kw, _ = _scan_case(4)
    t = {k: torch.from_numpy(v) for k, v in kw.items()}
    args, _ = _m3_case(4)
    m3 = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in args.items()}
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")   # (followed by default: computed at "highest")
        want = ssm_torch.ssm_scan(**t)
        assert ssm_torch.last_where().precision == "highest"
    finally:
        torch.set_float32_matmul_precision(before)
    for precision in PRECISIONS:
        y, _ = ssm_torch.ssm_scan(**t, precision=precision)
        assert ssm_torch.last_where().precision == "highest" and torch.equal(y, want[0])
        ssm_torch.mamba3_scan(**m3, precision=precision)
        assert ssm_torch.last_where().precision == "highest"
    for bad in ("fast", "HIGH", 1):
        with pytest.raises(ValueError, match=r"^precision: expected one of"):
            ssm_torch.ssm_scan(**t, precision=bad)
        with pytest.raises(ValueError, match=r"^precision: expected one of"):
            ssm_torch.mamba3_scan(**m3, precision=bad)


def test_the_jax_bridge_takes_the_names_and_reports_highest():
    need("jax")
    import ssm_jax

    kw, _ = _scan_case(5)
    args, _ = _m3_case(5)
    want = ssm_jax.ssm_scan(**kw)
    for precision in (None, *PRECISIONS):
        y, _ = ssm_jax.ssm_scan(**kw, precision=precision)
        assert ssm_jax.last_where().precision == "highest" and np.asarray(y).tobytes() == np.asarray(want[0]).tobytes()
        ssm_jax.mamba3_scan(**args, precision=precision)
    for bad in ("fast", "HIGH", 1):
        with pytest.raises(ValueError, match=r"^precision: expected one of"):
            ssm_jax.ssm_scan(**kw, precision=bad)
        with pytest.raises(ValueError, match=r"^precision: expected one of"):
            ssm_jax.mamba3_scan(**args, precision=bad)
