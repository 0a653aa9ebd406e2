"""A time-boxed fuzzer: every property of ssm_ref.testing.properties, on any port (docs/PORTING.md,
"The port interface"), over problems drawn by ssm_ref.testing.strategies, until the time is up.

    from ssm_ref.testing.fuzzing import fuzz
    report = fuzz([my_port], minutes=30, save_dir="tests/regressions")
    print(report.summary()); assert report.ok

A failure is shrunk by hypothesis to a small case, which is reported with its recipe (the
``make_problem`` call that rebuilds it: shapes, ids, variant, regime, seed) and, with
``save_dir``, written as a regression file (ssm_ref.testing.regressions) that the test suite replays.
Needs hypothesis (``pip install hypothesis``, or ssm-scan's ``test`` extra: :func:`ssm_ref.extras.install_hint`).
The command line is ``ssm-scan fuzz``.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ssm_ref.extras import install_hint

try:
    from hypothesis import HealthCheck, Phase, find, settings
    from hypothesis.errors import Flaky, NoSuchExample, Unsatisfiable
except ImportError as e:  # exercised without hypothesis installed (tests/kit/test_strategies.py)
    raise ImportError("ssm_ref.testing.fuzzing needs hypothesis, an optional dependency of ssm-scan: "
                      + install_hint("test", "hypothesis")) from e

from ssm_ref.ops import SCAN, Op
from ssm_ref.tolerance import F32_TOL

from . import ports
from .cases import REGIMES, Case
from .properties import BACKWARD_ONLY, PROPERTIES, PropertyFailed, known
from .regressions import save_case
from .strategies import problems

__all__ = ["MAX_K", "Failure", "FuzzReport", "fuzz", "reproducer"]

# The state snapshots drawn for a port that declares SNAPSHOTS (docs/PORTING.md): K in 1..MAX_K,
# small, so that T < K (the start-state slot, the NaN slots) comes up often.
MAX_K = 5


class _TimeUp(Exception):
    """Raised inside hypothesis's search when the time is up and nothing has failed."""


@dataclass
class Failure:
    backend: str
    property: str
    case: Case
    message: str
    saved: str = ""
    vectors: str = ""


@dataclass
class FuzzReport:
    """Counts per (backend, property): ``examples`` drawn, ``checked`` (the property applied),
    ``unsupported`` (drawn problems the port's supports() declined, with ``supported_only``),
    every failure found (one per pair at most: a pair that failed is not fuzzed again), and
    ``not_applicable``: pairs not fuzzed, with the reason (a property of the backward, for a port
    whose ssm_scan_back raises NotImplementedError). ``snapshots``: per backend, the K it was
    fuzzed with; ``with_k``: per (backend, property), the checks of a problem with K > 1."""

    seconds: float = 0.0
    examples: dict = field(default_factory=dict)
    checked: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)
    unsupported: dict = field(default_factory=dict)
    not_applicable: dict = field(default_factory=dict)
    snapshots: dict = field(default_factory=dict)
    with_k: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        lines = [f"fuzzed for {self.seconds:.0f} s: "
                 f"{sum(self.checked.values())} property checks on {sum(self.examples.values())} drawn problems"]
        for b, p in sorted(self.examples):
            bad = any(f.backend == b and f.property == p for f in self.failures)
            skipped = self.unsupported.get((b, p), 0)
            with_k = self.with_k.get((b, p), 0)
            lines.append(f"  {b:10s} {p:20s} {self.checked.get((b, p), 0):6d} checked  {'FAIL' if bad else 'ok'}"
                         + (f"  ({with_k} with K > 1)" if with_k else "")
                         + (f"  ({skipped} drawn problems declined by supports())" if skipped else ""))
        for b, what in sorted(self.snapshots.items()):
            lines.append(f"  state snapshots of {b}: {what}")
        by_reason: dict = {}
        for (b, p), why in sorted(self.not_applicable.items()):
            by_reason.setdefault((b, why), []).append(p)
        for (b, why), props in by_reason.items():
            lines.append(f"  {b:10s} not applicable: {', '.join(props)}: {why}")
        for f in self.failures:
            lines += ["", f"FAIL {f.backend} {f.property}", f"  reproduce: {reproducer(f.case)}",
                      *([f"  ggml: {ggml_shapes(f.case)}"] if isinstance(f.case, Case) else []),
                      *("  " + line for line in f.message.splitlines())]
            if f.saved:
                lines.append(f"  saved: {f.saved}")
            if f.vectors:
                lines.append(f"  golden vectors: {f.vectors} (inputs and the float64 expected outputs, "
                             "docs/PORTING.md section 1)")
        return "\n".join(lines)


def reproducer(case: Case) -> str:
    """The Python call that rebuilds ``case`` (from its recipe), or its label without one."""
    if not case.recipe:
        return case.label
    r = dict(case.recipe)
    seed = r.pop("seed")
    args = ", ".join(f"{k}={v!r}" for k, v in r.items())
    if not isinstance(case, Case):   # another op's case: its declaration says how to make one
        return f"ssm_ref.testing.ports.kit_part(ssm_ref.ops.get({case.op!r}), 'make_case')({seed}, {args})"
    return f"ssm_ref.testing.cases.make_problem({seed}, {args})"


def ggml_shapes(case: Case) -> str:
    """The case's tensors as ggml's ggml_ssm_scan takes them (ne, fastest axis first), for a C test."""
    d = case.dims
    N, P, H, G, T, S, R = (d[k] for k in "NPHGTSR")
    a = f"({N}, {H})" if case.variant == "mamba1" else f"(1, {H})"
    ids = np.asarray(case.ids).tolist()
    return (f"s ne (d_state, head_dim, n_head, rows) = ({N}, {P}, {H}, {R}), x ({P}, {H}, {T}, {S}), "
            f"dt ({H}, {T}, {S}), A {a}, B and C ({N}, {G}, {T}, {S}), ids I32 {ids}"
            + (f", K = {case.K}" if case.K != 1 else ""))


def _modname(module) -> str:
    return ports.port_name(module)


def crash_message(e: BaseException) -> str:
    """What a failure report says about an exception a port raised: its type and message, then
    its traceback (the port's own frames; ssm_ref.testing.ports.traceback_text)."""
    tb = ports.traceback_text(e)
    return f"{type(e).__name__}: {e}" + (f"\n{tb}" if tb else "")


def _no_backward(module) -> str:
    """The message of ``module``'s NotImplementedError when its ssm_scan_back raises one on a
    one-element problem (it has no backward), else ""."""
    from .cases import make_problem

    c = make_problem(0, S=1, T=1, H=1, P=1, N=1, G=1, R=1, ids="none", variant="mamba2", a_form="h",
                     regime="typical")
    try:
        ports.call_op(module, SCAN, c.args(), c.cotangents)
    except NotImplementedError as e:
        return ports.error_text(e)
    except Exception:  # any other failure is the properties' to find and report
        return ""
    return ""


def fuzz(backends, *, minutes: float, properties=None, regimes=REGIMES, tol=None, seed=None,
         save_dir=None, batch: int = 5, log: Callable[[str], None] | None = None, supported_only: bool = False,
         op: Op = SCAN, **sizes) -> FuzzReport:
    """Fuzz ``backends`` (ports: modules with NAME, ssm_scan, ssm_scan_back, supports;
    docs/PORTING.md, "The port interface") for ``minutes`` (every property checks one drawn problem
    at least, however short the time).

    properties: names from ssm_ref.testing.properties.PROPERTIES (default: all of them) or INVARIANCES
    (``batch_invariant``, ``split_invariant``: bit-for-bit, run only when named). regimes: value regimes
    to draw (each property only gets the regimes it is claimed for). tol: output -> Tol table
    (default ssm_ref.tolerance.F32_TOL). seed: makes the sequence of draws repeatable. save_dir:
    where failures are written as regression files. batch: examples per (backend, property)
    per round (small, so that every property gets its turn early). sizes: size limits passed to
    ssm_ref.testing.strategies.problems (max_elements=..., max_K=...). K, the state snapshots: a
    port that declares SNAPSHOTS (docs/PORTING.md, "The port interface") is fuzzed with K in
    1..``max_K`` (default :data:`MAX_K`; a "ggml" port with K = 1 for Mamba-1, which ggml
    refuses), every property comparing the snapshot slots it compares; a port that does not, with
    K = 1 only, as before. supported_only: a drawn problem that the port's
    ``supports("ssm_scan", ...)`` declines is not checked (counted in ``unsupported``): for a port
    that runs some shapes on another device (ssm_ggml on a GPU), to fuzz the device itself.
    A port whose ssm_scan_back raises NotImplementedError is fuzzed on its forward: the
    properties of the backward alone are listed as not applicable, the others check the forward.
    op: another declared op (ssm_ref.ops) than the scan: its own properties (``Op.properties``;
    default all), problems (``Op.strategy``, which takes no sizes) and tolerance; the scan's
    snapshots, regression files and supports() filter are the scan's alone (with ``save_dir`` another
    op's failure is written as golden vectors of one case, which ``verify(port, vectors=...)`` replays).
    Raises ValueError for an unknown property or regime, a backend that is no port, or minutes
    that are not a positive number. Returns a FuzzReport; a failure caused by an exception
    carries its traceback in its message.
    """
    scan = op.name == SCAN.name
    registry = known() if scan else dict(ports.kit_part(op, "properties"))
    names = (list(PROPERTIES) if scan else list(registry)) if properties is None else list(properties)
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise ValueError(f"properties: unknown {unknown}, expected names from {list(registry)}")
    bad = [r for r in regimes if r not in REGIMES]
    if bad or not regimes:
        raise ValueError(f"regimes: expected a non-empty selection of {REGIMES}, got {tuple(regimes)}")
    for b in backends:
        lacks = ports.interface_problems(b, op)
        if lacks:
            raise ValueError(f"backends: {ports.port_name(b)} is no port ({', '.join(lacks)}; docs/PORTING.md, "
                             "\"The port interface\")")
    if not math.isfinite(minutes) or minutes <= 0:
        raise ValueError(f"minutes: expected a positive number, got {minutes!r}")
    tol = (F32_TOL if scan else op.tol()) if tol is None else tol
    rnd = random.Random(seed)
    report = FuzzReport()
    start = last_log = time.monotonic()
    deadline = start + 60.0 * minutes
    pairs = [(b, n) for b in backends for n in names if set(registry[n].regimes) & set(regimes)]
    max_K = sizes.pop("max_K", MAX_K)
    for b in (backends if scan else ()):
        kind = ports.snapshot_kind(b)
        report.snapshots[_modname(b)] = (
            f"K in 1..{max_K}" + (", slots k < T compared (SNAPSHOTS 'ggml'), Mamba-1 with K = 1" if kind == "ggml"
                                  else ", every slot compared") if kind and max_K > 1
            else "K = 1 only (the port declares no SNAPSHOTS)" if not kind else "K = 1 only (max_K = 1)")
    for b in (backends if scan else ()):
        why = _no_backward(b)
        if why:
            for n in BACKWARD_ONLY:
                if (b, n) in pairs:
                    pairs.remove((b, n))
                    report.not_applicable[(_modname(b), n)] = f"no backward ({why})"
    done: set = set()
    cfg = settings(max_examples=batch, database=None, deadline=None, phases=(Phase.generate, Phase.shrink),
                   suppress_health_check=list(HealthCheck))
    first = True
    while (first or time.monotonic() < deadline) and len(done) < len(pairs):
        for module, name in pairs:
            key = (_modname(module), name)
            if key in done or (not first and time.monotonic() >= deadline):
                continue
            prop = registry[name]
            strategy = (problems(regimes=[r for r in regimes if r in prop.regimes], **sizes,
                                 **_snapshot_sizes(module, max_K)) if scan else ports.kit_part(op, "strategy")())

            found = []

            def fails(case, module=module, prop=prop, key=key, found=found) -> bool:
                if not found and report.examples.get(key, 0) and time.monotonic() >= deadline:
                    raise _TimeUp           # stop drawing (each pair checks one problem at least); a
                                            # failure already found is still shrunk
                report.examples[key] = report.examples.get(key, 0) + 1
                if supported_only and scan and not _supported(module, case):
                    report.unsupported[key] = report.unsupported.get(key, 0) + 1
                    return False
                try:
                    applied = prop.check(module, case, tol)
                except Exception:  # PropertyFailed, or a crash, which is a failure too
                    found.append(case)
                    return True
                report.checked[key] = report.checked.get(key, 0) + int(bool(applied))
                if applied and getattr(case, "K", 1) > 1:
                    report.with_k[key] = report.with_k.get(key, 0) + 1
                return False

            try:
                case = find(strategy, fails, settings=cfg, random=random.Random(rnd.getrandbits(64)))
            except (NoSuchExample, Unsatisfiable, _TimeUp):
                continue
            except Flaky as e:  # a case failed, then passed when hypothesis ran it again (a port whose
                if not found:   # results vary between runs): report the last case that failed
                    if _time_up(e):  # the time ran out while hypothesis replayed a passing case
                        continue
                    raise
                case = found[-1]
            done.add(key)
            report.failures.append(_failure(module, key, prop, case, tol, save_dir))
            if log:
                log(f"FAIL {key[0]} {name}: {reproducer(case)}")
        first = False
        if log and time.monotonic() - last_log >= 10.0:
            last_log = time.monotonic()
            log(f"{last_log - start:6.0f} s  {sum(report.checked.values())} checks, "
                f"{len(report.failures)} failures")
    report.seconds = time.monotonic() - start
    return report


def _time_up(exc: BaseException) -> bool:
    """Whether ``exc`` is, or groups (hypothesis's FlakyFailure), the end of the fuzzing time."""
    return isinstance(exc, _TimeUp) or any(_time_up(e) for e in getattr(exc, "exceptions", ()))


def _snapshot_sizes(module, max_K: int) -> dict:
    """The strategies' K arguments for ``module``: K > 1 only where it declares SNAPSHOTS."""
    kind = ports.snapshot_kind(module)
    if not kind:
        return {"max_K": 1}
    return {"max_K": max_K, "snapshots_mamba1": kind != "ggml"}


def _supported(module, case: Case) -> bool:
    kw = {"snapshots": case.K} if case.K > 1 and ports.snapshot_kind(module) else {}
    try:
        return ports.support(module.supports("ssm_scan", *ports.args_of(case.args()), **kw)).ok
    except Exception:  # a supports() that raises: let the property run and report the port
        return True


def _failure(module, key, prop, case: Case, tol, save_dir) -> Failure:
    try:
        prop.check(module, case, tol)
        message = "failed while fuzzing, passed on the re-run (not deterministic?)"
    except Exception as e:  # PropertyFailed, or the crash itself
        message = str(e) if isinstance(e, PropertyFailed) else crash_message(e)
    f = Failure(backend=key[0], property=key[1], case=case, message=message)
    if save_dir is not None and isinstance(case, Case):   # (regression files are the scan's)
        saved = save_case(case, save_dir, prop=key[1], found_on=key[0], message=message)
        f.saved = str(saved)
        if case.inputs.get("s") is not None and case.regime != "nonfinite":
            from .vectors import write_case

            folder = Path(save_dir) / (saved.stem + ".vectors")
            f.vectors = str(write_case(folder, case, saved.stem, message.splitlines()[0] if message else "").parent)
    elif save_dir is not None:   # another op's failure: its golden vectors (verify(port, vectors=...) replays it)
        from .vectors import write_case

        seed = case.recipe["seed"] if case.recipe else 0
        stem = f"{case.op}-{key[0]}-{key[1]}-{seed}"
        folder = Path(save_dir) / (stem + ".vectors")
        f.vectors = str(write_case(folder, case, stem, message.splitlines()[0] if message else "").parent)
    return f
