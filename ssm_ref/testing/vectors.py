"""Golden vectors: a fixed, documented set of cases with their inputs and the float64 oracle's
outputs, in memory or on disk for ports in any language (docs/PORTING.md).

    cases = golden_cases()                  # list[Golden], computed now by ssm_ref
    write_vectors("golden/")                # manifest.json + <case>.bin + <case>.npz
    cases = read_vectors("golden/")         # the same list, read back (from the .bin files)

On disk, per case, one raw little-endian ``<case>.bin`` (arrays back to back, each at an offset
that is a multiple of 8) and one ``<case>.npz`` with the same arrays by name; ``manifest.json``
lists every array's name, role, dtype, shape (numpy order), ggml ``ne`` (reversed), offset and
byte count, plus the tolerance table. Arrays of a case:

    inputs    s x dt A B C (float32; A in the shape the case gives it), ids (int32),
              g_y g_states (float32), g_packed (float32: g_y | g_states, the packed layout)
    expected  y states d_s d_s0 d_x d_dt d_A d_B d_C (float64: the oracle),
              fwd_packed (float32: y | states, ggml SSM_SCAN),
              bwd_packed (float32: d_s0 | d_x | d_dt | d_A | d_B | d_C, ggmlR SSM_SCAN_BACK)

The cases of state snapshots (``snapshots_*``, docs/SPEC.md section 3.1) have ``K`` in their dims
and, besides, ``snapshots`` (float64, (K, S, H, P, N): slot k the state after T - k tokens, slot
T the start state, slots k > T NaN) among the expected arrays; with K > 1 also ``g_snapshots``
(float32, (K, S, H, P, N)) after g_packed among the inputs, g_states all zeros (slot 0 of
g_snapshots is the final state's gradient), g_packed and fwd_packed in the layout with K slots
(g_y | g_snapshots, y | snapshots), and the gradients those of sum(y * g_y) + sum(snapshots *
g_snapshots). ggml writes only the slots k < T (ssm_ref.testing.ports, "ggml").

Any other declared op (ssm_ref.ops; ``op=`` of each function) has golden vectors by its
declaration: its fixed cases (``Op.golden``: name -> (what it exercises, make_case's keyword
arguments, seed included); without one, its ``cases(quick=True, seed=0)``), the inputs by the
op's names (float32; index inputs int32; an optional input left None is not written), the
cotangents (``g_`` + each output), and as expected arrays every output and gradient of the float64
reference (a gradient the reference gives as None, such as Mamba-3's d_psi without psi, is not
written). No packed layouts: those are ggml's SSM_SCAN's. The manifest names the op of every case
(``"op"``; absent: ssm_scan) and the keyword arguments of its calls (``"keywords"``: Mamba-3's
rotation).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ssm_ref import ops
from ssm_ref.ops import SCAN
from ssm_ref.tolerance import F32_TOL, T_MEASURED

from .cases import Case, make_problem

__all__ = ["GOLDEN", "Golden", "golden_cases", "golden_table", "read_vectors", "write_case", "write_vectors"]

FORMAT = "ssm-scan golden vectors 1"
INPUTS = (*SCAN.input_names, *SCAN.cotangent_names, "g_packed")                     # s .. ids, g_y, g_states
EXPECTED = (*SCAN.output_names, *SCAN.grad_names, "fwd_packed", "bwd_packed")       # y, states, d_s .. d_C

# name -> (what it exercises, make_problem arguments). Fixed seeds: the values never change.
GOLDEN = {
    "tiny_mamba2": ("the smallest interesting case: Mamba-2, A of shape (H,), one group",
                    dict(seed=101, S=1, T=3, H=2, P=2, N=4, G=1, ids="none")),
    "mamba1_groups": ("Mamba-1 (A of shape (H, N)), two groups, ids permuted into a cache of R > S rows",
                      dict(seed=102, S=2, T=5, H=4, P=3, N=5, G=2, R=3, ids="permutation", variant="mamba1")),
    "shared_rows": ("ids [2, 0, 2]: two sequences read one row, row 1 is read by none; d_s != d_s0; "
                    "A of shape (H, 1)", dict(seed=103, S=3, T=4, H=2, P=2, N=3, G=1, R=4, ids=[2, 0, 2],
                                              a_form="h1")),
    "no_tokens": ("T = 0: empty y, states = s[ids], d_s0 = g_states, d_A = 0",
                  dict(seed=104, S=2, T=0, H=2, P=2, N=3, G=1, R=3, ids="permutation")),
    "one_token": ("T = 1, three groups of one head", dict(seed=105, S=2, T=1, H=3, P=2, N=2, G=3, ids="identity")),
    "softplus_branches": ("dt exactly 20 (log branch), above 20 (identity), below -20 (float32 softplus is 0)",
                          dict(seed=106, S=2, T=6, H=2, P=2, N=3, G=1, ids="none", regime="wide_dt")),
    "small_A": ("A within 1e-3 of 0, some exactly 0", dict(seed=107, S=2, T=5, H=2, P=3, N=4, G=2,
                                                         variant="mamba1", regime="small_A")),
    "long_decay": ("T = 128 with decay exp(d*A) in [0.99, 0.9995]: the tolerance is scaled by T / 16",
                   dict(seed=108, S=1, T=128, H=2, P=2, N=4, G=1, ids="none", regime="long_decay")),
    "ggml_shape": ("d_state 128, head_dim 16: a shape ggml's own Vulkan kernel accepts",
                   dict(seed=109, S=1, T=4, H=2, P=16, N=128, G=1, ids="none")),
    "overflow": ("heads 0, 1: A > 0 large, exp overflows (head 0 only in sequence 0); head 2 typical: "
                 "outputs hold inf and nan at defined places",
                 dict(seed=110, S=2, T=3, H=3, P=2, N=3, G=1, ids="identity", regime="overflow")),
    # State snapshots (snapshots=K): Mamba-2 only, as ggml defines them.
    "snapshots_k1": ("K = 1: the one snapshot slot is the final states",
                     dict(seed=111, S=2, T=3, H=2, P=2, N=3, G=1, R=3, ids="permutation", K=1)),
    "snapshots_k2": ("K = 2: the final states and the state one token before, two groups",
                     dict(seed=112, S=2, T=5, H=4, P=2, N=4, G=2, R=3, ids="permutation", K=2)),
    "snapshots_k4": ("K = 4 over T = 6 tokens, two sequences on one cache row, A of shape (H, 1)",
                     dict(seed=113, S=3, T=6, H=2, P=3, N=5, G=1, R=3, ids=[1, 0, 1], a_form="h1", K=4)),
    "snapshots_k4_short": ("K = 4 over T = 2 tokens (T < K): slot 2 is the start state s[ids], slot 3 NaN "
                           "(ggml leaves slots 2 and 3 unwritten)",
                           dict(seed=114, S=2, T=2, H=2, P=2, N=4, G=2, R=4, ids="unused", K=4)),
}


@dataclass(frozen=True)
class Golden:
    """One golden case: ``inputs`` and ``expected`` arrays by name (see the module docstring),
    its dims (S T H P N G R, and K for a case of snapshots; another op's own letters), the op it is
    a case of, the keyword arguments of its calls, and the tolerance table for its T."""

    name: str
    description: str
    dims: dict
    variant: str
    regime: str
    inputs: dict
    expected: dict
    op: str = SCAN.name
    keywords: dict = field(default_factory=dict)

    @property
    def tol(self) -> dict:
        from ssm_ref.tolerance import scaled

        if self.op != SCAN.name:
            return dict(ops.get(self.op).tol())
        return scaled(F32_TOL, self.dims["T"])

    @property
    def K(self) -> int:
        """The state snapshots the case asks for (1 for the cases without snapshots)."""
        return int(self.dims.get("K", 1))


def _golden(name: str, description: str, case: Case, snapshots: bool = False) -> Golden:
    """One golden case; ``snapshots``: a case of state snapshots (always when case.K > 1)."""
    import ssm_ref

    a = case.args()
    ids = np.asarray(case.ids, dtype=np.int32)                # explicit, ggml's id type
    K = case.K
    g_states = case.g_states if K == 1 else np.zeros_like(case.g_states)   # slot 0 of g_snapshots is its
    r = ssm_ref.ssm_scan(**{**a, "ids": ids}, dtype=np.float64, snapshots=K)
    g = ssm_ref.ssm_scan_back(**{**a, "ids": ids}, g_y=case.g_y, g_states=g_states, dtype=np.float64,
                              g_snapshots=case.g_snapshots if K > 1 else None)
    inputs = {k: a[k] for k in SCAN.float_inputs}
    inputs.update(ids=ids, g_y=case.g_y, g_states=g_states,
                  g_packed=ssm_ref.pack_forward(case.g_y, g_states if K == 1 else case.g_snapshots))
    if K > 1:
        inputs["g_snapshots"] = case.g_snapshots
    expected = {"y": r.y, "states": r.states, **({"snapshots": r.snapshots} if snapshots or K > 1 else {}),
                **g.as_dict(), "fwd_packed": r.packed(), "bwd_packed": g.packed()}
    dims = dict(case.dims)
    if snapshots or K > 1:
        dims["K"] = K
    return Golden(name=name, description=description, dims=dims, variant=case.variant,
                  regime=case.regime, inputs=inputs, expected=expected)


def golden_table(op=SCAN) -> dict:
    """The golden cases of ``op`` (an Op or its name): name -> (what it exercises, keyword arguments
    of its case maker, seed included). The scan's is :data:`GOLDEN`; another op's its declared
    ``golden`` (else its ``cases(quick=True, seed=0)``, named ``<op>_<k>``, recipe None)."""
    from . import ports

    op = ops.get(op) if isinstance(op, str) else op
    if op.name == SCAN.name:
        return GOLDEN
    if op.golden is not None:
        return dict(ports.kit_part(op, "golden"))
    return {f"{op.name}_{k}": (c.label, None) for k, c in enumerate(ports.kit_part(op, "cases")(quick=True, seed=0))}


def _op_golden(op: ops.Op, name: str, description: str, case) -> Golden:
    """One golden case of an op other than the scan, from its OpCase (module docstring)."""
    from .properties.generic import keywords_of, reference_of

    args, cot = case.args(), case.cotangents
    kw = keywords_of(case)
    want = reference_of(op, case.args(np.float64), cot, kw)
    index = {a.name for a in op.inputs if a.kind == "index"}
    inputs = {n: (args[n].astype(np.int32) if n in index else args[n])
              for n in op.input_names if args.get(n) is not None}
    inputs.update({n: np.asarray(cot[n], np.float32) for n in op.cotangent_names if cot.get(n) is not None})
    expected = {n: want[n] for n in (*op.output_names, *op.grad_names) if want.get(n) is not None}
    return Golden(name=name, description=description, dims=dict(case.dims), variant="", regime=case.regime,
                  inputs=inputs, expected=expected, op=op.name, keywords=kw)


def golden_cases(names=None, op=SCAN) -> list[Golden]:
    """The golden cases of ``op`` (the scan by default; an Op or its name): all of its table
    (:func:`golden_table`) or those named, computed with ssm_ref's float64 oracle. Raises KeyError
    for an unknown name."""
    from . import ports

    op = ops.get(op) if isinstance(op, str) else op
    table = golden_table(op)
    out = []
    for name in (table if names is None else names):
        description, recipe = table[name]
        if op.name == SCAN.name:
            kw = dict(recipe)
            out.append(_golden(name, description, make_problem(kw.pop("seed"), **kw), snapshots="K" in recipe))
        elif recipe is None:       # an op without a golden table: its fixed cases, in order
            case = ports.kit_part(op, "cases")(quick=True, seed=0)[list(table).index(name)]
            out.append(_op_golden(op, name, description, case))
        else:
            kw = dict(recipe)
            out.append(_op_golden(op, name, description, ports.kit_part(op, "make_case")(kw.pop("seed"), **kw)))
    return out


def _layout(g: Golden) -> list[dict]:
    entries, offset = [], 0
    for role, arrays in (("input", g.inputs), ("expected", g.expected)):
        for k, v in arrays.items():
            v = np.asarray(v)
            nbytes = v.size * v.dtype.itemsize
            entries.append({"name": k, "role": role, "dtype": v.dtype.name, "shape": list(v.shape),
                            "ne": list(v.shape[::-1]), "offset": offset, "nbytes": nbytes})
            offset += -(-nbytes // 8) * 8
    return entries


def write_vectors(out_dir, names=None, op=SCAN) -> Path:
    """Write the golden cases of ``op`` (the scan by default) to ``out_dir`` (created if needed);
    returns the manifest's path."""
    return _write(out_dir, golden_cases(names, op))


def write_case(out_dir, case, name: str, description: str = "") -> Path:
    """Write one drawn or rebuilt case (a fuzzer's shrunk failure, say) as golden vectors in
    ``out_dir``, in the format of :func:`write_vectors` (a manifest.json of one case,
    ``<name>.bin`` and ``<name>.npz``); the expected outputs are the float64 oracle's. ``case``:
    a scan :class:`ssm_ref.testing.cases.Case` or another op's OpCase. Returns the manifest's path."""
    if isinstance(case, Case):
        return _write(out_dir, [_golden(name, description, case)])
    return _write(out_dir, [_op_golden(ops.get(case.op), name, description, case)])


def _write(out_dir, goldens: list[Golden]) -> Path:
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    import ssm_ref

    cases = []
    for g in goldens:
        layout = _layout(g)
        blob = bytearray(layout[-1]["offset"] + layout[-1]["nbytes"] if layout else 0)
        arrays = {**g.inputs, **g.expected}
        for e in layout:
            v = np.ascontiguousarray(arrays[e["name"]])
            le = v.astype(v.dtype.newbyteorder("<"), copy=False)
            blob[e["offset"]:e["offset"] + e["nbytes"]] = le.tobytes()
        (d / f"{g.name}.bin").write_bytes(bytes(blob))
        np.savez(d / f"{g.name}.npz", **arrays)
        cases.append({"name": g.name, "description": g.description, "op": g.op, "keywords": g.keywords,
                      "dims": g.dims, "variant": g.variant,
                      "regime": g.regime, "bin": f"{g.name}.bin", "npz": f"{g.name}.npz",
                      "tolerance": {k: {"rtol": t.rtol, "atol": t.atol} for k, t in g.tol.items()},
                      "arrays": layout})
    manifest = {
        "format": FORMAT, "ssm_ref_version": ssm_ref.__version__, "byte_order": "little",
        "ops": sorted({g.op for g in goldens}),
        "layout": "C order (numpy shape; ggml ne is the reverse); offsets are multiples of 8",
        "expected_precision": "float64 oracle for structured outputs; packed blocks rounded to float32",
        "tolerance_rule": "||got - want||_2 <= rtol * ||want||_2 + atol * sqrt(size), over finite entries; "
                          f"non-finite entries (nan, +inf, -inf) must match exactly; each case's table is the one to "
                          f"use (ssm_scan's: scaled by T / {T_MEASURED} when T > {T_MEASURED}, already applied)",
        "cases": cases,
    }
    path = d / "manifest.json"
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return path


def read_vectors(in_dir) -> list[Golden]:
    """Read cases written by :func:`write_vectors` from their ``.bin`` files and the manifest.
    Raises ValueError for another format or a file whose size disagrees with the manifest."""
    d = Path(in_dir)
    manifest = json.loads((d / "manifest.json").read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{d / 'manifest.json'}: expected format {FORMAT!r}, got {manifest.get('format')!r}")
    out = []
    for c in manifest["cases"]:
        blob = (d / c["bin"]).read_bytes()
        arrays = {"input": {}, "expected": {}}
        for e in c["arrays"]:
            end = e["offset"] + e["nbytes"]
            if end > len(blob):
                raise ValueError(f"{c['bin']}: {e['name']} ends at byte {end}, the file has {len(blob)}")
            dt = np.dtype(e["dtype"]).newbyteorder("<")
            v = np.frombuffer(blob[e["offset"]:end], dtype=dt).reshape(e["shape"])
            arrays[e["role"]][e["name"]] = v.astype(dt.newbyteorder("="))
        out.append(Golden(name=c["name"], description=c["description"], dims=c["dims"], variant=c["variant"],
                          regime=c["regime"], inputs=arrays["input"], expected=arrays["expected"],
                          op=c.get("op", SCAN.name), keywords=dict(c.get("keywords") or {})))
    return out
