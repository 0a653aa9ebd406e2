"""``ssm-scan fuzz``: run every property (ssm_ref.testing.properties) on one or more backends for
a given time, through ssm_ref.testing.fuzzing.fuzz; the help below is the user's account."""

from __future__ import annotations

import argparse

from . import backends as bk
from . import common

# Larger than the test suite's sizes: a GPU kernel's multi-block layouts (channels split over
# workgroups, several lanes per state row, checkpoints every K tokens) need P, N, T that big.
SIZES = (("--max-elements", 20_000, 16, "elements per drawn problem"),
         ("--max-S", 4, 1, "sequences"), ("--max-T", 40, 0, "tokens"),
         ("--max-T-long", 256, 1, "tokens of the long_decay regime"),
         ("--max-G", 4, 1, "groups"), ("--max-H-per-G", 4, 1, "heads per group"),
         ("--max-P", 64, 1, "channels per head"), ("--max-N", 64, 1, "state size"))


HELP = "check every property on drawn problems for a given time"
DESCRIPTION = """Check every property on drawn problems, on one or more backends, for a given time.

A property is a relation a correct scan satisfies (the float64 reference's outputs, the adjoint
identity, splitting the tokens, ...; docs/PORTING.md, "The properties"). Each failure is printed
with a reproducer; with --save it is also written as a regression file and as golden vectors
(DIR/<name>.vectors/).

  ssm-scan fuzz --minutes 30                          every backend available here
  ssm-scan fuzz --minutes 5 --backend vk --save tests/regressions
  ssm-scan fuzz --minutes 60 --backend mypkg.myscan   your own port (docs/PORTING.md, "The port interface")
  ssm-scan fuzz --minutes 10 --backend ./myport.py    ... or its file
  ssm-scan fuzz --minutes 5 --backend ssm_ggml:CPU    ggml's own SSM_SCAN (SSM_GGML_LIB), in a worker
  ssm-scan fuzz --minutes 5 --backend ssm_ggml:Vulkan0 --supported-only --min-N 256 --max-N 256 --variant mamba2

The bit-for-bit invariances batch_invariant and split_invariant (docs/SPEC.md section 3.2) are no
part of the correctness contract: they run only when named with --property, and a failure says
which outputs differ and by how much.

A port whose ssm_scan_back raises NotImplementedError (ggml has no SSM_SCAN_BACK) is fuzzed on
its forward: the properties of the backward alone are reported as not applicable, the others
check their forward half.

Exit code 0 when nothing failed, 1 when a property failed, 2 for bad arguments or a backend named
by --backend that cannot run here, 3 when the --save folder cannot be written."""


def add_parser(sub) -> None:
    """Register the sub-command on ``sub`` (argparse sub-parsers)."""
    from ssm_ref.testing.cases import REGIMES
    from ssm_ref.testing.properties import INVARIANCES, PROPERTIES

    p = sub.add_parser("fuzz", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=common.positive_float("--minutes"), required=True,
                   help="how long to fuzz (a number > 0, e.g. 0.5)")
    common.add_backend(p, "fuzz")
    common.add_op(p)
    common.add_device(p)
    p.add_argument("--property", action="append", metavar="NAME",
                   help=f"property to check (repeatable; default all): {', '.join(PROPERTIES)}; "
                        f"bit-for-bit invariances, only when named: {', '.join(INVARIANCES)}")
    p.add_argument("--regime", action="append", choices=REGIMES, help="value regime to draw (repeatable; default all)")
    for flag, default, least, what in SIZES:
        p.add_argument(flag, type=common.int_at_least(least), default=default,
                       help=f"{what}, at most (default {default})")
    p.add_argument("--min-N", type=common.int_at_least(1), default=None,
                   help="state size, at least (with --max-N: a fixed d_state, e.g. 256)")
    p.add_argument("--min-P", type=common.int_at_least(1), default=None, help="channels per head, at least")
    p.add_argument("--min-T", type=common.int_at_least(0), default=None,
                   help="tokens, at least (default 0; 1 leaves out the empty scan)")
    p.add_argument("--variant", action="append", choices=("mamba1", "mamba2"),
                   help="draw only this variant (repeatable; default both)")
    p.add_argument("--supported-only", action="store_true",
                   help="skip drawn problems the backend's supports() declines (e.g. shapes ssm_ggml:Vulkan0 "
                        "would run on ggml's CPU): fuzz the device itself")
    common.add_isolate(p)
    p.add_argument("--seed", type=int, default=None, help="make the draws repeatable")
    p.add_argument("--tol-scale", type=common.positive_float("--tol-scale"), default=1.0,
                   help="multiply the tolerance table (default 1; for exploring a less accurate port)")
    p.add_argument("--save", metavar="DIR", default=None, help="write each failure as a regression file in DIR")
    common.add_verbose(p)
    p.set_defaults(func=run)


def _fuzz_op(args, runnable, fuzz) -> int:
    from ssm_ref import ops
    from ssm_ref.testing import ports

    op = ops.get(args.op)
    props = dict(ports.kit_part(op, "properties"))
    unknown = [n for n in args.property or () if n not in props]
    if unknown:
        raise common.UsageError(f"--property {unknown[0]}: unknown for {op.name}; its properties are: "
                                f"{', '.join(props)}")
    tol = {k: t.times(args.tol_scale) for k, t in op.tol().items()}
    print(f"fuzzing {op.name} on " + ", ".join(b.name for b in runnable) + f" for {args.minutes:g} min", flush=True)
    report = fuzz([b.module for b in runnable], minutes=args.minutes, properties=args.property, tol=tol,
                  seed=args.seed, log=print, op=op, save_dir=args.save)
    print(report.summary())
    return common.EXIT_OK if report.ok else common.EXIT_FAIL


def run(args) -> int:
    from ssm_ref.testing.properties import known

    unknown = [n for n in args.property or () if n not in known()]
    if unknown and args.op == "ssm_scan":  # before anything runs or prints
        raise common.UsageError(f"--property {unknown[0]}: unknown; the properties are: {', '.join(known())}")
    try:
        from ssm_ref.testing.fuzzing import fuzz
    except ImportError as e:  # hypothesis is an optional dependency
        raise common.UsageError(str(e)) from None
    from ssm_ref.tolerance import F32_TOL

    if args.save:
        common.writable_dir(args.save, "--save")
    for flag, lo, hi in (("--min-N", args.min_N, args.max_N), ("--min-P", args.min_P, args.max_P),
                         ("--min-T", args.min_T, args.max_T)):
        if lo is not None and lo > hi:
            raise common.UsageError(f"{flag} {lo} is above --max-{flag[-1]} {hi}")
    names = common.split_list(args.backend, "--backend")
    backs = bk.require(bk.resolve(names or None, args.device, ggml_isolate=not args.in_process, op=args.op))
    runnable = [b for b in backs if b.available]
    if args.op != "ssm_scan":   # another op: its own problems, properties and tolerance (ssm_ref.ops)
        return _fuzz_op(args, runnable, fuzz)
    for b in backs:
        if not b.available:
            print(f"{b.name}: skipped, not available: {b.reason}")
    if not runnable:
        return common.EXIT_OK
    tol = {k: t.times(args.tol_scale) for k, t in F32_TOL.items()}
    print("fuzzing " + ", ".join(b.name for b in runnable)
          + f" for {args.minutes:g} min" + (f" (tolerance x{args.tol_scale:g})" if args.tol_scale != 1 else ""),
          flush=True)
    kw = {}
    if args.regime:
        kw["regimes"] = args.regime
    if args.variant:
        kw["variants"] = args.variant
    for k in ("min_N", "min_P", "min_T"):
        if getattr(args, k) is not None:
            kw[k] = getattr(args, k)
    report = fuzz([b.module for b in runnable], minutes=args.minutes, properties=args.property, tol=tol,
                  seed=args.seed, save_dir=args.save, log=print, supported_only=args.supported_only,
                  max_elements=args.max_elements, max_S=args.max_S, max_T=args.max_T,
                  max_T_long=args.max_T_long, max_G=args.max_G, max_H_per_G=args.max_H_per_G,
                  max_P=args.max_P, max_N=args.max_N, **kw)
    print(report.summary())
    if report.failures and not args.save:
        print("\n(rerun with --save DIR to keep the failing cases as regression files)")
    return common.EXIT_OK if report.ok else common.EXIT_FAIL
