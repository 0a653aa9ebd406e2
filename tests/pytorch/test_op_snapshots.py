"""ssm_torch.ssm_scan(..., snapshots=K): the K state snapshots (docs/SPEC.md section 3.1) as a third
output, differentiable: gradcheck in float64 on ssm_ref, every backend's float32 forward and
gradients against the float64 oracle for a loss on y, states and the snapshots (slot T, the start
state, and the NaN slots k > T included), NaN slots that give zero gradient and poison nothing, the
two-output call unchanged, T == 0, errors, meta tensors and torch.compile.

Expected values come from ssm_ref's numpy functions in float64 (the oracle), never from ssm_torch.
"""

import numpy as np
import pytest
from torchreq import need_torch

torch = need_torch()

from bridgecheck import assert_compiles_as_eager  # noqa: E402
from oracles import snapshot_cotangent, snapshot_oracle  # noqa: E402
from problems import make_problem  # noqa: E402
from registry import BACKENDS, assert_close  # noqa: E402

import ssm_ref  # noqa: E402
import ssm_torch  # noqa: E402

NAMES = ("s", "x", "dt", "A", "B", "C")
BACKEND_NAMES = [b.name for b in BACKENDS]


def entry(name):
    return next(b for b in BACKENDS if b.name == name)


def tensors(case, dtype=torch.float64, requires_grad=True):
    args = case.args()
    out = {k: torch.tensor(np.asarray(args[k], np.float64), dtype=dtype, requires_grad=requires_grad) for k in NAMES}
    ids = None if args["ids"] is None else torch.tensor(np.asarray(args["ids"]))
    return out, ids


def loss_of(y, states, snaps, case, g_snap):
    """The loss with the NaN slots masked out (torch.nan_to_num: its gradient there is 0)."""
    w = {k: torch.from_numpy(np.asarray(v, np.float64)) for k, v in
         (("y", case.g_y), ("states", case.g_states), ("snaps", g_snap))}
    return ((y.double() * w["y"]).sum() + (states.double() * w["states"]).sum()
            + (torch.nan_to_num(snaps.double()) * w["snaps"]).sum())


GRADCHECK = {
    "mamba2-G2-permuted-K5": (dict(S=2, T=3, H=4, P=2, N=3, G=2, R=3, ids="permutation", variant="mamba2"), 5),
    "mamba1-duplicates-K4": (dict(S=3, T=3, H=2, P=2, N=3, G=1, R=2, ids="duplicates", variant="mamba1"), 4),
    "mamba2-h1-default-ids-K2": (dict(S=2, T=3, H=2, P=1, N=4, G=1, R=2, ids="none", variant="mamba2",
                                      a_form="h1"), 2),
}


@pytest.mark.parametrize("form", ["ggml", None])
@pytest.mark.parametrize("name", list(GRADCHECK))
def test_gradcheck_through_the_snapshots_in_float64_on_ssm_ref(name, form):
    dims, K = GRADCHECK[name]
    case = make_problem(3, **dims)
    T = dims["T"]
    t, ids = tensors(case)
    if form is None:
        t["dt"] = (t["dt"].detach().abs() + 0.05).requires_grad_()

    def f(*arrays):
        y, states, snaps = ssm_torch.ssm_scan(*arrays, ids, backend="ssm_ref", dt_softplus=form, snapshots=K)
        # the slots that hold a state (k <= T): the NaN ones have no derivative to check
        return y, states, snaps[:T + 1]

    assert torch.autograd.gradcheck(f, tuple(t[k] for k in NAMES), eps=1e-6, atol=1e-9, rtol=1e-7)
    w = ssm_torch.last_where()
    assert (w.op, w.dtype) == ("ssm_scan_back", "float64")


@pytest.mark.parametrize("K", [1, 3, 6])
def test_float64_forward_and_gradients_equal_the_oracle(K):
    # T = 4: K = 6 has slot T (the start state) and a NaN slot k = 5 > T
    case = make_problem(5, S=2, T=4, H=4, P=3, N=5, G=2, R=3, ids="duplicates", variant="mamba2")
    t, ids = tensors(case)
    y, states, snaps = ssm_torch.ssm_scan(*(t[k] for k in NAMES), ids, backend="ssm_ref", snapshots=K)
    g_snap = snapshot_cotangent(case, K)
    want, gwant = snapshot_oracle(case, K, g_snap)
    assert snaps.shape == (K, 2, 4, 3, 5) and snaps.dtype == torch.float64
    np.testing.assert_array_equal(y.detach().numpy(), want.y)
    np.testing.assert_array_equal(states.detach().numpy(), want.states)
    np.testing.assert_array_equal(snaps.detach().numpy(), want.snapshots)   # NaN where the oracle has NaN
    assert torch.isnan(snaps[5:]).all() and not torch.isnan(snaps[:5]).any()
    loss_of(y, states, snaps, case, g_snap).backward()
    for k in NAMES:
        np.testing.assert_allclose(t[k].grad.numpy(), gwant["d_" + k], rtol=1e-13, atol=1e-15, err_msg=k)


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("variant", ["mamba1", "mamba2"])
def test_float32_against_the_float64_oracle_on_every_backend(backend, variant):
    case = make_problem(7, S=2, T=5, H=4, P=3, N=8, G=2, R=3, ids="permutation", variant=variant)
    K = 7  # slots 0..4 after tokens, slot 5 the start state, slot 6 NaN
    t, ids = tensors(case, torch.float32)
    y, states, snaps = ssm_torch.ssm_scan(*(t[k] for k in NAMES), ids, backend=backend, snapshots=K)
    assert y.dtype == snaps.dtype == torch.float32
    g_snap = snapshot_cotangent(case, K, seed=1)
    loss_of(y, states, snaps, case, g_snap).backward()
    want, gwant = snapshot_oracle(case, K, g_snap)
    be = entry(backend)
    assert_close(be, "y", y.detach().numpy(), want.y)
    assert_close(be, "states", states.detach().numpy(), want.states)
    for k in range(K):
        assert_close(be, "states", snaps[k].detach().numpy(), want.snapshots[k], label=f"slot {k}")
    for k in NAMES:
        assert_close(be, "d_" + k, t[k].grad.numpy(), gwant["d_" + k], label="autograd")
    w = ssm_torch.last_where()
    assert (w.op, w.dtype) == ("ssm_scan_back", "float32")
    # the outputs of the call without snapshots, bit for bit (docs/SPEC.md section 3.1)
    y2, states2 = ssm_torch.ssm_scan(*(t[k].detach() for k in NAMES), ids, backend=backend)
    assert torch.equal(y2, y.detach()) and torch.equal(states2, states.detach())


def test_nan_slots_give_zero_gradient_and_poison_nothing():
    # T = 2, K = 5: slots 3 and 4 are NaN. A gradient of NaN (what a loss that reads them
    # unmasked hands back, e.g. snaps.square()) reaches the backend there and is ignored.
    case = make_problem(9, S=2, T=2, H=2, P=2, N=3, G=1, R=3, ids="permutation")
    t, ids = tensors(case)
    K = 5
    y, states, snaps = ssm_torch.ssm_scan(*(t[k] for k in NAMES), ids, backend="ssm_ref", snapshots=K)
    g_snap = snapshot_cotangent(case, K, seed=2)
    g_nan = torch.from_numpy(g_snap.copy())
    g_nan[3:] = float("nan")
    grads = torch.autograd.grad((y, states, snaps), tuple(t[k] for k in NAMES),
                                grad_outputs=(torch.from_numpy(case.g_y).double(),
                                              torch.from_numpy(case.g_states).double(), g_nan), retain_graph=True)
    _, gwant = snapshot_oracle(case, K, g_snap)
    for k, g in zip(NAMES, grads, strict=True):
        assert torch.isfinite(g).all(), k
        np.testing.assert_allclose(g.numpy(), gwant["d_" + k], rtol=1e-13, atol=1e-15, err_msg=k)
    # masking by torch.where gives the same gradients as torch.nan_to_num; an unmasked sum is NaN
    w = torch.from_numpy(g_snap)
    masked = torch.where(torch.isnan(snaps), torch.zeros_like(snaps), snaps)
    by_where = torch.autograd.grad((masked * w).sum(), t["x"], retain_graph=True)[0]
    by_nan_to_num = torch.autograd.grad((torch.nan_to_num(snaps) * w).sum(), t["x"], retain_graph=True)[0]
    assert torch.equal(by_where, by_nan_to_num) and torch.isfinite(by_where).all()
    assert torch.isnan((snaps * w).sum())


def test_without_snapshots_two_outputs_and_k1_the_states_slot():
    case = make_problem(10, S=2, T=3, H=2, P=2, N=3, G=1, R=2, ids="identity")
    t, ids = tensors(case)
    out = ssm_torch.ssm_scan(*(t[k] for k in NAMES), ids, backend="ssm_ref")
    assert isinstance(out, tuple) and len(out) == 2
    y, states, snaps = ssm_torch.ssm_scan(*(t[k] for k in NAMES), ids, backend="ssm_ref", snapshots=1)
    assert snaps.shape == (1, *states.shape) and torch.equal(snaps[0], states) and torch.equal(y, out[0])
    # slot 0 is the final state: its gradient adds to the states' (the oracle's g_states)
    g_snap = snapshot_cotangent(case, 1, seed=3)
    (snaps * torch.from_numpy(g_snap)).sum().backward()
    g = ssm_ref.ssm_scan_back(**case.args(np.float64), g_states=g_snap[0], dtype=np.float64)
    for k in NAMES:
        np.testing.assert_allclose(t[k].grad.numpy(), g["d_" + k], rtol=1e-13, atol=1e-15, err_msg=k)


def test_t0_slot_0_is_the_start_state():
    S, H, P, N, R, K = 2, 2, 3, 4, 3, 3
    rng = np.random.default_rng(11)
    s = torch.tensor(rng.uniform(-0.5, 0.5, (R, H, P, N)), requires_grad=True)
    x, dt, B, C = (torch.zeros(shape, dtype=torch.float64) for shape in
                   [(S, 0, H, P), (S, 0, H), (S, 0, 1, N), (S, 0, 1, N)])
    y, states, snaps = ssm_torch.ssm_scan(s, x, dt, -torch.ones(H, dtype=torch.float64), B, C, [2, 0],
                                          backend="ssm_ref", snapshots=K)
    want = ssm_ref.ssm_scan(s.detach().numpy(), x.numpy(), dt.numpy(), -np.ones(H), B.numpy(), C.numpy(), [2, 0],
                            dtype=np.float64, snapshots=K)
    np.testing.assert_array_equal(snaps.detach().numpy(), want.snapshots)
    assert torch.equal(snaps[0], s.detach()[[2, 0]]) and torch.isnan(snaps[1:]).all()
    assert y.shape == (S, 0, H, P) and torch.equal(states, snaps[0])
    g_snap = rng.uniform(-1.0, 1.0, (K, S, H, P, N))
    (torch.nan_to_num(snaps) * torch.from_numpy(g_snap)).sum().backward()
    d_s = np.zeros((R, H, P, N))
    d_s[[2, 0]] = g_snap[0]
    np.testing.assert_array_equal(s.grad.numpy(), d_s)


def test_errors_name_the_argument_and_meta_tensors():
    case = make_problem(12, S=2, T=3, H=2, P=2, N=3, G=1, R=2, ids="identity")
    t, _ = tensors(case, torch.float32, requires_grad=False)
    a = [t[k] for k in NAMES]
    with pytest.raises(ValueError, match=r"^snapshots: expected K >= 1"):
        ssm_torch.ssm_scan(*a, backend="ssm_ref", snapshots=0)
    for bad in (True, 2.0, "2"):
        with pytest.raises(TypeError, match=r"^snapshots: expected an integer K >= 1"):
            ssm_torch.ssm_scan(*a, backend="ssm_ref", snapshots=bad)
    ym, sm, km = ssm_torch.ssm_scan(*(v.to("meta") for v in a), backend="ssm_ref", snapshots=4)  # shapes only
    assert km.device.type == "meta" and km.shape == (4, 2, 2, 2, 3) and sm.shape == (2, 2, 2, 3)
    assert ym.shape == (2, 3, 2, 2)
    # the snapshots come in s's dtype, as the states do
    mixed = [a[0], *(v.to(torch.bfloat16) for v in a[1:])]
    y, states, snaps = ssm_torch.ssm_scan(*mixed, backend="ssm_ref", snapshots=2)
    assert y.dtype == torch.bfloat16 and states.dtype == snaps.dtype == torch.float32


class TinyWithRollback(torch.nn.Module):
    """A Mamba-2-like layer whose loss reads the state two tokens back (slot 2), as a speculative
    decoder's rollback does."""

    def __init__(self, H=2, P=3, N=4, K=3):
        super().__init__()
        torch.manual_seed(0)
        self.H, self.P, self.N, self.K = H, P, N, K
        self.A_log = torch.nn.Parameter(torch.zeros(H))
        self.inp = torch.nn.Linear(H * P, H * P + H + 2 * N)

    def forward(self, u):                                     # u (S, T, H*P)
        S, T, _ = u.shape
        H, P, N = self.H, self.P, self.N
        x, dt, B, C = self.inp(u).split([H * P, H, N, N], dim=-1)
        y, states, snaps = ssm_torch.ssm_scan(u.new_zeros((S, H, P, N)), x.reshape(S, T, H, P), dt,
                                              -torch.exp(self.A_log), B[:, :, None], C[:, :, None],
                                              backend="ssm_ref", snapshots=self.K)
        return y.square().mean() + states.square().mean() + snaps[2].square().mean()


def test_torch_compile_traces_the_snapshots_without_a_graph_break():
    model, u = TinyWithRollback(), torch.randn(2, 5, 6)
    assert_compiles_as_eager(model, u)
    assert ssm_torch.last_where().op == "ssm_scan_back"


def test_torch_compile_reports_a_bad_k_while_tracing():
    S, T, H, P, N = 1, 3, 2, 2, 4
    args = [torch.zeros(S, H, P, N), torch.zeros(S, T, H, P), torch.zeros(S, T, H), -torch.ones(H),
            torch.zeros(S, T, 1, N), torch.zeros(S, T, 1, N)]
    with pytest.raises(Exception, match=r"snapshots: expected K >= 1"):
        torch.compile(lambda *a: ssm_torch.ssm_scan(*a, backend="ssm_ref", snapshots=0)[2], fullgraph=True,
                      backend="aot_eager")(*args)
    # the fake implementation's shapes: slot 0 and the states of a compiled call are the eager ones
    f = torch.compile(lambda *a: ssm_torch.ssm_scan(*a, backend="ssm_ref", snapshots=5), fullgraph=True,
                      backend="aot_eager")
    a = [torch.randn(v.shape) for v in args[:3]] + [-torch.rand(H)] + [torch.randn(v.shape) for v in args[4:]]
    y, states, snaps = f(*a)
    want = ssm_ref.ssm_scan(*(v.numpy() for v in a), snapshots=5)
    assert snaps.shape == (5, S, H, P, N)
    np.testing.assert_array_equal(snaps.numpy(), want.snapshots)
    assert torch.equal(y, torch.from_numpy(want.y)) and torch.equal(states, snaps[0])
