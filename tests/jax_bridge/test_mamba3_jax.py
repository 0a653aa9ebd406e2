"""ssm_jax.mamba3_scan: Mamba-3's scan as a jax.custom_vjp over jax.pure_callback, under jit, grad
and vmap, against the float64 oracle (ssm_ref.mamba3_scan / mamba3_scan_back on the same numbers)
and JAX's own finite-difference check. Skipped without jax; failed instead under SSM_REQUIRE_JAX=1."""

import numpy as np
import pytest
from optional import need

jax = need("jax")

import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import ssm_jax  # noqa: E402
import ssm_ref  # noqa: E402

NAMES = ssm_ref.ops.get("mamba3_scan").float_inputs


def problem(seed, mimo, states, S=2, T=4, H=4, P=2, N=6, G=2, M=2, F=2, R=3):
    """The op's 15 inputs as float64 numpy arrays (None where absent) of a small random problem."""
    rng = np.random.default_rng(seed)

    def u(*shape, lo=-1.0, hi=1.0):
        return rng.uniform(lo, hi, shape)

    rk = (M,) if mimo else ()
    dt = u(S, T, H, lo=0.05, hi=0.6)
    a = [u(S, T, H, P), dt, -dt * u(S, T, H, lo=0.1), u(S, T, H, lo=0, hi=1), u(S, T, *rk, G, N), u(S, T, *rk, G, N),
         u(H, *rk, N), u(H, *rk, N), u(S, T, H, F, lo=-2, hi=2), u(H, M, P) if mimo else None]
    if states:
        return [*a, u(R, H, F, lo=0, hi=6), u(R, H, P, N), u(R, H, *rk, N), u(R, H, *rk, P), np.array([2, 0][:S])]
    return [*a, None, None, None, None, None]


def cotangents(seed, out):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(np.shape(o)) for o in out]


@pytest.mark.parametrize(("mimo", "states"), [(False, False), (False, True), (True, False), (True, True)])
def test_jit_and_grad_in_float64_equal_the_oracle(x64, mimo, states):
    *floats, ids = problem(1, mimo, states)
    rotation = "halved" if mimo else "interleaved"
    want = ssm_ref.mamba3_scan(*floats, ids, rotation=rotation, dtype=np.float64)
    arrays = [None if a is None else jnp.asarray(a) for a in floats]
    out = jax.jit(lambda *a: ssm_jax.mamba3_scan(*a, ids=ids, rotation=rotation, backend="ssm_ref"))(*arrays)
    for o, w in zip(out, want, strict=True):
        assert o.dtype == jnp.float64
        np.testing.assert_array_equal(np.asarray(o), w)
    cot = cotangents(2, want)
    g = ssm_ref.mamba3_scan_back(*floats, ids, *cot, rotation=rotation, dtype=np.float64)
    live = [i for i, a in enumerate(arrays) if a is not None]

    def loss(*given):
        a = list(arrays)
        for i, v in zip(live, given, strict=True):
            a[i] = v
        out = ssm_jax.mamba3_scan(*a, ids=ids, rotation=rotation, backend="ssm_ref")
        return sum((o * c).sum() for o, c in zip(out, cot, strict=True))

    grads = jax.jit(jax.grad(loss, argnums=tuple(range(len(live)))))(*(arrays[i] for i in live))
    for i, got in zip(live, grads, strict=True):
        np.testing.assert_allclose(np.asarray(got), g["d_" + NAMES[i]], rtol=1e-12, atol=1e-14, err_msg=NAMES[i])
    check_grads(loss, tuple(arrays[i] for i in live), order=1, modes=["rev"], atol=1e-6, rtol=1e-6)
    assert ssm_jax.last_where().op == "mamba3_scan_back"


def test_vmap_runs_each_element_as_its_own_call(x64):
    *floats, ids = problem(3, True, True)
    arrays = [None if a is None else jnp.asarray(a) for a in floats]
    xs = jnp.stack([arrays[0], 2 * arrays[0], -arrays[0]])

    def f(x):
        return ssm_jax.mamba3_scan(x, *arrays[1:], ids=ids, rotation="halved", backend="ssm_ref")

    batched = jax.vmap(f)(xs)
    for b in range(3):
        one = ssm_ref.mamba3_scan(np.asarray(xs[b]), *floats[1:], ids, rotation="halved", dtype=np.float64)
        for o, w in zip(batched, one, strict=True):
            np.testing.assert_allclose(np.asarray(o[b]), w, rtol=1e-13, atol=1e-15)
    gx = jax.vmap(jax.grad(lambda x: f(x)[0].sum() + f(x)[2].sum()))(xs)
    assert gx.shape == xs.shape and np.isfinite(np.asarray(gx)).all()


def test_float32_default_backend_within_float32_of_the_oracle():
    *floats, ids = problem(4, False, True, T=6)
    want = ssm_ref.mamba3_scan(*floats, ids, dtype=np.float64)
    arrays = [None if a is None else jnp.asarray(a, jnp.float32) for a in floats]
    out = jax.jit(lambda *a: ssm_jax.mamba3_scan(*a, ids=ids))(*arrays)
    for o, w in zip(out, want, strict=True):
        assert o.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(o), w, rtol=1e-4, atol=1e-5)
    assert ssm_jax.last_where().dtype == "float32"


def test_errors_name_the_argument():
    *floats, ids = problem(5, False, True)
    with pytest.raises(ValueError, match=r"^backend: expected one of .ssm_fast., .ssm_vk., .ssm_ref."):
        ssm_jax.mamba3_scan(*floats, ids=ids, backend="ggml")
    with pytest.raises(ValueError, match=r"^rotation: "):
        ssm_jax.mamba3_scan(*floats, ids=ids, rotation="pairs")
    with pytest.raises(ValueError, match=r"^s_v: "):
        ssm_jax.mamba3_scan(*floats[:13], None, ids=ids)
    with pytest.raises(ValueError, match=r"^ids: "):
        ssm_jax.mamba3_scan(*floats, ids=np.array([5, 0]))
