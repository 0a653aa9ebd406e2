"""The interface's defaults and result types on every backend (docs/API.md): ``s=None`` (zero start
states), ``g_y`` / ``g_states`` None (zeros), ssm_scan_back's keyword-friendly ids, mamba_ssm's
``dt_softplus`` booleans, ScanResult unpacking, ScanGrads as a mapping, supports() taking the same
keywords, the errors that name ``ids`` and ``s``; and the public namespaces (``__all__`` and
``dir()``) of every package.

A default is held bit for bit to the call that passes its zeros (or its form) on the same backend,
and that call to the float64 oracle within the tolerance table.
"""

from __future__ import annotations

import dataclasses
import importlib
import types

import numpy as np
import pytest
from optional import need
from problems import make_problem
from registry import BACKENDS, assert_close, oracle_back, oracle_scan

import ssm_ref

VARIANTS = ["mamba2", "mamba1"]
FLOATS = ("x", "dt", "A", "B", "C")


def host(a) -> np.ndarray:
    return np.asarray(a.numpy() if hasattr(a, "numpy") and not isinstance(a, np.ndarray) else a)


def same(a, b) -> bool:
    """Bit for bit (NaN where NaN)."""
    a, b = host(a), host(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def case_and_zeros(variant: str, seed: int = 0):
    case = make_problem(np.random.default_rng(seed), S=2, T=5, H=4, P=3, N=4, G=2, ids="none", variant=variant)
    d = case.dims
    inputs = {k: case.inputs[k] for k in FLOATS}
    return case, inputs, np.zeros((d["S"], d["H"], d["P"], d["N"]), np.float32)


# --- s=None: zero start states ------------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_s_none_is_zero_start_states(backend, variant):
    _case, inp, zeros = case_and_zeros(variant)
    m = backend.module
    got = m.ssm_scan(None, **inp)
    want = m.ssm_scan(zeros, **inp)
    assert same(got.y, want.y) and same(got.states, want.states)
    oracle = oracle_scan(s=zeros, **inp)
    assert same(ssm_ref.ssm_scan(None, **inp, dtype=np.float64).y, oracle.y)
    assert_close(backend, "y", host(got.y), oracle.y)
    assert_close(backend, "states", host(got.states), oracle.states)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_s_none_backward_gives_the_gradient_of_the_zero_start(backend, variant):
    case, inp, zeros = case_and_zeros(variant, seed=1)
    m = backend.module
    got = m.ssm_scan_back(None, **inp, g_y=case.g_y, g_states=case.g_states)
    want = m.ssm_scan_back(zeros, **inp, g_y=case.g_y, g_states=case.g_states)
    oracle = oracle_back(s=zeros, **inp, g_y=case.g_y, g_states=case.g_states)
    for k in ssm_ref.GRAD_NAMES:
        assert same(got[k], want[k]), k
        assert_close(backend, k, host(got[k]), oracle[k])
    # d_s is the gradient of the zero start states: (S, H, P, N), one row per sequence = d_s0
    assert host(got.d_s).shape == zeros.shape and same(got.d_s, got.d_s0)


@pytest.mark.parametrize("op", ["ssm_scan", "ssm_scan_back"])
@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_ids_with_s_none_is_a_value_error_naming_ids(backend, op):
    case, inp, _ = case_and_zeros("mamba2")
    extra = dict(g_y=case.g_y, g_states=case.g_states) if op == "ssm_scan_back" else {}
    for ids in ([1, 0], np.arange(2)):
        with pytest.raises(ValueError, match=r"^ids: s is None \(zero start states, one per sequence\), so ids "
                                             r"must be None, got "):
            getattr(backend.module, op)(None, **inp, ids=ids, **extra)
        with pytest.raises(ValueError, match=r"^ids: s is None"):
            backend.module.supports(op, None, **inp, ids=ids)


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_update_cache_with_s_none_is_a_value_error_naming_s(backend):
    _case, inp, _ = case_and_zeros("mamba2")
    with pytest.raises(ValueError, match=r"^s: update_cache=True writes the new states into s, got None"):
        backend.module.ssm_scan(None, **inp, update_cache=True)
    with pytest.raises(ValueError, match=r"^s: update_cache=True"):
        backend.module.supports("ssm_scan", None, **inp, update_cache=True)


# --- ssm_scan_back's gradients of the loss: None for zeros, keyword-friendly -----------------------

@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_g_y_or_g_states_none_is_zeros(backend, variant):
    case = make_problem(np.random.default_rng(2), S=2, T=4, H=4, P=2, N=3, G=1, ids="permutation", variant=variant)
    args = case.args()
    m = backend.module
    zy, zs = np.zeros_like(case.g_y), np.zeros_like(case.g_states)
    for g_y, g_states, want_y, want_s in ((None, case.g_states, zy, case.g_states),
                                         (case.g_y, None, case.g_y, zs),
                                         (None, None, zy, zs)):
        got = m.ssm_scan_back(**args, g_y=g_y, g_states=g_states)
        want = m.ssm_scan_back(**args, g_y=want_y, g_states=want_s)
        oracle = oracle_back(**case.args(np.float64), g_y=want_y, g_states=want_s)
        for k in ssm_ref.GRAD_NAMES:
            assert same(got[k], want[k]), (k, g_y is None, g_states is None)
            assert_close(backend, k, host(got[k]), oracle[k])
    zero = m.ssm_scan_back(**args)   # neither: every gradient is zero
    for k in ssm_ref.GRAD_NAMES:
        assert not np.any(host(zero[k])), k


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_positional_keyword_and_packed_calls_agree(backend):
    case = make_problem(np.random.default_rng(3), S=2, T=4, H=4, P=2, N=3, G=2, ids="none")
    a = case.args()
    m = backend.module
    pos = m.ssm_scan_back(a["s"], a["x"], a["dt"], a["A"], a["B"], a["C"], None, case.g_y, case.g_states)
    kw = m.ssm_scan_back(a["s"], a["x"], a["dt"], a["A"], a["B"], a["C"], g_y=case.g_y, g_states=case.g_states)
    packed = m.ssm_scan_back(a["s"], a["x"], a["dt"], a["A"], a["B"], a["C"], None,
                             ssm_ref.pack_forward(case.g_y, case.g_states), None)
    oracle = oracle_back(**case.args(np.float64), g_y=case.g_y, g_states=case.g_states)
    for k in ssm_ref.GRAD_NAMES:
        assert same(pos[k], kw[k]) and same(pos[k], packed[k]), k
        assert_close(backend, k, host(pos[k]), oracle[k])


# --- dt_softplus: mamba_ssm's booleans ----------------------------------------------------------

@pytest.mark.parametrize("flag,form", [(True, "log1p"), (False, None)])
@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_dt_softplus_booleans_are_mamba_ssms_forms(backend, flag, form):
    case = make_problem(np.random.default_rng(4), S=2, T=5, H=4, P=2, N=3, G=2, ids="permutation",
                        dt_range=(-12.0, 2.0))
    args = case.args()
    m = backend.module
    got, want = m.ssm_scan(**args, dt_softplus=flag), m.ssm_scan(**args, dt_softplus=form)
    assert same(got.y, want.y) and same(got.states, want.states)
    oracle = oracle_scan(**case.args(np.float64), dt_softplus=form)
    assert_close(backend, "y", host(got.y), oracle.y)
    gb = m.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states, dt_softplus=flag)
    wb = m.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states, dt_softplus=form)
    for k in ssm_ref.GRAD_NAMES:
        assert same(gb[k], wb[k]), k
    assert_close(backend, "d_dt", host(gb.d_dt),
                 oracle_back(**case.args(np.float64), g_y=case.g_y, g_states=case.g_states, dt_softplus=form).d_dt)
    assert ssm_ref.check_dt_softplus(flag) == form and ssm_ref.check_dt_softplus(np.bool_(flag)) == form
    # the default stays ggml's form
    default = m.ssm_scan(**args)
    assert same(default.y, m.ssm_scan(**args, dt_softplus="ggml").y)


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_supports_takes_the_calls_keywords(backend):
    _case, inp, _ = case_and_zeros("mamba2")
    m = backend.module
    for form in ("ggml", "log1p", None, True, False):
        for op in ("ssm_scan", "ssm_scan_back"):
            assert isinstance(m.supports(op, None, **inp, dt_softplus=form), ssm_ref.Support)
    assert m.supports("ssm_scan", None, **inp, ids=None, dt_softplus=True, update_cache=False) is not None
    with pytest.raises(ValueError, match=r"^dt_softplus: expected 'ggml', 'log1p', None, True \(the same as "
                                         r"'log1p'\) or False \(the same as None\), got 'softplus'$"):
        m.supports("ssm_scan", None, **inp, dt_softplus="softplus")
    with pytest.raises(ValueError, match=r"^dt_softplus: .* got 1$"):
        m.ssm_scan(None, **inp, dt_softplus=1)   # 1 == True, but not mamba_ssm's boolean


# --- the result types ------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_scan_result_unpacks_as_y_and_states(backend):
    _case, inp, zeros = case_and_zeros("mamba2")
    r = backend.module.ssm_scan(zeros, **inp)
    y, states = r
    assert y is r.y and states is r.states and len(r) == 2 and list(r) == [r.y, r.states]
    assert r.backend in ("ssm_ref", "ssm_fast", "ssm_vk") and isinstance(r.where, str)
    assert same(r.packed(), ssm_ref.pack_forward(host(y), host(states)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.y = None


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_scan_grads_is_a_read_only_mapping_by_name(backend):
    case, inp, zeros = case_and_zeros("mamba1")
    g = backend.module.ssm_scan_back(zeros, **inp, g_y=case.g_y, g_states=case.g_states)
    assert tuple(g.keys()) == ssm_ref.GRAD_NAMES == ("d_s", "d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C")
    assert list(g) == list(ssm_ref.GRAD_NAMES) and len(g) == 7 and "d_x" in g and "x" not in g
    for k, v in g.items():
        assert g[k] is v is getattr(g, k) is g.get(k)
    assert [id(v) for v in g.values()] == [id(getattr(g, k)) for k in ssm_ref.GRAD_NAMES]
    assert all(dict(g)[k] is g.as_dict()[k] for k in ssm_ref.GRAD_NAMES)
    assert (lambda **kw: sorted(kw))(**g) == sorted(ssm_ref.GRAD_NAMES)
    with pytest.raises(KeyError, match="d_s, d_s0, d_x"):
        g["x"]
    assert g.get("x") is None
    with pytest.raises(TypeError):
        g["d_x"] = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.d_x = None
    assert g == g and g != backend.module.ssm_scan_back(zeros, **inp, g_y=case.g_y, g_states=case.g_states)
    # the port interface still reads it by its attributes, where and backend included
    from ssm_ref.testing import ports
    assert ports.origin(g) == (g.where, g.backend) and ports.origin(r := backend.module.ssm_scan(zeros, **inp)) == (
        r.where, r.backend)


# --- public namespaces ---------------------------------------------------------------------------

# The submodules each package presents as part of its API; every other module stays importable by
# its path but is not listed.
PUBLIC_MODULES = {
    "ssm_ref": {"chunked", "jvp", "mamba3_chunked", "mamba3_chunked_back", "ops", "packing", "tolerance"},
    "ssm_fast": set(),
    "ssm_vk": {"config", "runtime"},
    "ssm_torch": {"mamba", "mamba3"},
    "ssm_jax": set(),
    "ssm_ref.testing": {"cases", "fuzzing", "ports", "properties", "regressions", "strategies", "vectors",
                        "verification"},
}
INTERNALS = {"ssm_ref": ["checks", "scan", "results", "memory", "environ", "extras", "backend_names", "shapes", "ids",
                         "arraylike", "mamba3", "mamba3_checks"],
             "ssm_fast": ["config", "pool", "threads", "kernels_fwd"],
             "ssm_vk": ["engine", "replay_cache", "recording", "workspace", "api", "validate"],
             "ssm_torch": ["_bridge", "_op", "_mamba3_op"], "ssm_jax": ["_bridge", "_mamba3"], "ssm_ref.testing": []}


def _package(name):
    """The package, where the bridges' framework is installed (skipped without it, failed under
    SSM_REQUIRE_TORCH=1 / SSM_REQUIRE_JAX=1: tests/optional.py)."""
    if name in ("ssm_torch", "ssm_jax"):
        need(name.replace("ssm_", ""))
    return importlib.import_module(name)


@pytest.mark.parametrize("name", list(PUBLIC_MODULES))
def test_dir_and_all_are_the_public_names(name):
    m = _package(name)
    for internal in INTERNALS[name]:   # importable by their path (and so attached to the package)
        importlib.import_module(f"{name}.{internal}")
    assert sorted(dir(m)) == sorted(set(m.__all__)) and len(m.__all__) == len(set(m.__all__))
    for k in m.__all__:
        v = getattr(m, k)   # every listed name is there
        if isinstance(v, types.ModuleType):
            assert k in PUBLIC_MODULES[name] and v.__name__ == f"{name}.{k}", k
    assert {"np", "numpy", "annotations", "environ", "jax", "jnp", "torch"}.isdisjoint(dir(m))
    assert PUBLIC_MODULES[name] <= set(m.__all__)
    for internal in INTERNALS[name]:
        assert internal not in dir(m)
    assert {"ssm_scan", "ssm_scan_back", "supports", "NAME"} <= set(dir(m)) or name in (
        "ssm_torch", "ssm_jax", "ssm_ref.testing")


def test_where_is_one_type_for_both_bridges():
    torch_bridge, jax_bridge = _package("ssm_torch"), _package("ssm_jax")
    assert torch_bridge.Where is jax_bridge.Where is ssm_ref.Where
    import torch
    _case, inp, zeros = case_and_zeros("mamba2")
    torch_bridge.ssm_scan(*(torch.from_numpy(v) for v in (zeros, *inp.values())), backend="ssm_ref")
    jax_bridge.ssm_scan(zeros, *inp.values(), backend="ssm_ref")
    wt, wj = torch_bridge.last_where(), jax_bridge.last_where()
    assert type(wt) is type(wj) is ssm_ref.Where
    assert wt == wj == ssm_ref.Where(op="ssm_scan", where="CPU", backend="ssm_ref", dtype="float32")
    with pytest.raises(dataclasses.FrozenInstanceError):
        wt.op = "x"
