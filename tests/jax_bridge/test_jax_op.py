"""ssm_jax.ssm_scan: the scan as a jax.custom_vjp over jax.pure_callback, under jit, grad and vmap,
against the float64 oracle (ssm_ref's numpy functions) and JAX's own finite-difference check.
Skipped without jax; failed instead under SSM_REQUIRE_JAX=1."""

import numpy as np
import pytest
from optional import need

jax = need("jax")

import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402
from jaxcheck import NAMES, arrays  # noqa: E402
from problems import make_problem  # noqa: E402
from registry import BACKENDS, assert_close  # noqa: E402

import ssm_jax  # noqa: E402
import ssm_ref  # noqa: E402

REF = next(b for b in BACKENDS if b.name == "ssm_ref")
FAST = next((b for b in BACKENDS if b.name == "ssm_fast"), None)


def loss_fn(case, ids, **kw):
    gy, gs = jnp.asarray(case.g_y), jnp.asarray(case.g_states)

    def loss(*a):
        y, states = ssm_jax.ssm_scan(*a, ids, **kw)
        return (y * gy.astype(y.dtype)).sum() + (states * gs.astype(states.dtype)).sum()

    return loss


@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
def test_jit_grad_in_float64_equals_the_oracle_and_finite_differences(x64, variant):
    case = make_problem(1, S=2, T=4, H=4, P=2, N=3, G=2, R=3, ids="duplicates", variant=variant)
    a, ids = arrays(case, jnp.float64)
    y, states = jax.jit(lambda *a: ssm_jax.ssm_scan(*a, ids, backend="ssm_ref"))(*a)
    want = ssm_ref.ssm_scan(**case.args(np.float64), dtype=np.float64)
    assert y.dtype == jnp.float64
    np.testing.assert_array_equal(np.asarray(y), want.y)
    np.testing.assert_array_equal(np.asarray(states), want.states)
    grads = jax.jit(jax.grad(loss_fn(case, ids, backend="ssm_ref"), argnums=tuple(range(6))))(*a)
    g = ssm_ref.ssm_scan_back(**case.args(np.float64), g_y=case.g_y, g_states=case.g_states, dtype=np.float64)
    for k, got in zip(NAMES, grads, strict=True):
        np.testing.assert_allclose(np.asarray(got), getattr(g, "d_" + k), rtol=1e-13, atol=1e-15, err_msg=k)
    check_grads(loss_fn(case, ids, backend="ssm_ref", dt_softplus="log1p"), a, order=1, modes=["rev"],
                atol=1e-7, rtol=1e-7)
    assert ssm_jax.last_where().dtype == "float64"


@pytest.mark.parametrize("backend", ["ssm_ref", "ssm_fast"])
def test_float32_under_jit_within_the_tolerance_table(backend):
    if backend == "ssm_fast" and FAST is None:
        pytest.skip("ssm_fast does not expose the interface")
    case = make_problem(2, S=2, T=6, H=4, P=3, N=5, G=2, R=3, ids="permutation", variant="mamba2")
    a, ids = arrays(case, jnp.float32)
    y, states = jax.jit(lambda *a: ssm_jax.ssm_scan(*a, ids, backend=backend))(*a)
    grads = jax.jit(jax.grad(loss_fn(case, ids, backend=backend), argnums=tuple(range(6))))(*a)
    want = ssm_ref.ssm_scan(**case.args(np.float64), dtype=np.float64)
    g = ssm_ref.ssm_scan_back(**case.args(np.float64), g_y=case.g_y, g_states=case.g_states, dtype=np.float64)
    entry = REF if backend == "ssm_ref" else FAST
    assert y.dtype == jnp.float32
    assert_close(entry, "y", np.asarray(y), want.y)
    assert_close(entry, "states", np.asarray(states), want.states)
    for k, got in zip(NAMES, grads, strict=True):
        assert_close(entry, "d_" + k, np.asarray(got), getattr(g, "d_" + k))
    w = ssm_jax.last_where()
    assert (w.op, w.backend, w.dtype) == ("ssm_scan_back", backend, "float32")


def test_vmap_of_the_scan_and_of_its_gradient(x64):
    case = make_problem(3, S=1, T=5, H=2, P=3, N=4, G=1, R=1, ids="identity")
    a, _ = arrays(case, jnp.float64)
    xs = jnp.stack([a[1], 0.5 * a[1], -a[1]])

    def y_of(x):
        return ssm_jax.ssm_scan(a[0], x, *a[2:], backend="ssm_ref")[0]

    ys = jax.jit(jax.vmap(y_of))(xs)
    gs = jax.vmap(jax.grad(lambda x: (y_of(x) ** 2).sum()))(xs)
    base = case.args(np.float64)
    for i in range(3):
        one = {**base, "x": np.asarray(xs[i])}
        r = ssm_ref.ssm_scan(**one, dtype=np.float64)
        np.testing.assert_array_equal(np.asarray(ys[i]), r.y)
        g = ssm_ref.ssm_scan_back(**one, g_y=2 * r.y, g_states=np.zeros_like(r.states), dtype=np.float64)
        np.testing.assert_allclose(np.asarray(gs[i]), g.d_x, rtol=1e-13, atol=1e-15)


def test_bfloat16_in_bfloat16_out():
    case = make_problem(4, S=1, T=3, H=2, P=2, N=3, G=1, R=1, ids="identity")
    a, ids = arrays(case, jnp.bfloat16)
    y, states = ssm_jax.ssm_scan(*a, ids, backend="ssm_ref")
    assert y.dtype == states.dtype == jnp.bfloat16
    r = ssm_ref.ssm_scan(*(np.asarray(v, np.float32) for v in a), ids)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(jnp.asarray(r.y).astype(jnp.bfloat16)))
    g = jax.grad(lambda x: ssm_jax.ssm_scan(a[0], x, *a[2:], ids, backend="ssm_ref")[0].astype(jnp.float32).sum())(a[1])
    assert g.dtype == jnp.bfloat16


def test_errors_name_the_argument_also_while_tracing():
    case = make_problem(5, S=2, T=7, H=4, P=3, N=5, G=1, R=2, ids="identity")
    a, _ = arrays(case, jnp.float32)
    with pytest.raises(ValueError, match=r"^B: expected shape \(S, T, G, N\) = \(2, 7, G, 5\), got \(2, 7, 5\)(\n|$)"):
        jax.jit(lambda *v: ssm_jax.ssm_scan(*v))(*a[:4], a[4][:, :, 0], a[5])
    with pytest.raises(ValueError, match=r"^backend: expected one of"):
        ssm_jax.ssm_scan(*a, backend="torch")
    with pytest.raises(ValueError, match=r"^dt_softplus: expected 'ggml', 'log1p', None, True .* or False"):
        ssm_jax.ssm_scan(*a, backend="ssm_ref", dt_softplus="exp")


def test_ids_traced_under_jit_are_checked_when_the_call_runs():
    case = make_problem(6, S=2, T=3, H=2, P=2, N=3, G=1, R=3, ids=[2, 0])
    a, _ = arrays(case, jnp.float32)
    f = jax.jit(lambda ids, *v: ssm_jax.ssm_scan(*v, ids, backend="ssm_ref")[0])
    y = f(jnp.asarray([2, 0]), *a)
    np.testing.assert_array_equal(np.asarray(y), ssm_ref.ssm_scan(*(np.asarray(v) for v in a), [2, 0]).y)
    with pytest.raises(Exception, match=r"ids: every id must be in \[0, R\) = \[0, 3\)"):
        jax.block_until_ready(f(jnp.asarray([3, 0]), *a))


@pytest.mark.parametrize("backend", ["ssm_ref", "ssm_fast"])
def test_defaults_s_none_and_the_dt_softplus_booleans(backend):
    """s=None is zero start states and dt_softplus True / False are "log1p" / None: bit for bit
    the calls that pass them, forward and gradients; the float64 oracle; last_where's ssm_ref.Where."""
    if backend == "ssm_fast" and FAST is None:
        pytest.skip("ssm_fast does not expose the interface")
    case = make_problem(7, S=2, T=5, H=4, P=3, N=4, G=2, ids="none", dt_range=(-12.0, 2.0))
    (s, *a), _ = arrays(case, jnp.float32)
    zeros = jnp.zeros_like(s)

    def run(s0, **kw):
        def loss(*v):
            y, states = ssm_jax.ssm_scan(s0, *v, backend=backend, **kw)
            return (y * case.g_y).sum() + (states * case.g_states).sum(), (y, states)
        (_, out), grads = jax.value_and_grad(loss, argnums=tuple(range(5)), has_aux=True)(*a)
        return [np.asarray(v) for v in (*out, *grads)]

    for got, want in ((run(None), run(zeros)), (run(zeros, dt_softplus=True), run(zeros, dt_softplus="log1p")),
                      (run(zeros, dt_softplus=False), run(zeros, dt_softplus=None))):
        for g, w in zip(got, want, strict=True):
            assert g.tobytes() == w.tobytes()
    inp = {k: case.inputs[k] for k in NAMES[1:]}
    oracle = ssm_ref.ssm_scan(np.zeros(s.shape), **inp, dtype=np.float64, dt_softplus="log1p")
    entry = REF if backend == "ssm_ref" else FAST
    assert_close(entry, "y", run(None, dt_softplus=True)[0], oracle.y)
    w = ssm_jax.last_where()
    assert type(w) is ssm_ref.Where is ssm_jax.Where and (w.op, w.backend) == ("ssm_scan_back", backend)
    with pytest.raises(ValueError, match=r"^ids: s is None \(zero start states, one per sequence\), so ids must"):
        ssm_jax.ssm_scan(None, *a, [1, 0])
