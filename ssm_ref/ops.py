"""The ops ssm-scan computes, each declared once, as data that every backend, bridge, test and tool
reads (after PyTorch's OpInfo): its inputs with their shape letters, its outputs, its gradients
and the input each belongs to, the validator, the reference forward and backward, the float32
tolerances, and where the testing kit finds its problems and properties.

    import ssm_ref.ops as ops
    op = ops.get("ssm_scan")
    op.input_names            # ('s', 'x', 'dt', 'A', 'B', 'C', 'ids')
    op.output_names           # ('y', 'states')
    op.grad_names             # ('d_s', 'd_s0', 'd_x', 'd_dt', 'd_A', 'd_B', 'd_C')
    op.grad_of                # {'s': 'd_s', 'x': 'd_x', ...}: the gradient of each float input
    op.cotangent_names        # ('g_y', 'g_states'): the backward's loss gradients, one per output
    op.backward_name          # 'ssm_scan_back'
    op.forward(*args, dtype=np.float64)    # the reference (ssm_ref.ssm_scan)
    op.tol()                  # the float32 bounds (ssm_ref.tolerance.F32_TOL)

An op's functions are named ``op.name`` (the forward) and ``op.backward_name`` (its backward) in
every backend module; they take the inputs positionally in ``op.inputs``' order (the backward then
the cotangents). What the testing kit holds for an op (its problems, strategy and properties)
is named here as ``"module:attribute"`` text, which the kit imports
(:func:`ssm_ref.testing.ports.kit_part`): the spec imports nothing of the kit.

Adding an op: docs/ARCHITECTURE.md, "Adding an op".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

__all__ = ["MAMBA3", "OPS", "SCAN", "Arg", "Grad", "Op", "Output", "get", "register"]


@dataclass(frozen=True)
class Arg:
    """One input (or one cotangent of the backward). ``axes``: its shape as one letter per axis
    ("STHP" is (S, T, H, P)); where several shapes are accepted, the first is the one the
    properties reshape by and ``what`` names the others. ``optional``: None is accepted (``what``
    says what it means). ``kind``: "float" or "index" (integers, no gradient)."""

    name: str
    axes: str
    what: str
    optional: bool = False
    kind: str = "float"


@dataclass(frozen=True)
class Output:
    """One output of the forward."""

    name: str
    axes: str
    what: str


@dataclass(frozen=True)
class Grad:
    """One output of the backward: the gradient of the loss for input ``of``."""

    name: str
    of: str
    axes: str
    what: str


@dataclass(frozen=True)
class Op:
    """One op.

    forward(*inputs, dtype=...) -> an object with the outputs as attributes or keys: the reference
    backward(*inputs, *cotangents, dtype=...) -> the gradients by name: the reference
    check_forward(*inputs) -> the validated problem (raises TypeError / ValueError naming the
    argument before any work); check_backward likewise with the cotangents
    tolerance: output and gradient name -> Tol, a float32 result against the float64 reference
    (or a function of no arguments that returns that table)
    state: the state a call carries from one token range to the next, as a tuple of (start-state
    input, final-state output) pairs, one per part (the scan's one: (("s", "states"),); an op with
    a state of several parts names each), or None. A start-state input with an "R" axis is a cache
    read at the op's index input (axes "S": each sequence's row; None: arange(S)), as the scan's
    ``s`` at ``ids``; the op-generic properties rely on that reading
    The testing kit's parts, each a callable or ``"module:attribute"`` text: make_case(seed,
    **dims) -> a case (``.op``, ``.dims``, ``.args()``, ``.cotangents``, ``.label``); cases(quick,
    seed) -> the fixed problems ``ssm-scan check`` runs; strategy() -> a hypothesis strategy of
    cases; properties: name -> Property, those that apply to this op; golden: name -> (what it
    exercises, make_case's keyword arguments, seed included), the fixed cases of ``ssm-scan vectors
    --op`` (None: its ``cases(quick=True, seed=0)``; the scan's are ssm_ref.testing.vectors.GOLDEN).
    letters: what each shape letter means.
    What a port's result may differ in, and what ``ssm-scan check`` adds, also declared here (the
    scan's; none for most ops): extras, the outputs a forward gives only when a keyword asks for
    them (the scan's snapshots, with snapshots=K); may_omit, the outputs and gradients a result may
    leave out (the scan's d_s: a 6-tuple or ggml's packed layout gives none); unpack(array, args,
    keywords, backward) -> arrays by name, the reading of a result given as one packed 1-D array
    (ValueError when it does not fit); scaled(table, T) -> the tolerance of a problem of T tokens;
    resident: a port's ``to_device`` arrays are inputs its functions take (``ssm-scan check`` runs
    its first problem so too); invariance(module, kind, seed) -> the bit-for-bit reports ("batch",
    "split") ``ssm-scan check`` prints as information, a kit part."""

    name: str
    summary: str
    inputs: tuple
    outputs: tuple
    grads: tuple
    forward: object
    backward: object
    check_forward: object
    check_backward: object
    tolerance: object = None
    state: tuple | None = None    # ((input, output), ...)
    make_case: object = None
    cases: object = None
    strategy: object = None
    properties: object = None
    golden: object = None
    letters: Mapping = field(default_factory=dict)
    extras: tuple = ()
    may_omit: tuple = ()
    unpack: object = None
    scaled: object = None
    resident: bool = False
    invariance: object = None

    # (the names below are derived once per op: the call paths read them)
    @cached_property
    def backward_name(self) -> str:
        return self.name + "_back"

    @cached_property
    def input_names(self) -> tuple:
        return tuple(a.name for a in self.inputs)

    @cached_property
    def output_names(self) -> tuple:
        return tuple(o.name for o in self.outputs)

    @cached_property
    def grad_names(self) -> tuple:
        return tuple(g.name for g in self.grads)

    @cached_property
    def cotangent_names(self) -> tuple:
        return tuple("g_" + o for o in self.output_names)

    @cached_property
    def float_inputs(self) -> tuple:
        return tuple(a.name for a in self.inputs if a.kind == "float")

    @cached_property
    def grad_of(self) -> dict:
        """Each float input's gradient (the first declared for it: the scan's d_s, not d_s0). Read it,
        do not change it: it is made once."""
        out: dict = {}
        for g in self.grads:
            out.setdefault(g.of, g.name)
        return out

    def tol(self, T: int | None = None) -> Mapping:
        """The tolerance table (the declared one, or what its function returns); given T, that of a
        problem of T tokens (``scaled``, where the op declares it)."""
        table = self.tolerance() if callable(self.tolerance) else self.tolerance
        return table if T is None or self.scaled is None else self.scaled(table, T)


OPS: dict[str, Op] = {}


def register(op: Op) -> Op:
    """Add ``op`` to :data:`OPS` (a module that declares an op calls this when imported); the same
    declaration again is a no-op, another one of the same name a ValueError."""
    if not isinstance(op, Op):
        raise TypeError(f"op: expected an ssm_ref.ops.Op, got {type(op).__name__}")
    have = OPS.get(op.name)
    if have is not None and have is not op:
        raise ValueError(f"op: {op.name!r} is declared already ({have.summary})")
    for names, what in ((op.input_names, "inputs"), (op.output_names, "outputs"), (op.grad_names, "grads")):
        if len(set(names)) != len(names):
            raise ValueError(f"op {op.name!r}: its {what} repeat a name: {names}")
    stray = [g.of for g in op.grads if g.of not in op.float_inputs]
    if stray:
        raise ValueError(f"op {op.name!r}: gradients of {stray}, which are no float inputs of it")
    if op.state is not None:
        pairs = op.state if isinstance(op.state, tuple) else ()
        bad = [p for p in pairs if not (isinstance(p, tuple) and len(p) == 2 and p[0] in op.input_names
                                        and p[1] in op.output_names)]
        if not pairs or bad:
            raise ValueError(f"op {op.name!r}: state must be a non-empty tuple of (input, output) pairs of its "
                             f"names, got {op.state!r}")
    OPS[op.name] = op
    return op


def get(name) -> Op:
    """The op declared as ``name``; ValueError naming the ops there are."""
    op = OPS.get(name) if isinstance(name, str) else None
    if op is None:
        raise ValueError(f"op: expected one of {', '.join(repr(k) for k in OPS)}, got {name!r}")
    return op


# The scan's parts in the spec. The public functions and the tolerance table import this module
# (their names and outputs are declared here), so the declaration reaches them when called.

def _scan(*args, **kw):
    from . import ssm_scan

    return ssm_scan(*args, **kw)


def _scan_back(*args, **kw):
    from . import ssm_scan_back

    return ssm_scan_back(*args, **kw)


def _scan_tolerance() -> Mapping:
    from .tolerance import F32_TOL  # (each bound with the measurement behind it)

    return F32_TOL


def _scan_scaled(table: Mapping, T: int) -> Mapping:
    from .tolerance import scaled

    return scaled(table, T)


def _scan_unpack(packed, args: Mapping, keywords: Mapping, backward: bool) -> dict:
    from .packing import unpack_result

    return unpack_result(packed, args, keywords, backward)


def _check_forward(*args, **kw):
    from .checks import check_forward

    return check_forward(*args, **kw)


def _check_backward(*args, **kw):
    from .checks import check_backward

    return check_backward(*args, **kw)


SCAN = register(Op(
    name="ssm_scan",
    summary="the Mamba selective scan, ggml's SSM_SCAN; its backward is ggmlR's SSM_SCAN_BACK",
    inputs=(
        Arg("s", "RHPN", "the state cache; sequence i starts from row ids[i]; None: zero start states (S, H, P, N)",
            optional=True),
        Arg("x", "STHP", "the input"),
        Arg("dt", "STH", "the step before its softplus"),
        Arg("A", "H", "the decay rates: (H,) or (H, 1) Mamba-2, (H, N) Mamba-1"),
        Arg("B", "STGN", "the input's projection into the state, per group"),
        Arg("C", "STGN", "the state's projection out, per group"),
        Arg("ids", "S", "the cache row of each sequence; None: arange(S)", optional=True, kind="index"),
    ),
    outputs=(
        Output("y", "STHP", "the output"),
        Output("states", "SHPN", "each sequence's final state"),
    ),
    grads=(
        Grad("d_s", "s", "RHPN", "the gradient of the cache: d_s0 scatter-added by ids"),
        Grad("d_s0", "s", "SHPN", "the gradient of each sequence's start state"),
        Grad("d_x", "x", "STHP", "the gradient of x"),
        Grad("d_dt", "dt", "STH", "the gradient of dt, through the softplus"),
        Grad("d_A", "A", "H", "the gradient of A, in A's shape"),
        Grad("d_B", "B", "STGN", "the gradient of B"),
        Grad("d_C", "C", "STGN", "the gradient of C"),
    ),
    forward=_scan,
    backward=_scan_back,
    check_forward=_check_forward,
    check_backward=_check_backward,
    tolerance=_scan_tolerance,
    state=(("s", "states"),),
    make_case="ssm_ref.testing.cases:make_problem",
    cases="ssm_ref.testing.cases:check_cases",
    strategy="ssm_ref.testing.strategies:problems",
    properties="ssm_ref.testing.properties:PROPERTIES",
    letters={"S": "sequences", "T": "tokens per sequence", "H": "heads", "P": "channels per head",
             "N": "state size", "G": "groups of heads sharing B and C", "R": "rows of the state cache",
             "K": "state snapshots (snapshots=K)"},
    extras=(Output("snapshots", "KSHPN", "the K state snapshots, with snapshots=K (docs/SPEC.md section 3.1)"),),
    may_omit=("d_s",),
    unpack=_scan_unpack,
    scaled=_scan_scaled,
    resident=True,
    invariance="ssm_ref.testing.properties.invariance:check_reports",
))


# ---- Mamba-3 (docs/SPEC.md, "Mamba-3"; ssm_ref.mamba3) ----

def _mamba3(*args, **kw):
    from . import mamba3_scan

    return mamba3_scan(*args, **kw)


def _mamba3_back(*args, **kw):
    from . import mamba3_scan_back

    return mamba3_scan_back(*args, **kw)


def _mamba3_check_forward(*args, **kw):
    from .mamba3_checks import check_mamba3_forward

    return check_mamba3_forward(*args, **kw)


def _mamba3_check_backward(*args, **kw):
    from .mamba3_checks import check_mamba3_backward

    return check_mamba3_backward(*args, **kw)


def _mamba3_tolerance() -> Mapping:
    from .tolerance import MAMBA3_F32_TOL  # (each bound with the measurement behind it)

    return MAMBA3_F32_TOL


_MIMO = "; MIMO: "   # where an array takes a rank axis with MIMO, ``what`` gives that shape

MAMBA3 = register(Op(
    name="mamba3_scan",
    summary="the Mamba-3 scan: a trapezoid-rule SSM with rotated keys and queries (RoPE by a running "
            "angle), SISO or MIMO rank M, mamba_ssm's mamba3 ops",
    inputs=(
        Arg("x", "STHP", "the value (mamba_ssm V)"),
        Arg("dt", "STH", "the step, already positive (mamba_ssm DT)"),
        Arg("dA", "STH", "the log decay A*dt (mamba_ssm ADT)"),
        Arg("lam", "STH", "the trapezoid's weight, after the sigmoid (mamba_ssm sigmoid(Trap))"),
        Arg("B", "STGN", "the key before bias and rotation (mamba_ssm K)" + _MIMO + "(S, T, M, G, N)"),
        Arg("C", "STGN", "the query before bias and rotation (mamba_ssm Q)" + _MIMO + "(S, T, M, G, N)"),
        Arg("B_bias", "HN", "the key's bias, per head (mamba_ssm K_bias)" + _MIMO + "(H, M, N)"),
        Arg("C_bias", "HN", "the query's bias, per head (mamba_ssm Q_bias)" + _MIMO + "(H, M, N)"),
        Arg("dtheta", "STHF", "the angle increments (mamba_ssm pi*tanh(Angles)*DT)"),
        Arg("psi", "HMP", "MIMO's value projection (mamba_ssm MIMO_V); None: ones; SISO: None", optional=True),
        Arg("s_theta", "RHF", "the start angles (cache rows); None: zeros (all four None or all given)",
            optional=True),
        Arg("s_h", "RHPN", "the start SSM state (cache rows); None: zeros", optional=True),
        Arg("s_k", "RHN", "the start key state, biased and rotated (cache rows); None: zeros" + _MIMO
            + "(R, H, M, N)", optional=True),
        Arg("s_v", "RHP", "the start value state (cache rows); None: zeros" + _MIMO + "(R, H, M, P)",
            optional=True),
        Arg("ids", "S", "the cache row of each sequence; None: arange(S) (None without states)", optional=True,
            kind="index"),
    ),
    outputs=(
        Output("y", "STHP", "the output, y_t = h_t q_t" + _MIMO + "(S, T, M, H, P), per rank"),
        Output("theta", "SHF", "each sequence's final angles, in [0, 2*pi)"),
        Output("h", "SHPN", "each sequence's final SSM state"),
        Output("k", "SHN", "each sequence's last key, biased and rotated" + _MIMO + "(S, H, M, N)"),
        Output("v", "SHP", "each sequence's last value (after psi)" + _MIMO + "(S, H, M, P)"),
    ),
    grads=(
        Grad("d_x", "x", "STHP", "the gradient of x"),
        Grad("d_dt", "dt", "STH", "the gradient of dt"),
        Grad("d_dA", "dA", "STH", "the gradient of dA"),
        Grad("d_lam", "lam", "STH", "the gradient of lam"),
        Grad("d_B", "B", "STGN", "the gradient of B, in B's shape"),
        Grad("d_C", "C", "STGN", "the gradient of C, in C's shape"),
        Grad("d_B_bias", "B_bias", "HN", "the gradient of B_bias, in its shape"),
        Grad("d_C_bias", "C_bias", "HN", "the gradient of C_bias, in its shape"),
        Grad("d_dtheta", "dtheta", "STHF", "the gradient of dtheta (through the mod 2*pi as 1)"),
        Grad("d_psi", "psi", "HMP", "the gradient of psi; None when psi is None"),
        Grad("d_s_theta", "s_theta", "RHF", "the start angles' gradient scatter-added by ids"),
        Grad("d_s_h", "s_h", "RHPN", "the start SSM state's gradient scatter-added by ids"),
        Grad("d_s_k", "s_k", "RHN", "the start key state's gradient scatter-added by ids"),
        Grad("d_s_v", "s_v", "RHP", "the start value state's gradient scatter-added by ids"),
    ),
    forward=_mamba3,
    backward=_mamba3_back,
    check_forward=_mamba3_check_forward,
    check_backward=_mamba3_check_backward,
    tolerance=_mamba3_tolerance,
    state=(("s_theta", "theta"), ("s_h", "h"), ("s_k", "k"), ("s_v", "v")),
    make_case="ssm_ref.testing.mamba3_cases:make_case",
    cases="ssm_ref.testing.mamba3_cases:cases",
    strategy="ssm_ref.testing.mamba3_cases:strategy",
    properties="ssm_ref.testing.properties.mamba3:PROPERTIES",
    golden="ssm_ref.testing.mamba3_cases:GOLDEN",
    letters={"S": "sequences", "T": "tokens per sequence", "H": "heads", "P": "channels per head",
             "N": "state size", "G": "groups of heads sharing B and C", "M": "MIMO rank (SISO: no rank axis)",
             "F": "rotated pairs (0 <= F <= N/2)", "R": "rows of the state cache"},
))
