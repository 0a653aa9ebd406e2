"""``ssm-scan check``: every backend against the float64 oracle, with the tests' tolerance table.

First the oracle itself is checked: its gradients against finite differences of its forward.
Then each backend runs the forward and the backward of a set of problems (Mamba-1 and Mamba-2,
groups, permuted and shared cache rows, d_state that is no power of two, ggml's layouts) and every
output is judged against the oracle with ``ssm_ref.tolerance`` -- the table the test suite uses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ssm_ref.ops import SCAN

from . import backends as bk
from . import check_invariance, check_op, common
from .check_report import output_record, render
from .progress import Progress
from .shapes import SHAPES, Shape, make_inputs

HELP = "check every backend against the float64 reference; exit 1 on any result out of tolerance"
DESCRIPTION = """Check every backend against the float64 reference, with the tests' tolerance table.

Runs the forward and backward of a set of problems on every backend available here (or those
named by --backend), compares every output with the float64 reference (ssm_ref with dtype=float64,
itself checked against finite differences first) and prints, per backend and problem, where it
ran, the norm-relative error of each output and PASS/FAIL against the tolerance table of
ssm_ref/tolerance.py (the one the tests, ssm_ref.testing.verify and the fuzzer use; bounds grow as
T/16 beyond 16 tokens). Run it after installing a new driver.

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


@dataclass(frozen=True)
class Problem:
    name: str
    shape: Shape
    R: int | None = None     # rows of the state cache (default S)
    ids: str = "none"        # "none" | "permutation" | "duplicates"
    what: str = ""
    K: int = 1               # state snapshots (snapshots=K)


QUICK = (
    Problem("mamba2", Shape("mamba2", N=16, P=8, H=4, G=2, T=16, S=2), R=3, ids="permutation",
            what="Mamba-2, 2 groups, 2 of 3 cache rows in shuffled order"),
    Problem("mamba1", Shape("mamba1", N=16, P=1, H=8, G=1, T=20, S=1, mamba1=True),
            what="Mamba-1: A (H, N)"),
    Problem("shared-rows", Shape("shared-rows", N=5, P=3, H=2, G=1, T=17, S=3), R=2, ids="duplicates",
            what="3 sequences on 2 cache rows, N = 5 (no power of two)"),
    Problem("ggml", Shape("ggml", N=128, P=16, H=2, G=1, T=8, S=1),
            what="a layout ggml's Vulkan kernels take: d_state 128, head_dim 16"),
    Problem("snapshots", Shape("snapshots", N=16, P=8, H=4, G=2, T=3, S=2), R=3, ids="permutation", K=4,
            what="K = 4 state snapshots over T = 3 tokens: slot 3 the start state, ggml writes slots 0-2"),
)
FULL = (
    *QUICK,
    Problem("demo", SHAPES["demo"], what="the demo shape (Mamba-2, d_state 128, head_dim 64)"),
    Problem("n256", Shape("n256", N=256, P=16, H=4, G=2, T=40, S=2), what="d_state 256, 2 groups"),
    Problem("n256-odd", Shape("n256-odd", N=256, P=16, H=3, G=1, T=9, S=1),
            what="d_state 256 with H*P = 48, no multiple of 32 (a layout ggml's Vulkan kernel takes)"),
    Problem("mamba1-long", Shape("mamba1-long", N=16, P=1, H=64, G=1, T=300, S=2, mamba1=True),
            what="Mamba-1, T not a multiple of the checkpoint interval"),
    Problem("many-groups", Shape("many-groups", N=64, P=32, H=8, G=4, T=33, S=3), R=5, ids="permutation",
            what="4 groups, 3 of 5 cache rows"),
    Problem("no-tokens", Shape("no-tokens", N=8, P=4, H=2, G=1, T=0, S=2), what="T = 0"),
    Problem("snapshots-long", Shape("snapshots-long", N=128, P=16, H=4, G=2, T=40, S=2), K=5,
            what="K = 5 state snapshots of a 40-token scan, d_state 128"),
)
FD_PROBLEMS = ("mamba2", "mamba1")


def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true", help=f"only the {len(QUICK)} small problems "
                                                        f"(default: all {len(FULL)})")
    common.add_backend(p, "check")
    common.add_op(p)
    common.add_device(p)
    common.add_isolate(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    common.add_json(p)
    common.add_verbose(p)


def _run_one(mod, kw, g_y, g_states, device_resident: bool, K: int = 1, g_snapshots=None):
    """Forward and backward of ``mod`` through ssm_ref.testing.ports (the reading verify and the fuzzer
    use), with K state snapshots: (forward PortResult, backward PortResult or the
    NotImplementedError of a port without a backward, seconds)."""
    from ssm_ref.testing import ports

    if device_resident:
        kw = {k: (mod.to_device(v) if isinstance(v, np.ndarray) and k != "ids" else v) for k, v in kw.items()}
        g_y, g_states = mod.to_device(g_y), mod.to_device(g_states)
    name = ports.port_name(mod)
    pos = ports.args_of(kw)
    t0 = time.perf_counter()
    r = ports.call(mod.ssm_scan, "ssm_scan", pos, backend=name, K=K)
    try:
        g = ports.call(mod.ssm_scan_back, "ssm_scan_back", (*pos, g_y, g_states), backend=name, K=K,
                       g_snapshots=g_snapshots)
    except NotImplementedError as e:
        g = e
    return r, g, time.perf_counter() - t0


def not_run(b: bk.Backend, prob: Problem, kw) -> str:
    """Why ``b`` does not run ``prob`` ("" when it does): a problem of K > 1 state snapshots on a
    backend that declares no SNAPSHOTS, or whose supports() declines them."""
    from ssm_ref.testing import ports

    if prob.K == 1:
        return ""
    try:
        sup = ports.support(b.module.supports("ssm_scan", *ports.args_of(kw), snapshots=prob.K))
    except Exception:  # no snapshots keyword, or a supports() that raises: the run reports it
        sup = None
    if not ports.snapshot_kind(b.module):   # its supports' reason says why, when it has one (ggml's)
        return (sup.reason if sup is not None and not sup.ok and sup.reason
                else "takes no snapshots=K (declares no SNAPSHOTS; docs/PORTING.md)")
    return "" if sup is None or sup.ok else sup.reason or "its supports() declines it"


def check_backend(b: bk.Backend, prob: Problem, kw, g_y, g_states, oracle, device_resident=False,
                  g_snapshots=None) -> dict:
    """Run one backend on one problem and compare every output it gives with the oracle, with the
    tolerance table scaled for the problem's T (ssm_ref.tolerance.scaled). An output the port
    does not give (d_s from a 6-tuple or the packed layout) is listed in ``not_given``; an
    exception is recorded with its traceback. A problem of K > 1 state snapshots: the snapshot
    slots the backend's SNAPSHOTS says it writes, against the states' bound."""
    from ssm_ref.testing import ports
    from ssm_ref.tolerance import F32_TOL, OUTPUTS, compare, scaled

    label = prob.name + (" (device)" if device_resident else "")
    row = {"backend": b.name, "problem": label, "ok": False, "where": "-", "computed_by": None,
           "outputs": {}, "not_given": [], "no_backward": None, "error": None, "traceback": None}
    try:
        r, g, secs = _run_one(b.module, kw, g_y, g_states, device_resident, prob.K, g_snapshots)
    except Exception as e:  # a broken backend is a failed check, reported, not a crash
        row["error"] = ports.error_text(e)
        row["traceback"] = ports.traceback_text(e) or None
        return row
    row["seconds"] = secs
    if isinstance(g, NotImplementedError):
        row["no_backward"] = ports.error_text(g)
        g = ports.PortResult("ssm_scan_back", {}, r.where, r.backend)
    row["where"] = "/".join(sorted({r.where, g.where}))
    row["computed_by"] = "/".join(sorted({r.backend, g.backend}))
    got = {**r.arrays, **g.arrays}
    tol = scaled(F32_TOL, prob.shape.T)
    ok = True
    for out in OUTPUTS:
        if row["no_backward"] and out not in SCAN.output_names:
            continue
        if out not in got:
            row["not_given"].append(out)
            continue
        c = compare(out, got[out], oracle[out], tol[out])
        row["outputs"][out] = output_record(c, f"{b.name} {label}")
        ok &= c.ok
    if prob.K > 1:
        n = ports.compared_slots(ports.snapshot_kind(b.module), prob.K, prob.shape.T)
        if "snapshots" not in got:
            row["not_given"].append("snapshots")
            ok = False
        else:
            c = compare("snapshots", got["snapshots"][:n], oracle["snapshots"][:n], tol["states"])
            row["outputs"]["snapshots"] = output_record(c, f"{b.name} {label}")
            ok &= c.ok
    row["ok"] = ok
    return row


def run(args) -> int:
    import ssm_ref
    from ssm_ref.tolerance import F32_TOL, OUTPUTS

    common.check_json_dest(args)
    names = common.split_list(args.backend, "--backend")
    backs = bk.require(bk.resolve(names or None, args.device, ggml_isolate=not args.in_process, op=args.op))
    if args.op != ssm_ref.ops.SCAN.name:
        return check_op.run(args, ssm_ref.ops.get(args.op), backs)
    problems = QUICK if args.quick else FULL
    report = {"ok": True, "quick": bool(args.quick), "seed": args.seed,
              "tolerance": {k: {"rtol": t.rtol, "atol": t.atol} for k, t in F32_TOL.items()},
              "problems": [{"name": p.name, "dims": p.shape.dims, "variant": p.shape.variant,
                            "R": p.R or p.shape.S, "ids": p.ids, "what": p.what} for p in problems],
              "backends": [{"name": b.name, "available": b.available, "reason": b.reason,
                            "where": b.where() if b.available else None} for b in backs],
              "oracle": {}, "runs": [], "not_run": []}
    runnable = [b for b in backs if b.available]
    steps = len(problems) * (1 + len(runnable)) + sum(1 for b in runnable if hasattr(b.module, "to_device"))
    steps += len(runnable)
    report["invariance"] = []
    prog = Progress(steps, args.verbose)
    inputs = {}
    try:
        for k, p in enumerate(problems):
            prog.update(f"oracle (float64) on {p.name}")
            kw, g_y, g_states = make_inputs(p.shape, args.seed + k, R=p.R, ids=p.ids)
            g_snap = None
            if p.K > 1:   # the snapshots' loss term: the backward of a port with one is checked with it
                g_snap = np.random.default_rng(args.seed + 200 + k).uniform(
                    -1, 1, (p.K, p.shape.S, p.shape.H, p.shape.P, p.shape.N)).astype(np.float32)
            r64 = ssm_ref.ssm_scan(**kw, dtype=np.float64, snapshots=p.K)
            g64 = ssm_ref.ssm_scan_back(**kw, g_y=g_y, g_states=g_states, dtype=np.float64, g_snapshots=g_snap)
            oracle = {"y": r64.y, "states": r64.states, "snapshots": r64.snapshots,
                      **{o: getattr(g64, o) for o in OUTPUTS[2:]}}
            inputs[p.name] = (kw, g_y, g_states, oracle, g_snap)
            if p.name in FD_PROBLEMS:
                fd = check_op.fd_check(ssm_ref.ops.SCAN, kw, {"g_y": g_y, "g_states": g_states},
                              np.random.default_rng(args.seed + 100 + k))
                report["oracle"][p.name] = {n: {"err": e, "bound": bd, "ok": e <= bd} for n, (e, bd) in fd.items()}
            prog.update(f"oracle (float64) on {p.name}", advance=1)
        for b in runnable:
            for k, p in enumerate(problems):
                prog.update(f"{b.name} on {p.name}")
                kw, g_y, g_states, oracle, g_snap = inputs[p.name]
                why = not_run(b, p, kw)
                if why:
                    report["not_run"].append({"backend": b.name, "problem": p.name, "reason": why})
                else:
                    report["runs"].append(check_backend(b, p, kw, g_y, g_states, oracle, g_snapshots=g_snap))
                if k == 0 and hasattr(b.module, "to_device"):
                    prog.update(f"{b.name} on {p.name}, device-resident inputs", advance=1)
                    report["runs"].append(check_backend(b, p, kw, g_y, g_states, oracle, device_resident=True,
                                                        g_snapshots=g_snap))
                prog.update(f"{b.name} on {p.name}", advance=1)
            prog.update(f"{b.name}: batch and split invariance")
            report["invariance"] += check_invariance.rows(b, args.seed)
            prog.update(f"{b.name}: batch and split invariance", advance=1)
    finally:
        prog.close()
    fd_ok = all(v["ok"] for per in report["oracle"].values() for v in per.values())
    report["oracle_ok"] = fd_ok
    report["ok"] = fd_ok and all(r["ok"] for r in report["runs"])   # invariance: information only
    common.say(args, render(report))
    common.write_json(args, report)
    return common.EXIT_OK if report["ok"] else common.EXIT_FAIL
