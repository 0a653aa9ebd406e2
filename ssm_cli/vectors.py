"""``ssm-scan vectors --out DIR``: write the golden vectors (docs/PORTING.md) for ports in any
language: manifest.json plus one raw little-endian .bin and one .npz per case."""

from __future__ import annotations

import argparse

HELP = "write the golden vectors (inputs, forward and backward outputs) for ports in any language"
DESCRIPTION = """Write the golden vectors: inputs and float64-reference outputs for ports in any language.

DIR gets manifest.json (the cases, their sizes and the files) plus, per case, one raw
little-endian .bin and one .npz; docs/PORTING.md ("Golden vectors") describes the layout.

  ssm-scan vectors --out golden
  ssm-scan vectors --out golden --case tiny_mamba2 --case no_tokens"""


def add_parser(sub) -> None:
    """Register the sub-command on ``sub`` (argparse sub-parsers)."""
    from ssm_ref.testing.vectors import GOLDEN

    p = sub.add_parser("vectors", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write (created if missing)")
    p.add_argument("--case", action="append", metavar="NAME",
                   help=f"write only this case (repeatable; default all): {', '.join(GOLDEN)}")
    from . import common

    common.add_op(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ssm_ref.testing.vectors import GOLDEN, write_vectors

    from . import common

    common.scan_only(args, "the golden vectors are")
    unknown = [c for c in (args.case or []) if c not in GOLDEN]
    if unknown:
        raise common.UsageError(f"--case {unknown[0]}: unknown; the cases are: {', '.join(GOLDEN)}")
    common.writable_dir(args.out, "--out")
    path = write_vectors(args.out, args.case)
    for name in args.case or GOLDEN:
        print(f"  {name:18s} {GOLDEN[name][0]}")
    print(f"wrote {len(args.case or GOLDEN)} cases: {path} (+ <case>.bin, <case>.npz)")
    return 0
