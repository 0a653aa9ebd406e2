"""ssm_ref.testing: the kit for testing an implementation of the scan against ssm_ref, the
executable spec (docs/PORTING.md). It imports the spec; the spec never imports it.

    from ssm_ref.testing import verify, write_vectors
    report = verify(fn_forward, fn_backward)   # golden cases, a report per case and output
    write_vectors("golden/")                    # the golden cases on disk, for ports in other languages

Modules, one per concern:

    verification   verify: a callable or a port against the golden cases, with a report
    vectors        the golden cases of any op (golden_cases, write_vectors, read_vectors)
    cases          whole problems from a seed: make_problem, Case, the value regimes; OpCase (any op)
    mamba3_cases   Mamba-3's problems (make_case, cases, strategy, GOLDEN)
    properties     the properties every backend must have, as plain functions (PROPERTIES)
    strategies     hypothesis strategies drawing whole problems (needs hypothesis)
    fuzzing        a time-boxed fuzzer over the properties (needs hypothesis); ``ssm-scan fuzz``
    regressions    saved failing cases, replayed by the test suite
    ports          the port interface: how verify, ``ssm-scan check`` and the fuzzer call a port

numpy only: ``strategies`` and ``fuzzing`` (and their names, ``problems``, ``fuzz``) load on first
use, so importing this package never imports hypothesis. The bounds the kit judges by are the
spec's: ``ssm_ref.tolerance``.
"""

from __future__ import annotations

from . import cases, ports, properties, regressions, vectors, verification
from .cases import IDS_PATTERNS, ORACLE_REGIMES, REGIMES, Case, make_problem
from .properties import PROPERTIES, Property, PropertyFailed
from .regressions import load_all, save_case
from .vectors import GOLDEN, golden_cases, read_vectors, write_vectors
from .verification import VerifyReport, verify

__all__ = [
    "verify",
    "VerifyReport",
    "GOLDEN",
    "golden_cases",
    "read_vectors",
    "write_vectors",
    "Case",
    "make_problem",
    "IDS_PATTERNS",
    "ORACLE_REGIMES",
    "REGIMES",
    "PROPERTIES",
    "Property",
    "PropertyFailed",
    "problems",
    "fuzz",
    "load_all",
    "save_case",
    "cases",
    "fuzzing",
    "ports",
    "properties",
    "regressions",
    "strategies",
    "vectors",
    "verification",
]

# Loaded on first use: they need hypothesis, an optional dependency.
_NEEDS_HYPOTHESIS = {"strategies": None, "fuzzing": None, "problems": "strategies", "fuzz": "fuzzing"}


def __getattr__(name):
    if name in _NEEDS_HYPOTHESIS:
        import importlib

        module = importlib.import_module(f"{__name__}.{_NEEDS_HYPOTHESIS[name] or name}")
        return getattr(module, name) if _NEEDS_HYPOTHESIS[name] else module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    # The public names only (the lazily loaded ones included); helpers are not the API.
    return sorted(__all__)
