"""The properties of any declared op (ssm_ref.ops), written once from its declaration: they read
its inputs, outputs, gradients, shape letters and carried state, never one op's names. An op
lists the ones that apply to it (``Op.properties``); a port is called through
ssm_ref.testing.ports.call_op and compared with the op's reference in float64.

    from ssm_ref.testing.properties.generic import GENERIC
    GENERIC["oracle_forward"].check(my_port, case, op.tol())   # raises PropertyFailed

``case``: an ssm_ref.testing.cases.OpCase (or any case with ``op``, ``dims``, ``args()``,
``cotangents``, ``label``; its ``keywords``, when it has them, go to every call). The carried
state is every (input, output) pair of ``Op.state``; an index input picks each sequence's row of
the state cache (the reading ssm_ref.ops.Op.state declares), so a split's later calls take the
earlier call's final states with the index None. An optional input may be None in a case (its
gradient then may be None on both sides). The scan has richer properties of its own (ids, snapshots, packed
layouts: ssm_ref.testing.properties); these are what a new op gets on the day it is declared.
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np

from ssm_ref import ops
from ssm_ref.tolerance import compare

from .. import ports
from ._common import Property, PropertyFailed

__all__ = ["GENERIC", "decode_steps", "deterministic", "keywords_of", "oracle_backward", "oracle_forward",
           "output_of", "permute_sequences", "port_outputs", "reference", "reference_of", "run_chunks",
           "split_tokens"]


def output_of(result, name: str):
    """Output ``name`` of a reference's result: a key of a mapping, else an attribute."""
    return result[name] if isinstance(result, dict) else getattr(result, name)


def _host(v):
    return None if v is None else np.asarray(v)


def keywords_of(case) -> dict:
    """The keyword arguments of every call on ``case`` (an OpCase's ``keywords``; none for others)."""
    return dict(getattr(case, "keywords", None) or {})


def reference_of(op: ops.Op, args: dict, cotangents: dict | None = None, keywords: dict | None = None) -> dict:
    """The op's reference in float64 on ``args`` (by name, with ``keywords``) and, given
    ``cotangents``, its gradients too: outputs (and gradients) by name. A gradient the reference
    gives as None (that of an optional input left None) stays None."""
    ref = ports.reference_port(op)
    out = {k: v for k, v in ports.call_op(ref, op, args, keywords=keywords).arrays.items() if k in op.output_names}
    if cotangents is not None:
        out.update(ports.call_op(ref, op, args, cotangents, keywords).arrays)
    return out


def reference(op: ops.Op, case, backward: bool) -> dict:
    """:func:`reference_of` on the case's inputs widened to float64 (and its cotangents)."""
    return reference_of(op, case.args(np.float64), case.cotangents if backward else None, keywords_of(case))


def port_outputs(module, op: ops.Op, args: dict, cotangents: dict | None, keywords: dict | None = None) -> dict | None:
    """The port's forward outputs, and its gradients where ``cotangents`` are given (None when its
    backward raises NotImplementedError: it has none); the extras a result carries (the scan's
    snapshots) left out: these properties are of the declared outputs."""
    r = ports.call_op(module, op, args, keywords=keywords)
    out = {k: v for k, v in r.arrays.items() if k in op.output_names}
    if cotangents is not None:
        try:
            out.update(ports.call_op(module, op, args, cotangents, keywords=keywords).arrays)
        except NotImplementedError:
            return None
    return out


def _fail(prop: str, case, bad: list) -> None:
    if bad:
        lines = "\n  ".join(bad)
        raise PropertyFailed(f"{prop} fails for {case.label}:\n  {lines}")


def _compare(names, got: dict, want: dict, tol: dict, label: str) -> list:
    """The failed comparisons' messages. An output both sides give as None (the gradient of an
    input left None) agrees; one side's None against the other's array does not."""
    missing = [k for k in names if k not in tol]
    if missing:
        raise ValueError(f"tol: no bound for {missing}")
    bad = []
    for k in names:
        if got.get(k) is None or want.get(k) is None:
            if (got.get(k) is None) != (want.get(k) is None):
                which = "the port" if got.get(k) is None else "the reference"
                bad.append(f"{k}: {which} gave None, the other an array ({label})")
            continue
        c = compare(k, got[k], want[k], tol[k])
        if not c.ok:
            bad.append(c.message(label))
    return bad


def oracle_forward(module, case, tol: dict) -> bool:
    """Every output within the tolerance of the op's float64 reference."""
    op = ops.get(case.op)
    got = port_outputs(module, op, case.args(), None, keywords_of(case))
    _fail("oracle_forward", case, _compare(op.output_names, got, reference(op, case, False), tol, case.label))
    return True


def oracle_backward(module, case, tol: dict) -> bool:
    """Every gradient within the tolerance of the op's float64 reference (False: no backward)."""
    op = ops.get(case.op)
    got = port_outputs(module, op, case.args(), case.cotangents, keywords_of(case))
    if got is None:
        return False
    _fail("oracle_backward", case, _compare(op.grad_names, got, reference(op, case, True), tol, case.label))
    return True


def _bytes(v) -> bytes | None:
    return None if v is None else np.ascontiguousarray(v).tobytes()


def deterministic(module, case, tol: dict) -> bool:
    """Two runs give the same bits, forward and backward."""
    op = ops.get(case.op)
    kw = keywords_of(case)

    def run():
        return (port_outputs(module, op, case.args(), case.cotangents, kw)
                or port_outputs(module, op, case.args(), None, kw))

    one, two = run(), run()
    _fail("deterministic", case, [f"{k}: the second run differs" for k in one if _bytes(one[k]) != _bytes(two[k])])
    return True


def _rng(case, salt: str) -> np.random.Generator:
    key = int(case.recipe["seed"]) if getattr(case, "recipe", None) else zlib.crc32(case.label.encode())
    return np.random.default_rng([key, zlib.crc32(salt.encode())])


def _take(a, axes: str, letter: str, index) -> np.ndarray | None:
    """``a`` indexed along the axis of ``letter`` (a slice or an index array)."""
    if a is None or letter not in axes:
        return a
    sl = [slice(None)] * a.ndim
    sl[axes.index(letter)] = index
    return a[tuple(sl)]


def _rows_by_index(op: ops.Op) -> bool:
    """Whether the op's index inputs (if any) follow the declared reading (ssm_ref.ops.Op.state):
    axes "S", each sequence's row of the inputs with an "R" axis (the state cache). The token
    splits and sequence permutations below rely on it; for an op whose index inputs mean
    something else they do not apply to a case that gives one."""
    return all(a.axes == "S" for a in op.inputs if a.kind == "index")


def _indexed(op: ops.Op, case) -> bool:
    """Whether the case gives an index input (a cache row per sequence, say)."""
    return any(a.kind == "index" and case.inputs.get(a.name) is not None for a in op.inputs)


def _grad_of_state(op: ops.Op) -> dict:
    """Each state part's final-state output -> the gradient of its start-state input."""
    return {out: op.grad_of[inp] for inp, out in op.state if inp in op.grad_of}


def run_chunks(module, op: ops.Op, case, bounds: list, backward: bool) -> dict | None:
    """The port on the case's tokens in consecutive calls over [bounds[0], bounds[1]), [bounds[1],
    bounds[2]), ..., each starting from the previous call's final state (every part of
    ``op.state``; the index inputs then None: those states are already one per sequence), joined
    into what one call over all tokens gives: the outputs with a T axis concatenated, the final
    state the last call's. With ``backward``, the gradients too, chained backwards: the last call
    gets the case's cotangents, each earlier one the gradient of the next one's start state as its
    final state's cotangent; the gradients with a T axis concatenated, the start state's from the
    first call, the others (inputs shared by every token) summed. None when ``backward`` and the
    port has no backward."""
    axes = {a.name: a.axes for a in op.inputs}
    out_axes = {o.name: o.axes for o in op.outputs}
    grad_axes = {g.name: g.axes for g in op.grads}
    cot_axes = {"g_" + o.name: o.axes for o in op.outputs}
    state_out = {o for _, o in op.state}
    state_grads = {g.name for g in op.grads if g.of in dict(op.state)}      # (the scan's d_s and d_s0)
    kw = keywords_of(case)
    args = case.args()
    calls = []
    for k, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        part = {n: _take(v, axes[n], "T", slice(lo, hi)) for n, v in args.items()}
        if k:
            prev = calls[-1][1]
            part.update({inp: prev[o] for inp, o in op.state})
            part.update({a.name: None for a in op.inputs if a.kind == "index"})
        calls.append((part, port_outputs(module, op, part, None, kw)))
    joined = {n: calls[-1][1][n] if n in state_out or "T" not in out_axes[n]
              else np.concatenate([c[1][n] for c in calls], axis=out_axes[n].index("T")) for n in op.output_names}
    if not backward:
        return joined
    grads, carried = [None] * len(calls), {}
    for k in range(len(calls) - 1, -1, -1):
        lo, hi = bounds[k], bounds[k + 1]
        last = k == len(calls) - 1
        cot = {}
        for n, v in case.cotangents.items():
            if n[2:] in state_out:
                cot[n] = v if last else carried[n[2:]]
            elif "T" in cot_axes[n]:
                cot[n] = _take(v, cot_axes[n], "T", slice(lo, hi))
            else:
                cot[n] = v if last else None
        g = port_outputs(module, op, calls[k][0], cot, kw)
        if g is None:
            return None
        grads[k] = g
        carried = {o: g[gname] for o, gname in _grad_of_state(op).items()}
    for n in op.grad_names:
        parts = [g[n] for g in grads]
        if n in state_grads:
            joined[n] = parts[0]
        elif "T" in grad_axes[n]:
            joined[n] = np.concatenate(parts, axis=grad_axes[n].index("T"))
        else:   # an input every token shares: its gradient is the calls' sum (None: the input was None)
            given = [np.asarray(p, np.float64) for p in parts if p is not None]
            joined[n] = np.sum(given, axis=0) if given else None
    return joined


def _splits(module, case, tol: dict, prop: str, bounds: list, what: str) -> bool:
    op = ops.get(case.op)
    kw = keywords_of(case)
    joined = run_chunks(module, op, case, bounds, backward=True)
    whole = port_outputs(module, op, case.args(), case.cotangents, kw)
    names = list(op.output_names)
    if joined is None or whole is None:      # no backward: the forward's half
        joined = run_chunks(module, op, case, bounds, backward=False)
        whole = port_outputs(module, op, case.args(), None, kw)
    else:
        names += list(op.grad_names)
    # two float32 computations, each within tol of the truth: twice the bound between them
    # (three for the chained backward, which adds the calls' errors)
    t2 = {k: v.times(3 if k in op.grad_names else 2) for k, v in tol.items()}
    _fail(prop, case, _compare(names, joined, whole, t2, f"{case.label} {what}"))
    return True


def _splittable(op: ops.Op, case) -> bool:
    return op.state is not None and case.dims.get("T", 0) >= 2 and (_rows_by_index(op) or not _indexed(op, case))


def split_tokens(module, case, tol: dict) -> bool:
    """Tokens [0, t) then [t, T), the second call starting from the first's final state (every
    part of it), equal one call over [0, T): the outputs along T joined, the final state the
    second's; the gradients chained back through the split (:func:`run_chunks`)."""
    op = ops.get(case.op)
    if not _splittable(op, case):
        return False
    T = case.dims["T"]
    t = int(_rng(case, "split_tokens").integers(1, T))
    return _splits(module, case, tol, "split_tokens", [0, t, T], f"split at t = {t}")


def decode_steps(module, case, tol: dict) -> bool:
    """A prefill of tokens [0, t), then one call per token (T = 1: a decoding step), each
    starting from the previous call's final state, equal one call over [0, T), forward and
    chained backward (:func:`run_chunks`)."""
    op = ops.get(case.op)
    if not _splittable(op, case):
        return False
    T = case.dims["T"]
    t = int(_rng(case, "decode_steps").integers(0, T))
    bounds = [0, *range(max(t, 1), T + 1)]
    return _splits(module, case, tol, "decode_steps", bounds, f"prefill of {bounds[1]} tokens, then steps of one")


def permute_sequences(module, case, tol: dict) -> bool:
    """Permuting the sequences (the S axis of every input that has one, the index inputs
    included) permutes the outputs and the gradients of those inputs; the gradients of inputs
    shared by all sequences (the state cache among them) stay."""
    op = ops.get(case.op)
    S = case.dims.get("S", 0)
    if S < 2 or (_indexed(op, case) and not _rows_by_index(op)):
        return False
    perm = _rng(case, "permute_sequences").permutation(S)
    if (perm == np.arange(S)).all():     # (the identity would check nothing)
        perm = np.roll(perm, 1)
    axes = {a.name: a.axes for a in op.inputs}
    cot_axes = {"g_" + o.name: o.axes for o in op.outputs}
    kw = keywords_of(case)
    args, cot = case.args(), case.cotangents
    # a cache left None is zeros, one row per sequence: its gradient then has S rows, not R
    named = {**{o.name: o.axes for o in op.outputs},
             **{g.name: g.axes.replace("R", "S") if args.get(g.of) is None else g.axes for g in op.grads}}
    if _rows_by_index(op) and any(v is not None and "R" in axes[n] for n, v in args.items()):
        # ids None reads row i for sequence i: explicit, so that the rows move with their sequences
        args.update({a.name: np.arange(S, dtype=np.int64) for a in op.inputs
                     if a.kind == "index" and args.get(a.name) is None})
    base = port_outputs(module, op, args, cot, kw) or port_outputs(module, op, args, None, kw)
    moved_args = {k: _take(v, axes[k], "S", perm) for k, v in args.items()}
    moved = port_outputs(module, op, moved_args, {k: _take(v, cot_axes[k], "S", perm) for k, v in cot.items()}, kw)
    if moved is None:
        moved = port_outputs(module, op, moved_args, None, kw)
    want = {k: _take(v, named[k], "S", perm) for k, v in base.items()}
    _fail("permute_sequences", case, _compare(list(moved), moved, want, {k: v.times(2) for k, v in tol.items()},
                                              f"{case.label} permuted {perm.tolist()}"))
    return True


_ALL = ("typical",)

GENERIC: dict[str, Property] = {p.name: p for p in (
    Property("oracle_forward", oracle_forward, _ALL, "every output within the tolerance of the float64 reference"),
    Property("oracle_backward", oracle_backward, _ALL, "every gradient within the tolerance of the float64 reference"),
    Property("split_tokens", split_tokens, _ALL,
             "tokens [0, t) then [t, T), carrying every part of the state, equal one call (forward, chained backward)"),
    Property("decode_steps", decode_steps, _ALL,
             "a prefill, then one call per token carrying the state, equals one call (forward, chained backward)"),
    Property("permute_sequences", permute_sequences, _ALL, "permuting the sequences permutes the results"),
    Property("deterministic", deterministic, _ALL, "two runs give bit-identical outputs"),
)}
