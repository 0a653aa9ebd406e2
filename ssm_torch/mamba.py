"""Drop-ins for mamba_ssm's scan functions, with its signatures and semantics, on ssm-scan's CPU
backends (docs/TORCH.md has the argument mapping):

- :func:`selective_scan_fn` -- Mamba-1 (``mamba_ssm.ops.selective_scan_interface``);
- :func:`mamba_chunk_scan_combined` -- Mamba-2 (``mamba_ssm.ops.triton.ssd_combined``);
- :func:`selective_state_update` -- one decoding step, the state cache updated in place
  (``mamba_ssm.ops.triton.selective_state_update``).

Everything around the recurrence -- ``delta_bias`` / ``dt_bias``, the softplus (PyTorch's
``F.softplus``: log1p(exp(z)), identity above 20, as mamba_ssm's kernels), Mamba-2's ``dt_limit``
clamp, the ``D`` skip and the ``z`` gate -- is computed in torch around ``ssm_torch.ssm_scan``, so
autograd differentiates those parts as written, but for the skip and the gate, which go through
one function with the same derivative in fewer passes over memory (_gate.py); the softplus alone is left to the backend
(``dt_softplus="log1p"``: the same function and derivative) wherever no clamp after it could bind
and no padded packed run needs a zero step, which saves its forward and backward passes. The glue
is the fewest torch ops the math allows: each tensor the scan takes is made contiguous once, in
the forward (the operator would copy a strided one in the forward and again in the backward),
and no zero start state is made where the scan's ``s=None`` will do.

Each function takes two extra keywords, ``backend`` (None: ssm_fast, the CPU backend) and
``invariant`` (ssm_torch.ssm_scan's: True for batch- and split-invariant scans, ssm_vk's invariant
mode; docs/SPEC.md section 3.2); :func:`selective_scan_fn` also takes Mamba-2's ``seq_idx`` /
``cu_seqlens`` (packed sequences, which mamba_ssm's Mamba-1 lacks).

Glossary (mamba_ssm's names): batch, seqlen L, d_inner (Mamba-1 channels), nheads, headdim,
ngroups, dstate. In ssm-scan's letters: S batch rows (or sequences), T tokens, H heads, P
channels per head, N state size, G groups.

One module of ~470 lines on purpose: the three drop-ins share the glue around the scan and
mamba_ssm's argument conventions, which a reader compares side by side.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's and mamba_ssm's name)

from ssm_ref.backend_names import resolve_backend

from . import _bridge
from . import ssm_scan as _ssm_scan
from ._common import tensor_arg as _tensor
from ._gate import gate as _gate

__all__ = ["mamba_chunk_scan_combined", "selective_scan_fn", "selective_state_update", "seq_idx_from_cu_seqlens"]

# backend=None: the CPU backend, as for ssm_torch.ssm_scan
DEFAULT_BACKEND = "ssm_fast"


def _backend(backend):
    """The module name of ``backend`` (a module or short name: ssm_ref.backend_names), None: the default."""
    return DEFAULT_BACKEND if backend is None else resolve_backend(backend)


def _work(backend: str, *tensors) -> torch.dtype:
    """float64 when the backend is ssm_ref and every float tensor given is float64, else float32."""
    return _bridge.work_dtype(backend, tensors)


def _shape_error(name: str, t, want: str, got=None) -> ValueError:
    return ValueError(f"{name}: expected shape {want}, got {tuple(t.shape) if got is None else got}")


def _real(name: str, t) -> None:
    if t is not None and t.is_complex():
        raise NotImplementedError(f"{name}: complex tensors (mamba_ssm's complex S4D variant) are not supported")


def _dt_steps(dt, bias, softplus: bool, limit, work, fuse: bool = False):
    """mamba_ssm's step: dt (+ bias), softplus (F.softplus: identity above 20), clamped to limit.
    Returns (steps, the scan's ``dt_softplus``). ``fuse``: the scan may apply the softplus itself
    (no padding, which needs a zero step, and nothing else reads the steps); it does when the clamp
    after it is the identity (limit None, or (lo <= 0, inf): a softplus is never negative), handing
    back the biased dt and "log1p", F.softplus's form."""
    dt = dt.to(work)
    if bias is not None:
        dt = dt + bias.to(work)
    if softplus and fuse and (limit is None or (limit[0] <= 0 and limit[1] == float("inf"))):
        return dt, "log1p"
    if softplus:
        dt = F.softplus(dt)
    if limit is not None:
        dt = dt.clamp(min=limit[0], max=limit[1])
    return dt, None


# ---------------------------------------------------------------------------------------------
# Mamba-1


def _bc_groups(name: str, M, batch: int, dim: int, dstate: int, L: int, work):
    """B or C in mamba_ssm's layouts -> (batch, L, G, N): (D, N) constant (G = d_inner, one per
    channel), (batch, N, L) (G = 1) or (batch, G, N, L)."""
    _real(name, M)
    M = M.to(work)
    if M.dim() == 2:
        if tuple(M.shape) != (dim, dstate):
            raise _shape_error(name, M, f"(d_inner, dstate) = ({dim}, {dstate})")
        return M[None, None].expand(batch, L, dim, dstate)
    if M.dim() == 3:
        if tuple(M.shape) != (batch, dstate, L):
            raise _shape_error(name, M, f"(batch, dstate, L) = ({batch}, {dstate}, {L})")
        return M.permute(0, 2, 1).unsqueeze(2)
    if M.dim() == 4:
        G = M.shape[1]
        if tuple(M.shape) != (batch, G, dstate, L) or G < 1 or dim % G:
            raise _shape_error(name, M, f"(batch, G, dstate, L) = ({batch}, G, {dstate}, {L}) with d_inner % G == 0 "
                                        f"(d_inner = {dim})")
        return M.permute(0, 3, 1, 2)
    raise _shape_error(name, M, "(d_inner, dstate), (batch, dstate, L) or (batch, G, dstate, L)")


def _per_head(M, G: int, H: int):
    """(batch, L, G, N) -> (batch, L, H, N): head h reads group h // (H // G)."""
    return M if M.shape[2] == H else M.repeat_interleave(H // M.shape[2], dim=2)


def selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                      return_last_state=False, seq_idx=None, cu_seqlens=None, *, backend=None, invariant=False):
    """mamba_ssm's Mamba-1 selective scan.

    u, delta (batch, d_inner, L); A (d_inner, dstate), real; B and C (batch, dstate, L), grouped
    (batch, G, dstate, L) or constant (d_inner, dstate); D (d_inner,); z (batch, d_inner, L);
    delta_bias (d_inner,). The step is ``softplus(delta + delta_bias)`` (F.softplus) when
    ``delta_softplus``, else ``delta + delta_bias``; the state starts at zero. Returns out
    (batch, d_inner, L) in u's dtype, and with ``return_last_state`` also the last state
    (batch, d_inner, dstate) in the working dtype (float32; float64 on ssm_ref when every input is
    float64). Gradients for u, delta, A, B, C, D, z, delta_bias -- and, unlike mamba_ssm, through
    the last state too.

    Packed sequences (not in mamba_ssm's Mamba-1, state-spaces/mamba#180), as
    :func:`mamba_chunk_scan_combined` marks them: ``seq_idx`` (batch, L) integers, nondecreasing
    along each row, or ``cu_seqlens`` (n_sequences + 1,) offsets along L (batch 1), one or the
    other. The state restarts from zero at each change of index (each run is a sequence of its
    own), and the last state is then that of each run, (n_sequences, d_inner, dstate), the runs in
    order row by row.
    """
    u, delta, A, B, C = (_tensor(n, t) for n, t in zip(("u", "delta", "A", "B", "C"), (u, delta, A, B, C),
                                                            strict=True))
    D, z, delta_bias = (_tensor(n, t, True) for n, t in (("D", D), ("z", z), ("delta_bias", delta_bias)))
    _real("A", A)
    if u.dim() != 3:
        raise _shape_error("u", u, "(batch, d_inner, L)")
    batch, dim, L = (int(v) for v in u.shape)
    if A.dim() != 2 or A.shape[0] != dim:
        raise _shape_error("A", A, f"(d_inner, dstate) = ({dim}, dstate)")
    dstate = int(A.shape[1])
    if tuple(delta.shape) != (batch, dim, L):
        raise _shape_error("delta", delta, f"(batch, d_inner, L) = ({batch}, {dim}, {L})")
    for name, t, want in (("D", D, f"(d_inner,) = ({dim},)"), ("delta_bias", delta_bias, f"(d_inner,) = ({dim},)"),
                          ("z", z, f"(batch, d_inner, L) = ({batch}, {dim}, {L})")):
        if t is not None and tuple(t.shape) != ((dim,) if name != "z" else (batch, dim, L)):
            raise _shape_error(name, t, want)
    segs = _packed_runs(seq_idx, cu_seqlens, batch, L)
    be = _backend(backend)
    work = _work(be, u, delta, A, B, C, D, z, delta_bias)
    Bg = _bc_groups("B", B, batch, dim, dstate, L, work)
    Cg = _bc_groups("C", C, batch, dim, dstate, L, work)
    if Bg.shape[2] != Cg.shape[2]:  # e.g. a constant B beside a time-varying C: both per channel
        Bg, Cg = _per_head(Bg, Bg.shape[2], dim), _per_head(Cg, Cg.shape[2], dim)

    # ssm-scan's layout: H = d_inner heads of P = 1 channel, Mamba-1 A (H, N), S = batch (or the
    # runs of seq_idx, through Mamba-2's path); s=None: the zero start state. Each input of the
    # scan contiguous in that layout (one copy, in the forward; none where the caller's tensor is
    # already laid out so, as transformers' delta), the bias added after the copy
    dts, form = _dt_steps(delta.to(work).transpose(1, 2).contiguous(), delta_bias, delta_softplus, None, work,
                          fuse=_unpadded(segs))                          # (batch, L, d_inner)
    x = u.to(work).transpose(1, 2).unsqueeze(-1).contiguous()            # (batch, L, d_inner, 1)
    Bg, Cg, Aw = Bg.contiguous(), Cg.contiguous(), A.to(work)
    if segs is None:
        y, last = _ssm_scan(None, x, dts, Aw, Bg, Cg, backend=be, dt_softplus=form, invariant=invariant)
    else:
        y, last, _ = _scan_segments(segs, batch, L, None, x, dts, form, Aw, Bg, Cg, be, invariant)
    # the skip and the gate in the scan's layout, on views of u and z (out a view in mamba_ssm's)
    y = _gate(y, x, None if D is None else D.to(work)[:, None],
              None if z is None else z.to(work).transpose(1, 2).unsqueeze(-1))
    out = y.squeeze(-1).transpose(1, 2).to(u.dtype)                     # (batch, d_inner, L)
    return (out, last.squeeze(2)) if return_last_state else out


# ---------------------------------------------------------------------------------------------
# Mamba-2


def seq_idx_from_cu_seqlens(cu_seqlens, seqlen: int | None = None):
    """(1, seqlen) int32 seq_idx marking the sequences of ``cu_seqlens`` (0, 1, 2, ...), as
    mamba_ssm's callers build it for a packed batch."""
    cu = torch.as_tensor(cu_seqlens).to(torch.int64)
    L = int(cu[-1]) if seqlen is None else int(seqlen)
    return torch.repeat_interleave(torch.arange(cu.numel() - 1, dtype=torch.int32), cu.diff(), output_size=L)[None]


def _segments(seq_idx, batch: int, L: int):
    """The runs of equal seq_idx in each row: [(row, start, end)], in order. seq_idx must be
    integers, (batch, L), nondecreasing along each row (mamba_ssm's chunked kernels assume it)."""
    if seq_idx.dtype.is_floating_point or seq_idx.is_complex() or seq_idx.dtype == torch.bool:
        raise TypeError(f"seq_idx: expected an integer tensor, got dtype {seq_idx.dtype}")
    if tuple(seq_idx.shape) != (batch, L):
        raise _shape_error("seq_idx", seq_idx, f"(batch, seqlen) = ({batch}, {L})")
    rows = seq_idx.detach().cpu().to(torch.int64)
    if bool((rows < 0).any()):
        raise ValueError(f"seq_idx: expected indices >= 0, got {int(rows.min())}")
    if L and bool((rows.diff(dim=1) < 0).any()):
        raise ValueError("seq_idx: must be nondecreasing along each row (a new sequence gets a larger index)")
    segs = []
    for b in range(batch):
        r = rows[b]
        starts = [0, *(torch.nonzero(r.diff() != 0).flatten() + 1).tolist()] if L else []
        ends = [*starts[1:], L]
        segs += [(b, t0, t1, int(r[t0])) for t0, t1 in zip(starts, ends, strict=True)]
    return segs


def _check_cu_seqlens(cu_seqlens, L: int):
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype.is_floating_point or cu_seqlens.dim() != 1:
        raise TypeError("cu_seqlens: expected a 1-D integer tensor (num_sequences + 1,)")
    cu = cu_seqlens.detach().cpu().to(torch.int64)
    if cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != L or bool((cu.diff() <= 0).any()):
        raise ValueError(f"cu_seqlens: expected increasing offsets from 0 to seqlen = {L} (no empty sequence), "
                         f"got {cu.tolist()}")
    return cu.tolist()


def _packed_runs(seq_idx, cu_seqlens, batch: int, L: int):
    """selective_scan_fn's packing: the runs of seq_idx, or of cu_seqlens (batch 1); None for none."""
    if seq_idx is not None and cu_seqlens is not None:
        raise ValueError("seq_idx, cu_seqlens: give one or the other (both mark the packed sequences)")
    if cu_seqlens is not None:
        if batch != 1:
            raise ValueError(f"cu_seqlens: expected batch 1 (the sequences packed along L), got batch {batch}; "
                             "use seq_idx (batch, L) for several rows")
        seq_idx = seq_idx_from_cu_seqlens(_check_cu_seqlens(cu_seqlens, L), L)
    if seq_idx is None:
        return None
    segs = _segments(_tensor("seq_idx", seq_idx), batch, L)
    if not segs:
        raise ValueError("seq_idx: packed sequences need L >= 1")
    return segs


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False, *, backend=None,
                              invariant=False):
    """mamba_ssm's Mamba-2 scan (``mamba_chunk_scan_combined``), token by token.

    x (batch, seqlen, nheads, headdim); dt (batch, seqlen, nheads); A (nheads,); B and C (batch,
    seqlen, ngroups, dstate); D (nheads, headdim) or (nheads,); z like x; dt_bias (nheads,);
    initial_states (batch, nheads, headdim, dstate); seq_idx (batch, seqlen) integers,
    nondecreasing: the state restarts from zero wherever it changes, and initial_states feeds the
    run whose index is 0 (as mamba_ssm's kernels do); cu_seqlens (num_sequences + 1,) offsets,
    read only for ``return_varlen_states`` (batch 1, with a seq_idx that marks the same sequences).

    The step is ``clamp(softplus(dt + dt_bias), *dt_limit)`` (softplus only when
    ``dt_softplus``; the clamp always, as mamba_ssm's kernels do, so a negative step becomes 0
    under the default (0, inf)). ``chunk_size`` is accepted and does not change the result: the
    backends scan token by token (ssm_vk chooses its own chunks). Returns out (x's dtype), then
    final_states (batch, nheads, headdim, dstate) if ``return_final_states``, then
    varlen_states (num_sequences, nheads, headdim, dstate) if ``return_varlen_states``; states
    in the working dtype. Gradients for x, dt, A, B, C, D, z, dt_bias, initial_states, through
    every output.
    """
    x, dt, A, B, C = (_tensor(n, t) for n, t in zip(("x", "dt", "A", "B", "C"), (x, dt, A, B, C), strict=True))
    D, z, dt_bias, initial_states = (_tensor(n, t, True) for n, t in (("D", D), ("z", z), ("dt_bias", dt_bias),
                                                                      ("initial_states", initial_states)))
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: expected a positive int, got {chunk_size!r}")
    if x.dim() != 4:
        raise _shape_error("x", x, "(batch, seqlen, nheads, headdim)")
    batch, L, H, P = (int(v) for v in x.shape)
    if tuple(dt.shape) != (batch, L, H):
        raise _shape_error("dt", dt, f"(batch, seqlen, nheads) = ({batch}, {L}, {H})")
    if tuple(A.shape) != (H,):
        raise _shape_error("A", A, f"(nheads,) = ({H},)")
    if B.dim() != 4 or tuple(B.shape[:2]) != (batch, L) or B.shape[2] < 1 or H % B.shape[2]:
        raise _shape_error("B", B, f"(batch, seqlen, ngroups, dstate) = ({batch}, {L}, ngroups, dstate) with "
                                   f"nheads % ngroups == 0 (nheads = {H})")
    G, N = int(B.shape[2]), int(B.shape[3])
    if tuple(C.shape) != (batch, L, G, N):
        raise _shape_error("C", C, f"(batch, seqlen, ngroups, dstate) = ({batch}, {L}, {G}, {N})")
    if D is not None and tuple(D.shape) not in ((H, P), (H,)):
        raise _shape_error("D", D, f"(nheads, headdim) = ({H}, {P}) or (nheads,) = ({H},)")
    if z is not None and tuple(z.shape) != (batch, L, H, P):
        raise _shape_error("z", z, f"(batch, seqlen, nheads, headdim) = ({batch}, {L}, {H}, {P})")
    if dt_bias is not None and tuple(dt_bias.shape) != (H,):
        raise _shape_error("dt_bias", dt_bias, f"(nheads,) = ({H},)")
    if initial_states is not None and tuple(initial_states.shape) != (batch, H, P, N):
        raise _shape_error("initial_states", initial_states,
                           f"(batch, nheads, headdim, dstate) = ({batch}, {H}, {P}, {N})")
    try:
        lo, hi = (float(v) for v in dt_limit)
    except (TypeError, ValueError) as e:
        raise ValueError(f"dt_limit: expected a pair (min, max) of numbers, got {dt_limit!r}") from e
    if return_varlen_states:
        if cu_seqlens is None:
            raise ValueError("cu_seqlens: return_varlen_states=True needs cu_seqlens")
        if batch != 1:
            raise ValueError(f"cu_seqlens: varlen states need batch 1 (the sequences packed along seqlen), "
                             f"got batch {batch}")
        if seq_idx is None:
            raise ValueError("seq_idx: return_varlen_states=True needs seq_idx marking the sequences of cu_seqlens "
                             "(without it the scan runs across their boundaries); pass "
                             "seq_idx=ssm_torch.mamba.seq_idx_from_cu_seqlens(cu_seqlens)")
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("z", z)):
        _real(name, t)

    be = _backend(backend)
    work = _work(be, x, dt, A, B, C, D, z, dt_bias, initial_states)
    segs = None if seq_idx is None else _segments(_tensor("seq_idx", seq_idx), batch, L)
    steps, form = _dt_steps(dt, dt_bias, dt_softplus, (lo, hi), work, fuse=_unpadded(segs))   # (batch, L, H)
    # contiguous once here (x, B, C split from one projection, as transformers' are, are strided)
    xw, Bw, Cw, Aw = x.to(work).contiguous(), B.to(work).contiguous(), C.to(work).contiguous(), A.to(work)
    s0 = initial_states.to(work) if initial_states is not None else None

    varlen = None
    if segs is None:   # (s=None without initial_states: the zero start state)
        y, final = _ssm_scan(s0, xw, steps.contiguous(), Aw, Bw, Cw, backend=be, dt_softplus=form,
                             invariant=invariant)
    else:
        y, seg_states, last_of_row = _scan_segments(segs, batch, L, s0, xw, steps, form, Aw, Bw, Cw, be, invariant)
        final = seg_states[last_of_row]
        if return_varlen_states:
            cu = _check_cu_seqlens(cu_seqlens, L)
            bounds = [(t0, t1) for _, t0, t1, _ in segs]
            if bounds != list(itertools.pairwise(cu)):
                raise ValueError(f"seq_idx: must mark the same sequences as cu_seqlens {cu}, its runs are "
                                 f"{[t0 for t0, _ in bounds] + [L]}")
            varlen = seg_states
    Dw = None if D is None else D.to(work)
    out = _gate(y, xw, None if Dw is None else (Dw[:, None] if Dw.dim() == 1 else Dw),
                None if z is None else z.to(work)).to(x.dtype)
    res = (out,)
    if return_final_states:
        res += (final,)
    if return_varlen_states:
        res += (varlen,)
    return res[0] if len(res) == 1 else res


def _unpadded(segs) -> bool:
    """Whether the scan's steps need no padding: one call over the rows (``segs`` None), or runs of
    one length. Padding must give the step 0, which only an unsoftplussed step of 0 does; the
    backend applies the softplus (``_dt_steps``'s fuse) only then."""
    return segs is None or len({t1 - t0 for _, t0, t1, _ in segs}) == 1


def _scan_segments(segs, batch, L, s0, x, steps, form, A, B, C, backend, invariant=False):
    """Each run of seq_idx as its own sequence of the scan, padded at its end to the longest run
    (padding: zero step, input and B, C -- the state passes through unchanged; ``form`` the scan's
    dt_softplus, "log1p" only where there is no padding). ``s0``: the rows' start states
    (batch, H, P, N), or None for zeros. Returns y (batch, L, H, P), the state each run ends with
    (n_runs, H, P, N), and the index of each row's last run."""
    H, P, N = x.shape[2], x.shape[3], B.shape[3]
    n, Lmax = len(segs), max(t1 - t0 for _, t0, t1, _ in segs)
    pad = batch * L                                            # the index of the zero row
    gather = torch.full((n, Lmax), pad, dtype=torch.int64)     # run token -> flat (row, t)
    scatter = torch.empty(batch * L, dtype=torch.int64)        # flat (row, t) -> run token
    zero_row = batch if s0 is not None else 0
    ids = torch.full((n,), zero_row, dtype=torch.int64)        # start state: row b of s0 or zeros
    last_of_row = [0] * batch
    first = [True] * batch
    for k, (b, t0, t1, v) in enumerate(segs):
        flat = torch.arange(b * L + t0, b * L + t1)
        gather[k, : t1 - t0] = flat
        scatter[flat] = k * Lmax + torch.arange(t1 - t0)
        if first[b] and v == 0 and s0 is not None:  # mamba_ssm: initial_states feed the run of index 0
            ids[k] = b
        first[b] = False
        last_of_row[b] = k

    def runs(t, *inner):
        flat = torch.cat([t.reshape(batch * L, *inner), t.new_zeros((1, *inner))])
        return flat[gather]                                    # (n, Lmax, *inner)

    G = B.shape[2]
    zeros = x.new_zeros((1, H, P, N))
    cache = zeros if s0 is None else torch.cat([s0, zeros])   # (batch + 1, H, P, N), or the zero row alone
    y, states = _ssm_scan(cache, runs(x, H, P), runs(steps, H), A, runs(B, G, N), runs(C, G, N), ids,
                          backend=backend, dt_softplus=form, invariant=invariant)
    y = y.reshape(n * Lmax, H, P)[scatter].reshape(batch, L, H, P)
    return y, states, torch.tensor(last_of_row)


# ---------------------------------------------------------------------------------------------
# Decoding


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None, *, backend=None, invariant=False):
    """mamba_ssm's decoding step: advances ``state`` by one token in place and returns the output.

    With heads: state (rows, nheads, headdim, dstate); x, dt, z (batch, nheads, headdim); A
    (nheads, headdim, dstate); B, C (batch, ngroups, dstate); D, dt_bias (nheads, headdim).
    Without: state (rows, dim, dstate); x, dt, z (batch, dim); A (dim, dstate); B, C (batch,
    dstate); D, dt_bias (dim,). The step is ``softplus(dt + dt_bias)`` (F.softplus) when
    ``dt_softplus``, else ``dt + dt_bias`` (no clamp, as mamba_ssm). Batch row b reads and
    writes state row ``state_batch_indices[b]`` (distinct indices in [0, rows)), or row b
    (rows == batch) without them. Returns out like x, in x's dtype. The write into ``state``
    (in its dtype) is not recorded by autograd; gradients flow to x, dt, A, B, C, D, z, dt_bias
    and the state rows read.
    """
    state, x, dt, A, B, C = (_tensor(n, t) for n, t in zip(("state", "x", "dt", "A", "B", "C"),
                                                               (state, x, dt, A, B, C), strict=True))
    D, z, dt_bias = (_tensor(n, t, True) for n, t in (("D", D), ("z", z), ("dt_bias", dt_bias)))
    heads = state.dim() == 4
    if state.dim() not in (3, 4):
        raise _shape_error("state", state, "(rows, nheads, headdim, dstate) or (rows, dim, dstate)")
    st = state if heads else state.unsqueeze(1)
    R, H, P, N = (int(v) for v in st.shape)
    lead = "(batch, nheads, headdim)" if heads else "(batch, dim)"

    def lift(name, t, k):
        """Add the heads axis mamba_ssm's 'no heads' forms leave out (k: where it goes)."""
        return t if t is None or heads else t.unsqueeze(k)

    xh, dth, zh = lift("x", x, 1), lift("dt", dt, 1), lift("z", z, 1)
    Ah, Bh, Ch = lift("A", A, 0), lift("B", B, 1), lift("C", C, 1)
    Dh, bh = lift("D", D, 0), lift("dt_bias", dt_bias, 0)
    if xh.dim() != 3 or tuple(xh.shape[1:]) != (H, P):
        raise _shape_error("x", x, f"{lead} with the state's nheads, headdim = {H}, {P}" if heads
                           else f"(batch, dim) with the state's dim = {P}")
    batch = int(xh.shape[0])
    for name, t, th in (("dt", dt, dth), ("z", z, zh)):
        if t is not None and tuple(th.shape) != (batch, H, P):
            raise _shape_error(name, t, f"{lead} = " + (f"({batch}, {H}, {P})" if heads else f"({batch}, {P})"))
    if tuple(Ah.shape) != (H, P, N):
        raise _shape_error("A", A, f"(nheads, headdim, dstate) = ({H}, {P}, {N})" if heads
                           else f"(dim, dstate) = ({P}, {N})")
    if Bh.dim() != 3 or Bh.shape[0] != batch or Bh.shape[2] != N or Bh.shape[1] < 1 or H % Bh.shape[1]:
        raise _shape_error("B", B, f"(batch, ngroups, dstate) = ({batch}, ngroups, {N}) with nheads % ngroups == 0"
                           if heads else f"(batch, dstate) = ({batch}, {N})")
    if tuple(Ch.shape) != tuple(Bh.shape):
        raise _shape_error("C", C, f"B's shape {tuple(B.shape)}")
    for name, t, th in (("D", D, Dh), ("dt_bias", dt_bias, bh)):
        if t is not None and tuple(th.shape) != (H, P):
            raise _shape_error(name, t, f"(nheads, headdim) = ({H}, {P})" if heads else f"(dim,) = ({P},)")
    for name, t in (("state", state), ("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
        _real(name, t)

    if state_batch_indices is None:
        if R != batch:
            raise ValueError(f"state: without state_batch_indices expected {batch} rows (batch), got {R}")
        rows = None
    else:
        idx = _tensor("state_batch_indices", state_batch_indices)
        if idx.dtype.is_floating_point or idx.is_complex() or idx.dtype == torch.bool:
            raise TypeError(f"state_batch_indices: expected an integer tensor, got dtype {idx.dtype}")
        if tuple(idx.shape) != (batch,):
            raise _shape_error("state_batch_indices", idx, f"(batch,) = ({batch},)")
        rows = idx.detach().cpu().to(torch.int64)
        bad = [int(i) for i in rows if not 0 <= int(i) < R]
        if bad:
            raise ValueError(f"state_batch_indices: every index must be in [0, rows) = [0, {R}), got {bad[0]}")
        if rows.unique().numel() != batch:
            raise ValueError(f"state_batch_indices: indices must be distinct (each row is written), got "
                             f"{rows.tolist()}")

    be = _backend(backend)
    work = _work(be, st, xh, dth, Ah, Bh, Ch, Dh, zh, bh)
    steps, form = _dt_steps(dth, bh, dt_softplus, None, work, fuse=True)   # (batch, H, P)
    # the rows read: a copy where autograd keeps the op's inputs for the backward (state is written
    # below), else state itself (the op has read it by then)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                           for t in (st, xh, dth, Ah, Bh, Ch, Dh, zh, bh))
    s_in = (st.clone() if grad else st) if rows is None else st.index_select(0, rows.to(st.device))
    # ssm-scan's layout: H*P heads of one channel, Mamba-1 A (H*P, N), one token
    s0 = s_in.to(work).reshape(batch, H * P, 1, N)
    y, new = _ssm_scan(s0, xh.to(work).reshape(batch, 1, H * P, 1), steps.reshape(batch, 1, H * P),
                       Ah.to(work).reshape(H * P, N), Bh.to(work)[:, None], Ch.to(work)[:, None],
                       backend=be, dt_softplus=form, invariant=invariant)
    with torch.no_grad():
        new = new.reshape(batch, H, P, N).to(state.dtype)
        if rows is None:
            st.copy_(new)
        else:
            st.index_copy_(0, rows.to(st.device), new)
    out = _gate(y.reshape(batch, H, P), xh.to(work), None if D is None else Dh.to(work),
                None if z is None else zh.to(work)).to(x.dtype)
    return out if heads else out.squeeze(1)
