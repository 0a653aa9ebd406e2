"""``ssm-scan fuzz``: run every property on one or more backends for a given time.

    ssm-scan fuzz --minutes 30                          # every installed backend
    ssm-scan fuzz --minutes 5 --backend ssm_vk --save tests/regressions
    ssm-scan fuzz --minutes 60 --backend mypkg.myscan   # your own port (docs/API.md)

Exit status 0 when nothing failed, 1 when a property failed (each failure printed with its
reproducer, and saved as a regression file with --save), 2 for bad arguments.
"""

from __future__ import annotations

import importlib

BUILTIN = ("ssm_ref", "ssm_fast", "ssm_vk")
INTERFACE = ("ssm_scan", "ssm_scan_back")


def add_parser(sub) -> None:
    """Register the sub-command on ``sub`` (argparse sub-parsers)."""
    from ssm_ref.cases import REGIMES

    p = sub.add_parser("fuzz", help="check every property on drawn problems for a given time",
                       description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, required=True, help="how long to fuzz")
    p.add_argument("--backend", action="append", metavar="MODULE",
                   help="module to test (repeatable; default: every installed one of " + ", ".join(BUILTIN) + ")")
    p.add_argument("--property", action="append", metavar="NAME", help="property to check (repeatable; default all)")
    p.add_argument("--regime", action="append", choices=REGIMES, help="value regime to draw (repeatable; default all)")
    # Larger than the test suite's sizes: a GPU kernel's multi-block layouts (channels split over
    # workgroups, several lanes per state row, checkpoints every K tokens) need P, N, T that big.
    for flag, default, what in (("--max-elements", 20_000, "elements per drawn problem"),
                                ("--max-S", 4, "sequences"), ("--max-T", 40, "tokens"),
                                ("--max-T-long", 256, "tokens of the long_decay regime"),
                                ("--max-G", 4, "groups"), ("--max-H-per-G", 4, "heads per group"),
                                ("--max-P", 64, "channels per head"), ("--max-N", 64, "state size")):
        p.add_argument(flag, type=int, default=default, help=f"{what}, at most (default {default})")
    p.add_argument("--seed", type=int, default=None, help="make the draws repeatable")
    p.add_argument("--tol-scale", type=float, default=1.0,
                   help="multiply the tolerance table (default 1; for exploring a less accurate port)")
    p.add_argument("--save", metavar="DIR", default=None, help="write each failure as a regression file in DIR")
    p.set_defaults(func=run)


def _load(names):
    mods = []
    for name in names:
        try:
            mod = importlib.import_module(name)
        except ImportError as e:
            raise SystemExit(f"ssm-scan fuzz: --backend {name}: cannot import it ({e})") from e
        missing = [a for a in INTERFACE if not hasattr(mod, a)]
        if missing:
            raise SystemExit(f"ssm-scan fuzz: --backend {name}: lacks {missing} (docs/API.md)")
        mods.append(mod)
    return mods


def _installed():
    out = []
    for name in BUILTIN:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if all(hasattr(mod, a) for a in INTERFACE):
            out.append(mod)
    return out


def run(args) -> int:
    try:
        from ssm_ref.fuzzing import fuzz
    except ImportError as e:  # hypothesis is an optional dependency
        print(f"ssm-scan fuzz: {e}")
        return 2
    from ssm_ref.tolerance import F32_TOL

    backends = _load(args.backend) if args.backend else _installed()
    tol = {k: t.times(args.tol_scale) for k, t in F32_TOL.items()}
    print("fuzzing " + ", ".join(getattr(m, "NAME", m.__name__) for m in backends)
          + f" for {args.minutes:g} min" + (f" (tolerance x{args.tol_scale:g})" if args.tol_scale != 1 else ""))
    kw = {}
    if args.regime:
        kw["regimes"] = args.regime
    try:
        report = fuzz(backends, minutes=args.minutes, properties=args.property, tol=tol, seed=args.seed,
                      save_dir=args.save, log=print, max_elements=args.max_elements, max_S=args.max_S,
                      max_T=args.max_T, max_T_long=args.max_T_long, max_G=args.max_G,
                      max_H_per_G=args.max_H_per_G, max_P=args.max_P, max_N=args.max_N, **kw)
    except ValueError as e:
        print(f"ssm-scan fuzz: {e}")
        return 2
    print(report.summary())
    if report.failures and not args.save:
        print("\n(rerun with --save DIR to keep the failing cases as regression files)")
    return 0 if report.ok else 1
