"""The packed ggml layouts and the two state gradients (d_s vs d_s0).

Forward (SSM_SCAN):       y (S*T*H*P) | states (S*H*P*N)
Backward (SSM_SCAN_BACK): d_s0 (S*H*P*N) | d_x (S*T*H*P) | d_dt (S*T*H) | d_A (size of A)
                          | d_B (S*T*G*N) | d_C (S*T*G*N)
Offsets are computed here from the sizes, blocks are filled with distinct known values, and
every block is looked for at its offset.
"""

import numpy as np
import pytest
from oracles import fd_grad, scatter_add
from problems import make_problem
from registry import BACKENDS, assert_close

import ssm_ref
from ssm_ref import Dims, ScanGrads, ScanResult

S, T, H, P, N, G, R = 2, 3, 4, 2, 5, 2, 3


def dims(a_shape):
    return Dims(S=S, T=T, H=H, P=P, N=N, G=G, R=R, mamba1=a_shape == (H, N), a_shape=a_shape)


def block(shape, start):
    """Distinct values start, start+1, ...: a block found at the wrong place cannot match."""
    return (start + np.arange(int(np.prod(shape)), dtype=np.float32)).reshape(shape)


def grads_blocks(a_shape):
    return {
        "d_s0": block((S, H, P, N), 1_000),
        "d_x": block((S, T, H, P), 2_000),
        "d_dt": block((S, T, H), 3_000),
        "d_A": block(a_shape, 4_000),
        "d_B": block((S, T, G, N), 5_000),
        "d_C": block((S, T, G, N), 6_000),
    }


def test_forward_layout_sizes_and_offsets():
    y, states = block((S, T, H, P), 1_000), block((S, H, P, N), 5_000)
    packed = ScanResult(y=y, states=states, where="CPU", backend="test").packed()
    n_y, n_st = S * T * H * P, S * H * P * N
    assert packed.dtype == np.float32 and packed.shape == (n_y + n_st,)
    assert packed.shape == (dims((H,)).forward_size,)
    assert np.array_equal(packed[:n_y], y.ravel())
    assert np.array_equal(packed[n_y:], states.ravel())
    assert np.array_equal(ssm_ref.pack_forward(y, states), packed)


@pytest.mark.parametrize("a_shape", [(H,), (H, 1), (H, N)])
def test_backward_layout_sizes_and_offsets(a_shape):
    b = grads_blocks(a_shape)
    g = ScanGrads(d_s=np.zeros((R, H, P, N), np.float32), **b, where="CPU", backend="test")
    packed = g.packed()
    sizes = [S * H * P * N, S * T * H * P, S * T * H, int(np.prod(a_shape)), S * T * G * N, S * T * G * N]
    assert packed.dtype == np.float32 and packed.shape == (sum(sizes),)
    assert packed.shape == (dims(a_shape).backward_size,)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    for k, name in enumerate(("d_s0", "d_x", "d_dt", "d_A", "d_B", "d_C")):
        assert np.array_equal(packed[offsets[k]:offsets[k + 1]], b[name].ravel()), name
    assert np.array_equal(ssm_ref.pack_backward(*b.values()), packed)


@pytest.mark.parametrize("a_shape", [(H,), (H, 1), (H, N)])
def test_round_trips(a_shape):
    y, states = block((S, T, H, P), 7), block((S, H, P, N), 9_000)
    packed = ssm_ref.pack_forward(y, states)
    y2, st2 = ssm_ref.unpack_forward(packed, dims(a_shape))
    assert np.array_equal(y2, y) and np.array_equal(st2, states)
    assert not np.shares_memory(y2, packed) and not np.shares_memory(st2, packed)

    b = grads_blocks(a_shape)
    packed = ssm_ref.pack_backward(*b.values())
    back = ssm_ref.unpack_backward(packed, dims(a_shape))
    assert list(back) == list(b)
    for name in b:
        assert back[name].shape == b[name].shape and np.array_equal(back[name], b[name]), name
        assert not np.shares_memory(back[name], packed)


def test_unpack_refuses_a_wrong_length():
    d = dims((H,))
    with pytest.raises(ValueError, match="packed forward"):
        ssm_ref.unpack_forward(np.zeros(d.forward_size + 1, np.float32), d)
    with pytest.raises(ValueError, match="packed backward"):
        ssm_ref.unpack_backward(np.zeros(d.backward_size - 1, np.float32), d)
    with pytest.raises(ValueError, match="packed forward"):
        ssm_ref.unpack_forward(np.zeros((1, d.forward_size), np.float32), d)


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
def test_results_pack_in_the_ggml_layouts(backend, variant):
    case = make_problem(np.random.default_rng(41), S=S, T=T, H=H, P=P, N=N, G=G, R=R, ids="duplicates",
                        variant=variant)
    a = case.args()
    r = backend.module.ssm_scan(**a)
    g = backend.module.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states)
    assert np.array_equal(r.packed(), np.concatenate([np.ravel(r.y), np.ravel(r.states)]))
    parts = [g.d_s0, g.d_x, g.d_dt, g.d_A, g.d_B, g.d_C]
    assert np.array_equal(g.packed(), np.concatenate([np.ravel(p) for p in parts]))


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@pytest.mark.parametrize("T_", [0, 3])
def test_packed_gradient_input_gives_the_same_grads_as_structured(backend, T_):
    case = make_problem(np.random.default_rng(42), S=S, T=T_, H=H, P=P, N=N, G=G, R=R, ids="permutation")
    a = case.args()
    m = backend.module
    structured = m.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states)
    g_packed = np.concatenate([case.g_y.ravel(), case.g_states.ravel()])
    packed = m.ssm_scan_back(**a, g_y=g_packed, g_states=None)
    for name, want in structured.as_dict().items():
        assert np.array_equal(getattr(packed, name), want), name


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@pytest.mark.parametrize("ids", [[0, 1, 2], [2, 0, 1], [1, 1, 1], [3, 0, 3], [4, 2, 0]],
                         ids=["identity", "permuted", "all-same", "dup-unused", "spread"])
def test_d_s_is_d_s0_scatter_added_by_ids(backend, ids):
    case = make_problem(np.random.default_rng(43), S=3, T=T, H=H, P=P, N=N, G=G, R=5, ids=ids)
    a = case.args()
    g = backend.module.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states)
    assert g.d_s.shape == (5, H, P, N) and g.d_s0.shape == (3, H, P, N)
    want = scatter_add(g.d_s0.astype(np.float64), ids, 5)
    if len(set(ids)) == len(ids):                          # no sums: a pure copy into rows
        assert np.array_equal(g.d_s, want)
    else:
        assert_close(backend, "d_s", g.d_s, want)
    unread = sorted(set(range(5)) - set(ids))
    assert np.all(g.d_s[unread] == 0)
    # d_s0 itself does not depend on where the rows live: the same start states at other rows
    # give the same d_s0 (R = S, identity ids).
    own = {**a, "s": a["s"][ids], "ids": None}
    g_own = backend.module.ssm_scan_back(**own, g_y=case.g_y, g_states=case.g_states)
    assert np.array_equal(g_own.d_s0, g.d_s0)


@pytest.mark.parametrize("ids", [[2, 0, 1], [3, 0, 3], [1, 1, 1]], ids=["permuted", "dup-unused", "all-same"])
def test_d_s_is_the_finite_difference_gradient_of_the_cache(ids):
    case = make_problem(np.random.default_rng(44), S=3, T=T, H=2, P=2, N=3, G=1, R=4, ids=ids)
    inputs = case.args(np.float64)
    g = ssm_ref.ssm_scan_back(**inputs, g_y=case.g_y, g_states=case.g_states, dtype=np.float64)
    fd = fd_grad(inputs, "s", case.g_y, case.g_states)
    assert np.linalg.norm(g.d_s - fd) <= 1e-7 * np.linalg.norm(fd)
    # ... while d_s0 added to the cache rows unscattered (row i gets d_s0[i], as ggmlR does) is
    # not, for any ids but the identity.
    unscattered = np.zeros_like(fd)
    unscattered[:3] = g.d_s0
    assert np.linalg.norm(unscattered - fd) > 0.1 * np.linalg.norm(fd)
