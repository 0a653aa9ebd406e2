"""``ssm-scan demo`` (``make demo``): info, a quick check, and a small bench with a plot, on the
default device (lavapipe when there is no GPU)."""

from __future__ import annotations

import time

from . import common

PLOT_NAME = "ssm-scan-demo.png"
JSON_NAME = "ssm-scan-demo.json"

HELP = "info, a quick check and a small bench with a plot (what make demo runs)"
DESCRIPTION = f"""Run info, a quick check and a small bench with a plot: what make demo runs.

In order:
  ssm-scan info
  ssm-scan check --quick          (includes the oracle's finite-difference check)
  ssm-scan bench --shape demo --sweep T=16,64,256 --reps 3 --plot OUT/{PLOT_NAME} --json OUT/{JSON_NAME}
on every backend available here (Vulkan on the default device: lavapipe when there is no GPU).

Files written (OUT is --out, default out/, created when missing):
  OUT/{PLOT_NAME}   the bench plot (skipped, with a one-line note, when matplotlib is not installed)
  OUT/{JSON_NAME}  the bench results as JSON

Exit code 1 when the check fails (the bench still runs); 2 when a backend named by --backend
cannot run here."""

DEMO_BENCH = ["--shape", "demo", "--sweep", "T=16,64,256", "--reps", "3"]
QUICK_BENCH = ["--shape", "custom:1,16,4,8,16,1", "--sweep", "T=4,16", "--reps", "2"]


def add_arguments(p) -> None:
    p.add_argument("--out", default="out", metavar="DIR",
                   help=f"folder for {PLOT_NAME} (the plot) and {JSON_NAME} (the bench results); "
                        "default: out")
    p.add_argument("--quick", action="store_true", help="tiny bench shapes (seconds; for tests)")
    common.add_backend(p, "run")
    common.add_verbose(p)


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def run(args) -> int:
    from . import backends as bk
    from .main import build_parser

    out = common.writable_dir(args.out, "--out")
    names = common.split_list(args.backend, "--backend")
    if names:  # a backend that cannot run here stops the demo before its first step (exit code 2)
        bk.require(bk.resolve(names))
    backend = [f"--backend={b}" for b in names]
    verbose = ["-v"] * args.verbose
    plot = out / PLOT_NAME
    plotting = _have_matplotlib()
    if not plotting:
        from ssm_ref.extras import install_hint

        print(f"demo: matplotlib is not installed: no plot (to draw it: {install_hint('plot', 'matplotlib')})",
              flush=True)
    steps = [
        ["info", *verbose],
        ["check", "--quick", *backend, *verbose],
        ["bench", *(QUICK_BENCH if args.quick else DEMO_BENCH), *backend,
         *(["--plot", str(plot)] if plotting else []), "--json", str(out / JSON_NAME), *verbose],
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
    tail = f"plot {plot}" if plotting else f"no plot (no matplotlib); results {out / JSON_NAME}"
    print(f"\ndemo finished in {time.perf_counter() - t0:.0f} s: check {'PASS' if worst == 0 else 'FAIL'}; {tail}")
    return worst
