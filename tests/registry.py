"""The backends under test, their tolerances, and the comparison helpers.

Every backend is judged the same way: its float32 result against the float64 oracle
(``ssm_ref`` with ``dtype=np.float64``) on the same float32-representable inputs, output by
output, with the bound of :data:`F32_TOL`. Adding a backend is one line in ``BACKENDS``::

    _entry("ssm_fast", where=r"CPU", tol=F32_TOL),
    _entry("ssm_vk", where=r"Vulkan\\d+", tol=F32_TOL),

``_entry`` imports the module only if it is installed *and* exposes the interface of
INTERFACE.md (NAME, ssm_scan, ssm_scan_back, supports); otherwise the entry is left out, so a
backend still under construction neither breaks nor silently passes the suite (the registry
test below asserts ssm_ref is always present).

The bound, the per-output table (``F32_TOL``) and the error measures live in the package, in
``ssm_ref/tolerance.py``, so that ``ssm-scan check`` judges a backend exactly as these tests do.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import numpy as np

import ssm_ref
from ssm_ref.tolerance import F32_TOL, OUTPUTS, Tol, judge, rel_err

__all__ = [
    "BACKENDS",
    "F32_TOL",
    "OUTPUTS",
    "Backend",
    "Tol",
    "assert_close",
    "oracle_back",
    "oracle_scan",
    "rel_err",
]

@dataclass(frozen=True)
class Backend:
    """One backend module under test.

    name: the module (and the ``backend`` field of its results); where: a regex the result's
    ``where`` must match when ``supports()`` says ok; tol: output -> Tol against the oracle.
    """

    name: str
    module: ModuleType
    where: str
    tol: dict

    def __repr__(self) -> str:  # shown in pytest ids and failure messages
        return self.name


_INTERFACE = ("NAME", "ssm_scan", "ssm_scan_back", "supports")


def _entry(name: str, *, where: str, tol: dict) -> Backend | None:
    try:
        mod = importlib.import_module(name)
    except ImportError:
        return None
    if not all(hasattr(mod, attr) for attr in _INTERFACE):
        return None
    return Backend(name=name, module=mod, where=where, tol=tol)


# ssm_vk: the same float32 bounds. Its kernels fuse multiply-adds and sum over n, channels and
# heads in other orders (row sums by subgroup operations, per-workgroup partials); measured on
# lavapipe and on an H200 its errors sit within 1.5x of the reference's (docs/BENCHMARKS.md).
BACKENDS: list[Backend] = [b for b in (
    _entry("ssm_ref", where=r"CPU", tol=F32_TOL),
    _entry("ssm_vk", where=r"Vulkan\d+", tol=F32_TOL),
) if b is not None]


def oracle_scan(**kw):
    """The float64 oracle forward (ssm_ref with every input widened, all arithmetic float64)."""
    return ssm_ref.ssm_scan(**kw, dtype=np.float64)


def oracle_back(**kw):
    """The float64 oracle backward."""
    return ssm_ref.ssm_scan_back(**kw, dtype=np.float64)


def assert_close(backend: Backend, output: str, got, want, *, label: str = "") -> None:
    """Assert ``got`` (a backend's float32 ``output``) is within the backend's tolerance of the
    float64 oracle's ``want``: ||got - want|| <= rtol*||want|| + atol*sqrt(size)
    (``ssm_ref.tolerance.judge``, the same verdict ``ssm-scan check`` gives)."""
    v = judge(output, got, want, backend.tol)
    where = f"{backend.name} {output}" + (f" [{label}]" if label else "")
    assert v.ok, f"{where}: {v.message}"
