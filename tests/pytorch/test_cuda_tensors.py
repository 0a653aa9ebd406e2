"""CUDA tensors through ssm_torch with backend="ssm_vk" on a GPU (ssm_torch/cuda.py): outputs and
gradients against the float64 oracle, with and without requires_grad, strided inputs, float16 /
bfloat16 / float64 in and out, snapshots, ids on the GPU, work queued on a side stream before the
call, outputs that later calls leave alone, and mamba_ssm's Mamba-2 drop-in on CUDA tensors.

Run where torch has a CUDA device that is the Vulkan device's GPU and shares memory with it
(benchmarks/gpu_tests.sh); skipped elsewhere, failed instead under SSM_REQUIRE_CUDA=1 (the
``cuda`` marker: tests/conftest.py). The machinery itself is tested on any machine by
tests/pytorch/test_cuda_bridge.py. Expected values come from ssm_ref in float64 on the same numbers.
"""

import numpy as np
import pytest
from torchreq import need, need_torch

torch = need_torch()

from bridgecheck import NAMES, assert_close_as, host64, leaves, oracle, rounded  # noqa: E402
from problems import make_problem  # noqa: E402

import ssm_ref  # noqa: E402
import ssm_torch  # noqa: E402
from ssm_torch import _driver, cuda, mamba  # noqa: E402
from ssm_vk import runtime as rt  # noqa: E402
from ssm_vk.runtime import external  # noqa: E402

pytestmark = [pytest.mark.vulkan, pytest.mark.cuda]

DEV = "cuda"


def loss_backward(outputs, weights):
    """Backward of sum(output * weight) over the outputs (weights: float64 arrays, given to each
    output in its own dtype: the output gradients are the weights rounded to it, ``rounded``)."""
    loss = sum((o * torch.as_tensor(w, device=o.device).to(o.dtype)).double().sum() for o, w in zip(outputs, weights,
                                                                                                   strict=True))
    loss.backward()


def ran_on_vulkan(op="ssm_scan_back"):
    w = ssm_torch.last_where()
    ctx = rt.current_context()
    assert (w.op, w.backend, w.where, w.dtype) == (op, "ssm_vk", ctx.info.where, "float32"), w


def test_the_gpu_is_the_vulkan_device():
    ctx = rt.get_context()
    assert cuda.shares_memory(ctx, "cuda") == (True, "")
    assert cuda.available("cuda") == (True, "")
    assert external.device_uuid(ctx) == _driver.the_driver().uuid(torch.cuda.current_device())


@pytest.mark.parametrize(("variant", "ids"), [("mamba2", "permutation"), ("mamba1", "duplicates"),
                                              ("mamba2", "none")])
def test_outputs_and_gradients_against_the_float64_oracle(variant, ids):
    case = make_problem(41, S=2, T=9, H=4, P=8, N=16, G=2, R=3, ids=ids, variant=variant)
    t, ids_t = leaves(case, device=DEV)
    y, states = ssm_torch.ssm_scan(*(t[k] for k in NAMES), ids_t, backend="ssm_vk")
    assert y.device == states.device == t["x"].device and y.dtype == states.dtype == torch.float32
    assert y.requires_grad and states.requires_grad
    ran_on_vulkan("ssm_scan")
    loss_backward((y, states), (case.g_y, case.g_states))
    ran_on_vulkan()
    want, gwant = oracle(t, ids_t, rounded(case.g_y, torch.float32), rounded(case.g_states, torch.float32))
    assert_close_as(torch.float32, "y", y, want.y)
    assert_close_as(torch.float32, "states", states, want.states)
    for k in NAMES:
        g = t[k].grad
        assert g.device == t[k].device and g.dtype == torch.float32 and g.shape == t[k].shape, k
        assert_close_as(torch.float32, "d_" + k, g, getattr(gwant, "d_" + k))


def test_without_requires_grad_and_with_ids_on_the_gpu():
    case = make_problem(42, S=3, T=5, H=2, P=4, N=8, G=1, R=4, ids="unused")
    t, ids = leaves(case, device=DEV, requires_grad=False)
    assert ids.device.type == "cuda"
    y, states = ssm_torch.ssm_scan(*(t[k] for k in NAMES), ids, backend="ssm_vk")
    assert not y.requires_grad and not states.requires_grad and y.is_cuda
    want, _ = oracle(t, ids, case.g_y, case.g_states)
    assert_close_as(torch.float32, "y", y, want.y)
    assert_close_as(torch.float32, "states", states, want.states)
    y0, states0 = ssm_torch.ssm_scan(None, t["x"], t["dt"], t["A"], t["B"], t["C"], backend="ssm_vk")
    zero = {**t, "s": torch.zeros_like(states0)}
    want0, _ = oracle(zero, None, case.g_y, case.g_states)
    assert_close_as(torch.float32, "y", y0, want0.y, label="s=None")
    assert_close_as(torch.float32, "states", states0, want0.states, label="s=None")


def test_strided_inputs():
    case = make_problem(43, S=2, T=6, H=4, P=4, N=8, G=2, R=2, ids="permutation")
    t, ids = leaves(case, device=DEV, requires_grad=False)
    odd = {"x": t["x"].transpose(0, 1).contiguous().transpose(0, 1),
           "B": torch.stack([t["B"], -t["B"]], dim=-1)[..., 0],
           "C": t["C"].permute(3, 2, 1, 0).contiguous().permute(3, 2, 1, 0),
           "s": t["s"].permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2)}
    leaves_ = {k: v.requires_grad_() for k, v in {**t, **odd}.items()}
    assert not any(leaves_[k].is_contiguous() for k in odd)
    y, states = ssm_torch.ssm_scan(*(leaves_[k] for k in NAMES), ids, backend="ssm_vk")
    loss_backward((y, states), (case.g_y, case.g_states))
    want, gwant = oracle(t, ids, rounded(case.g_y, torch.float32), rounded(case.g_states, torch.float32))
    assert_close_as(torch.float32, "y", y, want.y)
    assert_close_as(torch.float32, "states", states, want.states)
    for k in NAMES:
        assert_close_as(torch.float32, "d_" + k, leaves_[k].grad, getattr(gwant, "d_" + k))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtypes_in_and_out(dtype):
    # computed in float32 from the inputs as given, returned in their dtypes (as the CPU path);
    # a float32 cache beside activations of another dtype
    case = make_problem(44, S=2, T=7, H=4, P=4, N=8, G=1, R=2, ids="identity")
    t, ids = leaves(case, dtype, device=DEV, dtypes={"s": torch.float32})
    y, states = ssm_torch.ssm_scan(*(t[k] for k in NAMES), ids, backend="ssm_vk")
    assert y.dtype == dtype and states.dtype == torch.float32 and y.is_cuda
    gy = rounded(case.g_y, dtype)   # the output gradient as y's dtype carries it
    loss_backward((y, states), (gy, case.g_states))
    want, gwant = oracle(t, ids, gy, rounded(case.g_states, torch.float32))
    assert_close_as(dtype, "y", y, want.y)
    assert_close_as(torch.float32, "states", states, want.states)
    for k in NAMES:
        assert t[k].grad.dtype == t[k].dtype, k
        assert_close_as(t[k].dtype, "d_" + k, t[k].grad, getattr(gwant, "d_" + k))


def test_snapshots_and_their_gradient():
    case = make_problem(45, S=2, T=5, H=4, P=4, N=8, G=2, R=3, ids="permutation")
    K = 7   # slots 0..4 after tokens, slot 5 the start state, slot 6 NaN
    t, ids = leaves(case, device=DEV)
    y, states, snaps = ssm_torch.ssm_scan(*(t[k] for k in NAMES), ids, backend="ssm_vk", snapshots=K)
    assert snaps.shape == (K, 2, 4, 4, 8) and snaps.is_cuda
    assert torch.isnan(snaps[6]).all() and not torch.isnan(snaps[:6]).any()
    gy, gs = rounded(case.g_y, torch.float32), rounded(case.g_states, torch.float32)
    g_snap = rounded(np.random.default_rng(3).uniform(-1, 1, tuple(snaps.shape)), torch.float32)
    held = g_snap.copy()
    held[6:] = 0.0   # slot 6 holds NaN, which depends on nothing (nan_to_num's gradient there is 0)
    loss = ((y.double() * torch.as_tensor(gy, device=DEV)).sum()
            + (states.double() * torch.as_tensor(gs, device=DEV)).sum()
            + (torch.nan_to_num(snaps.double()) * torch.as_tensor(g_snap, device=DEV)).sum())
    loss.backward()
    want, gwant = oracle(t, ids, gy, gs, K=K, g_snapshots=held)
    assert_close_as(torch.float32, "y", y, want.y)
    for k in range(K):
        assert_close_as(torch.float32, "states", snaps[k], want.snapshots[k], label=f"slot {k}")
    for k in NAMES:
        assert_close_as(torch.float32, "d_" + k, t[k].grad, getattr(gwant, "d_" + k))


def test_work_queued_on_a_side_stream_before_the_call_is_what_the_call_reads():
    # x is written on a side stream behind a long matrix product; the call, made on that stream
    # (its current stream), must read the written x, not what the arena held from the call before
    case = make_problem(46, S=2, T=8, H=4, P=8, N=16, G=1, R=2, ids="identity")
    t, ids = leaves(case, device=DEV, requires_grad=False)
    before = {**t, "x": -t["x"]}
    ssm_torch.ssm_scan(*(before[k] for k in NAMES), ids, backend="ssm_vk")   # the arena now holds -x
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        a = torch.randn(8192, 8192, device=DEV)
        for _ in range(4):
            a = torch.tanh(a @ a)      # tens of milliseconds of queued work, finite values
        x = t["x"] + 0.0 * a[0, 0]     # x exists only once the products are done
        y, states = ssm_torch.ssm_scan(t["s"], x, t["dt"], t["A"], t["B"], t["C"], ids, backend="ssm_vk")
        y_host = y.cpu()
    torch.cuda.current_stream().wait_stream(side)
    want, _ = oracle(t, ids, case.g_y, case.g_states)
    assert_close_as(torch.float32, "y", y_host, want.y)
    assert_close_as(torch.float32, "states", states, want.states)


def test_outputs_are_tensors_of_their_own():
    c1 = make_problem(47, S=1, T=4, H=2, P=4, N=8, G=1, R=1, ids="identity")
    c2 = make_problem(48, S=2, T=12, H=8, P=64, N=64, G=2, R=2, ids="identity")   # bigger slots (s: 256 KiB)
    t1, _ = leaves(c1, device=DEV, requires_grad=False)
    t2, _ = leaves(c2, device=DEV, requires_grad=False)
    y1, states1 = ssm_torch.ssm_scan(*(t1[k] for k in NAMES), backend="ssm_vk")
    kept = (y1.clone(), states1.clone())
    ssm_torch.ssm_scan(*(t2[k] for k in NAMES), backend="ssm_vk")
    cuda.release_memory()
    assert torch.equal(y1, kept[0]) and torch.equal(states1, kept[1])
    y2, _ = ssm_torch.ssm_scan(*(t1[k] for k in NAMES), backend="ssm_vk")   # the arena made again
    assert torch.equal(y2, y1)


def test_a_tensor_on_the_cpu_beside_cuda_tensors_is_refused():
    case = make_problem(49, S=1, T=2, H=2, P=2, N=4, G=1, R=1, ids="identity")
    t, _ = leaves(case, device=DEV, requires_grad=False)
    with pytest.raises(ValueError, match=r"^dt: on cpu, the other tensors on cuda:\d$"):
        ssm_torch.ssm_scan(t["s"], t["x"], t["dt"].cpu(), t["A"], t["B"], t["C"], backend="ssm_vk")
    with pytest.raises(ValueError, match=r"^s: expected a CPU tensor .*\(CUDA tensors: with backend='ssm_vk'\)"):
        ssm_torch.ssm_scan(*(t[k] for k in NAMES))


# ---------------------------------------------------------------------------------------------
# mamba_ssm's Mamba-2 drop-in on CUDA tensors

def m2_oracle(x, dt, A, B, C, D, z, dt_bias, s0, limit):
    """mamba_chunk_scan_combined's documented semantics in float64 around ssm_ref: the step
    clamp(softplus(dt + dt_bias), *limit), the scan from s0, out = (y + D x) * silu(z)."""
    x, dt, A, B, C, D, z, dt_bias, s0 = (host64(v) for v in (x, dt, A, B, C, D, z, dt_bias, s0))
    v = dt + dt_bias
    step = np.clip(np.where(v > 20.0, v, np.log1p(np.exp(np.minimum(v, 20.0)))), *limit)
    r = ssm_ref.ssm_scan(s0, x, step, A, B, C, dt_softplus=None, dtype=np.float64)
    out = (r.y + x * D[None, None]) * (z / (1.0 + np.exp(-z)))
    return out, r.states


def rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))


def test_mamba_chunk_scan_combined_on_cuda_tensors():
    g = torch.Generator().manual_seed(50)

    def r(*shape, lo=-1.0, hi=1.0):
        return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float64)

    batch, L, H, P, N, G = 2, 13, 4, 8, 16, 2
    base = dict(x=r(batch, L, H, P), dt=r(batch, L, H, lo=-2.0, hi=1.0), A=-r(H, lo=0.2, hi=1.5),
                B=r(batch, L, G, N), C=r(batch, L, G, N), D=r(H, P), z=r(batch, L, H, P, lo=-2, hi=2),
                dt_bias=r(H, lo=-0.5, hi=0.5), initial_states=r(batch, H, P, N, lo=-0.5, hi=0.5))
    limit = (0.05, 0.8)
    ours = {k: v.to(device=DEV, dtype=torch.float32).requires_grad_() for k, v in base.items()}
    out, final = mamba.mamba_chunk_scan_combined(**ours, chunk_size=64, dt_softplus=True, dt_limit=limit,
                                                 return_final_states=True, backend="ssm_vk")
    assert out.is_cuda and final.is_cuda and out.dtype == torch.float32
    ran_on_vulkan("ssm_scan")
    w_out = torch.randn(out.shape, generator=g, dtype=torch.float64)
    w_final = torch.randn(final.shape, generator=g, dtype=torch.float64)
    ((out.double() * w_out.to(DEV)).sum() + (final.double() * w_final.to(DEV)).sum()).backward()
    ran_on_vulkan()
    numbers = {k: v.detach() for k, v in ours.items()}   # the float32 numbers the GPU computed from
    want_out, want_final = m2_oracle(numbers["x"], numbers["dt"], numbers["A"], numbers["B"], numbers["C"],
                                     numbers["D"], numbers["z"], numbers["dt_bias"], numbers["initial_states"], limit)
    # the float32 tolerances of test_mamba.py's low-precision test: 3e-6 forward, 30x for gradients
    assert rel(host64(out), want_out) <= 3e-6
    assert rel(host64(final), want_final) <= 3e-6
    # gradients: the same function on the CPU in float64 on ssm_ref (whose gradients test_mamba.py
    # holds to mamba_ssm's references to 1e-9), from the same float32 numbers
    cpu = {k: v.cpu().double().requires_grad_() for k, v in numbers.items()}
    o64, f64 = mamba.mamba_chunk_scan_combined(**cpu, chunk_size=64, dt_softplus=True, dt_limit=limit,
                                               return_final_states=True, backend="ssm_ref")
    assert rel(o64.detach().numpy(), want_out) <= 1e-12
    ((o64 * w_out).sum() + (f64 * w_final).sum()).backward()
    for k in ours:
        assert ours[k].grad.is_cuda, k
        assert rel(host64(ours[k].grad), cpu[k].grad.numpy()) <= 9e-5, k


def test_mamba_chunk_scan_combined_with_seq_idx_on_cuda_tensors():
    # packed sequences: the runs become sequences of one scan, gathered with index tensors on the
    # CPU; the result of each run is the oracle's scan of that run alone
    g = torch.Generator().manual_seed(51)
    batch, L, H, P, N = 2, 10, 2, 4, 8
    x = torch.rand(batch, L, H, P, generator=g, dtype=torch.float64) - 0.5
    dt = 0.05 + 0.5 * torch.rand(batch, L, H, generator=g, dtype=torch.float64)
    A = -(0.2 + torch.rand(H, generator=g, dtype=torch.float64))
    B = torch.rand(batch, L, 1, N, generator=g, dtype=torch.float64) - 0.5
    C = torch.rand(batch, L, 1, N, generator=g, dtype=torch.float64) - 0.5
    seq_idx = torch.tensor([[0] * 4 + [1] * 6, [0] * 7 + [1] * 3], dtype=torch.int32)
    args = {k: v.to(DEV, torch.float32) for k, v in dict(x=x, dt=dt, A=A, B=B, C=C).items()}
    out = mamba.mamba_chunk_scan_combined(**args, chunk_size=8, seq_idx=seq_idx.to(DEV), backend="ssm_vk")
    assert out.is_cuda
    ran_on_vulkan("ssm_scan")
    n = {k: host64(v) for k, v in args.items()}
    want = np.empty((batch, L, H, P))
    for b, cut in ((0, 4), (1, 7)):
        for t0, t1 in ((0, cut), (cut, L)):
            r = ssm_ref.ssm_scan(np.zeros((1, H, P, N)), n["x"][b:b + 1, t0:t1], n["dt"][b:b + 1, t0:t1], n["A"],
                                 n["B"][b:b + 1, t0:t1], n["C"][b:b + 1, t0:t1], dt_softplus=None, dtype=np.float64)
            want[b, t0:t1] = r.y[0]
    assert rel(host64(out), want) <= 3e-6


@pytest.mark.parametrize("model_name", ["mamba1", "mamba2"])
def test_hf_patch_on_a_cuda_model(model_name):
    # transformers' MambaForCausalLM / Mamba2ForCausalLM on the GPU, patched with backend="ssm_vk":
    # logits and every parameter's gradient equal the unpatched model's (transformers' own torch
    # path on the same GPU) within test_hf.py's float32 tolerances
    need("transformers", "pip install transformers")
    import test_hf

    from ssm_torch import _common, hf
    torch.manual_seed(0)
    model = test_hf.randomize(getattr(test_hf, model_name)(), 1).train().to(DEV)
    ids = torch.randint(0, test_hf.VOCAB, (2, 11), generator=torch.Generator().manual_seed(2)).to(DEV)
    want_logits, want = test_hf.loss_and_grads(model, ids)
    hf.patch(model, backend="ssm_vk")
    _common._LAST.value = None
    got_logits, got = test_hf.loss_and_grads(model, ids)
    ran_on_vulkan()
    assert got_logits.is_cuda
    assert test_hf.rel(got_logits, want_logits) < 1e-5
    assert got.keys() == want.keys() and len(got) > 10
    for name in want:
        assert got[name].is_cuda, name
        assert test_hf.rel(got[name], want[name]) < 1e-4, name
    hf.unpatch(model)


@pytest.mark.parametrize("shape", [dict(S=2, T=70, H=4, P=8, N=16, G=2, F=4, R=3, ids="permutation"),
                                   dict(S=2, T=9, H=2, P=4, N=8, G=1, M=2, F=2, states=False)])
def test_mamba3_outputs_and_gradients_against_the_float64_oracle(shape):
    # Mamba-3's scan on CUDA tensors (SISO with start states and ids, 70 tokens: the chunked kernels
    # on a GPU; MIMO without states): outputs and the gradients of every float input, on the GPU
    from ssm_ref.ops import MAMBA3
    from ssm_ref.testing import mamba3_cases
    from ssm_ref.tolerance import MAMBA3_F32_TOL, compare, scaled

    case = mamba3_cases.make_case(44, **shape)
    ins = {n: None if case.inputs[n] is None else torch.tensor(case.inputs[n], device=DEV).requires_grad_()
           for n in MAMBA3.float_inputs}
    ids = None if case.inputs["ids"] is None else torch.tensor(case.inputs["ids"], device=DEV)
    rot = case.keywords["rotation"]
    outs = ssm_torch.mamba3_scan(*ins.values(), ids, rotation=rot, backend="ssm_vk")
    ran_on_vulkan("mamba3_scan")
    assert all(o.is_cuda and o.dtype == torch.float32 and o.requires_grad for o in outs)
    loss = sum((o.double() * torch.tensor(case.cotangents["g_" + n], device=DEV).double()).sum()
               for o, n in zip(outs, MAMBA3.output_names, strict=True))
    loss.backward()
    ran_on_vulkan("mamba3_scan_back")
    host = [None if v is None else v.detach().double().cpu().numpy() for v in ins.values()]
    host_ids = None if ids is None else ids.cpu().numpy()
    cots = {k: np.asarray(v, np.float64) for k, v in case.cotangents.items()}
    want = ssm_ref.mamba3_scan(*host, host_ids, rotation=rot, dtype=np.float64)
    gwant = ssm_ref.mamba3_scan_back(*host, host_ids, **cots, rotation=rot, dtype=np.float64)
    tol = scaled(MAMBA3_F32_TOL, case.dims["T"])
    for o, n in zip(outs, MAMBA3.output_names, strict=True):
        c = compare(n, getattr(want, n), o.detach().double().cpu().numpy(), tol[n])
        assert c.ok, c
    for n, t in ins.items():
        if t is None:
            continue
        assert t.grad is not None and t.grad.is_cuda and t.grad.shape == t.shape, n
        c = compare("d_" + n, gwant["d_" + n], t.grad.double().cpu().numpy(), tol["d_" + n])
        assert c.ok, c


@pytest.mark.parametrize("is_mimo", [False, True])
def test_the_mamba3_layer_on_the_gpu_against_float64_on_the_cpu(is_mimo):
    # ssm_torch.mamba3.Mamba3 on CUDA (its glue on torch's CUDA kernels, the scan on ssm_vk) against
    # the same weights in float64 on the CPU (ssm_ref): output and every parameter's gradient
    import copy

    from ssm_torch import mamba3 as m3

    torch.manual_seed(45)
    kw = dict(d_model=32, d_state=16, expand=2, headdim=16, ngroups=1, is_mimo=is_mimo, mimo_rank=2,
              is_outproj_norm=is_mimo)
    cpu = m3.Mamba3(**kw, backend="ssm_ref").double()
    gpu = copy.deepcopy(cpu).float().to(DEV)
    gpu.backend = "ssm_vk"
    u = torch.randn(2, 70, 32, dtype=torch.float64)
    w = torch.randn(2, 70, 32, dtype=torch.float64)
    want = cpu(u)
    (want * w).sum().backward()
    got = gpu(u.float().to(DEV))
    (got.double() * w.to(DEV)).sum().backward()
    ran_on_vulkan("mamba3_scan_back")
    err = float((got.double().cpu() - want).norm() / want.norm())
    assert err < 2e-5, err   # (float32 on both sides of the scan: about 1e-6 on lavapipe)
    for (name, p), q in zip(cpu.named_parameters(), gpu.parameters(), strict=True):
        assert q.grad is not None and q.grad.is_cuda, name
        e = float((q.grad.double().cpu() - p.grad).norm() / max(float(p.grad.norm()), 1e-30))
        assert e < 1e-4, (name, e)   # (about 3e-6 on lavapipe)
