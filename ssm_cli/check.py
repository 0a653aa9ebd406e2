"""``ssm-scan check``: every backend against the float64 reference of an op (the scan, or ``--op
NAME`` any op declared in ssm_ref.ops), with the op's tolerance table, by its declaration.

First the reference itself is checked: its gradients against finite differences of its forward.
Then each backend runs the forward and the backward of the op's fixed problems (its declared
``cases``; the scan's: Mamba-1 and Mamba-2, groups, permuted and shared cache rows, d_state that
is no power of two, ggml's layouts, K state snapshots) and every output is judged against the
reference with the op's tolerance (ssm_ref.tolerance, scaled as the op declares) -- the table the
test suite uses. What the op declares besides adds to it: the first problem again with a port's
device-resident inputs (``resident``), the bit-for-bit invariance rows (``invariance``).
"""

from __future__ import annotations

import time

import numpy as np

from . import backends as bk
from . import check_invariance, common
from .check_report import FD_SAMPLES, output_record, render
from .progress import Progress

HELP = "check every backend against the float64 reference; exit 1 on any result out of tolerance"
DESCRIPTION = """Check every backend against the float64 reference, with the tests' tolerance table.

Runs the forward and backward of a set of problems on every backend available here (or those
named by --backend), compares every output with the float64 reference (ssm_ref with dtype=float64,
itself checked against finite differences first) and prints, per backend and problem, where it
ran, the norm-relative error of each output and PASS/FAIL against the tolerance table of
ssm_ref/tolerance.py (the one the tests, ssm_ref.testing.verify and the fuzzer use; bounds grow as
T/16 beyond 16 tokens). Run it after installing a new driver. --op NAME checks another declared
op (mamba3_scan) on its own problems, by its declaration.

Exit code 1 when a result is out of tolerance or a backend raises; 2 when a backend named by
--backend cannot run here (no Vulkan device, no ggml build, ...): the message says why.

  ssm-scan check --quick             small problems, a few seconds per backend
  ssm-scan check --backend vk        the Vulkan backend must run (and pass)
  ssm-scan check --backend mypkg.myport   your own port (docs/PORTING.md, "The port interface")
  ssm-scan check --backend ./myport.py    ... named by its file
  ssm-scan check --backend ssm_ggml:CPU   ggml's own SSM_SCAN (the build in SSM_GGML_LIB), in a worker process

A port whose ssm_scan_back raises NotImplementedError (ggml: no SSM_SCAN_BACK) is checked on
its forward; its gradients are reported as not checked.

Two more rows per backend say whether it is batch invariant and split invariant here, bit for bit
(docs/SPEC.md section 3.2), on a few drawn arrangements (for ssm_vk also two of its invariant mode,
"ssm_vk invariant=True"): per output "=" (the same bits in every
arrangement), "diff" (some entries differ), "-" (not compared: d_A is a sum over sequences and
tokens). That is information, not part of the correctness contract: it never changes the exit
code.

The problems of K state snapshots (snapshots=K, docs/SPEC.md section 3.1) run on the backends
that declare SNAPSHOTS (docs/PORTING.md, "The port interface"): their snapshot slots are checked
too (ggml's: the slots k < T it writes), the backward with the snapshots' loss term. They are
listed as not run on a backend that declares none, or whose supports() declines them (a ggml
build without K)."""

FD_H = 1e-3           # SPEC.md section 10: 4th-order stencil, truncation and rounding near 1e-12
FD_RTOL, FD_ATOL = 1e-7, 1e-11


def add_arguments(p) -> None:
    from ssm_ref.testing.cases import CHECK_MORE, CHECK_QUICK

    p.add_argument("--quick", action="store_true", help=f"only the {len(CHECK_QUICK)} small problems "
                                                        f"(default: all {len(CHECK_QUICK) + len(CHECK_MORE)})")
    common.add_backend(p, "check")
    common.add_op(p)
    common.add_device(p)
    common.add_isolate(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    common.add_json(p)
    common.add_verbose(p)


def fd_check(op, args: dict, cotangents: dict, rng, keywords: dict | None = None) -> dict:
    """The float64 reference's gradients of ``op`` (ssm_ref.ops) against finite differences of its
    forward, on :data:`FD_SAMPLES` entries of every float input given (not None), the loss the sum
    of each output times its cotangent, ``keywords`` (a case's, such as Mamba-3's rotation) passed
    to every call: {gradient: (max |fd - analytic|, bound)}."""
    from ssm_ref.testing.properties.generic import output_of, reference_of

    args = {k: (np.asarray(v, dtype=np.float64) if v is not None and np.asarray(v).dtype.kind == "f" else v)
            for k, v in args.items()}
    cot = {k: np.asarray(v, dtype=np.float64) for k, v in cotangents.items()}
    kw = dict(keywords or {})
    grads = reference_of(op, args, cot, kw)

    def loss(**over) -> float:
        r = op.forward(*(over.get(n, args.get(n)) for n in op.input_names), dtype=np.float64, **kw)
        return float(sum(np.sum(np.asarray(output_of(r, o)) * cot["g_" + o]) for o in op.output_names))

    out = {}
    for name, gname in op.grad_of.items():
        if args.get(name) is None or grads.get(gname) is None or np.asarray(args[name]).size == 0:
            continue
        base = args[name]
        grad = np.asarray(grads[gname], dtype=np.float64)
        fds, ans = [], []
        for flat in rng.choice(base.size, size=min(FD_SAMPLES, base.size), replace=False):
            i = np.unravel_index(flat, base.shape)
            f = {}
            for k in (-2, -1, 1, 2):
                moved = base.copy()
                moved[i] += k * FD_H
                f[k] = loss(**{name: moved})
            fds.append((f[-2] - 8 * f[-1] + 8 * f[1] - f[2]) / (12 * FD_H))
            ans.append(grad[i])
        fds_a, ans_a = np.array(fds), np.array(ans)
        err = float(np.max(np.abs(fds_a - ans_a))) if fds else 0.0
        bound = FD_RTOL * float(np.max(np.abs(fds_a), initial=0.0)) + FD_ATOL
        out[gname] = (err, bound)
    return out


def _name(c) -> str:
    return c.name or c.label


def _calls(port, op, c, device_resident: bool = False):
    """Forward and backward of ``port`` on case ``c`` through ssm_ref.testing.ports (the reading
    verify and the fuzzer use), the case's keywords with them (K state snapshots included);
    ``device_resident``: its float inputs and the cotangents through the port's ``to_device``.
    (forward PortResult, backward PortResult or the NotImplementedError of a port without a
    backward, seconds)."""
    from ssm_ref.testing import ports

    args, cot = c.args(), dict(c.cotangents)
    if device_resident:
        args = {k: (port.to_device(v) if isinstance(v, np.ndarray) and k in op.float_inputs else v)
                for k, v in args.items()}
        cot = {k: port.to_device(v) for k, v in cot.items()}
    t0 = time.perf_counter()
    r = ports.call_op(port, op, args, keywords=ports.case_keywords(c))
    try:
        g = ports.call_op(port, op, args, cot, ports.case_keywords(c, backward=True))
    except NotImplementedError as e:
        g = e
    return r, g, time.perf_counter() - t0


def reference(op, c) -> dict:
    """The op's float64 reference on case ``c``, read as a port's results are: outputs (the
    extras the case asks for, such as K snapshots, too) and gradients by name."""
    from ssm_ref.testing import ports

    r, g, _ = _calls(ports.reference_port(op), op, c)
    return {**r.arrays, **g.arrays}


def not_run(b: bk.Backend, op, c) -> str:
    """Why ``b`` does not run case ``c`` ("" when it does): a problem of K > 1 state snapshots on a
    backend that declares no SNAPSHOTS, or whose supports() declines them."""
    from ssm_ref.testing import ports

    if getattr(c, "K", 1) == 1:
        return ""
    args = c.args()
    try:
        sup = ports.support(b.module.supports(op.name, *(args.get(n) for n in op.input_names),
                                              **ports.case_keywords(c)))
    except Exception:  # no snapshots keyword, or a supports() that raises: the run reports it
        sup = None
    if not ports.snapshot_kind(b.module):   # its supports' reason says why, when it has one (ggml's)
        return (sup.reason if sup is not None and not sup.ok and sup.reason
                else "takes no snapshots=K (declares no SNAPSHOTS; docs/PORTING.md)")
    return "" if sup is None or sup.ok else sup.reason or "its supports() declines it"


def check_backend(b: bk.Backend, op, c, want: dict, device_resident: bool = False) -> dict:
    """Run one backend on one case and compare every output it gives with the reference ``want``,
    with the op's tolerance for the case's T. An output the port does not give (the scan's d_s
    from a 6-tuple or the packed layout) is listed in ``not_given``; an exception is recorded
    with its traceback. A case of K > 1 state snapshots: the snapshot slots the backend's
    SNAPSHOTS says it writes, against the states' bound."""
    from ssm_ref.testing import ports
    from ssm_ref.tolerance import compare

    label = _name(c) + (" (device)" if device_resident else "")
    row = {"backend": b.name, "problem": label, "ok": False, "where": "-", "computed_by": None,
           "outputs": {}, "not_given": [], "no_backward": None, "error": None, "traceback": None}
    try:
        r, g, row["seconds"] = _calls(b.module, op, c, device_resident)
    except Exception as e:  # a broken backend is a failed check, reported, not a crash
        row["error"], row["traceback"] = ports.error_text(e), ports.traceback_text(e) or None
        return row
    if isinstance(g, NotImplementedError):
        row["no_backward"] = ports.error_text(g)
        g = ports.PortResult(op.backward_name, {}, r.where, r.backend)
    row["where"] = "/".join(sorted({r.where, g.where}))
    row["computed_by"] = "/".join(sorted({r.backend, g.backend}))
    got = {**r.arrays, **g.arrays}
    tol = op.tol(c.dims.get("T"))
    ok = True
    for name in (*op.output_names, *op.grad_names):
        if name not in got:
            if not (row["no_backward"] and name in op.grad_names):
                row["not_given"].append(name)
            continue
        if got[name] is None or want.get(name) is None:
            continue        # the gradient of an input the case left None (d_psi): nothing to check
        cmp = compare(name, got[name], want[name], tol[name])
        row["outputs"][name] = output_record(cmp, f"{b.name} {label}")
        ok &= cmp.ok
    K = getattr(c, "K", 1)
    if K > 1:
        n = ports.compared_slots(ports.snapshot_kind(b.module), K, c.dims["T"])
        if "snapshots" not in got:
            row["not_given"].append("snapshots")
            ok = False
        else:
            cmp = compare("snapshots", got["snapshots"][:n], want["snapshots"][:n], tol["states"])
            row["outputs"]["snapshots"] = output_record(cmp, f"{b.name} {label}")
            ok &= cmp.ok
    row["ok"] = ok
    return row


def run(args) -> int:
    import ssm_ref
    from ssm_ref.testing import ports
    from ssm_ref.testing.properties.generic import keywords_of

    common.check_json_dest(args)
    names = common.split_list(args.backend, "--backend")
    backs = bk.require(bk.resolve(names or None, args.device, ggml_isolate=not args.in_process, op=args.op))
    op = ssm_ref.ops.get(args.op)
    cases = list(ports.kit_part(op, "cases")(quick=bool(args.quick), seed=args.seed))
    in_ref = op.forward.__module__.partition(".")[0] == "ssm_ref"
    report = {"ok": True, "op": op.name, "reference": "ssm_ref" if in_ref else f"{op.name}'s reference in",
              "quick": bool(args.quick), "seed": args.seed, "columns": [*op.output_names, *op.grad_names],
              "tolerance": {k: {"rtol": t.rtol, "atol": t.atol} for k, t in op.tol().items()},
              "problems": [{"name": _name(c), "dims": c.dims, "what": c.what} for c in cases],
              "backends": [{"name": b.name, "available": b.available, "reason": b.reason,
                            "where": b.where() if b.available else None} for b in backs],
              "oracle": {}, "runs": [], "not_run": [], "invariance": []}
    runnable = [b for b in backs if b.available]
    resident = [b for b in runnable if op.resident and hasattr(b.module, "to_device")]
    prog = Progress(len(cases) * (1 + len(runnable)) + len(resident)
                    + (len(runnable) if op.invariance is not None else 0), args.verbose)
    wants = []
    try:
        for k, c in enumerate(cases):
            prog.update(f"oracle (float64) on {_name(c)}")
            wants.append(reference(op, c))
            if k < 2:
                fd = fd_check(op, c.args(), c.cotangents, np.random.default_rng(args.seed + 100 + k), keywords_of(c))
                report["oracle"][_name(c)] = {n: {"err": e, "bound": bd, "ok": e <= bd} for n, (e, bd) in fd.items()}
            prog.update(f"oracle (float64) on {_name(c)}", advance=1)
        for b in runnable:
            for k, (c, want) in enumerate(zip(cases, wants, strict=True)):
                prog.update(f"{b.name} on {_name(c)}")
                why = not_run(b, op, c)
                if why:
                    report["not_run"].append({"backend": b.name, "problem": _name(c), "reason": why})
                else:
                    report["runs"].append(check_backend(b, op, c, want))
                if k == 0 and b in resident:
                    prog.update(f"{b.name} on {_name(c)}, device-resident inputs", advance=1)
                    report["runs"].append(check_backend(b, op, c, want, device_resident=True))
                prog.update(f"{b.name} on {_name(c)}", advance=1)
            if op.invariance is not None:
                prog.update(f"{b.name}: batch and split invariance")
                report["invariance"] += check_invariance.rows(b, op, args.seed)
                prog.update(f"{b.name}: batch and split invariance", advance=1)
    finally:
        prog.close()
    report["oracle_ok"] = all(v["ok"] for per in report["oracle"].values() for v in per.values())
    report["ok"] = report["oracle_ok"] and all(r["ok"] for r in report["runs"])   # invariance: information only
    common.say(args, render(report))
    common.write_json(args, report)
    return common.EXIT_OK if report["ok"] else common.EXIT_FAIL
