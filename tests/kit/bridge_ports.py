"""The PyTorch and JAX bridges of a declared op as ports of the testing kit, so that the op's
properties (ssm_ref.testing.properties) hold the bridges to the same float64 reference as the
numpy backends: numpy arrays in, the bridge's function on tensors (``ssm_torch.<op.name>``,
``ssm_jax.<op.name>``), numpy arrays out; the backward through the framework's own autodiff
(torch.autograd.grad, jax.vjp) at the case's cotangents, so what is checked is the gradient a
user of the bridge gets. An op joins when its bridge function exists and it has one gradient per
float input (Mamba-3; the scan's d_s0 has no input of its own: its bridges are tested in
tests/pytorch and tests/jax_bridge).

The bridges have no update_cache (a framework's arrays are not written in place): the ports
refuse it, and the properties that need it are not run on them (docs/TORCH.md)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ssm_ref.results import Support


def _no_update_cache(kw: dict) -> None:
    if kw.pop("update_cache", False):
        raise NotImplementedError("update_cache: the bridges do not write arrays in place")


def _cotangent(op, outputs: dict, cot: dict, name: str) -> np.ndarray:
    g = cot.get("g_" + name)
    return np.zeros(np.shape(outputs[name])) if g is None else np.asarray(g, np.float64)


def torch_port(op, backend: str = "ssm_fast") -> SimpleNamespace:
    """``ssm_torch.<op.name>`` on float32 CPU tensors as a port of ``op``."""
    import torch

    import ssm_torch

    fn = getattr(ssm_torch, op.name)

    def tensors(args, grad: bool) -> list:
        out = []
        for name, a in zip(op.input_names, args, strict=True):
            if a is None or name not in op.float_inputs:
                out.append(None if a is None else torch.as_tensor(np.asarray(a)))
                continue
            t = torch.tensor(np.asarray(a, np.float32))
            out.append(t.requires_grad_(grad))
        return out

    def forward(*args, **kw):
        _no_update_cache(kw)
        outs = fn(*tensors(args, False), **kw, backend=backend)
        return {n: o.detach().numpy() for n, o in zip(op.output_names, outs, strict=True)}

    def backward(*args, **kw):
        _no_update_cache(kw)
        args = _zero_start(op, forward, args, kw)
        k = len(op.input_names)
        ins, cot = tensors(args[:k], True), dict(zip(op.cotangent_names, args[k:], strict=True))
        outs = fn(*ins, **kw, backend=backend)
        named = {n: o for n, o in zip(op.output_names, outs, strict=True)}
        grads_out = [torch.tensor(_cotangent(op, named, cot, n), dtype=o.dtype) for n, o in named.items()]
        leaves = [(n, t) for n, t in zip(op.input_names, ins, strict=True) if t is not None and t.requires_grad]
        got = torch.autograd.grad(list(named.values()), [t for _, t in leaves], grads_out, allow_unused=True)
        by_input = {n: (np.zeros(t.shape, np.float32) if g is None else g.numpy()) for (n, t), g in
                    zip(leaves, got, strict=True)}
        return {op.grad_of[n]: by_input.get(n) for n in op.float_inputs}

    return _port("ssm_torch", op, forward, backward)


def jax_port(op, backend: str = "ssm_fast") -> SimpleNamespace:
    """``ssm_jax.<op.name>`` on float32 arrays as a port of ``op``."""
    import jax
    import jax.numpy as jnp

    import ssm_jax

    fn = getattr(ssm_jax, op.name)

    def split(args):
        floats = {n: jnp.asarray(np.asarray(a, np.float32)) for n, a in zip(op.input_names, args, strict=True)
                  if a is not None and n in op.float_inputs}
        rest = {n: a for n, a in zip(op.input_names, args, strict=True) if n not in op.float_inputs}
        return floats, rest

    def call(floats, rest, kw):
        return fn(*(floats.get(n, rest.get(n)) for n in op.input_names), **kw, backend=backend)

    def forward(*args, **kw):
        _no_update_cache(kw)
        floats, rest = split(args)
        return {n: np.asarray(o) for n, o in zip(op.output_names, call(floats, rest, kw), strict=True)}

    def backward(*args, **kw):
        _no_update_cache(kw)
        args = _zero_start(op, forward, args, kw)
        k = len(op.input_names)
        floats, rest = split(args[:k])
        cot = dict(zip(op.cotangent_names, args[k:], strict=True))
        outs, vjp = jax.vjp(lambda f: call(f, rest, kw), floats)
        named = dict(zip(op.output_names, outs, strict=True))
        (g,) = vjp(tuple(jnp.asarray(_cotangent(op, named, cot, n), o.dtype) for n, o in named.items()))
        return {op.grad_of[n]: (np.asarray(g[n]) if n in g else None) for n in op.float_inputs}

    return _port("ssm_jax", op, forward, backward)


def _zero_start(op, forward, args: tuple, kw: dict) -> tuple:
    """``args`` with zero start states where the call left them all None (ids None: one row per
    sequence), so that the framework has leaves to differentiate: the gradient of the zero start
    states, which the reference returns too. The shapes are those of the final states."""
    k = len(op.input_names)
    pos = dict(zip(op.input_names, args[:k], strict=True))
    starts = [i for i, _ in op.state]
    if any(pos[i] is not None for i in starts):
        return args
    finals = forward(*args[:k], **kw)
    for i, o in op.state:
        pos[i] = np.zeros(np.shape(finals[o]), np.float32)
    return (*(pos[n] for n in op.input_names), *args[k:])


def _port(name: str, op, forward, backward) -> SimpleNamespace:
    def supports(op_name, *args, **kw):
        if kw.get("update_cache"):
            return Support(False, "the bridges do not write arrays in place (update_cache)")
        return Support(True, "CPU")

    return SimpleNamespace(NAME=name, supports=supports, **{op.name: forward, op.backward_name: backward})
