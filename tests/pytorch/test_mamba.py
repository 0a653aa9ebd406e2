"""ssm_torch.mamba's drop-ins against mamba_ssm's own pure-PyTorch references, loaded at test time
from its sdist (tests/pytorch/mamba_reference.py): selective_scan_ref (Mamba-1),
ssd_minimal_discrete (Mamba-2, the SSD paper's chunked listing) and selective_state_update_ref
(decoding). Problems are drawn from seeds: every option of each signature, on and off. Forward
and every gradient (a random linear loss on all outputs, both sides through autograd).

Where a reference lacks a feature of the kernels (ssd_minimal_discrete has no dt_bias, softplus,
dt_limit, D, z, seq_idx; selective_state_update_ref no state_batch_indices), the test builds it
around the reference from mamba_ssm's documented semantics: the step clamp(softplus(dt + dt_bias),
*dt_limit), out = (y + D x) * silu(z), the state restarting at each change of seq_idx.

float64 (ssm_ref, float64 inputs) is compared with the float64 reference to 1e-9 relative;
float32 and bfloat16 runs with the float64 reference at their precision.
"""

import itertools
import zlib

import numpy as np
import pytest
from torchreq import need_torch

torch = need_torch()

import torch.nn.functional as F  # noqa: E402, N812

import ssm_torch  # noqa: E402
from ssm_torch import mamba  # noqa: E402


def rel(got, want) -> float:
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / max(float(want.norm()), 1e-300))


def check(got: dict, want: dict, tol: float, what: str):
    assert got.keys() == want.keys(), what
    for k in want:
        assert got[k].shape == want[k].shape, f"{what}: {k} shape {tuple(got[k].shape)} != {tuple(want[k].shape)}"
        r = rel(got[k], want[k])
        assert r <= tol, f"{what}: {k} relative error {r:.2e} > {tol:.0e}"


def grads_of(outputs, inputs: dict, seed: int) -> dict:
    """Gradients of sum(w_k * output_k) with fixed random w_k, for every input that requires grad."""
    gen = torch.Generator().manual_seed(seed)
    loss = sum((o.double() * torch.randn(o.shape, generator=gen, dtype=torch.float64)).sum() for o in outputs)
    names = [k for k, v in inputs.items() if v is not None and v.requires_grad]
    gs = torch.autograd.grad(loss, [inputs[k] for k in names])
    return dict(zip(names, gs, strict=True))


def leaves(d: dict, dtype) -> dict:
    return {k: None if v is None else v.detach().to(dtype).requires_grad_(v.dtype.is_floating_point)
            for k, v in d.items()}


# ---------------------------------------------------------------------------------------------
# Mamba-1: selective_scan_fn vs selective_scan_ref

M1_OPTIONS = list(itertools.product(["variable", "grouped", "constant_B", "constant_C"], [False, True], [False, True]))


def m1_problem(seed, layout, full, softplus):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, lo=-1.0, hi=1.0):
        return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float64)

    b, D, L, N = 2, 6, 7, 4
    G = 3 if layout == "grouped" else 1
    BC = {"variable": (b, N, L), "grouped": (b, G, N, L)}
    Bs = (D, N) if layout == "constant_B" else BC.get(layout, (b, N, L))
    Cs = (D, N) if layout == "constant_C" else BC.get(layout, (b, N, L))
    p = dict(u=r(b, D, L), delta=r(b, D, L, lo=-1.5, hi=1.0) if softplus else r(b, D, L, lo=0.05, hi=1.0),
             A=-r(D, N, lo=0.2, hi=1.5), B=r(*Bs), C=r(*Cs), D=r(D) if full else None,
             z=r(b, D, L, lo=-2, hi=2) if full else None, delta_bias=r(D, lo=-0.5, hi=0.5) if full else None)
    return p


@pytest.mark.parametrize(("layout", "full", "softplus"), M1_OPTIONS)
def test_selective_scan_fn_matches_selective_scan_ref_in_float64(mamba_ref, layout, full, softplus):
    import mamba_reference

    seed = zlib.crc32(repr((layout, full, softplus)).encode())
    base = m1_problem(seed, layout, full, softplus)
    ours, theirs = leaves(base, torch.float64), leaves(base, torch.float64)
    out, last = mamba.selective_scan_fn(**ours, delta_softplus=softplus, return_last_state=True, backend="ssm_ref")
    with mamba_reference.float64():
        r_out, r_last = mamba_ref.selective_scan_ref(**theirs, delta_softplus=softplus, return_last_state=True)
    assert out.dtype == r_out.dtype == torch.float64
    check({"out": out, "last_state": last}, {"out": r_out, "last_state": r_last}, 1e-12, "forward")
    check(grads_of([out, last], ours, seed), grads_of([r_out, r_last], theirs, seed), 1e-10, "gradients")


@pytest.mark.parametrize(("dtype", "lo", "hi", "tol"), [(torch.float64, -30.0, -18.0, 1e-12),
                                                     (torch.float32, -15.0, -10.0, 3e-6)])
def test_the_softplus_is_the_accurate_one_far_below_zero(mamba_ref, dtype, lo, hi, tol):
    # F.softplus (log1p) as mamba_ssm: ggml's log(1 + exp) would be off by 1e-16/exp(dt) in float64
    # (up to 1e-3 here) and by up to 17% in float32 at -15.
    import mamba_reference

    base = m1_problem(17, "variable", False, True)
    base["delta"] = lo + (hi - lo) * torch.rand(base["delta"].shape, generator=torch.Generator().manual_seed(3),
                                                dtype=torch.float64)
    base["u"] = base["u"] * 1e4   # a state of order one from steps of order exp(dt)
    ours = {k: None if v is None else v.to(dtype) for k, v in base.items()}
    out, last = mamba.selective_scan_fn(**ours, delta_softplus=True, return_last_state=True, backend="ssm_ref")
    with mamba_reference.float64():
        r_out, r_last = mamba_ref.selective_scan_ref(**{k: None if v is None else v.double() for k, v in ours.items()},
                                                     delta_softplus=True, return_last_state=True)
    check({"out": out, "last": last}, {"out": r_out, "last": r_last}, tol, "forward")


def ran_on(backend):
    """Assert the last call ran on ``backend`` (None: the drop-ins' default, ssm_fast)."""
    w = ssm_torch.last_where()
    if backend is None:
        assert w.backend == "ssm_fast" and w.where == "CPU", w
    else:
        assert w.backend == backend and w.where.startswith("Vulkan"), w


@pytest.mark.parametrize("backend", [None, "ssm_vk"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["variable", "grouped"])
def test_selective_scan_fn_in_low_precision_against_the_float64_reference(mamba_ref, layout, dtype, backend):
    import mamba_reference

    base = m1_problem(5, layout, True, True)
    ours = leaves(base, dtype)
    theirs = leaves({k: None if v is None else v.to(dtype) for k, v in base.items()}, torch.float64)
    out = mamba.selective_scan_fn(**ours, delta_softplus=True, backend=backend)
    ran_on(backend)
    assert out.dtype == dtype
    with mamba_reference.float64():
        r_out = mamba_ref.selective_scan_ref(**theirs, delta_softplus=True)
    tol = 3e-6 if dtype == torch.float32 else 1e-2    # float32 work; bfloat16: the output's rounding
    check({"out": out}, {"out": r_out}, tol, "forward")
    check(grads_of([out], ours, 1), grads_of([r_out], theirs, 1), 30 * tol, "gradients")
    assert ssm_torch.last_where().dtype == "float32"


# ---------------------------------------------------------------------------------------------
# Mamba-2: mamba_chunk_scan_combined vs ssd_minimal_discrete


def runs(seq_idx_row):
    """[(t0, t1, value)] of the runs of equal values."""
    vals = seq_idx_row.tolist()
    out, t0 = [], 0
    for t in range(1, len(vals) + 1):
        if t == len(vals) or vals[t] != vals[t0]:
            out.append((t0, t, vals[t0]))
            t0 = t
    return out


def m2_reference(ref, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                 dt_softplus=False, dt_limit=(0.0, float("inf")), block_len=4):
    """mamba_chunk_scan_combined's semantics built on ssd_minimal_discrete: returns out, the final
    states and the state each run of seq_idx ends with."""
    batch, L, H, _ = x.shape
    G = B.shape[2]
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = F.softplus(dt)
    dt = dt.clamp(min=dt_limit[0], max=dt_limit[1])
    Bh, Ch = B.repeat_interleave(H // G, dim=2), C.repeat_interleave(H // G, dim=2)
    ys, finals, run_states = [], [], []
    for b in range(batch):
        pieces = runs(seq_idx[b]) if seq_idx is not None else [(0, L, 0)]
        row = []
        for k, (t0, t1, v) in enumerate(pieces):
            n = t1 - t0
            pad = (-n) % block_len           # zero steps at the end: the state passes unchanged

            def cut(t, b=b, t0=t0, t1=t1, pad=pad):
                t = t[b:b + 1, t0:t1]
                return torch.cat([t, t.new_zeros((1, pad, *t.shape[2:]))], dim=1)

            init = None
            if initial_states is not None and k == 0 and v == 0:
                init = initial_states[b:b + 1, None]
            Y, fin = ref.ssd_minimal_discrete(cut(x * dt[..., None]), cut(A * dt), cut(Bh), cut(Ch), block_len,
                                              initial_states=init)
            row.append(Y[:, :n])
            run_states.append(fin)
        ys.append(torch.cat(row, dim=1))
        finals.append(run_states[-1])
    out = torch.cat(ys)
    if D is not None:
        out = out + x * (D[:, None] if D.dim() == 1 else D)
    if z is not None:
        out = out * F.silu(z)
    return out, torch.cat(finals), torch.cat(run_states)


M2_OPTIONS = [
    dict(),
    dict(D="h", z=True, dt_bias=True, softplus=True),
    dict(D="hp", softplus=True, limit=(0.05, 0.6), initial=True),
    dict(G=2, z=True, initial=True, seq_idx=True),
    dict(G=4, D="h", dt_bias=True, softplus=True, initial=True, seq_idx=True, limit=(0.0, 0.8)),
    dict(batch=1, softplus=True, dt_bias=True, initial=True, varlen=True),
    dict(batch=1, G=2, D="hp", z=True, softplus=True, varlen=True, limit=(0.1, 5.0)),
]


def m2_problem(seed, opts):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, lo=-1.0, hi=1.0):
        return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float64)

    batch, L, H, P, N = opts.get("batch", 2), 11, 4, 3, 5
    G = opts.get("G", 1)
    softplus = opts.get("softplus", False)
    p = dict(x=r(batch, L, H, P), dt=r(batch, L, H, lo=-2.0, hi=1.0) if softplus else r(batch, L, H, lo=0.02, hi=0.9),
             A=-r(H, lo=0.2, hi=1.5), B=r(batch, L, G, N), C=r(batch, L, G, N))
    p["D"] = {"h": r(H), "hp": r(H, P)}.get(opts.get("D"))
    p["z"] = r(batch, L, H, P, lo=-2, hi=2) if opts.get("z") else None
    p["dt_bias"] = r(H, lo=-0.5, hi=0.5) if opts.get("dt_bias") else None
    p["initial_states"] = r(batch, H, P, N, lo=-0.5, hi=0.5) if opts.get("initial") else None
    seq_idx = cu = None
    if opts.get("seq_idx"):   # rows cut at drawn places; the second row starts at index 1 (no initial state)
        cuts = sorted(torch.randperm(L - 1, generator=g)[:2].add(1).tolist())
        seq_idx = torch.zeros(batch, L, dtype=torch.int32)
        for c in cuts:
            seq_idx[:, c:] += 1
        seq_idx[1:] += 1
    if opts.get("varlen"):
        lens = [3, 1, 5, 2]
        cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
        seq_idx = mamba.seq_idx_from_cu_seqlens(cu)
    return p, seq_idx, cu


@pytest.mark.parametrize("case", range(len(M2_OPTIONS)))
def test_mamba_chunk_scan_combined_matches_ssd_minimal_discrete_in_float64(mamba_ref, case):
    opts = M2_OPTIONS[case]
    base, seq_idx, cu = m2_problem(100 + case, opts)
    ours, theirs = leaves(base, torch.float64), leaves(base, torch.float64)
    limit = opts.get("limit", (0.0, float("inf")))
    varlen = bool(opts.get("varlen"))
    res = mamba.mamba_chunk_scan_combined(**ours, chunk_size=4, seq_idx=seq_idx, cu_seqlens=cu,
                                          dt_softplus=opts.get("softplus", False), dt_limit=limit,
                                          return_final_states=True, return_varlen_states=varlen, backend="ssm_ref")
    r_out, r_final, r_runs = m2_reference(mamba_ref, **theirs, seq_idx=seq_idx, dt_softplus=opts.get("softplus", False),
                                          dt_limit=limit)
    got = {"out": res[0], "final_states": res[1]}
    want = {"out": r_out, "final_states": r_final}
    if varlen:
        got["varlen_states"], want["varlen_states"] = res[2], r_runs
    check(got, want, 1e-11, f"{opts} forward")
    check(grads_of(list(got.values()), ours, case), grads_of(list(want.values()), theirs, case), 1e-9,
          f"{opts} gradients")


@pytest.mark.parametrize("backend", [None, "ssm_vk"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mamba_chunk_scan_combined_in_low_precision(mamba_ref, dtype, backend):
    opts = M2_OPTIONS[4]
    base, seq_idx, _ = m2_problem(7, opts)
    ours = leaves(base, dtype)
    theirs = leaves({k: None if v is None else v.to(dtype) for k, v in base.items()}, torch.float64)
    out, final = mamba.mamba_chunk_scan_combined(**ours, chunk_size=64, seq_idx=seq_idx, dt_softplus=True,
                                                 dt_limit=opts["limit"], return_final_states=True, backend=backend)
    ran_on(backend)
    assert out.dtype == dtype and final.dtype == torch.float32
    r_out, r_final, _ = m2_reference(mamba_ref, **theirs, seq_idx=seq_idx, dt_softplus=True, dt_limit=opts["limit"])
    tol = 3e-6 if dtype == torch.float32 else 1e-2
    check({"out": out, "final": final}, {"out": r_out, "final": r_final}, tol, "forward")
    check(grads_of([out, final], ours, 2), grads_of([r_out, r_final], theirs, 2), 30 * tol, "gradients")


def test_chunk_size_does_not_change_the_result():
    base, seq_idx, _ = m2_problem(8, M2_OPTIONS[3])
    outs = [mamba.mamba_chunk_scan_combined(**base, chunk_size=c, seq_idx=seq_idx, return_final_states=True)
            for c in (1, 4, 64, 256)]
    for o in outs[1:]:
        assert torch.equal(o[0], outs[0][0]) and torch.equal(o[1], outs[0][1])


def test_the_default_dt_limit_clamps_a_negative_step_to_zero():
    # As mamba_ssm's kernels (clamp to [0, inf) always): without softplus a negative dt is a zero
    # step -- that token leaves the state as it was and adds nothing -- and gets no gradient.
    base, _, _ = m2_problem(9, {})
    dt = base["dt"].clone()
    dt[:, 4] = -0.3
    dt.requires_grad_()
    out, final = mamba.mamba_chunk_scan_combined(**{**base, "dt": dt}, chunk_size=8, return_final_states=True)
    zero = base["dt"].clone()
    zero[:, 4] = 0.0
    out0, final0 = mamba.mamba_chunk_scan_combined(**{**base, "dt": zero}, chunk_size=8, return_final_states=True)
    assert torch.equal(out, out0) and torch.equal(final, final0)
    (out.sum() + final.sum()).backward()
    assert torch.all(dt.grad[:, 4] == 0) and torch.all(dt.grad[:, 3] != 0)


def test_varlen_needs_a_seq_idx_that_marks_its_sequences():
    base, _, _ = m2_problem(10, {"batch": 1})
    cu = torch.tensor([0, 4, 11])
    with pytest.raises(ValueError, match=r"^seq_idx: return_varlen_states=True needs seq_idx"):
        mamba.mamba_chunk_scan_combined(**base, chunk_size=4, cu_seqlens=cu, return_varlen_states=True)
    wrong = mamba.seq_idx_from_cu_seqlens(torch.tensor([0, 5, 11]))
    with pytest.raises(ValueError, match=r"^seq_idx: must mark the same sequences as cu_seqlens \[0, 4, 11\]"):
        mamba.mamba_chunk_scan_combined(**base, chunk_size=4, seq_idx=wrong, cu_seqlens=cu, return_varlen_states=True)
    with pytest.raises(ValueError, match=r"^cu_seqlens: return_varlen_states=True needs cu_seqlens$"):
        mamba.mamba_chunk_scan_combined(**base, chunk_size=4, return_varlen_states=True)
    down = torch.tensor([[0] * 5 + [1] * 3 + [0] * 3])
    with pytest.raises(ValueError, match=r"^seq_idx: must be nondecreasing along each row"):
        mamba.mamba_chunk_scan_combined(**base, chunk_size=4, seq_idx=down)


def test_mamba2_argument_errors_name_the_argument():
    base, _, _ = m2_problem(11, {})
    with pytest.raises(ValueError, match=r"^A: expected shape \(nheads,\) = \(4,\), got \(4, 1\)$"):
        mamba.mamba_chunk_scan_combined(**{**base, "A": base["A"][:, None]}, chunk_size=4)
    with pytest.raises(ValueError, match=r"^chunk_size: expected a positive int, got 0$"):
        mamba.mamba_chunk_scan_combined(**base, chunk_size=0)
    with pytest.raises(ValueError, match=r"^D: expected shape \(nheads, headdim\) = \(4, 3\) or \(nheads,\)"):
        mamba.mamba_chunk_scan_combined(**{**base, "D": torch.ones(3)}, chunk_size=4)
    with pytest.raises(ValueError, match=r"^B: expected shape \(batch, seqlen, ngroups, dstate\)"):
        mamba.mamba_chunk_scan_combined(**{**base, "B": base["B"].repeat(1, 1, 3, 1)}, chunk_size=4)


# ---------------------------------------------------------------------------------------------
# Decoding: selective_state_update vs selective_state_update_ref

SSU_OPTIONS = [
    dict(heads=True),
    dict(heads=True, full=True, softplus=True),
    dict(heads=True, full=True, softplus=True, tie=True, G=2),
    dict(heads=True, softplus=True, indices=True, G=4),
    dict(heads=False),
    dict(heads=False, full=True, softplus=True, indices=True),
]


def ssu_problem(seed, opts):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, lo=-1.0, hi=1.0):
        return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float64)

    batch, H, P, N, G = 3, 4, 3, 5, opts.get("G", 1)
    rows = 5 if opts.get("indices") else batch
    softplus, full = opts.get("softplus", False), opts.get("full", False)
    if opts.get("tie"):   # Mamba-2's decode: per-head A, dt and dt_bias broadcast over headdim
        A = (-r(H, lo=0.2, hi=1.5))[:, None, None].expand(H, P, N)
        dt = r(batch, H, lo=-2.0, hi=1.0)[:, :, None].expand(batch, H, P)
        dt_bias = r(H, lo=-0.5, hi=0.5)[:, None].expand(H, P)
    else:
        A = -r(H, P, N, lo=0.2, hi=1.5)
        dt = r(batch, H, P, lo=-2.0, hi=1.0) if softplus else r(batch, H, P, lo=0.02, hi=0.9)
        dt_bias = r(H, P, lo=-0.5, hi=0.5) if full else None
    p = dict(state=r(rows, H, P, N, lo=-0.5, hi=0.5), x=r(batch, H, P), dt=dt, A=A, B=r(batch, G, N),
             C=r(batch, G, N), D=r(H, P) if full else None, z=r(batch, H, P, lo=-2, hi=2) if full else None,
             dt_bias=dt_bias)
    if not opts["heads"]:   # mamba_ssm's forms without the heads axis: dim = headdim, one head
        p = {k: None if v is None else v[:, 0] if k in ("state", "x", "dt", "z", "B", "C") else v[0]
             for k, v in p.items()}
    idx = torch.tensor([3, 0, 4]) if opts.get("indices") else None
    return p, idx


@pytest.mark.parametrize("case", range(len(SSU_OPTIONS)))
def test_selective_state_update_matches_selective_state_update_ref(mamba_ref, case):
    opts = SSU_OPTIONS[case]
    base, idx = ssu_problem(200 + case, opts)
    softplus = opts.get("softplus", False)
    ours = leaves({k: v for k, v in base.items() if k != "state"}, torch.float64)
    theirs = leaves({k: v for k, v in base.items() if k != "state"}, torch.float64)
    state = base["state"].clone()
    out = mamba.selective_state_update(state, **ours, dt_softplus=softplus, state_batch_indices=idx,
                                       backend="ssm_ref")

    def reference(rows, **kw):
        """selective_state_update_ref on a copy of the rows read: (out, the rows written)."""
        rows = rows.clone()   # it writes into the state it is given
        return mamba_ref.selective_state_update_ref(rows, **kw, dt_softplus=softplus), rows

    read = base["state"] if idx is None else base["state"][idx]
    r_out, r_rows = reference(read, **theirs)
    expected_state = base["state"].clone()
    expected_state[slice(None) if idx is None else idx] = r_rows
    assert out.dtype == torch.float64 and out.shape == base["x"].shape
    check({"out": out, "state": state}, {"out": r_out, "state": expected_state}, 1e-12, f"{opts} forward")
    if idx is not None:   # rows nobody reads stay as they were, bit for bit
        untouched = [i for i in range(state.shape[0]) if i not in idx.tolist()]
        assert torch.equal(state[untouched], base["state"][untouched])
    # Gradients of out. selective_state_update_ref writes its state in place after multiplying it
    # (as mamba_ssm's kernel it is made for inference), so autograd cannot differentiate it: each
    # gradient is checked along random directions v against a fourth-order central difference of
    # the reference, <d_k, v> = d/dh <w, ref(k + h v)> (float64: agreement to ~1e-11).
    state0 = base["state"].clone().requires_grad_()
    out2 = mamba.selective_state_update(state0.clone(), **ours, dt_softplus=softplus, state_batch_indices=idx,
                                        backend="ssm_ref")
    gen = torch.Generator().manual_seed(case)
    w = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    inputs = {**ours, "state": state0}
    names = [k for k, v in inputs.items() if v is not None]
    got = dict(zip(names, torch.autograd.grad((out2 * w).sum(), [inputs[k] for k in names]), strict=True))
    plain = {k: None if v is None else v.detach() for k, v in base.items()}

    def loss(moved: dict) -> float:
        rows = moved["state"] if idx is None else moved["state"][idx]
        return float((w * reference(rows, **{k: v for k, v in moved.items() if k != "state"})[0]).sum())

    h = 1e-3
    for k in names:
        for _ in range(3):
            v = torch.randn(plain[k].shape, generator=gen, dtype=torch.float64)
            f = [loss({**plain, k: plain[k] + step * h * v}) for step in (-2, -1, 1, 2)]
            fd = (f[0] - 8 * f[1] + 8 * f[2] - f[3]) / (12 * h)
            ad = float((got[k] * v).sum())
            assert abs(ad - fd) <= 1e-8 * (1 + abs(fd)), f"{opts}: d_{k} along a direction {ad} vs {fd}"


def test_decoding_token_by_token_equals_the_scan():
    # Mamba-2 decoding (tied A, dt, dt_bias) step by step from the scan's initial state, against
    # mamba_chunk_scan_combined over the whole sequence: the same outputs and final state.
    base, _, _ = m2_problem(12, dict(G=2, D="h", z=True, dt_bias=True, softplus=True, initial=True))
    x, dt, A, B, C, D, z, bias, init = (base[k] for k in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias",
                                                           "initial_states"))
    # both on the float64 reference: the same function, to float64 rounding
    out, final = mamba.mamba_chunk_scan_combined(**base, chunk_size=4, dt_softplus=True, return_final_states=True,
                                                 backend="ssm_ref")
    batch, L, H, P = x.shape
    N = B.shape[-1]
    state = init.clone()
    steps = []
    for t in range(L):
        steps.append(mamba.selective_state_update(
            state, x[:, t], dt[:, t, :, None].expand(batch, H, P), A[:, None, None].expand(H, P, N), B[:, t],
            C[:, t], D=D[:, None].expand(H, P), z=z[:, t], dt_bias=bias[:, None].expand(H, P), dt_softplus=True,
            backend="ssm_ref"))
    assert rel(torch.stack(steps, dim=1), out) < 1e-12 and rel(state, final) < 1e-12


def test_decoding_errors_name_the_argument():
    base, idx = ssu_problem(13, SSU_OPTIONS[3])
    with pytest.raises(ValueError, match=r"^state_batch_indices: indices must be distinct"):
        mamba.selective_state_update(**base, state_batch_indices=torch.tensor([1, 1, 2]))
    with pytest.raises(ValueError, match=r"^state_batch_indices: every index must be in \[0, rows\) = \[0, 5\), "
                                         r"got 5$"):
        mamba.selective_state_update(**base, state_batch_indices=torch.tensor([1, 5, 2]))
    with pytest.raises(ValueError, match=r"^state: without state_batch_indices expected 3 rows \(batch\), got 5$"):
        mamba.selective_state_update(**base)
    with pytest.raises(ValueError, match=r"^A: expected shape \(nheads, headdim, dstate\) = \(4, 3, 5\)"):
        mamba.selective_state_update(**{**base, "A": base["A"][:, :, :2]}, state_batch_indices=idx)


def test_complex_a_is_refused_by_name():
    p = m1_problem(14, "variable", False, False)
    with pytest.raises(NotImplementedError, match=r"^A: complex tensors"):
        mamba.selective_scan_fn(**{**p, "A": p["A"].to(torch.complex128)})


@pytest.mark.parametrize("case", [1, 3, 5])
def test_selective_state_update_on_the_vulkan_device(case):
    # decoding on ssm_vk against the float64 reference backend: the output, the rows written in
    # place, and the rows nobody reads left as they were
    opts = SSU_OPTIONS[case]
    base, idx = ssu_problem(300 + case, opts)
    softplus = opts.get("softplus", False)
    args = {k: v for k, v in base.items() if k != "state"}
    want_state = base["state"].clone()
    want = mamba.selective_state_update(want_state, **args, dt_softplus=softplus, state_batch_indices=idx,
                                        backend="ssm_ref")
    state = base["state"].to(torch.float32)
    got = mamba.selective_state_update(state, **{k: None if v is None else v.float() for k, v in args.items()},
                                       dt_softplus=softplus, state_batch_indices=idx, backend="ssm_vk")
    ran_on("ssm_vk")
    assert rel(got, want) < 3e-6 and rel(state, want_state) < 3e-6
    if idx is not None:
        untouched = [i for i in range(state.shape[0]) if i not in idx.tolist()]
        assert torch.equal(state[untouched], base["state"][untouched].float())


def test_gradients_only_where_asked():
    p = m1_problem(16, "grouped", True, True)
    leaves_ = {k: v.clone() for k, v in p.items()}
    leaves_["A"].requires_grad_()
    out = mamba.selective_scan_fn(**leaves_, delta_softplus=True)
    out.sum().backward()
    assert leaves_["A"].grad is not None and np.isfinite(leaves_["A"].grad.numpy()).all()
    assert all(v.grad is None for k, v in leaves_.items() if k != "A")


def test_the_drop_ins_compile_without_a_graph_break():
    # (seq_idx, cu_seqlens and state_batch_indices are read on the host: those paths are not traced)
    base, _, _ = m2_problem(18, M2_OPTIONS[1])
    p1 = m1_problem(18, "grouped", True, True)

    def both(m2, m1):
        out2 = mamba.mamba_chunk_scan_combined(**m2, chunk_size=8, dt_softplus=True, dt_limit=(0.0, 2.0))
        out1, last = mamba.selective_scan_fn(**m1, delta_softplus=True, return_last_state=True)
        return out2.square().sum() + out1.square().sum() + last.sum()

    explained = torch._dynamo.explain(both)(base, p1)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(both, fullgraph=True, backend="aot_eager")
    m2 = {k: None if v is None else v.clone().requires_grad_() for k, v in base.items()}
    got = compiled(m2, p1)
    got.backward()
    assert torch.allclose(got, both(base, p1), rtol=1e-12, atol=0)
    m2e = {k: None if v is None else v.clone().requires_grad_() for k, v in base.items()}
    both(m2e, p1).backward()
    for k, v in m2.items():
        if v is not None:
            assert torch.allclose(v.grad, m2e[k].grad, rtol=1e-10, atol=1e-14), k
