"""``ssm-scan verify``: a port (or the built-in backends) against the golden vectors of an op, a
folder written by ``ssm-scan vectors`` or the cases computed now, through
ssm_ref.testing.verify; one table per backend, the rows of ssm_ref.testing.VerifyReport."""

from __future__ import annotations

import argparse

from . import backends as bk
from . import common

HELP = "check a port against the golden vectors (a folder written by ssm-scan vectors, or computed now)"
DESCRIPTION = """Check a port against the golden vectors, case by case and output by output.

The vectors are a folder written by ssm-scan vectors (--vectors DIR), or the same cases computed
now by the float64 reference. The op is the folder's (or --op: ssm_scan by default, mamba3_scan,
or their short names scan, mamba3). Each output and gradient passes when its error is within the
op's float32 tolerance (docs/PORTING.md, "What pass means"); a port's exception is a failed row.

  ssm-scan verify --backend ./myport.py                      the scan's golden cases, computed now
  ssm-scan vectors --out golden-m3 --op mamba3
  ssm-scan verify --backend ./myport.py --vectors golden-m3  Mamba-3's, from the files
  ssm-scan verify --op mamba3 --case mimo_halved             the built-in backends that compute it

Exit code 0 when every row passed, 1 when one failed or raised."""


def add_parser(sub) -> None:
    """Register the sub-command on ``sub`` (argparse sub-parsers)."""
    p = sub.add_parser("verify", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_backend(p, "verify")
    p.add_argument("--vectors", metavar="DIR", default=None,
                   help="a folder written by ssm-scan vectors (default: compute the cases now)")
    p.add_argument("--op", metavar="NAME", default=None, type=common.op_name,
                   help="the op whose cases to check: default the op of --vectors, else ssm_scan; short names: "
                        + ", ".join(f"{k} = {v}" for k, v in common.OP_ALIASES.items()))
    p.add_argument("--case", action="append", metavar="NAME",
                   help="check only this case (repeatable; default all; ssm-scan vectors lists them)")
    common.add_device(p)
    common.add_isolate(p)
    p.set_defaults(func=run)


def _op_of(args) -> str:
    """--op, else the one op of the --vectors folder, else ssm_scan; UsageError / OutputError for a
    folder that cannot be read or holds several ops."""
    if args.op is not None:
        return args.op
    if args.vectors is None:
        return "ssm_scan"
    from ssm_ref.testing.vectors import read_vectors

    try:
        found = sorted({g.op for g in read_vectors(args.vectors)})
    except (OSError, ValueError, KeyError) as e:
        raise common.OutputError(f"--vectors {args.vectors}: cannot read golden vectors: {e}") from None
    if len(found) > 1:
        raise common.UsageError(f"--vectors {args.vectors}: holds cases of {found}: name one with --op")
    return found[0] if found else "ssm_scan"


def run(args) -> int:
    from ssm_ref.testing import verify

    op = _op_of(args)
    names = common.split_list(args.backend, "--backend")
    backs = bk.require(bk.resolve(names or None, args.device, ggml_isolate=not args.in_process, op=op))
    ok, ran = True, 0
    for b in backs:
        if not b.available:
            print(f"{b.name}: skipped, not available: {b.reason}")
            continue
        report = verify(b.module, vectors=args.vectors, cases=args.case, op=op)
        print(f"== {b.name}: {op} golden cases" + (f" from {args.vectors}" if args.vectors else " (computed now)"))
        print(report)
        ok &= report.ok
        ran += 1
    verdict = ("PASS" if ok else "FAIL") if ran else f"nothing verified: no backend here computes {op}"
    print("verify: " + verdict)
    return common.EXIT_OK if ok else common.EXIT_FAIL
