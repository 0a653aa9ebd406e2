"""``ssm-scan vectors --out DIR``: write the golden vectors (docs/PORTING.md) for ports in any
language: manifest.json plus one raw little-endian .bin and one .npz per case."""

from __future__ import annotations


def add_parser(sub) -> None:
    """Register the sub-command on ``sub`` (argparse sub-parsers)."""
    p = sub.add_parser("vectors", help="write the golden vectors (inputs, forward and backward outputs)",
                       description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write (created if missing)")
    p.add_argument("--case", action="append", metavar="NAME", help="write only this case (repeatable)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ssm_ref.testing.vectors import GOLDEN, write_vectors

    from . import common

    unknown = [c for c in (args.case or []) if c not in GOLDEN]
    if unknown:
        raise common.UsageError(f"--case {unknown[0]}: unknown; the cases are: {', '.join(GOLDEN)}")
    common.writable_dir(args.out, "--out")
    path = write_vectors(args.out, args.case)
    for name in args.case or GOLDEN:
        print(f"  {name:18s} {GOLDEN[name][0]}")
    print(f"wrote {len(args.case or GOLDEN)} cases: {path} (+ <case>.bin, <case>.npz)")
    return 0
