"""``ssm-scan vectors --out DIR``: write the golden vectors (docs/PORTING.md) for ports in any
language: manifest.json plus one raw little-endian .bin and one .npz per case, of the scan or of
any other declared op (``--op``; ssm_ref.testing.vectors reads its cases from its declaration)."""

from __future__ import annotations

import argparse

HELP = "write the golden vectors (inputs, forward and backward outputs) for ports in any language"
DESCRIPTION = """Write the golden vectors: inputs and float64-reference outputs for ports in any language.

DIR gets manifest.json (the cases, their sizes and the files) plus, per case, one raw
little-endian .bin and one .npz; docs/PORTING.md ("Golden vectors") describes the layout. --op
writes another op's cases (its inputs, outputs and gradients by the names it declares, and the
keyword arguments of each case, such as Mamba-3's rotation).

  ssm-scan vectors --out golden
  ssm-scan vectors --out golden --case tiny_mamba2 --case no_tokens
  ssm-scan vectors --out golden-m3 --op mamba3_scan
  ssm-scan verify --backend ./myport.py --vectors golden-m3      check a port against them"""


def add_parser(sub) -> None:
    """Register the sub-command on ``sub`` (argparse sub-parsers)."""
    from ssm_ref.testing.vectors import GOLDEN

    from . import common

    p = sub.add_parser("vectors", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write (created if missing)")
    p.add_argument("--case", action="append", metavar="NAME",
                   help=f"write only this case (repeatable; default all): ssm_scan's are {', '.join(GOLDEN)}; "
                        "another op's: see its list in docs/PORTING.md, or the names this command prints")
    common.add_op(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ssm_ref import ops
    from ssm_ref.testing.vectors import golden_table, write_vectors

    from . import common

    try:
        op = ops.get(args.op)
    except ValueError as e:
        raise common.UsageError(f"--op {args.op}: {str(e).removeprefix('op: ')}") from None
    table = golden_table(op)
    unknown = [c for c in (args.case or []) if c not in table]
    if unknown:
        raise common.UsageError(f"--case {unknown[0]}: unknown for {op.name}; the cases are: {', '.join(table)}")
    common.writable_dir(args.out, "--out")
    path = write_vectors(args.out, args.case, op)
    width = max((len(n) for n in table), default=0)
    for name in args.case or table:
        print(f"  {name:{width}s}  {table[name][0]}")
    print(f"wrote {len(args.case or table)} cases of {op.name}: {path} (+ <case>.bin, <case>.npz)")
    return 0
