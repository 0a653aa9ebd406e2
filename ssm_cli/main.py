"""``ssm-scan``: the sub-command table and dispatch.

A command is a module of this package, in one of two forms:

- ``HELP`` (one line), ``DESCRIPTION`` (its first line a sentence of its own, then a blank line;
  shown verbatim), ``add_arguments(parser)`` and
  ``run(args) -> exit code`` (info, check, bench, build-shaders, demo);
- ``add_parser(subparsers)``, which registers the command itself with ``set_defaults(func=run)``
  (fuzz, vectors, verify).

Adding a command is one line in :data:`COMMANDS`. Modules import the heavy packages inside
``run`` so that ``--help`` and ``--version`` stay fast. The help is for users: what a command does
and its options, in plain text; how it works belongs in its module's docstring and in docs/.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

from . import common

# (command, module of ssm_cli), in the order --help lists them.
COMMANDS = (
    ("info", "info"),
    ("check", "check"),
    ("bench", "bench"),
    ("build-shaders", "build"),
    ("demo", "demo"),
    ("fuzz", "fuzz"),
    ("vectors", "vectors"),
    ("verify", "verify"),
)


DESCRIPTION = """Run, check and time the Mamba selective scan (ggml's SSM_SCAN) and its backward.

Three backends compute it: ssm_ref (numpy, the reference), ssm_fast (numba) and ssm_vk (Vulkan
compute shaders). Every command takes --help; ssm-scan --version prints the versions it runs on."""


class _Version(argparse.Action):
    """``--version``: versions of the package, Python and the backends' libraries, then exit 0.
    Reads package metadata and runs ``glslc --version`` only: no Vulkan context, no compilation."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from .machine import version_text

        print(version_text())
        parser.exit(common.EXIT_OK)


def build_parser() -> argparse.ArgumentParser:
    ap = common.Parser(prog="ssm-scan", description=DESCRIPTION, epilog=common.EXIT_CODES_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action=_Version,
                    help="print the versions of ssm-scan, Python, numpy, numba, the vulkan binding, glslc "
                         "(and torch, jax where installed), then exit")
    ap.add_argument("-v", "--verbose", action="count", default=0, dest="verbose_all",
                    help="log what happens (also accepted after the command)")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS:
        mod = importlib.import_module(f"{__package__}.{module}")
        if hasattr(mod, "add_parser"):  # a command that registers itself
            mod.add_parser(sub)
            p = sub.choices[name]
            p.epilog = p.epilog or common.EXIT_CODES_HELP
        else:
            p = sub.add_parser(name, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                               epilog=common.EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
            mod.add_arguments(p)
            p.set_defaults(run=mod.run)
        if "-v" not in p._option_string_actions:  # -v after every command, as the top-level help says
            common.add_verbose(p)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.verbose = getattr(args, "verbose", 0) + args.verbose_all
    common.setup_logging(args.verbose)
    prog = f"ssm-scan {args.command}"
    run = getattr(args, "run", None) or args.func
    try:
        return run(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return common.EXIT_INTERRUPTED
    except (common.OutputError, OSError) as e:
        # An output that cannot be written, an input that cannot be read: one line, exit 3.
        _report(prog, e, args.verbose)
        return common.EXIT_IO
    except (common.UsageError, ValueError, TypeError) as e:
        # Bad arguments (ours, or those the library rejects, such as H % G != 0): one line.
        _report(prog, e, args.verbose)
        return common.EXIT_USAGE
    except Exception as e:
        if _is_environment_error(e):  # no Vulkan, glslc missing, a device error: one line too
            _report(prog, e, args.verbose)
            return common.EXIT_USAGE
        raise


def _is_environment_error(e: Exception) -> bool:
    from ssm_vk import runtime as rt

    return isinstance(e, rt.VulkanUnavailable | rt.VulkanError | rt.ShaderBuildError)


def _report(prog: str, e: Exception, verbose: int) -> None:
    if verbose:
        traceback.print_exc()
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    ours = isinstance(e, common.UsageError | common.OutputError)
    hint = "" if verbose or (ours and e.__cause__ is None) else " (-v shows the traceback)"
    kind = "" if ours else f"{type(e).__name__}: "
    print(f"{prog}: error: {kind}{text}{hint}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
