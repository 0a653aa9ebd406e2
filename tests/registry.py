"""The backends under test, their tolerances, and the comparison helpers.

Every backend is judged the same way: its float32 result against the float64 oracle
(``ssm_ref`` with ``dtype=np.float64``) on the same float32-representable inputs, output by
output, with the bound of :data:`F32_TOL`. Adding a backend is one line in ``BACKENDS``::

    _entry("ssm_fast", where=r"CPU", tol=F32_TOL),
    _entry("ssm_vk", where=r"Vulkan\\d+", tol=F32_TOL),

``_entry`` imports the module only if it is installed *and* exposes the interface of
docs/API.md (NAME, ssm_scan, ssm_scan_back, supports); otherwise the entry is left out, so a
backend still under construction neither breaks nor silently passes the suite (the registry
test below asserts ssm_ref is always present).

The bound (see docs/SPEC.md, "Tolerance policy"):

    ||got - want||  <=  rtol * ||want||  +  atol * sqrt(size)         (2-norms, in float64)

``rtol`` is the norm-relative error float32 arithmetic may add; ``atol`` is an absolute floor
(an RMS error per element) for outputs whose exact value nearly cancels (a one-element d_A or y
can be 1e-3 of its terms, and then float32's absolute error is all that is left).

The bounds are claimed for inputs in the R test's ranges (problems.py), dt in [-0.5, 0.5] in
particular. Far down the log branch the float32 softplus log(1 + exp(dt)) itself is off by about
6e-8 / exp(dt) relative (docs/SPEC.md asks for exactly that formula), so float32 and float64 part
ways by design: measured on y and d_x, 5e-7 for dt in [-3, -2], 4e-6 in [-5, -4], 7e-5 in
[-8, -7], 4e-3 in [-12, -11], 0.2 in [-16, -15].
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from types import ModuleType

import numpy as np

import ssm_ref

# The float32 bounds (measured, with a comment per output saying why) and rel_err live in the
# package, where ssm_ref.testing.verify and the fuzzer use them too: ssm_ref/tolerance.py.
from ssm_ref.ops import SCAN
from ssm_ref.tolerance import F32_TOL, OUTPUTS, Tol, rel_err

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


# A backend of an op has NAME, the op's two functions and supports (ssm_ref.ops; the scan's here).
_INTERFACE = ("NAME", SCAN.name, SCAN.backward_name, "supports")


def _entry(name: str, *, where: str, tol: dict) -> Backend | None:
    try:
        mod = importlib.import_module(name)
    except ImportError:
        return None
    if not all(hasattr(mod, attr) for attr in _INTERFACE):
        return None
    return Backend(name=name, module=mod, where=where, tol=tol)


# ssm_fast: the same float32 bounds (it fuses multiply-adds and regroups sums over n; it is left out
# until its package exposes the interface).
# ssm_vk: the same float32 bounds. Its kernels fuse multiply-adds and sum over n, channels and
# heads in other orders (row sums by subgroup operations, per-workgroup partials); measured on
# lavapipe and on an H200 its errors sit within 1.5x of the reference's (docs/BENCHMARKS.md).
# ssm_fast: the same float32 bounds; it joins the suite as soon as it exposes the interface.
BACKENDS: list[Backend] = [b for b in (
    _entry("ssm_ref", where=r"CPU", tol=F32_TOL),
    _entry("ssm_fast", where=r"CPU", tol=F32_TOL),
    _entry("ssm_vk", where=r"Vulkan\d+", tol=F32_TOL),
) if b is not None]


def oracle_scan(**kw):
    """The float64 oracle forward (ssm_ref with every input widened, all arithmetic float64)."""
    return ssm_ref.ssm_scan(**kw, dtype=np.float64)


def oracle_back(**kw):
    """The float64 oracle backward."""
    return ssm_ref.ssm_scan_back(**kw, dtype=np.float64)


def _abs_err(got, want) -> float:
    g = np.asarray(got, dtype=np.float64)
    w = np.asarray(want, dtype=np.float64)
    fin = np.isfinite(w)
    return float(np.linalg.norm(g[fin] - w[fin]))


def assert_close(backend: Backend, output: str, got, want, *, label: str = "") -> None:
    """Assert ``got`` (a backend's float32 ``output``) is within the backend's tolerance of the
    float64 oracle's ``want``: ||got - want|| <= rtol*||want|| + atol*sqrt(size)."""
    tol = backend.tol[output]
    got_a = np.asarray(got)
    want_a = np.asarray(want)
    where = f"{backend.name} {output}" + (f" [{label}]" if label else "")
    assert got_a.shape == want_a.shape, f"{where}: shape {got_a.shape}, oracle {want_a.shape}"
    r = rel_err(got_a, want_a)
    if r == 0.0:
        return
    assert math.isfinite(r), f"{where}: non-finite entries differ from the oracle's"
    fin = np.isfinite(want_a)
    norm = float(np.linalg.norm(want_a[fin].astype(np.float64)))
    err = _abs_err(got_a, want_a)
    bound = tol.rtol * norm + tol.atol * math.sqrt(int(fin.sum()))
    assert err <= bound, (f"{where}: ||got - want|| = {err:.3e} > {bound:.3e} "
                          f"(rel_err {r:.3e}, rtol {tol.rtol:g}, atol {tol.atol:g}, size {want_a.size})")
