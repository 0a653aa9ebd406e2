"""What every property shares: running a backend, the oracle, comparisons that collect every
failing output into one message, and a random generator tied to the case (so a failure
reproduces from the case's recipe alone)."""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ssm_ref.ops import SCAN
from ssm_ref.tolerance import Comparison, Tol, compare, scaled

from .. import ports
from ..cases import Case

__all__ = ["Outputs", "Property", "PropertyFailed", "case_rng", "close", "combo", "expect", "oracle", "run",
           "snapshot_args", "tol_for"]


class PropertyFailed(AssertionError):
    """A property does not hold; the message names the property, the outputs and the case."""


@dataclass(frozen=True)
class Property:
    """One property: ``check(module, case, tol) -> bool`` raises PropertyFailed when it fails and
    returns False when it does not apply to the case (e.g. Mamba-2 vs Mamba-1 needs N >= 2).
    ``regimes``: the value regimes (ssm_ref.testing.cases.REGIMES) it is claimed for."""

    name: str
    check: Callable
    regimes: tuple
    summary: str


class Outputs(dict):
    """A backend's outputs by name; ``derived`` names those the port did not return and
    :func:`run` filled in (d_s, from a result without it: the scatter-add of its d_s0).
    ``no_backward`` is the message of a port whose ssm_scan_back raised NotImplementedError (it
    has no backward: only y and states are here), else ""."""

    derived: frozenset = frozenset()
    no_backward: str = ""

    def having(self, names) -> list:
        """The names of ``names`` this result holds (without a backward: the forward's only)."""
        return [n for n in names if n in self]


def _scatter(d_s0: np.ndarray, s, ids) -> np.ndarray:
    """d_s from d_s0: row r is the sum of d_s0[i] over ids[i] == r, in float32. Raises TypeError
    when d_s0 does not have the shape (S, H, P, N) of the inputs."""
    s_shape = tuple(int(v) for v in (s.shape if hasattr(s, "shape") else np.shape(s)))
    S = d_s0.shape[0] if d_s0.ndim == 4 else -1
    idx = np.arange(S) if ids is None else np.asarray(ids).reshape(-1)
    if len(s_shape) != 4 or d_s0.ndim != 4 or d_s0.shape[1:] != s_shape[1:] or idx.shape != (S,):
        raise TypeError(f"ssm_scan_back returned no d_s and a d_s0 of shape {d_s0.shape}: expected (S, H, P, N) "
                        f"with H, P, N of s {s_shape} and S = len(ids)")
    out = np.zeros(s_shape, dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for i, r in enumerate(idx.tolist()):
            out[r] += d_s0[i]
    return out


def snapshot_args(module, case: Case) -> dict:
    """The K arguments of :func:`run` and :func:`oracle` for ``case`` on the port ``module``:
    {"K": the case's K, "g_snapshots": its g_snapshots, "slots": the slots compared} for a port
    that declares SNAPSHOTS (ssm_ref.testing.ports: all K, or the k < T of a "ggml" port);
    K = 1 and no slots for one that does not (a case of K > 1 is run as K = 1 there)."""
    kind = ports.snapshot_kind(module)
    if not kind or case.K == 1:
        return {"K": 1, "g_snapshots": None, "slots": ports.compared_slots(kind, 1, case.dims["T"])}
    return {"K": case.K, "g_snapshots": case.g_snapshots, "slots": ports.compared_slots(kind, case.K, case.dims["T"])}


def _slots(out: dict, slots: int) -> None:
    """Keep the first ``slots`` snapshot slots (none: no "snapshots" entry)."""
    if "snapshots" in out:
        if slots:
            out["snapshots"] = out["snapshots"][:slots]
        else:
            del out["snapshots"]


def run(module, args: dict, g_y, g_states, backward: bool = True, *, K: int = 1, g_snapshots=None,
        slots: int = 0) -> Outputs:
    """Forward (and backward) of the port ``module`` (docs/PORTING.md, "The port interface") on
    keyword ``args``, through ssm_ref.testing.ports (the reading verify and ``ssm-scan check`` use):
    outputs by name (y, states, snapshots, d_s, d_s0, d_x, d_dt, d_A, d_B, d_C) as host arrays.
    K > 1: the forward asks for K state snapshots, the backward gets ``g_snapshots``; "snapshots"
    holds the first ``slots`` slots the port returned (none: left out; :func:`snapshot_args` gives
    all three for a case). A backward result without d_s gets the scatter-add of its d_s0 (named
    in ``derived``). A backward that raises NotImplementedError leaves the forward's outputs only
    (``no_backward``)."""
    out = Outputs(ports.call_op(module, SCAN, args, keywords=ports.snapshot_keywords(K)).arrays)
    _slots(out, slots)
    if backward:
        try:
            g = ports.call_op(module, SCAN, args, {"g_y": g_y, "g_states": g_states},
                              ports.snapshot_keywords(K, g_snapshots, backward=True))
        except NotImplementedError as e:  # a port without a backward: its forward is still checked
            out.no_backward = ports.error_text(e)
            return out
        out.update(g.arrays)
        if "d_s" not in g:
            out["d_s"] = _scatter(out["d_s0"], args["s"], args.get("ids"))
            out.derived = frozenset({"d_s"})
    return out


def oracle(args: dict, g_y, g_states, backward: bool = True, *, K: int = 1, g_snapshots=None,
           slots: int = 0) -> dict:
    """The float64 oracle's outputs (ssm_ref with dtype=np.float64): K and ``g_snapshots`` as
    :func:`run`, "snapshots" its first ``slots`` slots (none: left out)."""
    ref = ports.reference_port(SCAN)
    out = dict(ports.call_op(ref, SCAN, args, keywords={"snapshots": K}).arrays)
    _slots(out, slots)
    if backward:
        out.update(ports.call_op(ref, SCAN, args, {"g_y": g_y, "g_states": g_states},
                                 ports.snapshot_keywords(K, g_snapshots, backward=True)).arrays)
    return out


def tol_for(tol: dict, case: Case, k: float = 1.0) -> dict:
    """The tolerance table for this case's T (ssm_ref.tolerance.scaled), times k, its absolute
    floors times the largest step d = softplus(dt) where that exceeds 1.

    The floors are RMS errors per element measured with steps below 1 (typical dt); every output
    carries the step as a factor (u = x*d in the states and y, d_x = gamma*d, d_B = lam*u,
    d_A = q*d), so a cancelling sum's float32 error grows with it: with dt in the identity branch
    (d up to 40) a one-element d_x cancelling to 1e-4 of its terms had an error of 1.17e-6 on
    every backend, the float32 reference included, against a floor of 1.0e-6."""
    t = dict(scaled(tol, case.dims["T"]))   # a copy: scaled hands back the caller's table up to T = 16
    dt = np.asarray(case.inputs["dt"], dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        d = np.where(dt > 20, dt, np.log1p(np.exp(np.minimum(dt, 20))))
    d = d[np.isfinite(d)]
    step = max(1.0, float(d.max())) if d.size else 1.0
    if step > 1.0:
        t = {name: Tol(v.rtol, v.atol * step) for name, v in t.items()}
    t["snapshots"] = t["states"]          # each slot is a state: the states' bound
    return t if k == 1.0 else {name: v.times(k) for name, v in t.items()}


def close(name: str, got, want, tol: dict) -> Comparison:
    return compare(name, got, want, tol[name])


def combo(name: str, got, parts: list, tol: Tol) -> Comparison:
    """``got`` against sum(c * a for c, a in parts), with a bound that grows with each part's own
    size (a sum of float32 results carries each one's error): rtol * (||got|| + sum |c|*||a||)
    + atol * sqrt(size) * (1 + sum |c|)."""
    with np.errstate(invalid="ignore", over="ignore"):
        want = sum(c * np.asarray(a, dtype=np.float64) for c, a in parts)
    weight = 1.0 + sum(abs(c) for c, _ in parts)
    base = compare(name, got, want, Tol(0.0, 0.0))
    if base.detail or np.asarray(want).size == 0:
        return base if base.detail else Comparison(name, True, 0.0, 0.0, 0.0, 0.0)
    fin = np.isfinite(want)
    norm = float(np.linalg.norm(np.asarray(got, dtype=np.float64)[fin]))
    norm += sum(abs(c) * float(np.linalg.norm(np.asarray(a, dtype=np.float64)[fin])) for c, a in parts)
    bound = tol.rtol * norm + tol.atol * math.sqrt(int(fin.sum())) * weight
    return dataclasses.replace(base, ok=base.err <= bound, bound=bound)


def expect(prop: str, comparisons, case: Case, note: str = "") -> None:
    """Raise PropertyFailed listing every failed comparison."""
    bad = [c for c in comparisons if not c.ok]
    if bad:
        lines = "\n  ".join(c.message() for c in bad)
        raise PropertyFailed(f"{prop}{' (' + note + ')' if note else ''} fails for {case.label}:\n  {lines}")


def case_rng(case: Case, salt: str) -> np.random.Generator:
    """A generator determined by the case (its recipe seed, else its bytes) and ``salt``."""
    if case.recipe is not None:
        key = int(case.recipe["seed"])
    else:
        key = 0
        for v in (*case.inputs.values(), case.g_y, case.g_states):
            if v is not None:
                key = zlib.crc32(np.ascontiguousarray(v).tobytes(), key)
    return np.random.default_rng([key, zlib.crc32(salt.encode())])
