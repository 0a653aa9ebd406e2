"""What every command shares: exit codes, the parser class, -v/--json options, logging, JSON output.

Exit codes (all commands): 0 success; 1 a check failed (a wrong result, a port that raised); 2 a
usage error (bad arguments, or a request this machine cannot serve: a backend named by --backend
that cannot run here, such as ssm_vk without a Vulkan device; no glslc; no matplotlib for --plot),
one line on stderr; 3 an I/O error (an output file or folder that cannot be written, an input that
cannot be read); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
import textwrap
from pathlib import Path

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_IO = 3
EXIT_INTERRUPTED = 130

# Wrapped here: every command's help is shown verbatim (RawDescriptionHelpFormatter).
EXIT_CODES_HELP = textwrap.fill(
    "exit codes: 0 success, 1 a check failed, 2 usage error (bad arguments, or a request this machine cannot "
    "serve, such as a --backend that cannot run here), 3 I/O error (a file or folder that cannot be written or "
    "read), 130 interrupted", 100)


class UsageError(ValueError):
    """A request that cannot be served as given; reported in one line, exit code 2."""


class OutputError(Exception):
    """A file or folder that cannot be written (or an input that cannot be read); reported in one
    line, exit code 3."""


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error: ``ssm-scan bench: error: ... (see ssm-scan bench --help)``."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_verbose(p: argparse.ArgumentParser) -> None:
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="log what happens (-vv: debug); also shows progress when stderr is not a terminal")


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="also write the results as JSON to FILE; without FILE (or with -), print JSON "
                        "instead of the table")


def add_backend(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--backend", action="append", metavar="NAME",
                   help=f"backend(s) to {what}: the built-in ssm_ref, ssm_fast, ssm_vk (or ref, fast, vk); "
                        "ggml's own op, ssm_ggml:DEVICE (ssm_ggml:CPU, ssm_ggml:Vulkan0; the build from "
                        "SSM_GGML_LIB); or your own port: a module with NAME, ssm_scan, ssm_scan_back and "
                        "supports, named by its dotted module path (importable, or in the current directory) "
                        "or as a .py file (docs/PORTING.md, \"The port interface\"). Repeat or separate by "
                        "commas (default: every built-in backend available here). A backend named here that "
                        "cannot run here is exit code 2")


# Short names --op takes for the declared ops (ssm_ref.ops), as --backend takes ref, fast, vk.
OP_ALIASES = {"scan": "ssm_scan", "mamba3": "mamba3_scan"}


def op_name(text: str) -> str:
    """An argparse ``type``: the declared name of ``--op`` (a short name of :data:`OP_ALIASES`
    becomes its op's name; any other name is kept, checked where the op is looked up: a port's
    module may declare it)."""
    return OP_ALIASES.get(text, text)


def add_op(p: argparse.ArgumentParser) -> None:
    short = ", ".join(f"{k} = {v}" for k, v in OP_ALIASES.items())
    p.add_argument("--op", default="ssm_scan", metavar="NAME", type=op_name,
                   help="the op: ssm_scan (the default), mamba3_scan, or an op declared in ssm_ref.ops or by the "
                        "module of a --backend that computes it (docs/ARCHITECTURE.md, \"Adding an op\"); short "
                        f"names: {short}")


def scan_only(args, what: str) -> None:
    """For a command whose cases are the scan's (``what``: what it has of the scan alone), a
    UsageError for any other ``--op``, naming the ops declared."""
    if args.op == "ssm_scan":
        return
    from ssm_ref import ops

    try:
        ops.get(args.op)
    except ValueError as e:
        raise UsageError(f"--op {args.op}: {str(e).removeprefix('op: ')}") from None
    raise UsageError(f"--op {args.op}: {what} ssm_scan's only (check and fuzz take every declared op)")


def add_isolate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--in-process", action="store_true",
                   help="run ssm_ggml's calls in this process (default: in a worker process, so that a "
                        "GGML_ASSERT or a segfault in ggml is a reported failure and the run goes on)")


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", metavar="INDEX",
                   help="Vulkan device index for ssm_vk (sets SSM_VK_DEVICE; default: first discrete "
                        "GPU, else integrated, else a CPU implementation such as lavapipe)")


def setup_logging(verbose: int) -> None:
    """Quiet by default (errors only); -v info, -vv debug. Logs go to stderr."""
    level = logging.ERROR if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr,
                        force=True)


def json_ready(value):
    """``value`` with tuples, sets, numpy scalars and non-finite floats made JSON-safe."""
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(json_ready(v) for v in value)
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def json_to_stdout(args) -> bool:
    """True when ``--json`` asks for JSON on stdout (so the table is not printed)."""
    return getattr(args, "json", None) == "-"


def write_json(args, data) -> None:
    """Write ``data`` where ``--json`` says (nothing without --json)."""
    dest = getattr(args, "json", None)
    if dest is None:
        return
    text = json.dumps(json_ready(data), indent=1) + "\n"
    if dest == "-":
        sys.stdout.write(text)
        return
    try:
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        Path(dest).write_text(text)
    except OSError as e:
        raise OutputError(f"--json {dest}: cannot write: {e.strerror or e}") from None


def writable_dir(path, what: str, shown=None) -> Path:
    """Check, before any work, that files can be written in the folder ``path`` (created with its
    parents when missing). Raises OutputError (exit code 3) naming the option ``what``."""
    d = Path(path)
    label = f"{what} {shown if shown is not None else path}"
    existing = next((a for a in (d, *d.parents) if a.exists()), None)
    if existing is not None and not existing.is_dir():
        raise OutputError(f"{label}: {existing} is a file, not a folder")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{label}: cannot create the folder {d}: {e.strerror or e}") from None
    try:
        fd, probe = tempfile.mkstemp(dir=d, prefix=".ssm-scan-write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputError(f"{label}: cannot write in the folder {d}: {e.strerror or e}") from None
    return d


def writable_file(path, what: str) -> Path:
    """Check, before any work, that the file ``path`` can be written: not a folder, its folder
    writable (created when missing), the file writable if it exists. Raises OutputError (exit 3)."""
    f = Path(path)
    if f.is_dir():
        raise OutputError(f"{what} {path}: is a folder, expected a file name")
    writable_dir(f.parent, what, shown=path)
    if f.exists() and not os.access(f, os.W_OK):
        raise OutputError(f"{what} {path}: the file exists and is not writable")
    return f


def check_json_dest(args) -> None:
    """``--json FILE``: checked before the work starts (stdout needs no check)."""
    dest = getattr(args, "json", None)
    if dest not in (None, "-"):
        writable_file(dest, "--json")


def say(args, text: str = "") -> None:
    """Print a line of the human-readable output (suppressed when JSON goes to stdout)."""
    if not json_to_stdout(args):
        print(text, flush=True)


def split_list(values, what: str) -> list[str]:
    """Values of a repeatable, comma-separated option, in order, without duplicates."""
    out: list[str] = []
    for v in values or ():
        for item in v.split(","):
            item = item.strip()
            if not item:
                raise UsageError(f"{what}: empty item in {v!r}")
            if item not in out:
                out.append(item)
    return out


def positive_float(what: str):
    """An argparse ``type``: a finite number > 0 (nan, inf, 0, negatives and words are usage errors)."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
        if not math.isfinite(v) or v <= 0:
            raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
        return v

    parse.__name__ = what
    return parse


def int_at_least(minimum: int):
    """An argparse ``type``: an integer >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {v}")
        return v

    return parse


def int_list(text: str, what: str, minimum: int = 0) -> list[int]:
    """``"16,64,256"`` -> [16, 64, 256]; UsageError for anything else."""
    try:
        vals = [int(v) for v in text.split(",")]
    except ValueError:
        raise UsageError(f"{what}: expected comma-separated integers, got {text!r}") from None
    bad = [v for v in vals if v < minimum]
    if bad:
        raise UsageError(f"{what}: values must be >= {minimum}, got {bad[0]}")
    return vals
