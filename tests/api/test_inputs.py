"""What a call may do to the caller's arrays (nothing), what it hands back (fresh, writable arrays
sharing no memory with the inputs or with each other), and the inputs it converts rather than
refuses (other float dtypes, lists, any strides, read-only arrays, any integer ids)."""

import warnings

import numpy as np
import pytest
from problems import make_problem
from registry import BACKENDS, OUTPUTS

import ssm_ref

FWD_ARGS = ("s", "x", "dt", "A", "B", "C", "ids")


def awkward_inputs(T=3):
    """The same problem as ``plain_inputs`` but in every awkward form a caller may hand over:
    read-only, non-contiguous views into larger buffers, Fortran order, another float dtype, a
    transposed view, an int32 read-only ids, a strided g_y."""
    case = make_problem(np.random.default_rng(61), S=2, T=T, H=4, P=2, N=5, G=2, R=3, ids="duplicates")
    a = case.args()
    bases = {}

    s = a["s"].copy()
    s.flags.writeable = False                                      # read-only
    big_x = np.zeros((2, 2 * T, 4, 2), np.float32)
    big_x[:, ::2] = a["x"]
    x = big_x[:, ::2]                                              # a strided view
    dt = np.asfortranarray(a["dt"].astype(np.float64))            # Fortran order, float64
    A = a["A"].astype(np.float16).astype(np.float32)               # exactly representable in float16
    A16 = A.astype(np.float16)
    B = np.ascontiguousarray(a["B"].transpose(3, 2, 1, 0)).transpose(3, 2, 1, 0)  # transposed view
    big_C = np.zeros((2, T, 2, 10), np.float32)
    big_C[..., 1::2] = a["C"]
    C = big_C[..., 1::2]                                           # last axis strided
    ids = a["ids"].astype(np.int32)
    ids.flags.writeable = False
    big_gy = np.zeros((2, T, 4, 4), np.float32)
    big_gy[..., ::2] = case.g_y
    g_y = big_gy[..., ::2]
    g_states = case.g_states.copy()
    g_states.flags.writeable = False
    bases.update(big_x=big_x, big_C=big_C, big_gy=big_gy)
    awkward = dict(s=s, x=x, dt=dt, A=A16, B=B, C=C, ids=ids, g_y=g_y, g_states=g_states)
    plain = dict(s=a["s"], x=a["x"], dt=a["dt"], A=A, B=a["B"], C=a["C"], ids=a["ids"],
                 g_y=case.g_y, g_states=case.g_states)
    return awkward, plain, bases


def snapshot(arrays):
    return {k: (np.array(v, copy=True), v.flags.writeable, v.flags.c_contiguous, v.flags.f_contiguous, v.strides)
            for k, v in arrays.items()}


def assert_untouched(arrays, snap):
    for k, v in arrays.items():
        data, writeable, c, f, strides = snap[k]
        assert np.array_equal(v, data, equal_nan=True), f"{k} was written"
        now = (v.flags.writeable, v.flags.c_contiguous, v.flags.f_contiguous, v.strides)
        assert now == (writeable, c, f, strides), f"{k}: flags changed"


def results_of(module, a, packed=False):
    fwd = {k: a[k] for k in FWD_ARGS}
    r = module.ssm_scan(**fwd)
    if packed:
        g = module.ssm_scan_back(**fwd, g_y=np.concatenate([np.ravel(a["g_y"]), np.ravel(a["g_states"])]),
                                 g_states=None)
    else:
        g = module.ssm_scan_back(**fwd, g_y=a["g_y"], g_states=a["g_states"])
    return {"y": r.y, "states": r.states, **g.as_dict()}


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@pytest.mark.parametrize("T", [0, 3])
def test_inputs_are_never_written_by_a_call_that_succeeds_or_fails(backend, T):
    awkward, plain, bases = awkward_inputs(T)
    everything = {**{f"awkward.{k}": v for k, v in awkward.items()}, **{f"plain.{k}": v for k, v in plain.items()},
                  **bases}
    snap = snapshot(everything)
    m = backend.module
    for a in (awkward, plain):
        fwd = {k: a[k] for k in FWD_ARGS}
        results_of(m, a)
        results_of(m, a, packed=True)
        assert m.supports("ssm_scan_back", **fwd)
        # Failing calls, with the mistake in the last argument checked so every other input
        # has been looked at (and converted) first.
        with pytest.raises(ValueError):
            m.ssm_scan(**{**fwd, "ids": np.array([0, 7])})
        with pytest.raises(ValueError):
            m.ssm_scan_back(**fwd, g_y=a["g_y"], g_states=np.zeros((2, 4, 2, 4), np.float32))
        with pytest.raises(ValueError):
            m.supports("nope", **fwd)
    assert_untouched(everything, snap)


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@pytest.mark.parametrize("T", [0, 3])
@pytest.mark.parametrize("form", ["plain", "awkward"])
@pytest.mark.parametrize("packed", [False, True], ids=["structured", "packed"])
def test_results_are_fresh_writable_arrays(backend, T, form, packed):
    awkward, plain, bases = awkward_inputs(T)
    a = plain if form == "plain" else awkward
    out = results_of(backend.module, a, packed=packed)
    inputs = [*a.values(), *bases.values()]
    for name, arr in out.items():
        assert isinstance(arr, np.ndarray), name
        assert arr.flags.writeable, f"{name} is read-only"
        for inp in inputs:
            assert not np.shares_memory(arr, inp), f"{name} shares memory with an input"
        for other, arr2 in out.items():
            if other != name:
                assert not np.shares_memory(arr, arr2), f"{name} shares memory with {other}"
    # Writing into every result changes no other result and no input.
    snap = snapshot({f"in{i}": v for i, v in enumerate(inputs)})
    kept = {k: v.copy() for k, v in out.items()}
    for name in OUTPUTS:
        out[name][...] = -7.0
        for other in OUTPUTS:
            if other != name:
                assert np.array_equal(out[other], kept[other]), f"writing {name} changed {other}"
        out[name][...] = kept[name]
    assert_untouched({f"in{i}": v for i, v in enumerate(inputs)}, snap)


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_awkward_forms_give_the_same_results_as_plain_float32(backend):
    awkward, plain, _ = awkward_inputs()
    got = results_of(backend.module, awkward)
    want = results_of(backend.module, plain)
    for name in OUTPUTS:
        assert got[name].dtype == np.float32, name
        assert np.array_equal(got[name], want[name]), name


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_float16_float64_and_lists_are_converted(backend):
    # float16 widens to float32 exactly; float64 and Python floats are rounded to float32 once,
    # on the way in: the results equal those of the float32 arrays holding the same numbers.
    case = make_problem(np.random.default_rng(62), S=2, T=3, H=2, P=2, N=3, G=1, R=2, ids="permutation")
    plain = case.args()
    half = {k: (v.astype(np.float16) if k != "ids" else v) for k, v in plain.items()}
    half32 = {k: (v.astype(np.float32) if k != "ids" else v) for k, v in half.items()}
    m = backend.module
    assert np.array_equal(m.ssm_scan(**half).y, m.ssm_scan(**half32).y)

    wide = {k: (v.astype(np.float64) + 1e-9 if k != "ids" else v) for k, v in plain.items()}
    rounded = {k: (v.astype(np.float32) if k != "ids" else v) for k, v in wide.items()}
    assert np.array_equal(m.ssm_scan(**wide).states, m.ssm_scan(**rounded).states)

    lists = {k: v.tolist() for k, v in wide.items()}
    r_list, r_arr = m.ssm_scan(**lists), m.ssm_scan(**rounded)
    assert r_list.y.dtype == np.float32
    assert np.array_equal(r_list.y, r_arr.y) and np.array_equal(r_list.states, r_arr.states)
    g_list = m.ssm_scan_back(**lists, g_y=case.g_y.tolist(), g_states=case.g_states.tolist())
    g_arr = m.ssm_scan_back(**rounded, g_y=case.g_y, g_states=case.g_states)
    for name in ("d_s", "d_x", "d_dt", "d_A", "d_B", "d_C"):
        assert np.array_equal(getattr(g_list, name), getattr(g_arr, name)), name


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@pytest.mark.parametrize("ids", [np.array([1, 0], np.int8), np.array([1, 0], np.uint16), np.array([1, 0], np.int32),
                                 np.array([1, 0], np.uint64), [1, 0], (1, 0), range(1, -1, -1)],
                         ids=["int8", "uint16", "int32", "uint64", "list", "tuple", "range"])
def test_any_integer_ids_are_accepted(backend, ids):
    case = make_problem(np.random.default_rng(63), S=2, T=2, H=2, P=2, N=3, G=1, R=2, ids=[1, 0])
    a = case.args()
    want = backend.module.ssm_scan(**a)
    got = backend.module.ssm_scan(**{**a, "ids": ids})
    assert np.array_equal(got.y, want.y) and np.array_equal(got.states, want.states)
    assert not np.array_equal(want.states, backend.module.ssm_scan(**{**a, "ids": None}).states)


def test_the_oracle_widens_every_input_to_float64():
    case = make_problem(np.random.default_rng(64), S=1, T=2, H=2, P=1, N=2, G=1, R=1, ids="identity")
    a = case.args()
    r = ssm_ref.ssm_scan(**a, dtype=np.float64)
    g = ssm_ref.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states, dtype=np.float64)
    assert r.y.dtype == np.float64 and r.states.dtype == np.float64
    assert all(v.dtype == np.float64 for v in g.as_dict().values())
    # float16 inputs too: the oracle result equals the one from the same numbers in float64.
    half = {k: (v.astype(np.float16) if k != "ids" else v) for k, v in a.items()}
    wide = {k: (v.astype(np.float64) if k != "ids" else v) for k, v in half.items()}
    assert np.array_equal(ssm_ref.ssm_scan(**half, dtype=np.float64).y, ssm_ref.ssm_scan(**wide, dtype=np.float64).y)


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_float64_beyond_float32_range_becomes_inf_quietly(backend):
    # Rounding 1e39 to float32 gives inf; that inf then flows through the scan (SPEC.md section 8)
    # and, like the scan's own overflow, raises nothing and warns nothing.
    case = make_problem(np.random.default_rng(65), S=2, T=2, H=2, P=1, N=2, G=1, R=2, ids="identity")
    a = case.args(np.float64)
    a["x"][0, 0, 0, 0] = 1e39
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = backend.module.ssm_scan(**a)
    assert not np.all(np.isfinite(r.states[0, 0])) and np.all(np.isfinite(r.states[1]))
