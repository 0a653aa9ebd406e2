"""ssm_torch.ssm_scan, the PyTorch operator: gradients (gradcheck in float64 on ssm_ref), float32
against the float64 oracle, dtypes in and out, None gradients, inputs that require grad or are not
contiguous, zero-copy hand-over, backends and where they ran, errors, and torch.compile.

Expected values come from ssm_ref's numpy functions on the same numbers (the oracle), never from
ssm_torch itself.
"""


import numpy as np
import pytest
from torchreq import need_torch

torch = need_torch()

from bridgecheck import assert_close_as, assert_compiles_as_eager  # noqa: E402
from bridgecheck import oracle as bridge_oracle  # noqa: E402
from problems import make_problem  # noqa: E402
from registry import BACKENDS, assert_close  # noqa: E402

import ssm_ref  # noqa: E402
import ssm_torch  # noqa: E402

NAMES = ("s", "x", "dt", "A", "B", "C")
REF = next(b for b in BACKENDS if b.name == "ssm_ref")
FAST = next((b for b in BACKENDS if b.name == "ssm_fast"), None)


def tensors(case, dtype=torch.float64, requires_grad=True):
    args = case.args()
    out = {k: torch.tensor(np.asarray(args[k], np.float64), dtype=dtype, requires_grad=requires_grad) for k in NAMES}
    ids = None if args["ids"] is None else torch.tensor(np.asarray(args["ids"]))
    return out, ids


def oracle(case, forms="ggml"):
    """The float64 oracle's forward and backward for the case's own loss gradients."""
    args = case.args(np.float64)
    r = ssm_ref.ssm_scan(**args, dtype=np.float64, dt_softplus=forms)
    g = ssm_ref.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states, dtype=np.float64, dt_softplus=forms)
    return r, g


def run(case, dtype=torch.float32, **kw):
    """y, states and the gradients of sum(y * g_y) + sum(states * g_states) through ssm_torch."""
    t, ids = tensors(case, dtype)
    y, states = ssm_torch.ssm_scan(*(t[k] for k in NAMES), ids, **kw)
    loss = (y.double() * torch.from_numpy(case.g_y).double()).sum() + \
        (states.double() * torch.from_numpy(case.g_states).double()).sum()
    loss.backward()
    return y, states, {k: t[k].grad for k in NAMES}


GRADCHECK = {
    "mamba2-G2-permuted": dict(S=2, T=3, H=4, P=2, N=3, G=2, R=3, ids="permutation", variant="mamba2"),
    "mamba1-duplicates": dict(S=3, T=2, H=2, P=2, N=3, G=1, R=2, ids="duplicates", variant="mamba1"),
    "mamba2-h1-default-ids": dict(S=2, T=3, H=2, P=1, N=4, G=1, R=2, ids="none", variant="mamba2", a_form="h1"),
}


@pytest.mark.parametrize("form", ["ggml", "log1p", None])
@pytest.mark.parametrize("name", list(GRADCHECK))
def test_gradcheck_in_float64_on_ssm_ref(name, form):
    case = make_problem(3, **GRADCHECK[name])
    t, ids = tensors(case)
    if form is None:
        t["dt"] = (t["dt"].detach().abs() + 0.05).requires_grad_()

    def f(*arrays):
        return ssm_torch.ssm_scan(*arrays, ids, backend="ssm_ref", dt_softplus=form)

    assert torch.autograd.gradcheck(f, tuple(t[k] for k in NAMES), eps=1e-6, atol=1e-9, rtol=1e-7)
    assert ssm_torch.last_where().dtype == "float64"


@pytest.mark.parametrize("backend", ["ssm_ref", "ssm_fast"])
@pytest.mark.parametrize("seed", range(3))
def test_float32_against_the_float64_oracle(backend, seed):
    if backend == "ssm_fast" and FAST is None:
        pytest.skip("ssm_fast does not expose the interface")
    case = make_problem(seed, S=2, T=6, H=4, P=3, N=5, G=2, R=3, ids=("permutation", "duplicates", "unused")[seed],
                        variant=("mamba1", "mamba2", "mamba2")[seed])
    y, states, grads = run(case, backend=backend)
    assert y.dtype == torch.float32 and grads["A"].dtype == torch.float32
    want, gwant = oracle(case)
    entry = REF if backend == "ssm_ref" else FAST
    assert_close(entry, "y", y.detach().numpy(), want.y)
    assert_close(entry, "states", states.detach().numpy(), want.states)
    for k in NAMES:
        assert_close(entry, "d_" + k, grads[k].numpy(), getattr(gwant, "d_" + k), label="autograd")
    w = ssm_torch.last_where()
    assert (w.op, w.where, w.backend, w.dtype) == ("ssm_scan_back", "CPU", backend, "float32")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_dtypes_in_and_out(dtype):
    # Computed in float32 from the inputs as given (float64 inputs on ssm_ref: in float64),
    # returned in their dtype: the backend's numbers on those inputs, then rounded once.
    case = make_problem(7, S=2, T=4, H=2, P=3, N=4, G=1, R=2, ids="identity")
    t, ids = tensors(case, dtype)
    y, states = ssm_torch.ssm_scan(*(t[k] for k in NAMES), ids, backend="ssm_ref")
    assert y.dtype == dtype and states.dtype == dtype
    work = torch.float64 if dtype == torch.float64 else torch.float32
    f32 = [t[k].detach().to(work).numpy() for k in NAMES]
    r = ssm_ref.ssm_scan(*f32, None if ids is None else ids.numpy(), dtype=f32[0].dtype)
    assert torch.equal(y.detach(), torch.from_numpy(r.y).to(dtype))
    assert torch.equal(states.detach(), torch.from_numpy(r.states).to(dtype))
    (y.float().sum() + states.float().sum()).backward()
    g = ssm_ref.ssm_scan_back(*f32, None if ids is None else ids.numpy(), np.ones(r.y.shape), np.ones(r.states.shape),
                              dtype=f32[0].dtype)
    for k in NAMES:
        assert t[k].grad.dtype == dtype
        assert torch.equal(t[k].grad, torch.from_numpy(getattr(g, "d_" + k)).to(dtype)), k
    assert ssm_torch.last_where().dtype == ("float64" if dtype == torch.float64 else "float32")


def test_mixed_dtypes_a_float32_cache_beside_bfloat16_activations():
    case = make_problem(8, S=2, T=3, H=2, P=2, N=3, G=1, R=2, ids="identity")
    t, ids = tensors(case, torch.bfloat16)
    t["s"] = t["s"].detach().float().requires_grad_()
    y, states = ssm_torch.ssm_scan(*(t[k] for k in NAMES), ids, backend="ssm_ref")
    assert y.dtype == torch.bfloat16 and states.dtype == torch.float32
    (y.float().sum() + states.sum()).backward()
    assert t["s"].grad.dtype == torch.float32 and t["x"].grad.dtype == torch.bfloat16
    # the values: the float64 oracle on the numbers the tensors hold, within float32's bounds and
    # one rounding to the dtype each output is returned in
    r, g = bridge_oracle(t, ids, np.ones(y.shape), np.ones(states.shape))
    assert_close_as(torch.bfloat16, "y", y, r.y, label="ssm_ref, mixed dtypes")
    assert_close_as(torch.float32, "states", states, r.states, label="ssm_ref, mixed dtypes")
    for k in NAMES:
        assert_close_as(t[k].grad.dtype, "d_" + k, t[k].grad, getattr(g, "d_" + k), label="ssm_ref, mixed dtypes")


@pytest.mark.parametrize("used", ["y", "states"])
def test_an_unused_output_s_none_gradient_counts_as_zero(used):
    case = make_problem(9, S=2, T=4, H=2, P=2, N=3, G=1, R=3, ids="permutation")
    t, ids = tensors(case)
    y, states = ssm_torch.ssm_scan(*(t[k] for k in NAMES), ids, backend="ssm_ref")
    out, w = (y, case.g_y) if used == "y" else (states, case.g_states)
    (out * torch.from_numpy(w).double()).sum().backward()  # autograd hands the op None for the other
    args = case.args(np.float64)
    zero_y, zero_s = np.zeros_like(case.g_y), np.zeros_like(case.g_states)
    g = ssm_ref.ssm_scan_back(**args, g_y=case.g_y if used == "y" else zero_y,
                              g_states=case.g_states if used == "states" else zero_s, dtype=np.float64)
    for k in NAMES:
        np.testing.assert_allclose(t[k].grad.numpy(), getattr(g, "d_" + k), rtol=1e-13, atol=1e-15)


def test_only_some_inputs_require_grad():
    case = make_problem(10, S=1, T=3, H=2, P=2, N=3, G=1, R=1, ids="identity")
    t, ids = tensors(case, requires_grad=False)
    t["A"].requires_grad_()
    y, _ = ssm_torch.ssm_scan(*(t[k] for k in NAMES), ids, backend="ssm_ref")
    y.sum().backward()
    assert t["A"].grad is not None and all(t[k].grad is None for k in NAMES if k != "A")
    with torch.no_grad():
        y2, _ = ssm_torch.ssm_scan(*(t[k] for k in NAMES), ids, backend="ssm_ref")
    assert not y2.requires_grad and torch.equal(y2, y.detach())


def test_inputs_are_shared_zero_copy_and_never_written(monkeypatch):
    case = make_problem(11, S=2, T=4, H=2, P=3, N=4, G=1, R=2, ids="identity")
    t, ids = tensors(case, torch.float32)
    t["x"] = t["x"].detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()  # not contiguous
    before = {k: t[k].detach().clone() for k in NAMES}
    seen = {}
    real = ssm_ref.ssm_scan

    def spy(*arrays, **kw):
        seen.update(zip(NAMES, arrays, strict=False))
        return real(*arrays, **kw)

    monkeypatch.setattr(ssm_ref, "ssm_scan", spy)
    y, _ = ssm_torch.ssm_scan(*(t[k] for k in NAMES), ids, backend="ssm_ref")
    for k in NAMES:
        assert torch.equal(t[k].detach(), before[k]), f"{k} was written"
        shared = np.shares_memory(seen[k], t[k].detach().numpy())
        assert shared == (k != "x"), f"{k}: shares memory {shared}"  # x needed a contiguous copy
    assert not np.shares_memory(y.detach().numpy(), t["x"].detach().numpy())
    assert torch.equal(y, torch.from_numpy(real(*(before[k].numpy() for k in NAMES), ids.numpy()).y))


@pytest.mark.vulkan
def test_the_vulkan_backend_and_where_it_ran():
    case = make_problem(12, S=2, T=5, H=4, P=3, N=8, G=2, R=2, ids="identity")
    y, _, grads = run(case, backend="ssm_vk")
    want, gwant = oracle(case)
    vk = next(b for b in BACKENDS if b.name == "ssm_vk")
    assert_close(vk, "y", y.detach().numpy(), want.y)
    for k in NAMES:
        assert_close(vk, "d_" + k, grads[k].numpy(), getattr(gwant, "d_" + k))
    w = ssm_torch.last_where()
    assert w.op == "ssm_scan_back" and w.backend == "ssm_vk" and w.where.startswith("Vulkan"), w


@pytest.mark.parametrize("backend", ["ssm_fast", "ssm_vk"])
@pytest.mark.parametrize("form", ["log1p", None], ids=str)
def test_every_backend_computes_every_form(backend, form):
    # forward and every gradient through autograd against the float64 oracle of that form, with
    # dt far enough below zero that ggml's float32 form would be off
    case = make_problem(13, dt_range=(-14.0, 2.0))
    args = case.args()
    if form is None:
        args["dt"] = (np.abs(args["dt"]) / 8).astype(args["dt"].dtype)
    leaves_ = {k: torch.tensor(np.asarray(args[k], np.float64), dtype=torch.float32, requires_grad=True) for k in NAMES}
    ids = None if args["ids"] is None else torch.tensor(np.asarray(args["ids"]))
    y, states = ssm_torch.ssm_scan(*(leaves_[k] for k in NAMES), ids, backend=backend, dt_softplus=form)
    gy, gs = (torch.tensor(np.asarray(g, np.float64), dtype=torch.float32) for g in (case.g_y, case.g_states))
    ((y * gy).sum() + (states * gs).sum()).backward()
    w = ssm_torch.last_where()
    assert w.backend == backend and (w.where == "CPU") == (backend == "ssm_fast"), w
    o = ssm_ref.ssm_scan(**args, dtype=np.float64, dt_softplus=form)
    og = ssm_ref.ssm_scan_back(**args, g_y=case.g_y, g_states=case.g_states, dtype=np.float64, dt_softplus=form)
    be = next(b for b in BACKENDS if b.name == backend)
    assert_close(be, "y", y.detach().numpy(), o.y, label=str(form))
    assert_close(be, "states", states.detach().numpy(), o.states, label=str(form))
    for k in NAMES:
        assert_close(be, "d_" + k, leaves_[k].grad.numpy(), getattr(og, "d_" + k), label=str(form))


def test_errors_name_the_argument():
    case = make_problem(14, S=2, T=7, H=4, P=3, N=5, G=1, R=2, ids="identity")
    t, _ = tensors(case, torch.float32)
    a = [t[k] for k in NAMES]
    with pytest.raises(ValueError, match=r"^B: expected shape \(S, T, G, N\) = \(2, 7, G, 5\), got \(2, 7, 5\)$"):
        ssm_torch.ssm_scan(*a[:4], a[4][:, :, 0], a[5], backend="ssm_ref")
    with pytest.raises(TypeError, match=r"^x: expected a float array"):
        ssm_torch.ssm_scan(a[0], a[1].detach().to(torch.int64), *a[2:], backend="ssm_ref")
    with pytest.raises(TypeError, match=r"^dt: expected a torch.Tensor, got ndarray$"):
        ssm_torch.ssm_scan(a[0], a[1], a[2].detach().numpy(), *a[3:])
    with pytest.raises(ValueError, match=r"^ids: every id must be in \[0, R\) = \[0, 2\)"):
        ssm_torch.ssm_scan(*a, [0, 2], backend="ssm_ref")
    with pytest.raises(ValueError, match=r"^backend: expected one of 'ssm_fast', 'ssm_vk', 'ssm_ref' "
                       r"\(or 'fast', 'vk', 'ref'\), got 'numpy'$"):
        ssm_torch.ssm_scan(*a, backend="numpy")
    with pytest.raises(ValueError, match=r"^dt_softplus: expected 'ggml', 'log1p', None, "
                       r"True \(.*\) or False \(.*\), got 'softplus'$"):
        ssm_torch.ssm_scan(*a, backend="ssm_ref", dt_softplus="softplus")
    with pytest.raises(ValueError, match=r"^C: on meta, the other tensors on cpu$"):
        ssm_torch.ssm_scan(*a[:5], a[5].to("meta"))


def test_ids_as_a_list_and_meta_tensors():
    case = make_problem(15, S=2, T=3, H=2, P=2, N=3, G=1, R=3, ids=[2, 0])
    t, _ = tensors(case, torch.float32, requires_grad=False)
    y, states = ssm_torch.ssm_scan(*(t[k] for k in NAMES), [2, 0], backend="ssm_ref")
    want = ssm_ref.ssm_scan(*(t[k].numpy() for k in NAMES), [2, 0])
    assert torch.equal(y, torch.from_numpy(want.y)) and torch.equal(states, torch.from_numpy(want.states))
    ym, sm = ssm_torch.ssm_scan(*(t[k].to("meta") for k in NAMES), backend="ssm_ref")  # shapes only
    assert ym.device.type == "meta" and ym.shape == y.shape and sm.shape == (2, 2, 2, 3)


class Tiny(torch.nn.Module):
    """A Mamba-2-like layer: projections around the scan, A = -exp(A_log) a parameter."""

    def __init__(self, H=2, P=3, N=4, backend="ssm_ref"):
        super().__init__()
        torch.manual_seed(0)
        self.H, self.P, self.N, self.backend = H, P, N, backend
        self.A_log = torch.nn.Parameter(torch.zeros(H))
        self.inp = torch.nn.Linear(H * P, H * P + H + 2 * N)
        self.out = torch.nn.Linear(H * P, 1)

    def forward(self, u):                                     # u (S, T, H*P)
        S, T, _ = u.shape
        H, P, N = self.H, self.P, self.N
        x, dt, B, C = self.inp(u).split([H * P, H, N, N], dim=-1)
        s = u.new_zeros((S, H, P, N))
        y, states = ssm_torch.ssm_scan(s, x.reshape(S, T, H, P), dt, -torch.exp(self.A_log), B[:, :, None],
                                       C[:, :, None], backend=self.backend)
        return self.out(y.reshape(S, T, H * P)).square().mean() + states.square().mean()


def test_torch_compile_traces_the_op_without_a_graph_break():
    model, u = Tiny(), torch.randn(2, 5, 6)
    assert_compiles_as_eager(model, u)
    assert ssm_torch.last_where().op == "ssm_scan_back"


def test_torch_compile_reports_the_backends_errors_while_tracing():
    # The fake implementation runs the shared checker on the shapes: the same message as eager.
    def f(s, x, dt, A, B, C):
        return ssm_torch.ssm_scan(s, x, dt, A, B, C, backend="ssm_ref")[0]

    S, T, H, P, N = 1, 3, 4, 2, 5
    args = [torch.zeros(S, H, P, N), torch.zeros(S, T, H, P), torch.zeros(S, T, H), -torch.ones(H),
            torch.zeros(S, T, 3, N), torch.zeros(S, T, 3, N)]
    with pytest.raises(Exception, match=r"B: H % G must be 0 \(each group is shared by H/G heads\), got H = 4, G = 3"):
        torch.compile(f, fullgraph=True, backend="aot_eager")(*args)


def test_torch_compile_with_ids_as_an_input():
    # ids are fake while tracing (their values are checked by the backend when the call runs)
    case = make_problem(16, S=2, T=3, H=2, P=2, N=3, G=1, R=3, ids=[2, 0])
    t, _ = tensors(case, torch.float32, requires_grad=False)

    def f(ids, s, x, dt, A, B, C):
        return ssm_torch.ssm_scan(s, x, dt, A, B, C, ids, backend="ssm_ref")[0]

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    want = ssm_ref.ssm_scan(*(t[k].numpy() for k in NAMES), [2, 0]).y
    assert torch.equal(compiled(torch.tensor([2, 0]), *(t[k] for k in NAMES)), torch.from_numpy(want))
    with pytest.raises(ValueError, match=r"^ids: every id must be in \[0, R\) = \[0, 3\)"):
        compiled(torch.tensor([3, 0]), *(t[k] for k in NAMES))


def test_a_backward_run_on_another_thread_is_the_forward_threads_last_computation():
    # Autograd runs the backward of CUDA tensors on a device thread of its own: the thread that ran
    # the forward must still see that backward as its last computation (emulated here with a
    # backward started from a second Python thread, which autograd runs there for CPU tensors).
    import threading

    case = make_problem(3, S=1, T=4, H=2, P=2, N=4, G=1, ids="none")
    t, _ = tensors(case)
    y, states = ssm_torch.ssm_scan(None, *(t[k] for k in ("x", "dt", "A", "B", "C")), backend="ssm_ref")
    assert ssm_torch.last_where().op == "ssm_scan"
    seen = {}

    def other():
        (y.sum() + states.sum()).backward()
        seen["other"] = ssm_torch.last_where()

    th = threading.Thread(target=other)
    th.start()
    th.join()
    assert seen["other"].op == "ssm_scan_back"
    assert ssm_torch.last_where() == seen["other"]
    # a later forward of this thread is its last again
    ssm_torch.ssm_scan(None, *(t[k].detach() for k in ("x", "dt", "A", "B", "C")), backend="ssm_ref")
    assert ssm_torch.last_where().op == "ssm_scan"
    # a thread that ran neither sees nothing
    fresh = {}
    th = threading.Thread(target=lambda: fresh.setdefault("w", ssm_torch.last_where()))
    th.start()
    th.join()
    assert fresh["w"] is None
