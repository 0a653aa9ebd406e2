"""The properties of any declared op (ssm_ref.ops), written once from its declaration: they read
its inputs, outputs, gradients, shape letters and carried state, never one op's names. An op
lists the ones that apply to it (``Op.properties``); a port is called through
ssm_ref.testing.ports.call_op and compared with the op's reference in float64.

    from ssm_ref.testing.properties.generic import GENERIC
    GENERIC["oracle_forward"].check(my_port, case, op.tol())   # raises PropertyFailed

``case``: an ssm_ref.testing.cases.OpCase (or any case with ``op``, ``dims``, ``args()``,
``cotangents``, ``label``). The scan has richer properties of its own (ids, snapshots, packed
layouts: ssm_ref.testing.properties); these are what a new op gets on the day it is declared.
"""

from __future__ import annotations

import zlib

import numpy as np

from ssm_ref import ops
from ssm_ref.tolerance import compare

from .. import ports
from ._common import Property, PropertyFailed

__all__ = ["GENERIC", "deterministic", "oracle_backward", "oracle_forward", "output_of", "permute_sequences",
           "port_outputs", "reference", "reference_of", "split_tokens"]


def output_of(result, name: str):
    """Output ``name`` of a reference's result: a key of a mapping, else an attribute."""
    return result[name] if isinstance(result, dict) else getattr(result, name)


def reference_of(op: ops.Op, args: dict, cotangents: dict | None = None) -> dict:
    """The op's reference in float64 on ``args`` (by name) and, given ``cotangents``, its
    gradients too: outputs (and gradients) by name."""
    pos = [args.get(n) for n in op.input_names]
    r = op.forward(*pos, dtype=np.float64)
    out = {k: np.asarray(output_of(r, k)) for k in op.output_names}
    if cotangents is not None:
        g = op.backward(*pos, *(np.asarray(cotangents[n], np.float64) for n in op.cotangent_names), dtype=np.float64)
        out.update({k: np.asarray(output_of(g, k)) for k in op.grad_names})
    return out


def reference(op: ops.Op, case, backward: bool) -> dict:
    """:func:`reference_of` on the case's inputs widened to float64 (and its cotangents)."""
    return reference_of(op, case.args(np.float64), case.cotangents if backward else None)


def port_outputs(module, op: ops.Op, args: dict, cotangents: dict | None) -> dict | None:
    """The port's forward outputs, and its gradients where ``cotangents`` are given (None when its
    backward raises NotImplementedError: it has none)."""
    out = dict(ports.call_op(module, op, args).arrays)
    if cotangents is not None:
        try:
            out.update(ports.call_op(module, op, args, cotangents).arrays)
        except NotImplementedError:
            return None
    return out


def _fail(prop: str, case, bad: list) -> None:
    if bad:
        lines = "\n  ".join(bad)
        raise PropertyFailed(f"{prop} fails for {case.label}:\n  {lines}")


def _compare(names, got: dict, want: dict, tol: dict, label: str) -> list:
    missing = [k for k in names if k not in tol]
    if missing:
        raise ValueError(f"tol: no bound for {missing}")
    results = [compare(k, got[k], want[k], tol[k]) for k in names]
    return [c.message(label) for c in results if not c.ok]


def oracle_forward(module, case, tol: dict) -> bool:
    """Every output within the tolerance of the op's float64 reference."""
    op = ops.get(case.op)
    got = port_outputs(module, op, case.args(), None)
    _fail("oracle_forward", case, _compare(op.output_names, got, reference(op, case, False), tol, case.label))
    return True


def oracle_backward(module, case, tol: dict) -> bool:
    """Every gradient within the tolerance of the op's float64 reference (False: no backward)."""
    op = ops.get(case.op)
    got = port_outputs(module, op, case.args(), case.cotangents)
    if got is None:
        return False
    _fail("oracle_backward", case, _compare(op.grad_names, got, reference(op, case, True), tol, case.label))
    return True


def deterministic(module, case, tol: dict) -> bool:
    """Two runs give the same bits, forward and backward."""
    op = ops.get(case.op)
    one = port_outputs(module, op, case.args(), case.cotangents) or port_outputs(module, op, case.args(), None)
    two = port_outputs(module, op, case.args(), case.cotangents) or port_outputs(module, op, case.args(), None)
    _fail("deterministic", case, [f"{k}: the second run differs" for k in one if one[k].tobytes() != two[k].tobytes()])
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


def _indexed(op: ops.Op, case) -> bool:
    """Whether the case gives an index input (a cache row per sequence, say): the splits and
    permutations below do not know what it maps."""
    return any(a.kind == "index" and case.inputs.get(a.name) is not None for a in op.inputs)


def split_tokens(module, case, tol: dict) -> bool:
    """Tokens [0, t) then [t, T), the second call starting from the first's final state, equal one
    call over [0, T): the outputs along T joined, the final state the second's (forward)."""
    op = ops.get(case.op)
    T = case.dims.get("T", 0)
    if op.state is None or T < 2 or _indexed(op, case):
        return False
    state_in, state_out = op.state
    t = int(_rng(case, "split_tokens").integers(1, T))
    axes = {a.name: a.axes for a in op.inputs}
    out_axes = {o.name: o.axes for o in op.outputs}
    args = case.args()
    first = {k: _take(v, axes[k], "T", slice(0, t)) for k, v in args.items()}
    second = {k: _take(v, axes[k], "T", slice(t, T)) for k, v in args.items()}
    a = port_outputs(module, op, first, None)
    second[state_in] = a[state_out]
    b = port_outputs(module, op, second, None)
    whole = port_outputs(module, op, args, None)
    joined = {k: b[k] if k == state_out or "T" not in out_axes[k]
              else np.concatenate([a[k], b[k]], axis=out_axes[k].index("T")) for k in op.output_names}
    # two float32 computations, each within tol of the truth: twice the bound between them
    _fail("split_tokens", case, _compare(op.output_names, joined, whole, {k: v.times(2) for k, v in tol.items()},
                                         f"{case.label} split at t = {t}"))
    return True


def permute_sequences(module, case, tol: dict) -> bool:
    """Permuting the sequences (the S axis of every input that has one) permutes the outputs and
    the gradients of those inputs; the gradients of inputs shared by all sequences stay."""
    op = ops.get(case.op)
    S = case.dims.get("S", 0)
    if S < 2 or _indexed(op, case):
        return False
    perm = _rng(case, "permute_sequences").permutation(S)
    axes = {a.name: a.axes for a in op.inputs}
    named = {**{o.name: o.axes for o in op.outputs}, **{g.name: g.axes for g in op.grads}}
    cot_axes = {"g_" + o.name: o.axes for o in op.outputs}
    args, cot = case.args(), case.cotangents
    base = port_outputs(module, op, args, cot) or port_outputs(module, op, args, None)
    moved = port_outputs(module, op, {k: _take(v, axes[k], "S", perm) for k, v in args.items()},
                         {k: _take(v, cot_axes[k], "S", perm) for k, v in cot.items()})
    if moved is None:
        moved = port_outputs(module, op, {k: _take(v, axes[k], "S", perm) for k, v in args.items()}, None)
    want = {k: _take(v, named[k], "S", perm) for k, v in base.items()}
    _fail("permute_sequences", case, _compare(list(moved), moved, want, {k: v.times(2) for k, v in tol.items()},
                                              f"{case.label} permuted {perm.tolist()}"))
    return True


_ALL = ("typical",)

GENERIC: dict[str, Property] = {p.name: p for p in (
    Property("oracle_forward", oracle_forward, _ALL, "every output within the tolerance of the float64 reference"),
    Property("oracle_backward", oracle_backward, _ALL, "every gradient within the tolerance of the float64 reference"),
    Property("split_tokens", split_tokens, _ALL, "tokens [0, t) then [t, T), carrying the state, equal one call"),
    Property("permute_sequences", permute_sequences, _ALL, "permuting the sequences permutes the results"),
    Property("deterministic", deterministic, _ALL, "two runs give bit-identical outputs"),
)}
