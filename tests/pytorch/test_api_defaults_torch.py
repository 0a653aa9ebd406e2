"""ssm_torch.ssm_scan's defaults (docs/TORCH.md): ``s=None`` (zero start states in x's dtype; ids
must then be None), mamba_ssm's ``dt_softplus`` booleans (True = "log1p", False = None), each bit
for bit the call that passes the zeros (or the form) on the same backend, forward and gradients,
that call against the float64 oracle; last_where() returns ssm_ref.Where."""

import numpy as np
import pytest
from torchreq import need_torch

torch = need_torch()

from problems import make_problem  # noqa: E402
from registry import BACKENDS, assert_close  # noqa: E402

import ssm_ref  # noqa: E402
import ssm_torch  # noqa: E402

FLOATS = ("x", "dt", "A", "B", "C")


def _run(backend, s, case, **kw):
    """(y, states, the gradients of x, dt, A, B, C) of the case's own loss."""
    t = {k: torch.tensor(case.inputs[k], requires_grad=True) for k in FLOATS}
    y, states = ssm_torch.ssm_scan(s, *t.values(), backend=backend, **kw)
    loss = (y * torch.from_numpy(case.g_y)).sum() + (states * torch.from_numpy(case.g_states)).sum()
    loss.backward()
    return y.detach(), states.detach(), {k: v.grad for k, v in t.items()}


def _problem(seed=0):
    case = make_problem(np.random.default_rng(seed), S=2, T=5, H=4, P=3, N=4, G=2, ids="none",
                        dt_range=(-12.0, 2.0))
    d = case.dims
    return case, np.zeros((d["S"], d["H"], d["P"], d["N"]), np.float32)


@pytest.mark.parametrize("backend", [b.name for b in BACKENDS])
def test_s_none_is_zero_start_states(backend):
    case, zeros = _problem()
    y, states, grads = _run(backend, None, case)
    y0, states0, grads0 = _run(backend, torch.from_numpy(zeros), case)
    assert torch.equal(y, y0) and torch.equal(states, states0) and y.dtype == torch.float32
    for k in FLOATS:
        assert torch.equal(grads[k], grads0[k]), k
    inp = {k: case.inputs[k] for k in FLOATS}
    want = ssm_ref.ssm_scan(zeros, **inp, dtype=np.float64)
    want_g = ssm_ref.ssm_scan_back(zeros, **inp, g_y=case.g_y, g_states=case.g_states, dtype=np.float64)
    b = next(b for b in BACKENDS if b.name == backend)
    assert_close(b, "y", y.numpy(), want.y)
    for k in FLOATS:
        assert_close(b, "d_" + k, grads[k].numpy(), want_g["d_" + k])
    w = ssm_torch.last_where()
    assert type(w) is ssm_ref.Where and w.op == "ssm_scan_back"


@pytest.mark.parametrize("flag,form", [(True, "log1p"), (False, None)])
@pytest.mark.parametrize("backend", [b.name for b in BACKENDS])
def test_dt_softplus_booleans(backend, flag, form):
    case, zeros = _problem(1)
    got = _run(backend, torch.from_numpy(zeros), case, dt_softplus=flag)
    want = _run(backend, torch.from_numpy(zeros), case, dt_softplus=form)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for k in FLOATS:
        assert torch.equal(got[2][k], want[2][k]), k
    oracle = ssm_ref.ssm_scan(zeros, **{k: case.inputs[k] for k in FLOATS}, dtype=np.float64, dt_softplus=form)
    assert_close(next(b for b in BACKENDS if b.name == backend), "y", got[0].numpy(), oracle.y)


def test_ids_with_s_none_is_a_value_error_naming_ids():
    case, _ = _problem()
    t = [torch.from_numpy(case.inputs[k]) for k in FLOATS]
    with pytest.raises(ValueError, match=r"^ids: s is None \(zero start states, one per sequence\), so ids must"):
        ssm_torch.ssm_scan(None, *t, torch.tensor([1, 0]))
    with pytest.raises(ValueError, match=r"^dt_softplus: expected 'ggml', 'log1p', None, True"):
        ssm_torch.ssm_scan(None, *t, dt_softplus="softplus")
    assert ssm_torch.Where is ssm_ref.Where


def test_s_none_compiles_without_a_graph_break():
    case, zeros = _problem(2)
    t = [torch.from_numpy(case.inputs[k]) for k in FLOATS]
    torch._dynamo.reset()
    f = torch.compile(lambda *a: ssm_torch.ssm_scan(None, *a, backend="ssm_ref", dt_softplus=True), fullgraph=True)
    y, states = f(*t)
    y0, states0 = ssm_torch.ssm_scan(torch.from_numpy(zeros), *t, backend="ssm_ref", dt_softplus="log1p")
    assert torch.equal(y, y0) and torch.equal(states, states0)
