"""``ssm-scan``: entry point and sub-command table."""

from __future__ import annotations

import argparse
import sys

from . import fuzz, vectors


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ssm-scan", description="The Mamba selective scan on numpy, numba and Vulkan.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", help="run a small forward + backward with a finite-difference check")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    for mod in (fuzz, vectors):  # sub-commands that register themselves (set_defaults(func=...))
        mod.add_parser(sub)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if hasattr(args, "func"):
        return args.func(args)
    if args.command == "demo":
        from . import demo
        return demo.run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
