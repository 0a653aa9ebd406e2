"""Packed sequences in ssm_torch.mamba.selective_scan_fn (``seq_idx`` / ``cu_seqlens``, Mamba-2's
conventions; mamba_ssm's Mamba-1 has none, state-spaces/mamba#180).

A packed call is held to the same function called on each sequence alone (a loop over the
pieces), outputs, last states and gradients, on the same backend. Where the packed call is the
same call as the one alone (a single piece: the same shapes, no padding) everything is
bit-identical. Elsewhere the backends reduce (the contractions over dstate, the sums over
channels, tokens and pieces in the gradients) in an order that follows the call's shape -- the
number of runs and the padded length -- so the pieces agree to rounding: held to 1e-12 relative
in float64 (ssm_ref) and 3e-6 in float32 work (ssm_fast), the existing tests' bounds for those
precisions (measured: 3e-16 and 2e-7 at most). And each piece against
mamba_ssm's selective_scan_ref in float64 (1e-12 forward, 1e-10 gradients, as tests/pytorch/test_mamba.py),
and on ssm_vk (lavapipe) in float32 against that float64 reference (3e-6, gradients 30x).
"""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torchreq import need_torch

torch = need_torch()

from test_mamba import check  # noqa: E402

import ssm_torch  # noqa: E402
from ssm_torch import mamba  # noqa: E402

D_INNER, N = 6, 3


def problem(seed, batch, L, layout, full=True):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, lo=-1.0, hi=1.0):
        return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float64)

    d = D_INNER
    bc = {"variable": (batch, N, L), "grouped": (batch, 3, N, L), "constant_B": (d, N)}[layout]
    p = dict(u=r(batch, d, L), delta=r(batch, d, L, lo=-1.5, hi=1.0), A=-r(d, N, lo=0.2, hi=1.5), B=r(*bc),
             C=r(*(bc if layout != "constant_B" else (batch, N, L))), D=r(d) if full else None,
             z=r(batch, d, L, lo=-2, hi=2) if full else None, delta_bias=r(d, lo=-0.5, hi=0.5) if full else None)
    return {k: None if v is None else v.requires_grad_() for k, v in p.items()}


def piece(p, b, t0, t1):
    """The arguments of row b, tokens t0:t1 (slices of the same leaves: gradients flow back)."""
    def cut(k, v):
        if v is None or k in ("A", "D", "delta_bias") or v.dim() == 2:
            return v
        return v[b:b + 1, ..., t0:t1]
    return {k: cut(k, v) for k, v in p.items()}


def runs_of(seq_idx):
    """[(row, t0, t1)] of the runs of equal values, row by row."""
    out = []
    for b, row in enumerate(seq_idx.tolist()):
        t0 = 0
        for t in range(1, len(row) + 1):
            if t == len(row) or row[t] != row[t0]:
                out.append((b, t0, t))
                t0 = t
    return out


def seq_idx_of(lengths_per_row):
    rows = [torch.repeat_interleave(torch.arange(len(ls)) + 2 * b, torch.tensor(ls)) for b, ls in
            enumerate(lengths_per_row)]
    return torch.stack(rows).to(torch.int32)


def weights(seed, out_shape, n):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(out_shape, generator=g, dtype=torch.float64),
            torch.randn((n, D_INNER, N), generator=g, dtype=torch.float64))


def packed_and_loop(fn, p, runs, packing, seed, backend="ssm_ref"):
    """(out, last, grads) of the packed call and of the loop over runs with fn, the same linear loss."""
    names = [k for k, v in p.items() if v is not None]
    out, last = mamba_call(p, packing, backend)
    w_out, w_last = weights(seed, out.shape, len(runs))
    loss = (out.double() * w_out).sum() + (last.double() * w_last).sum()
    g_packed = dict(zip(names, torch.autograd.grad(loss, [p[k] for k in names]), strict=True))
    outs, lasts, loss = [], [], 0.0
    for i, (b, t0, t1) in enumerate(runs):
        o, lst = fn(piece(p, b, t0, t1))
        outs.append(o)
        lasts.append(lst[0])
        loss = loss + (o.double() * w_out[b:b + 1, :, t0:t1]).sum() + (lst[0].double() * w_last[i]).sum()
    g_loop = dict(zip(names, torch.autograd.grad(loss, [p[k] for k in names]), strict=True))
    return (out, last, g_packed), (outs, torch.stack(lasts), g_loop)


def mamba_call(p, packing, backend="ssm_ref"):
    return mamba.selective_scan_fn(**p, delta_softplus=True, return_last_state=True, backend=backend, **packing)


CASES = [  # lengths of the packed sequences, per row
    [[9]],                        # a single piece
    [[1]],                        # a single piece of length 1
    [[1, 1, 1, 1]],               # only length-1 pieces
    [[3, 1, 4, 1]],
    [[1, 7, 1], [4, 5]],          # batch 2 (seq_idx only)
    [[2, 2, 5], [9]],
]


def packing_of(lengths, use_cu):
    if use_cu:
        return {"cu_seqlens": torch.tensor([0, *itertools.accumulate(lengths[0])])}
    return {"seq_idx": seq_idx_of(lengths)}


def check_against_loop(packed, loop, runs, tol):
    out, last, g_packed = packed
    outs, lasts, g_loop = loop
    assert last.shape == (len(runs), D_INNER, N)
    got = {**{f"out{i}": out[b:b + 1, :, t0:t1] for i, (b, t0, t1) in enumerate(runs)}, "last": last}
    want = {**{f"out{i}": o for i, o in enumerate(outs)}, "last": lasts}
    if len(runs) == 1:   # the same call: the same arithmetic
        for k in want:
            assert torch.equal(got[k], want[k]), k
        for k in g_loop:
            assert torch.equal(g_packed[k], g_loop[k]), k
    check(got, want, tol, "forward")
    check(g_packed, g_loop, tol, "gradients")


@pytest.mark.parametrize(("backend", "dtype", "tol"), [("ssm_ref", torch.float64, 1e-12),
                                                       ("ssm_fast", torch.float32, 3e-6)])
@pytest.mark.parametrize("layout", ["variable", "grouped", "constant_B"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_packed_equals_each_sequence_alone(backend, dtype, tol, layout, case):
    lengths = CASES[case]
    for use_cu in ([False, True] if len(lengths) == 1 else [False]):
        packing = packing_of(lengths, use_cu)
        p = problem(10 * case + len(layout), len(lengths), sum(lengths[0]), layout)
        p = {k: None if v is None else v.detach().to(dtype).requires_grad_() for k, v in p.items()}
        runs = runs_of(seq_idx_of(lengths))

        def alone(q):
            return mamba.selective_scan_fn(**q, delta_softplus=True, return_last_state=True, backend=backend)

        packed, loop = packed_and_loop(alone, p, runs, packing, seed=case, backend=backend)
        check_against_loop(packed, loop, runs, tol)


@st.composite
def packed_rows(draw):
    """Lengths of the packed sequences of 1 or 2 rows of one length L: any cuts, length-1 pieces
    and a single piece among them."""
    L = draw(st.integers(1, 10))
    rows = []
    for _ in range(draw(st.integers(1, 2))):
        cuts = sorted(draw(st.sets(st.integers(1, L - 1), max_size=L - 1))) if L > 1 else []
        rows.append([b - a for a, b in itertools.pairwise([0, *cuts, L])])
    return rows


@given(packed_rows())
def test_drawn_boundaries_equal_each_sequence_alone(lengths):
    p = problem(sum(map(len, lengths)), len(lengths), sum(lengths[0]), "variable")
    runs = runs_of(seq_idx_of(lengths))

    def alone(q):
        return mamba.selective_scan_fn(**q, delta_softplus=True, return_last_state=True, backend="ssm_ref")

    packed, loop = packed_and_loop(alone, p, runs, packing_of(lengths, False), seed=len(runs))
    check_against_loop(packed, loop, runs, 1e-12)


def reference_alone(ref):
    import mamba_reference

    def alone(q):
        with mamba_reference.float64():
            return ref.selective_scan_ref(**q, delta_softplus=True, return_last_state=True)
    return alone


@pytest.mark.parametrize("layout", ["variable", "grouped", "constant_B"])
@pytest.mark.parametrize("case", [1, 2, 3, 4, 5])
def test_packed_matches_selective_scan_ref_on_each_piece_in_float64(mamba_ref, layout, case):
    lengths = CASES[case]
    p = problem(100 + case, len(lengths), sum(lengths[0]), layout)
    runs = runs_of(seq_idx_of(lengths))
    (out, last, g), (outs, lasts, g_ref) = packed_and_loop(reference_alone(mamba_ref), p, runs,
                                                           packing_of(lengths, False), seed=case)
    got = {f"out{i}": out[b:b + 1, :, t0:t1] for i, (b, t0, t1) in enumerate(runs)}
    check({**got, "last": last}, {**{f"out{i}": o for i, o in enumerate(outs)}, "last": lasts}, 1e-12, "forward")
    check(g, g_ref, 1e-10, "gradients")


@pytest.mark.parametrize("case", [3, 4])
def test_packed_on_the_vulkan_device_against_the_float64_reference(mamba_ref, case):
    lengths = CASES[case]
    p64 = problem(200 + case, len(lengths), sum(lengths[0]), "grouped")
    p32 = {k: v.detach().float().requires_grad_() for k, v in p64.items()}
    runs = runs_of(seq_idx_of(lengths))
    packing = packing_of(lengths, False)
    out, last = mamba_call(p32, packing, backend="ssm_vk")
    w = ssm_torch.last_where()
    assert w.backend == "ssm_vk" and w.where.startswith("Vulkan"), w
    w_out, w_last = weights(case, out.shape, len(runs))
    names = list(p32)
    loss = (out.double() * w_out).sum() + (last.double() * w_last).sum()
    g = dict(zip(names, torch.autograd.grad(loss, [p32[k] for k in names]), strict=True))
    ref = {k: v.detach().float().double().requires_grad_() for k, v in p64.items()}
    (_, _, _), (outs, lasts, g_ref) = packed_and_loop(reference_alone(mamba_ref), ref, runs, packing, seed=case)
    got = {f"out{i}": out[b:b + 1, :, t0:t1] for i, (b, t0, t1) in enumerate(runs)}
    check({**got, "last": last}, {**{f"out{i}": o for i, o in enumerate(outs)}, "last": lasts}, 3e-6, "forward")
    check(g, g_ref, 30 * 3e-6, "gradients")


def test_without_packing_the_last_state_keeps_its_shape():
    p = problem(7, 2, 6, "variable")
    out, last = mamba_call(p, {})
    assert last.shape == (2, D_INNER, N)
    packed_out, packed_last = mamba_call(p, {"seq_idx": torch.zeros(2, 6, dtype=torch.int64)})
    assert torch.equal(out, packed_out) and torch.equal(last, packed_last)


def test_packing_errors_name_the_argument():
    p = {k: None if v is None else v.detach() for k, v in problem(9, 1, 6, "variable").items()}
    p2 = {k: None if v is None else v.detach() for k, v in problem(9, 2, 6, "variable").items()}
    cu = torch.tensor([0, 2, 6])
    bad = [
        (p, dict(seq_idx=torch.zeros(1, 6, dtype=torch.int32), cu_seqlens=cu), ValueError, r"^seq_idx, cu_seqlens"),
        (p, dict(seq_idx=torch.zeros(1, 5, dtype=torch.int32)), ValueError, r"^seq_idx: expected shape"),
        (p, dict(seq_idx=torch.zeros(6, dtype=torch.int32)), ValueError, r"^seq_idx: expected shape"),
        (p, dict(seq_idx=torch.zeros(1, 6)), TypeError, r"^seq_idx: expected an integer tensor"),
        (p, dict(seq_idx=torch.tensor([[0, 0, 1, 1, 0, 0]])), ValueError, r"^seq_idx: must be nondecreasing"),
        (p, dict(seq_idx=torch.tensor([[-1, -1, 0, 0, 0, 0]])), ValueError, r"^seq_idx: expected indices >= 0"),
        (p, dict(seq_idx=[[0, 0, 0, 1, 1, 1]]), TypeError, r"^seq_idx: expected a torch.Tensor"),
        (p, dict(cu_seqlens=torch.tensor([0.0, 2.0, 6.0])), TypeError, r"^cu_seqlens: expected a 1-D integer"),
        (p, dict(cu_seqlens=cu[None]), TypeError, r"^cu_seqlens: expected a 1-D integer"),
        (p, dict(cu_seqlens=torch.tensor([0, 4, 2, 6])), ValueError, r"^cu_seqlens: expected increasing"),
        (p, dict(cu_seqlens=torch.tensor([0, 2, 2, 6])), ValueError, r"^cu_seqlens: expected increasing"),
        (p, dict(cu_seqlens=torch.tensor([0, 2, 5])), ValueError, r"^cu_seqlens: expected increasing"),
        (p, dict(cu_seqlens=torch.tensor([1, 2, 6])), ValueError, r"^cu_seqlens: expected increasing"),
        (p2, dict(cu_seqlens=cu), ValueError, r"^cu_seqlens: expected batch 1"),
    ]
    for args, packing, exc, msg in bad:
        with pytest.raises(exc, match=msg):
            mamba.selective_scan_fn(**args, **packing)
        # checked before any work: the same error with B in a shape the scan would refuse
        with pytest.raises(exc, match=msg):
            mamba.selective_scan_fn(**{**args, "B": args["B"][..., :1]}, **packing)
