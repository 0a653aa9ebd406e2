"""ssm_torch.mamba3_scan (Mamba-3's scan as a PyTorch operator), the drop-ins of ssm_torch.mamba3 and
its Mamba3 layer.

The operator: gradcheck in float64 (ssm_ref) through every output, the start states included;
float32 against the float64 oracle (ssm_ref's numpy functions on the same numbers); torch.compile
with fullgraph; errors. The drop-ins and the layer: against mamba_ssm's own pure-PyTorch
references, loaded at test time from the source tree in SSM_MAMBA_REPO (tests/mamba3_peer.py;
skipped with the reason when unset), in float64 to ~1e-10 -- forward, final
states and (through autograd on both sides) gradients; gradcheck of the drop-ins; mamba_ssm's
Mamba3 layer built on its references, its state dict loaded into ours; prefill then decoding step
by step equals the full forward.
"""

import math

import numpy as np
import pytest
from torchreq import need_torch

torch = need_torch()

import ssm_ref  # noqa: E402
import ssm_torch  # noqa: E402
from ssm_torch import mamba3 as m3  # noqa: E402

F64 = torch.float64


@pytest.fixture(scope="module")
def ref():
    import mamba3_peer as mr

    try:
        return mr.load()
    except mr.Unavailable as e:
        pytest.skip(f"mamba_ssm's Mamba-3 references are not available: {e}")


def rand(g, *shape, lo=-1.0, hi=1.0):
    return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=F64)


def op_problem(seed, mimo, states, S=2, T=4, H=4, P=2, N=6, G=2, M=2, F=2, R=3):
    """The op's 15 inputs (float64 tensors) of a small random problem."""
    g = torch.Generator().manual_seed(seed)
    rk = (M,) if mimo else ()
    dt = rand(g, S, T, H, lo=0.05, hi=0.6)
    a = [rand(g, S, T, H, P), dt, -dt * rand(g, S, T, H, lo=0.1, hi=1.0), rand(g, S, T, H, lo=0, hi=1),
         rand(g, S, T, *rk, G, N), rand(g, S, T, *rk, G, N), rand(g, H, *rk, N), rand(g, H, *rk, N),
         rand(g, S, T, H, F, lo=-2, hi=2), rand(g, H, M, P) if mimo else None]
    if states:
        a += [rand(g, R, H, F, lo=0, hi=6), rand(g, R, H, P, N), rand(g, R, H, *rk, N), rand(g, R, H, *rk, P),
              torch.tensor([2, 0][:S])]
    else:
        a += [None] * 5
    return a


def oracle(args, rotation):
    np_args = [None if a is None else a.detach().numpy() for a in args]
    return ssm_ref.mamba3_scan(*np_args, rotation=rotation, dtype=np.float64)


def close(got, want, tol, what=""):
    got, want = got.detach().double(), torch.as_tensor(want).detach().double()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = float((got - want).norm()) / max(float(want.norm()), 1e-300)
    assert err <= tol, f"{what}: relative error {err:.2e} > {tol:.0e}"


# ---------------------------------------------------------------------------------------------
# The operator


@pytest.mark.parametrize(("mimo", "states"), [(False, False), (False, True), (True, False), (True, True)])
def test_op_gradcheck_float64_every_input_and_output(mimo, states):
    args = op_problem(1, mimo, states, T=3, H=2, P=2, N=4, G=1, F=1)
    *floats, ids = args
    rotation = "halved" if mimo else "interleaved"
    leaves = [None if a is None else a.clone().requires_grad_() for a in floats]

    def f(*a):
        return ssm_torch.mamba3_scan(*a, ids=ids, rotation=rotation, backend="ssm_ref")

    out = f(*leaves)
    want = oracle(args, rotation)
    for name, o, w in zip(("y", "theta", "h", "k", "v"), out, want, strict=True):
        close(o, w, 1e-14, name)
        assert o.dtype == F64
    assert torch.autograd.gradcheck(f, tuple(leaves), eps=1e-6, atol=1e-7, rtol=1e-6)
    assert ssm_torch.last_where().op == "mamba3_scan_back"


def test_op_float32_default_backend_within_float32_of_the_oracle():
    args = op_problem(2, True, True, T=6)
    *floats, ids = args
    leaves = [None if a is None else a.float().requires_grad_() for a in floats]
    out = ssm_torch.mamba3_scan(*leaves, ids=ids, rotation="halved")
    assert all(o.dtype == torch.float32 for o in out)
    for o, w in zip(out, oracle(args, "halved"), strict=True):
        close(o, w, 1e-5)
    g = torch.Generator().manual_seed(5)
    cot = [torch.randn(o.shape, generator=g, dtype=F64) for o in out]
    sum((o.double() * c).sum() for o, c in zip(out, cot, strict=True)).backward()
    want = ssm_ref.mamba3_scan_back(*[None if a is None else a.numpy() for a in args], *[c.numpy() for c in cot],
                                    rotation="halved", dtype=np.float64)
    for name, leaf in zip(ssm_ref.ops.get("mamba3_scan").float_inputs, leaves, strict=True):
        if leaf is not None:
            close(leaf.grad, want["d_" + name], 1e-4, name)


def test_op_without_states_gives_no_state_gradients_and_bfloat16_out():
    args = op_problem(3, False, False)
    x = args[0].to(torch.bfloat16).requires_grad_()
    y, theta, h, k, v = ssm_torch.mamba3_scan(x, *args[1:9], backend="ssm_ref")
    assert y.dtype == v.dtype == h.dtype == torch.bfloat16 and theta.dtype == k.dtype == F64
    (y.float().sum() + h.float().sum()).backward()
    assert x.grad.dtype == torch.bfloat16 and x.grad.shape == x.shape


def test_op_compiles_fullgraph_as_eager():
    args = op_problem(4, True, True)
    *floats, ids = (a if a is None or not a.dtype.is_floating_point else a.float() for a in args)

    def loss(x, B):
        y, theta, h, k, v = ssm_torch.mamba3_scan(x, *floats[1:4], B, *floats[5:], ids=ids, rotation="halved",
                                                  backend="ssm_ref")
        return y.square().sum() + h.sum() + k.sum() + v.sum() + theta.sum()

    x, B = floats[0], floats[4]
    explained = torch._dynamo.explain(loss)(x, B)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    xs = [x.clone().requires_grad_(), B.clone().requires_grad_()]
    xe = [x.clone().requires_grad_(), B.clone().requires_grad_()]
    lc, le = compiled(*xs), loss(*xe)
    assert torch.allclose(lc, le, rtol=1e-6)
    lc.backward()
    le.backward()
    for a, b in zip(xs, xe, strict=True):
        assert torch.allclose(a.grad, b.grad, rtol=1e-6)


def test_op_errors_name_the_argument():
    args = op_problem(5, False, True)
    *floats, ids = args
    with pytest.raises(TypeError, match=r"^x: expected a torch\.Tensor"):
        ssm_torch.mamba3_scan(floats[0].numpy(), *floats[1:], ids=ids)
    with pytest.raises(ValueError, match=r"^backend: expected one of .ssm_fast., .ssm_vk., .ssm_ref."):
        ssm_torch.mamba3_scan(*floats, ids=ids, backend="ggml")
    with pytest.raises(ValueError, match=r"^rotation: "):
        ssm_torch.mamba3_scan(*floats, ids=ids, rotation="pairs")
    with pytest.raises(ValueError, match=r"^s_v: "):
        ssm_torch.mamba3_scan(*floats[:13], None, ids=ids, backend="ssm_ref")
    with pytest.raises(ValueError, match=r"^psi: "):
        ssm_torch.mamba3_scan(*floats[:9], torch.ones(4, 1, 2, dtype=F64), *floats[10:], ids=ids, backend="ssm_ref")
    meta = [None if a is None else a.to("meta") for a in floats]
    y, theta, h, k, v = ssm_torch.mamba3_scan(*meta, ids=ids.to("meta"), backend="ssm_ref")
    assert y.device.type == "meta"
    shapes = [tuple(t.shape) for t in (y, theta, h, k, v)]
    assert shapes == [(2, 4, 4, 2), (2, 4, 2), (2, 4, 2, 6), (2, 4, 6), (2, 4, 2)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_op_cuda_tensors_with_a_host_backend_are_refused_with_what_to_do():
    floats = op_problem(6, False, False)
    with pytest.raises(ValueError, match=r"^x: expected a CPU tensor.*backend='ssm_vk'.*\.cpu\(\)"):
        ssm_torch.mamba3_scan(floats[0].cuda(), *floats[1:9])


# ---------------------------------------------------------------------------------------------
# The drop-ins against mamba_ssm's references


def siso_args(seed, b=2, L=5, G=2, H=4, P=3, N=8, F=3, full=True):
    g = torch.Generator().manual_seed(seed)
    DT = rand(g, b, H, L, lo=0.05, hi=0.6)
    return dict(Q=rand(g, b, L, G, N), K=rand(g, b, L, G, N), V=rand(g, b, L, H, P), ADT=-DT * rand(g, b, H, L, lo=0.1),
                DT=DT, Trap=rand(g, b, H, L, lo=-2, hi=2), Q_bias=rand(g, H, N), K_bias=rand(g, H, N),
                Angles=rand(g, b, L, H, F, lo=-2, hi=2), D=rand(g, H) if full else None,
                Z=rand(g, b, L, H, P, lo=-2, hi=2) if full else None)


def siso_states(seed, n, H=4, P=3, N=8, F=3):
    g = torch.Generator().manual_seed(seed)
    return (rand(g, n, H, F, lo=0, hi=6), rand(g, n, H, P, N), rand(g, n, H, N), rand(g, n, H, P))


def leaves(d):
    return {k: None if v is None else v.clone().requires_grad_() for k, v in d.items()}


def grads(outputs, inputs: dict, seed: int) -> dict:
    """Gradients of sum(w_k * output_k) (fixed random w_k) for every input that requires grad."""
    g = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=F64)).sum() for o in outputs)
    names = [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.requires_grad]
    return dict(zip(names, torch.autograd.grad(loss, [inputs[k] for k in names]), strict=True))


@pytest.mark.parametrize("case", ["plain", "states", "packed", "packed_states", "no_D_Z"])
def test_siso_combined_equals_mamba3_siso_fwd_ref(ref, case):
    import mamba3_peer as mr

    a = siso_args(10, full=case != "no_D_Z")
    cu = None
    if case.startswith("packed"):   # the two rows packed as three sequences of 3, 2 and 5 tokens
        a = {k: v if v is None or k in ("Q_bias", "K_bias", "D") else
             (v.reshape(1, -1, *v.shape[2:]) if k not in ("ADT", "DT", "Trap") else
              v.transpose(0, 1).reshape(v.shape[1], 1, -1).transpose(0, 1)) for k, v in a.items()}
        cu = torch.tensor([0, 3, 5, 10], dtype=torch.int32)
    n = 2 if cu is None else 3
    ours_in, theirs_in = leaves(a), leaves(a)
    if case.endswith("states"):
        st = siso_states(11, n)
        ours_in["Input_States"] = tuple(t.clone().requires_grad_() for t in st)
        theirs_in["Input_States"] = tuple(t.clone().requires_grad_() for t in st)
    ours = m3.mamba3_siso_combined(**ours_in, return_final_states=True, cu_seqlens=cu, backend="ssm_ref")
    with mr.float64():
        want = ref.siso_combined(**theirs_in, return_final_states=True, cu_seqlens=cu)
    for name, o, w in zip(("out", "angle", "ssm", "k", "v"), ours, want, strict=True):
        close(o, w, 1e-12, name)
    flat = {**{k: v for k, v in ours_in.items() if k != "Input_States"},
            **{f"state{i}": t for i, t in enumerate(ours_in.get("Input_States", ()))}}
    flat_t = {**{k: v for k, v in theirs_in.items() if k != "Input_States"},
              **{f"state{i}": t for i, t in enumerate(theirs_in.get("Input_States", ()))}}
    # the angle's gradient: mamba_ssm's reference reduces it mod 2 pi too (a gradient of 1)
    g_ours = grads(ours, flat, 12)
    with mr.float64():
        g_want = grads(want, flat_t, 12)
    assert g_ours.keys() == g_want.keys()
    for k in g_want:
        close(g_ours[k], g_want[k], 1e-10, f"d {k}")


def test_siso_step_equals_mamba3_siso_step_ref(ref):
    import mamba3_peer as mr

    a = siso_args(20, L=1)
    step = {k: v if v is None or k in ("Q_bias", "K_bias", "D") else v[:, 0] if k not in ("ADT", "DT", "Trap")
            else v[..., 0] for k, v in a.items()}
    states = siso_states(21, 2)
    out, new = m3.mamba3_siso_step(**step, Input_States=states, backend="ssm_ref")
    with mr.float64():
        want, fs = ref.mamba3_siso_step_ref(**a, Input_States=states)
    close(out, want[:, 0], 1e-13, "out")
    for name, o, w in zip(("angle", "ssm", "k", "v"), new, fs, strict=True):
        close(o, w, 1e-13, name)
    assert new[3] is step["V"]


def mimo_args(seed, b=2, L=6, R=2, G=1, H=4, P=3, N=8, div=2):
    g = torch.Generator().manual_seed(seed)
    DT = rand(g, b, H, L, lo=0.05, hi=0.6)
    return dict(Q=rand(g, b, L, R, G, N), K=rand(g, b, L, R, G, N), V=rand(g, b, L, H, P),
                ADT=-DT * rand(g, b, H, L, lo=0.1), DT=DT, Trap=rand(g, b, H, L, lo=-2, hi=2),
                Q_bias=rand(g, H, R, N), K_bias=rand(g, H, R, N), MIMO_V=rand(g, H, R, P), MIMO_Z=rand(g, H, R, P),
                MIMO_Out=rand(g, H, R, P), Angles=rand(g, b, L, H, N // div, lo=-2, hi=2), D=rand(g, H),
                Z=rand(g, b, L, H, P, lo=-2, hi=2))


@pytest.mark.parametrize(("div", "variant"), [(2, "gated"), (4, "gated"), (4, "ranks"), (2, "fused"), (4, "packed")])
def test_mimo_equals_mamba3_MIMO_chunk_ref(ref, div, variant):
    import mamba3_peer as mr

    a = mimo_args(30 + div, div=div)
    kw = dict(chunk_size=4, rotary_dim_divisor=div, dtype=F64)
    if variant == "ranks":
        a["MIMO_Out"] = None
    if variant == "fused":
        kw.update(fuse_pregate_headwise_rms_norm=True,
                  outproj_norm_weight=rand(torch.Generator().manual_seed(3), 4, 3), outproj_norm_eps=1e-4)
    if variant == "packed":
        a = {k: v.reshape(1, -1, *v.shape[2:]) if k in ("Q", "K", "V", "Angles", "Z") else
             v.transpose(0, 1).reshape(4, 1, -1).transpose(0, 1) if k in ("ADT", "DT", "Trap") else v
             for k, v in a.items()}
        kw["cu_seqlens"] = torch.tensor([0, 5, 12], dtype=torch.int32)
    ours_in, theirs_in = leaves(a), leaves(a)
    ours = m3.mamba3_mimo(**ours_in, **kw, backend="ssm_ref")
    with mr.float64():
        want = ref.mimo_combined(**theirs_in, **kw)
    close(ours, want, 1e-12, "out")
    g_ours = grads([ours], ours_in, 31)
    with mr.float64():
        g_want = grads([want], theirs_in, 31)
    for k in g_want:
        close(g_ours[k], g_want[k], 1e-10, f"d {k}")


@pytest.mark.parametrize("states", [False, True])
def test_mimo_states_equal_mamba3_MIMO_step_ref(ref, states):
    """mamba3_MIMO_step_ref rotates the pairs (2j, 2j+1), the MIMO kernels (j, j + N/2): the state
    axis permuted maps one onto the other, so the reference runs on permuted keys, queries, biases
    and states."""
    import mamba3_peer as mr

    N, div, R, H, P, b = 8, 4, 2, 4, 3, 2
    Fr = N // div
    a = mimo_args(40, N=N, div=div)
    perm = [i for j in range(Fr) for i in (j, j + N // 2)]
    perm = torch.tensor(perm + [i for i in range(N) if i not in perm])
    back = torch.argsort(perm)
    g = torch.Generator().manual_seed(41)
    st = (rand(g, b, H, Fr, lo=0, hi=6), rand(g, b, H, P, N), rand(g, b, R, H, N), rand(g, b, H, P)) if states else None
    out, theta, h, k, v = m3.mamba3_mimo(**a, chunk_size=4, rotary_dim_divisor=div, dtype=F64, return_state=True,
                                         Input_States=st, backend="ssm_ref")
    p = {**a}
    for name in ("Q", "K", "Q_bias", "K_bias"):
        p[name] = a[name][..., perm]
    sref = None if st is None else (st[0], st[1][..., perm], st[2][..., perm].transpose(1, 2),
                                    st[3][:, :, None] * a["MIMO_V"])
    with mr.float64():
        want, fs = ref.mamba3_MIMO_step_ref(p["Q"], p["K"], a["V"], a["ADT"], a["DT"], a["Trap"], p["Q_bias"],
                                            p["K_bias"], a["Angles"], a["MIMO_V"], a["MIMO_Out"], a["D"], a["Z"],
                                            a["MIMO_Z"], sref)
    close(out, want, 1e-12, "out")
    close(theta, torch.remainder(fs[0], 2 * math.pi), 1e-12, "angle")   # (the reference's is not reduced)
    close(h, fs[1][..., back], 1e-12, "ssm")
    close(k, fs[2][..., back].transpose(1, 2), 1e-12, "k")
    close(v[:, :, None] * a["MIMO_V"], fs[3], 1e-12, "v")


def test_dropins_gradcheck():
    a = siso_args(50, b=1, L=5, G=1, H=2, P=2, N=4, F=2)
    st = siso_states(51, 2, H=2, P=2, N=4, F=2)
    cu = torch.tensor([0, 2, 5])
    names = list(a)

    def siso(*t):
        d = dict(zip(names, t[:len(names)], strict=True))
        return m3.mamba3_siso_combined(**d, Input_States=t[len(names):], return_final_states=True, cu_seqlens=cu,
                                       backend="ssm_ref")

    inputs = tuple(v.clone().requires_grad_() for v in [*a.values(), *st])
    assert torch.autograd.gradcheck(siso, inputs, eps=1e-6, atol=1e-7, rtol=1e-6)
    b = mimo_args(52, b=1, L=3, R=2, H=2, P=2, N=4)
    mnames = list(b)

    def mimo(*t):
        return m3.mamba3_mimo(**dict(zip(mnames, t, strict=True)), chunk_size=4, rotary_dim_divisor=2, dtype=F64,
                              return_state=True, backend="ssm_ref")

    assert torch.autograd.gradcheck(mimo, tuple(v.clone().requires_grad_() for v in b.values()), eps=1e-6,
                                    atol=1e-7, rtol=1e-6)


def test_dropin_errors_name_the_argument():
    a = siso_args(60)
    with pytest.raises(ValueError, match=r"^DT: expected shape \(batch, nheads, seqlen\)"):
        m3.mamba3_siso_combined(**{**a, "DT": a["DT"].transpose(1, 2)})
    with pytest.raises(ValueError, match=r"^cu_seqlens: expected batch 1"):
        m3.mamba3_siso_combined(**a, cu_seqlens=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match=r"^Input_States: the four states"):
        m3.mamba3_siso_combined(**a, Input_States=(None,) * 4)
    b = mimo_args(61)
    with pytest.raises(ValueError, match=r"^rotary_dim_divisor: expected 2 or 4"):
        m3.mamba3_mimo(**b, chunk_size=4, rotary_dim_divisor=3, dtype=F64)


# ---------------------------------------------------------------------------------------------
# The layer


CONFIGS = [dict(is_mimo=False, is_outproj_norm=False), dict(is_mimo=False, is_outproj_norm=True),
           dict(is_mimo=True, is_outproj_norm=False), dict(is_mimo=True, is_outproj_norm=True),
           dict(is_mimo=True, is_outproj_norm=True, fuse_pregate_headwise_norm=False)]


def layer_kw(cfg):
    return dict(d_model=8, d_state=8, expand=2, headdim=4, ngroups=1, mimo_rank=2, chunk_size=4, layer_idx=0, **cfg)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(k for k, v in c.items() if v) or "siso")
def test_layer_loads_mamba_ssm_state_dict_and_equals_its_forward(ref, cfg):
    import mamba3_peer as mr

    torch.manual_seed(70)
    theirs = ref.Mamba3(**layer_kw(cfg)).double()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ours = m3.Mamba3(**layer_kw(cfg), backend="ssm_ref").double()
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    ours.load_state_dict(theirs.state_dict())
    u = torch.randn(2, 6, 8, dtype=F64)
    with mr.float64():
        want = theirs(u)
        want_packed = theirs(u[:1], cu_seqlens=torch.tensor([0, 2, 6], dtype=torch.int32))
    close(ours(u), want, 1e-12, "forward")
    close(ours(u[:1], cu_seqlens=torch.tensor([0, 2, 6], dtype=torch.int32)), want_packed, 1e-12, "packed")
    # and the other way: a state dict made by ours loads into mamba_ssm's layer, which then agrees
    with torch.no_grad():
        for p in ours.parameters():
            p.mul_(1.1)
    theirs.load_state_dict(ours.state_dict())
    with mr.float64():
        want = theirs(u)
    close(ours(u), want, 1e-12, "forward after loading ours")


class _Params:
    """mamba_ssm's InferenceParams, the two fields the layer reads."""

    def __init__(self):
        self.key_value_memory_dict, self.seqlen_offset = {}, 0


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(k for k, v in c.items() if v) or "siso")
def test_layer_prefill_then_decode_equals_the_full_forward(cfg):
    torch.manual_seed(80)
    layer = m3.Mamba3(**layer_kw(cfg), backend="ssm_ref").double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.3 * torch.randn_like(p))
    u = torch.randn(2, 7, 8, dtype=F64)
    full = layer(u)
    params = _Params()
    outs = [layer(u[:, :3], inference_params=params)]
    for t in range(3, 7):
        params.seqlen_offset = t
        outs.append(layer(u[:, t:t + 1], inference_params=params))
    close(torch.cat(outs, 1), full, 1e-12, "decoded")
    # the step itself, (batch, d_model) in and out, from a fresh cache
    cache = layer.allocate_inference_cache(2, 7)
    steps = [layer.step(u[:, t], *cache)[0] for t in range(7)]
    close(torch.stack(steps, 1), full, 1e-12, "step")


def test_layer_backward_reaches_every_parameter():
    layer = m3.Mamba3(**layer_kw(dict(is_mimo=True, is_outproj_norm=True)))
    u = torch.randn(1, 5, 8, requires_grad=True)
    layer(u, cu_seqlens=torch.tensor([0, 2, 5])).square().sum().backward()
    assert u.grad is not None and torch.isfinite(u.grad).all()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_layer_packed_prefill_then_decode_equals_each_sequence_alone():
    torch.manual_seed(90)
    layer = m3.Mamba3(**layer_kw(dict(is_mimo=True, is_outproj_norm=False)), backend="ssm_ref").double()
    a, b = torch.randn(1, 3, 8, dtype=F64), torch.randn(1, 5, 8, dtype=F64)
    nxt = torch.randn(2, 1, 8, dtype=F64)
    params = _Params()
    layer(torch.cat([a, b], 1), cu_seqlens=torch.tensor([0, 3, 8]), inference_params=params)
    params.seqlen_offset = 8
    decoded = layer(nxt, inference_params=params)
    for i, seq in enumerate((a, b)):
        alone = layer(torch.cat([seq, nxt[i:i + 1]], 1))
        close(decoded[i], alone[0, -1:], 1e-12, f"sequence {i}")


def test_layer_compiles_fullgraph_as_eager():
    torch.manual_seed(91)
    layer = m3.Mamba3(**layer_kw(dict(is_mimo=True, is_outproj_norm=True)), backend="ssm_ref")
    u = torch.randn(2, 5, 8)

    def loss(u):
        return layer(u).square().mean()

    explained = torch._dynamo.explain(loss)(u)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    lc = compiled(u)
    lc.backward()
    gc = {n: p.grad.clone() for n, p in layer.named_parameters()}
    layer.zero_grad()
    le = loss(u)
    le.backward()
    assert torch.allclose(lc, le, rtol=1e-6)
    for n, p in layer.named_parameters():
        assert torch.allclose(gc[n], p.grad, rtol=1e-5, atol=1e-7), n


@pytest.mark.parametrize(("group_size", "before"), [(None, True), (4, True), (4, False)])
def test_rmsnormgated_equals_mamba_ssm_rms_norm_ref(ref, group_size, before):
    import mamba3_peer as mr

    torch.manual_seed(92)
    norm = m3.RMSNormGated(8, eps=1e-4, group_size=group_size, norm_before_gate=before, dtype=F64)
    with torch.no_grad():
        norm.weight.add_(torch.randn(8, dtype=F64))
    x, z = torch.randn(3, 2, 8, dtype=F64), torch.randn(3, 2, 8, dtype=F64)
    with mr.float64():
        want = ref.rms_norm_ref(x, norm.weight, None, z=z, eps=1e-4, group_size=group_size, norm_before_gate=before)
        want_plain = ref.rms_norm_ref(x, norm.weight, None, eps=1e-4, group_size=group_size)
    close(norm(x, z), want, 1e-14, "gated")
    close(norm(x), want_plain, 1e-14, "plain")
    assert [n for n, _ in norm.named_parameters()] == ["weight"]
