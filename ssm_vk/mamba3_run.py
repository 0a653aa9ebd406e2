"""Running a Mamba-3 call on the device, once it is decided (ssm_vk.mamba3_api): its workspace
(mamba3_workspace.M3Workspace, the Engine's for its shape), inputs bound, the sequence recorded for
those buffers replayed (or recorded), submit and wait, the outputs -- as ssm_vk.run does for the
scan, and with the same signatures, so that replay.Replay runs either op (:data:`MAMBA3_CALLS`, at the end).

Outputs are DeviceArrays from the context's pool in the op's shapes (SISO without the rank axis:
the kernels' layout with M = 1 is the same memory), or the caller's (``out=``); a call whose every
input is on the host reads them back and releases them. update_cache=True writes the final state
into the rows ids of the caches: of a DeviceArray cache on the device, by the token-sequential
kernel itself where it can (:func:`_in_place`) or by copies at the end of the call's own sequence
(nothing read back); of a host cache, from the final states read back.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ssm_ref.checks import arange_ids, check_ids
from ssm_ref.mamba3_checks import M3Problem
from ssm_ref.ops import MAMBA3

from . import run
from . import runtime as rt
from .arrays import DeviceArray, check_live, pieces, pool
from .mamba3_workspace import STATE_PARTS, M3Workspace
from .replay import OpCalls

if TYPE_CHECKING:
    from .engine import Engine
    from .family import Planned

__all__ = ["MAMBA3_CALLS", "backward_shapes", "finish", "forward_shapes", "fresh", "output_shapes", "problem",
           "record", "retry", "put_states_after", "run_bound", "run_call", "run_once", "template"]

_CACHES = ("s_theta", "s_h", "s_k", "s_v")


def forward_shapes(d) -> dict:
    """The forward's outputs' shapes, by name, in the op's layout (SISO: no rank axis)."""
    S, T, H, P, N, M, F = d.S, d.T, d.H, d.P, d.N, d.M, d.F
    r = (M,) if d.mimo else ()
    return {"y": (S, T, *r, H, P), "theta": (S, H, F), "h": (S, H, P, N), "k": (S, H, *r, N), "v": (S, H, *r, P)}


def backward_shapes(d, psi_given: bool) -> dict:
    """The backward's gradients' shapes, by name (MAMBA3.grad_names; d_psi only where psi was given)."""
    S, T, H, P, N, G, M, F, R = d.S, d.T, d.H, d.P, d.N, d.G, d.M, d.F, d.R
    r = (M,) if d.mimo else ()
    out = {"d_x": (S, T, H, P), "d_dt": (S, T, H), "d_dA": (S, T, H), "d_lam": (S, T, H), "d_B": (S, T, *r, G, N),
           "d_C": (S, T, *r, G, N), "d_B_bias": (H, *r, N), "d_C_bias": (H, *r, N), "d_dtheta": (S, T, H, F),
           "d_psi": (H, M, P), "d_s_theta": (R, H, F), "d_s_h": (R, H, P, N), "d_s_k": (R, H, *r, N),
           "d_s_v": (R, H, *r, P)}
    if not psi_given:
        del out["d_psi"]
    return out


def fresh(ws: M3Workspace, shapes: dict) -> dict:
    """DeviceArrays of ``shapes`` from the pool, the buffers taken at once."""
    ctx = ws.ctx
    buffers = ws.pool if not ws.pool.closed else pool(ctx)
    sizes = [math.prod(s) * 4 for s in shapes.values()]
    cut = [ws.cuts.get("out:" + k) for k in shapes] if ws.cuts else [None] * len(sizes)
    bufs = buffers.acquire_all([n for n, c in zip(sizes, cut, strict=True) if n and c is None])
    out, i = {}, 0
    try:
        for (k, shape), n, c in zip(shapes.items(), sizes, cut, strict=True):
            if c is not None:   # beyond one allocation: in pieces cut at the windows
                buf = pieces(ctx, n, c)
            else:
                buf, i = (bufs[i], i + 1) if n else (None, i)
            out[k] = DeviceArray._from_pool(ctx, buf, tuple(int(v) for v in shape), buffers)
    except BaseException:
        for b in bufs[i:]:
            buffers.release(b)
        _release(out)
        raise
    return out


def _release(arrays: dict) -> None:
    for a in arrays.values():
        if isinstance(a, DeviceArray):
            a.release()


def run_bound(engine: Engine, ws: M3Workspace, p, backward: bool, device_out: bool, bufs: dict, key: list,
              update: bool = False, given: dict | None = None) -> dict:
    """The call with its inputs bound (``bufs``, ``key``: M3Workspace.bind_inputs): its outputs
    (``given``: the caller's; else fresh), the sequence, submit and wait. Returns the outputs by
    name: DeviceArrays (``device_out``) or numpy arrays; with ``update`` the final state's four
    parts are None (written into the cache rows). A call that raises releases its own outputs."""
    if given is not None:
        outs = given
    elif device_out:
        outs = fresh(ws, output_shapes(ws.dims, p, backward, update))
    else:   # (the workspace's own: a host call's repeat replays the sequence recorded for them)
        outs = ws.host_outputs(output_shapes(ws.dims, p, backward, update))
    try:
        seq = record(ws, p, backward, bufs, key, outs, update)
        seq.submit()
        run.set_last_sequence(seq)
        if ws.flags_nonfinite:
            if ws.nonfinite():   # (the caller computes it again on the recompute's plan)
                if given is None and device_out:
                    _release(outs)
                return None
            if update:   # the cache rows written only now: a flagged call's recompute reads them as they were
                put_states_after(ws, p)
        return finish(ws, p, outs, update, device_out)
    except BaseException:
        if given is None and device_out:
            _release(outs)
        raise


def put_states_after(ws: M3Workspace, p) -> None:
    """update_cache's final states (the workspace's "fin:" buffers) into the rows ids of the
    DeviceArray caches, in a one-shot submission of its own: a flagging plan's call, once its flag
    was read (a flagged call's recompute must read the caches as they were)."""
    caches = {part: c for part, name in zip(STATE_PARTS, _CACHES, strict=True)
              if type(c := getattr(p, name)) is DeviceArray}
    if caches:
        finals = {part: ws.own("fin:" + part, ws.dims.S * row * 4) for part, row in zip(STATE_PARTS, ws.rows,
                                                                                          strict=True)}
        with rt.oneshot(ws.ctx) as seq:
            ws.put_states(seq, finals, caches, p.ids)


def output_shapes(d, p, backward: bool, update: bool) -> dict:
    """The shapes of the outputs a call hands out (with ``update``: y alone)."""
    if backward:
        return backward_shapes(d, p.psi_given)
    if update:
        return {"y": forward_shapes(d)["y"]}
    return forward_shapes(d)


def record(ws: M3Workspace, p, backward: bool, bufs: dict, key: list, outs: dict, update: bool):
    """The sequence of the call over its inputs' bindings and the outputs ``outs`` (DeviceArrays):
    looked up by their buffers and the ids, recorded on first use. With ``update`` the final state
    goes into the workspace's buffers, and from there into the rows of the DeviceArray caches at
    the sequence's end. The key is made first: a repeat (the sequence kept) binds nothing more."""
    d = ws.dims
    for a in outs.values():
        key += (None if a.buffer is None else a.buffer.serial, a.offset)
    caches = {}
    if update and not backward:
        caches = {part: c for part, name in zip(STATE_PARTS, _CACHES, strict=True)
                  if type(c := getattr(p, name)) is DeviceArray}
        key.append(("update", tuple(caches)))
    key.append(p.ids.tobytes())
    key = tuple(key)
    seq = ws.recorded(key)
    if seq is not None:
        return seq
    spill = []   # (own buffer, the output's buffer, byte offset, bytes): outputs in pieces the windows cannot bind
    for k, a in outs.items():
        b = a.buffer
        if type(b) is rt.Pieces and not ws.in_place(k, b, a.offset * 4):
            own = ws.own("out:" + k, a.nbytes)
            spill.append((own, b, a.offset * 4, a.nbytes))
            bufs[k] = (own, 0, a.nbytes)
        else:
            bufs[k] = (b, a.offset * 4, a.nbytes)
    for k, n in ws.scratch.items():
        bufs[k] = (ws.own(k, n * 4), 0, n * 4)
    if backward:
        def post(seq):
            ws.split_grads(seq, p, outs)
            _spill(seq, spill)
    else:
        if update:
            mask, direct = _in_place(ws, bufs, caches)
            for part, row in zip(STATE_PARTS, ws.rows, strict=True):
                n = d.S * row * 4
                bufs[part] = (None, 0, 0) if part in direct else (ws.own("fin:" + part, n), 0, n)
            bufs["_in_place"] = (None, mask)   # (a binding's form: no buffer of its own)
        finals = {part: bufs[part][0] for part in STATE_PARTS} if update else {}

        def post(seq):
            if caches and not ws.flags_nonfinite:   # (flagging plans: after the check, put_flagged_states)
                ws.put_states(seq, finals, caches, p.ids)
            _spill(seq, spill)
    return ws.sequence(key, p, bufs, post)


def _spill(seq, spill: list) -> None:
    """Record the copies of outputs computed into the workspace's own buffers (an output in pieces
    cut where the windows cannot bind it: a caller's ``out=`` array) into the caller's arrays."""
    if spill:
        seq.barrier()
        for own, dst, off, n in spill:
            seq.copy(own, dst, n, 0, off)


def _in_place(ws: M3Workspace, bufs: dict, caches: dict) -> tuple[int, set]:
    """Which final-state parts of an update_cache call the token-sequential forward writes into
    the cache rows itself (its IP bits, the parts), so that no copy follows: h and v (bit 0) and
    θ and k (bit 1, with one channel block per head: every block reads them at its start), each
    pair where both caches are DeviceArrays bound in place (not copied to an aligned buffer) and
    overlapping no other binding of the call (an input or output sharing their memory must be
    read, or written, as if the rows were written after the call; the ids are distinct, checked).
    The chunked kernels and any plan that flags non-finite results (whose cache rows are written
    only after the flag check) write none in place."""
    # (the token-sequential family's plans are the ones with channel blocks, npb; the chunked
    # kernels flag non-finite results, so theirs are written after the flag check)
    if ws.flags_nonfinite or getattr(ws.plan, "npb", None) is None:
        return 0, set()
    # the bindings on the caches' buffers (one pass over the call's bindings; each part then reads
    # only those)
    held = {c.buffer for c in caches.values()}   # (buffers hash by identity)
    on: dict = {}
    for k, v in bufs.items():
        if v[0] in held and k[:1] != "_":
            on.setdefault(v[0], []).append((k, v[1], v[1] + v[2]))
    ok = set()
    for part, name in zip(STATE_PARTS, _CACHES, strict=True):
        b = bufs[name]
        if b[2] == 0:   # (no elements: nothing to write)
            ok.add(part)
            continue
        c = caches.get(part)
        if c is None or b[0] is not c.buffer or b[1] != c.offset * 4:
            continue
        lo, hi = b[1], b[1] + b[2]
        if not any(k != name and at < hi and lo < end for k, at, end in on[b[0]]):
            ok.add(part)
    mask, direct = 0, set()
    if {"h", "v"} <= ok:
        mask, direct = 1, {"h", "v"}
    if ws.plan.npb == 1 and {"theta", "k"} <= ok:
        mask, direct = mask | 2, direct | {"theta", "k"}
    return mask, direct


def finish(ws: M3Workspace, p, outs: dict, update: bool, device_out: bool) -> dict:
    """After the submit: the outputs by name, read back unless ``device_out``; with
    ``update`` y and, flat, the final state of each part whose cache is a host array (for the
    caller to write into its rows; None where the sequence wrote a DeviceArray cache)."""
    if update:
        out = {"y": outs["y"], **_finals(ws, p)}
    else:
        out = dict(outs)
    if device_out:
        return out
    return {k: a.numpy() if type(a) is DeviceArray else a for k, a in out.items()}


def _finals(ws: M3Workspace, p) -> dict:
    """update_cache's final state, read back, of the parts whose cache is a host array (the caller
    writes their rows; the sequence left each in the workspace's buffer "fin:<part>"); None for
    those the sequence put into a DeviceArray cache."""
    d = ws.dims
    out = {}
    for part, name, row in zip(STATE_PARTS, _CACHES, ws.rows, strict=True):
        if type(getattr(p, name)) is DeviceArray:
            out[part] = None
            continue
        n = d.S * row
        out[part] = rt.download(ws.own("fin:" + part, n * 4), ((n,), np.float32)) if n else np.zeros(0, np.float32)
    return out


def run_once(engine: Engine, p, backward: bool, planned: Planned, device_out: bool, rerun: bool = False,
             update: bool = False, given: dict | None = None) -> dict:
    """One call in the engine's workspace of ``planned`` (looked up again when another thread
    closed it meanwhile), its inputs' buffers marked busy while it runs; ``rerun``: on the
    recompute's plan (a result the first plan's kernels flagged as not finite is computed again
    so: the token-sequential kernels, whose inf and nan are the spec's)."""
    while True:
        ws = engine.workspace(planned, M3Workspace, rerun)
        with ws.lock:
            if ws.closed:
                continue
            ws.settle()
            buffers = ws.pool if not ws.pool.closed else pool(ws.ctx)
            held = tuple(a.buffer for a in _resident(p, backward, given) if a.buffer is not None)
            token = buffers.busy(held) if held else None
            try:
                if given is not None:
                    check_live(given.values())
                bufs, key = ws.bind_inputs(p, backward)
                out = run_bound(engine, ws, p, backward, device_out, bufs, key, update, given)
            finally:
                if token is not None:
                    buffers.idle(token)
        if out is not None:
            return out
        planned.plan(rerun=True)   # (raises RecomputeOnHost where the recompute is the host's: nothing to note)
        run.note_rerun(engine, p.dims)
        return run_once(engine, p, backward, planned, device_out, rerun=True, update=update, given=given)


def _resident(p, backward: bool, given) -> list:
    names = (*MAMBA3.float_inputs, *MAMBA3.cotangent_names) if backward else MAMBA3.float_inputs
    out = [a for a in (getattr(p, k) for k in names) if type(a) is DeviceArray]
    return out + list(given.values()) if given else out


def retry(engine: Engine, p, backward: bool, planned: Planned, device_out: bool, update: bool = False,
          given: dict | None = None) -> dict:
    """The call once more after it ran out of device memory, the other shapes' workspaces closed."""
    engine.clear()
    return run_once(engine, p, backward, planned, device_out, update=update, given=given)


def run_call(engine: Engine, p, backward: bool, planned: Planned, device_out: bool, update: bool = False,
             given: dict | None = None) -> dict:
    """The call, its context held (DeviceLost when lost meanwhile); out of device memory once, the
    call again after the other workspaces gave their buffers back (run.in_context)."""
    return run.in_context(engine, p, backward, planned, device_out, update, given, run_once, retry)


def problem(dims, arrays: tuple, ids, known_ids=None, template=None):
    """The problem of a plain call that repeats one whose problem was ``template`` (its float
    arguments ``arrays``: the 14 inputs, and for the backward the 5 cotangents, DeviceArrays of the
    shapes and buffers the replay's signature fixed, None where the first call had None): its ids
    checked as ssm_ref's validator checks them (raising as it does; ``known_ids``: (bytes, checked
    copy) of an earlier call: int64 ids of those bytes take that copy); None: the full path."""
    if not template["states_given"]:
        if ids is not None:
            return None   # (the validator's message)
        ids_ = arange_ids(dims.S)
    else:
        ids_ = None
        if (known_ids is not None and type(ids) is np.ndarray and ids.dtype == np.int64
                and ids.shape == known_ids[1].shape and ids.tobytes() == known_ids[0]):
            ids_ = known_ids[1]
        if ids_ is None:
            ids_ = check_ids(ids, dims.S, dims.R)
            if ids_ is None:
                ids_ = arange_ids(dims.S)
    p = object.__new__(M3Problem)
    fields = dict(template, dims=dims, ids=ids_)
    fields.update(zip(MAMBA3.float_inputs, arrays[:14], strict=True))
    fields.update(zip(MAMBA3.cotangent_names, arrays[14:] if len(arrays) > 14 else (None,) * 5, strict=True))
    p.__dict__.update(fields)
    return p


def template(p) -> dict:
    """What :func:`problem` takes of a first call's problem ``p``: its keywords and which optional
    inputs it had (never an array: the replay must not keep the first call's alive)."""
    return {"rotation": p.rotation, "psi_given": p.psi_given, "states_given": p.states_given, "dtype": p.dtype}


# -- what replay.Replay asks of the op (replay.OpCalls) ------------------------------------------------

def _record_own(ws, p, backward: bool, bufs: dict, outs: dict, update: bool):
    # (a flagging plan's sequence leaves the cache rows to put_states_after, once its flag was read)
    return record(ws, p, backward, bufs, ["prepared"], outs, update), update and ws.flags_nonfinite


def _copy_states(ws, own: dict, p) -> None:
    put_states_after(ws, p)


def _nothing_kept(engine, p) -> None:
    """(Mamba-3 keeps no forward tables for its backward.)"""


MAMBA3_CALLS = OpCalls(MAMBA3, problem, run_bound, run_once, retry, _record_own, _copy_states, _nothing_kept,
                       template, M3Workspace)
