"""ssm_jax.ssm_scan(..., snapshots=K): the K state snapshots (docs/SPEC.md section 3.1) as a third
output under jit, grad and vmap, against the float64 oracle (ssm_ref's numpy functions) and JAX's
finite-difference check: slot T (the start state) and the NaN slots k > T included, whose
cotangents are ignored and poison nothing. Skipped without jax; failed instead under
SSM_REQUIRE_JAX=1."""

import numpy as np
import pytest
from optional import need

jax = need("jax")

import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402
from jaxcheck import NAMES, arrays  # noqa: E402
from oracles import snapshot_cotangent, snapshot_oracle  # noqa: E402
from problems import make_problem  # noqa: E402
from registry import BACKENDS, assert_close  # noqa: E402

import ssm_jax  # noqa: E402
import ssm_ref  # noqa: E402

BACKEND_NAMES = [b.name for b in BACKENDS]


def loss_fn(case, ids, K, g_snap, **kw):
    """sum(y * g_y) + sum(states * g_states) + sum(snapshots * g_snap), the NaN slots masked out
    (jnp.nan_to_num: its gradient there is 0)."""
    gy, gs, gk = (jnp.asarray(v) for v in (case.g_y, case.g_states, g_snap))

    def loss(*a):
        y, states, snaps = ssm_jax.ssm_scan(*a, ids, snapshots=K, **kw)
        return ((y * gy.astype(y.dtype)).sum() + (states * gs.astype(states.dtype)).sum()
                + (jnp.nan_to_num(snaps) * gk.astype(snaps.dtype)).sum())

    return loss


@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
def test_jit_grad_in_float64_equals_the_oracle_and_finite_differences(x64, variant):
    # T = 3, K = 6: slots 0..2 after tokens, slot 3 the start state, slots 4 and 5 NaN
    case = make_problem(1, S=2, T=3, H=4, P=2, N=3, G=2, R=3, ids="duplicates", variant=variant)
    K = 6
    a, ids = arrays(case, jnp.float64)
    y, states, snaps = jax.jit(lambda *a: ssm_jax.ssm_scan(*a, ids, backend="ssm_ref", snapshots=K))(*a)
    g_snap = snapshot_cotangent(case, K)
    want, g = snapshot_oracle(case, K, g_snap)
    assert snaps.shape == (K, 2, 4, 2, 3) and snaps.dtype == jnp.float64
    np.testing.assert_array_equal(np.asarray(y), want.y)
    np.testing.assert_array_equal(np.asarray(states), want.states)
    np.testing.assert_array_equal(np.asarray(snaps), want.snapshots)   # NaN where the oracle has NaN
    assert np.isnan(np.asarray(snaps[4:])).all() and not np.isnan(np.asarray(snaps[:4])).any()
    grads = jax.jit(jax.grad(loss_fn(case, ids, K, g_snap, backend="ssm_ref"), argnums=tuple(range(6))))(*a)
    for k, got in zip(NAMES, grads, strict=True):
        np.testing.assert_allclose(np.asarray(got), g["d_" + k], rtol=1e-13, atol=1e-15, err_msg=k)
    check_grads(loss_fn(case, ids, K, g_snap, backend="ssm_ref", dt_softplus="log1p"), a, order=1, modes=["rev"],
                atol=1e-7, rtol=1e-7)
    assert ssm_jax.last_where().dtype == "float64"


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_float32_under_jit_within_the_tolerance_table(backend):
    case = make_problem(2, S=2, T=5, H=4, P=3, N=8, G=2, R=3, ids="permutation", variant="mamba2")
    K = 7
    a, ids = arrays(case, jnp.float32)
    y, states, snaps = jax.jit(lambda *a: ssm_jax.ssm_scan(*a, ids, backend=backend, snapshots=K))(*a)
    g_snap = snapshot_cotangent(case, K, seed=1)
    grads = jax.jit(jax.grad(loss_fn(case, ids, K, g_snap, backend=backend), argnums=tuple(range(6))))(*a)
    want, g = snapshot_oracle(case, K, g_snap)
    entry = next(b for b in BACKENDS if b.name == backend)
    assert y.dtype == snaps.dtype == jnp.float32
    assert_close(entry, "y", np.asarray(y), want.y)
    assert_close(entry, "states", np.asarray(states), want.states)
    for k in range(K):
        assert_close(entry, "states", np.asarray(snaps[k]), want.snapshots[k], label=f"slot {k}")
    for k, got in zip(NAMES, grads, strict=True):
        assert_close(entry, "d_" + k, np.asarray(got), g["d_" + k])
    w = ssm_jax.last_where()
    assert (w.op, w.dtype) == ("ssm_scan_back", "float32")
    # the outputs of the call without snapshots, bit for bit (docs/SPEC.md section 3.1)
    y2, states2 = ssm_jax.ssm_scan(*a, ids, backend=backend)
    assert np.asarray(y2).tobytes() == np.asarray(y).tobytes()
    assert np.asarray(states2).tobytes() == np.asarray(states).tobytes()


def test_nan_cotangents_of_the_nan_slots_poison_nothing(x64):
    case = make_problem(3, S=2, T=2, H=2, P=2, N=3, G=1, R=3, ids="permutation")
    K = 5   # slots 3 and 4 are NaN
    a, ids = arrays(case, jnp.float64)
    out, vjp = jax.vjp(lambda *v: ssm_jax.ssm_scan(*v, ids, backend="ssm_ref", snapshots=K), *a)
    g_snap = snapshot_cotangent(case, K, seed=2)
    g_nan = g_snap.copy()
    g_nan[3:] = np.nan   # what a loss that reads those slots unmasked hands back
    grads = vjp((jnp.asarray(case.g_y, jnp.float64), jnp.asarray(case.g_states, jnp.float64), jnp.asarray(g_nan)))
    _, g = snapshot_oracle(case, K, g_snap)
    for k, got in zip(NAMES, grads, strict=True):
        assert np.isfinite(np.asarray(got)).all(), k
        np.testing.assert_allclose(np.asarray(got), g["d_" + k], rtol=1e-13, atol=1e-15, err_msg=k)
    assert np.isnan(float((out[2] * g_snap).sum()))   # an unmasked loss on the snapshots is NaN


def test_vmap_with_snapshots(x64):
    case = make_problem(4, S=1, T=3, H=2, P=3, N=4, G=1, R=1, ids="identity")
    K = 5
    a, _ = arrays(case, jnp.float64)
    xs = jnp.stack([a[1], 0.5 * a[1], -a[1]])

    def snaps_of(x):
        return ssm_jax.ssm_scan(a[0], x, *a[2:], backend="ssm_ref", snapshots=K)[2]

    got = jax.jit(jax.vmap(snaps_of))(xs)
    gs = jax.vmap(jax.grad(lambda x: jnp.nan_to_num(snaps_of(x)).sum()))(xs)
    base = case.args(np.float64)
    for i in range(3):
        one = {**base, "x": np.asarray(xs[i])}
        r = ssm_ref.ssm_scan(**one, dtype=np.float64, snapshots=K)
        np.testing.assert_array_equal(np.asarray(got[i]), r.snapshots)
        ones = np.where(np.isnan(r.snapshots), 0.0, 1.0)
        g = ssm_ref.ssm_scan_back(**one, g_snapshots=ones, dtype=np.float64)
        np.testing.assert_allclose(np.asarray(gs[i]), g.d_x, rtol=1e-13, atol=1e-15)


def test_without_snapshots_two_outputs_k1_the_states_slot_and_errors(x64):
    case = make_problem(5, S=2, T=3, H=2, P=2, N=3, G=1, R=2, ids="identity")
    a, ids = arrays(case, jnp.float64)
    out = ssm_jax.ssm_scan(*a, ids, backend="ssm_ref")
    assert len(out) == 2
    y, states, snaps = ssm_jax.ssm_scan(*a, ids, backend="ssm_ref", snapshots=1)
    assert snaps.shape == (1, *states.shape)
    np.testing.assert_array_equal(np.asarray(snaps[0]), np.asarray(states))
    # slot 0 is the final state: its cotangent adds to the states' (the oracle's g_states)
    g_snap = snapshot_cotangent(case, 1, seed=3)
    gx = jax.grad(lambda x: (ssm_jax.ssm_scan(a[0], x, *a[2:], ids, backend="ssm_ref", snapshots=1)[2]
                             * g_snap).sum())(a[1])
    g = ssm_ref.ssm_scan_back(**case.args(np.float64), g_states=g_snap[0], dtype=np.float64)
    np.testing.assert_allclose(np.asarray(gx), g.d_x, rtol=1e-13, atol=1e-15)
    with pytest.raises(ValueError, match=r"^snapshots: expected K >= 1"):
        jax.jit(lambda *v: ssm_jax.ssm_scan(*v, backend="ssm_ref", snapshots=0))(*a)
    with pytest.raises(TypeError, match=r"^snapshots: expected an integer K >= 1"):
        ssm_jax.ssm_scan(*a, backend="ssm_ref", snapshots=True)
    # in s's dtype, as the states
    mixed = [a[0].astype(jnp.float32), *(v.astype(jnp.bfloat16) for v in a[1:])]
    y, states, snaps = ssm_jax.ssm_scan(*mixed, ids, backend="ssm_ref", snapshots=2)
    assert y.dtype == jnp.bfloat16 and states.dtype == snaps.dtype == jnp.float32
