"""``ssm-scan demo`` (``make demo``): info, a quick check, and a small bench with a plot, on the
default device (lavapipe when there is no GPU)."""

from __future__ import annotations

import time
from pathlib import Path

from . import common

HELP = "the main job: info, a quick check, a small bench with a plot (what make demo runs)"
DESCRIPTION = """Run, in order:
  ssm-scan info
  ssm-scan check --quick          (includes the oracle's finite-difference check)
  ssm-scan bench --shape demo --sweep T=16,64,256 --reps 3 --plot OUT/bench.png --json OUT/bench.json
on every backend available here (Vulkan on the default device: lavapipe when there is no GPU).
Exit code 1 when the check fails (the bench still runs)."""

DEMO_BENCH = ["--shape", "demo", "--sweep", "T=16,64,256", "--reps", "3"]
QUICK_BENCH = ["--shape", "custom", "16,8,4,1,16,1", "--sweep", "T=4,16", "--reps", "2"]


def add_arguments(p) -> None:
    p.add_argument("--out", default="out", metavar="DIR",
                   help="folder for the plot and the bench JSON (default: out)")
    p.add_argument("--quick", action="store_true", help="tiny bench shapes (seconds; for tests)")
    common.add_backend(p, "run")
    common.add_verbose(p)


def run(args) -> int:
    from .main import build_parser

    out = Path(args.out)
    backend = [f"--backend={b}" for b in common.split_list(args.backend, "--backend")]
    verbose = ["-v"] * args.verbose
    plot = out / "ssm-scan-demo.png"
    steps = [
        ["info", *verbose],
        ["check", "--quick", *backend, *verbose],
        ["bench", *(QUICK_BENCH if args.quick else DEMO_BENCH), *backend, "--plot", str(plot),
         "--json", str(out / "ssm-scan-demo.json"), *verbose],
    ]
    parser = build_parser()
    worst = common.EXIT_OK
    t0 = time.perf_counter()
    for argv in steps:
        shown = " ".join(a for a in argv if a != "-v")
        print(f"\n=== ssm-scan {shown}\n", flush=True)
        sub = parser.parse_args(argv)
        sub.verbose = args.verbose
        code = sub.run(sub)
        worst = max(worst, code)
    print(f"\ndemo finished in {time.perf_counter() - t0:.0f} s: check {'PASS' if worst == 0 else 'FAIL'}; "
          f"plot {plot}")
    return worst
