"""What the framework bridges (ssm_torch/_bridge.py, ssm_jax/_bridge.py: one mechanism each for
every op of ssm_ref/ops.py) read of an op's declaration, framework-neutral and read once: which
inputs are floats and the gradient of each, the outputs (the declared ones, then a bridge's
extra ones), the input whose dtype each output takes; and the backend modules, which compute an
op by its declared function names (the bridges' default: ssm_fast where it computes the op).

    layout = BridgeLayout(ops.MAMBA3, like={"y": "x", "theta": "dtheta", ...})
    layout.floats        # the float inputs' positions in the declared order
    layout.grads         # the gradient name of each (op.grad_of)
    layout.dtypes(inputs)   # the outputs' dtypes, from the inputs' (tensors or arrays)
"""

from __future__ import annotations

from collections.abc import Mapping

from .backend_names import BACKENDS, refusal

__all__ = ["BridgeLayout", "computes", "default_backend", "module_name"]


def module_name(backend: str) -> str:
    """``backend`` when it names a backend module (one of BACKENDS: the module name the entry points
    resolved), else ValueError naming them (each bridge imports the module: the spec imports none)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: {refusal(backend)}")
    return backend


def computes(op, module) -> bool:
    """Whether the backend ``module`` has ``op``'s forward and backward."""
    return callable(getattr(module, op.name, None)) and callable(getattr(module, op.backward_name, None))


def default_backend(op, backend_module) -> str:
    """ssm_fast where it computes ``op`` (and ``backend_module("ssm_fast")`` can import it), else
    ssm_ref."""
    try:
        if computes(op, backend_module("ssm_fast")):
            return "ssm_fast"
    except ImportError:   # (numba missing: ssm_fast cannot be imported)
        pass
    return "ssm_ref"


class BridgeLayout:
    """An op's call as a bridge makes it, read from its declaration ``op`` (ssm_ref.ops.Op) once.

    like: output name -> the input whose dtype it has; an output that is the final state of a
    start-state input (``op.state``) has that input's dtype when it is given. extra: ((output,
    like), ...), outputs beyond the declared ones, whose cotangents reach the backend's backward
    as ``g_<output>`` keywords (the scan's snapshots).
    """

    def __init__(self, op, like: Mapping, extra: tuple = ()):
        names = op.input_names
        self.op = op
        self.n_inputs = len(names)
        self.is_float = tuple(a.kind == "float" for a in op.inputs)
        self.floats = tuple(i for i, f in enumerate(self.is_float) if f)
        self.grads = tuple(op.grad_of[names[i]] for i in self.floats)
        # the first float input that is always given: its device decides a call's path, and it
        # makes a bridge's empty gradients
        self.anchor = next(i for i in self.floats if not op.inputs[i].optional)
        self.outputs = (*op.output_names, *(o for o, _ in extra))
        self.n_declared = len(op.outputs)
        self.extra_keywords = tuple("g_" + o for o, _ in extra)
        start = {out: names.index(inp) for inp, out in (op.state or ())}
        like = {**like, **dict(extra)}
        self.dtype_of = tuple((start.get(o, -1), names.index(like[o])) for o in self.outputs)

    def dtypes(self, inputs) -> list:
        """The outputs' dtypes: each its start state's where that is given, else its ``like``
        input's. ``inputs``: in the declared order (None for an absent one), anything with a dtype."""
        return [inputs[i].dtype if i >= 0 and inputs[i] is not None else inputs[j].dtype for i, j in self.dtype_of]
