"""Batch invariance and split invariance (docs/SPEC.md section 3.2): bit-for-bit properties that
a backend may promise beyond the correctness contract (the float64 oracle's tolerance). They are
not in PROPERTIES, which every port must have; :data:`INVARIANCES` holds them, and the fuzzer,
``ssm-scan fuzz --property batch_invariant`` and ``ssm-scan check`` run them on any port.

* *batch invariance*: a sequence's y, final states and snapshots, and its own gradients (d_s0,
  d_x, d_dt, its rows of d_B and d_C) are the same bits alone (S = 1), inside the drawn case,
  and inside a shuffled batch where it appears at several positions among companions; d_s is
  the float32 scatter-add of the batch's own d_s0 in sequence order (0 + d_s0[i] + ..., i
  ascending), so it is a function of per-sequence results in a fixed order.
* *split invariance*: scanning tokens [0, T) in one call equals the same tokens cut into
  consecutive calls that carry the state (through ``states``, or through the cache with
  ``update_cache=True`` where the port takes it), the last tokens one at a time like a decode
  loop; backward: the calls chained last first through d_s0 -> g_states give the one call's d_s,
  d_s0, d_x, d_dt, d_B, d_C.

d_A is a sum over sequences and tokens: neither property compares it (section 3.2 says what each
backend's sum is). Equality is of bits: equal values with equal sign bits, or nan at both (a
nan's payload is not compared). A port that takes ``snapshots=K`` has its snapshots compared too.

:func:`batch_report` and :func:`split_report` return what was compared, output by output, with
the number of differing entries and the largest difference: ``ssm-scan check`` prints them as
information; the properties raise PropertyFailed when any compared output differs.
"""

from __future__ import annotations

import inspect
import itertools
from dataclasses import dataclass, field

import numpy as np

from ssm_ref.ops import SCAN

from .. import ports
from ..cases import Case
from ._common import PropertyFailed, case_rng

__all__ = ["CHECK_CASES", "Difference", "InvarianceReport", "batch_invariant", "batch_report", "check_reports",
           "invariant_port", "split_invariant", "split_report", "takes_keyword"]

PER_TOKEN = ("x", "dt", "B", "C")
OWN_GRADS = ("d_s0", "d_x", "d_dt", "d_B", "d_C")
SPLIT_GRADS = ("d_s", "d_s0", "d_x", "d_dt", "d_B", "d_C")
# The order of the outputs in a report (and in ssm-scan check's table).
ORDER = (*SCAN.output_names, "snapshots", *SCAN.grad_names)
D_A_NOTE = "a sum over sequences and tokens, not compared (docs/SPEC.md section 3.2)"


@dataclass(frozen=True)
class Difference:
    """One output's comparison: ``differ`` entries of ``size`` do not have the same bits;
    ``max_abs`` is the largest |a - b| among them (inf where one side is not finite, 0.0 when
    none differ); ``first`` the index of the first one (None when none)."""

    output: str
    differ: int
    size: int
    max_abs: float
    first: tuple | None = None

    @property
    def same(self) -> bool:
        return self.differ == 0

    def message(self) -> str:
        if self.same:
            return f"{self.output}: bit for bit"
        return (f"{self.output}: {self.differ} of {self.size} entries differ, largest |difference| "
                f"{self.max_abs:.3g}, first at {self.first}")


@dataclass
class InvarianceReport:
    """What :func:`batch_report` or :func:`split_report` compared: ``kind`` ("batch" or "split"),
    ``arrangement`` (the batch or the split points, in words), ``compared`` (output ->
    Difference, every arrangement folded in), ``not_compared`` (output -> why)."""

    kind: str
    arrangement: str = ""
    compared: dict = field(default_factory=dict)
    not_compared: dict = field(default_factory=dict)

    @property
    def holds(self) -> bool:
        return all(d.same for d in self.compared.values())

    def differing(self) -> list[str]:
        return [k for k in ORDER if k in self.compared and not self.compared[k].same]

    def add(self, output: str, a, b) -> None:
        """Compare ``a`` with ``b`` and fold the result into ``compared[output]``."""
        d = differences(output, a, b)
        old = self.compared.get(output)
        if old is not None:
            d = Difference(output, old.differ + d.differ, old.size + d.size, max(old.max_abs, d.max_abs),
                           old.first if old.first is not None else d.first)
        self.compared[output] = d


def differences(output: str, a, b) -> Difference:
    """Entries of ``a`` and ``b`` whose bits differ (nan on both sides counts as the same); shapes
    that differ make every entry differ."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return Difference(output, max(a.size, b.size, 1), max(a.size, b.size, 1), float("inf"), ())
    with np.errstate(invalid="ignore", over="ignore"):
        same = ((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))
        bad = ~same
        n = int(bad.sum())
        if not n:
            return Difference(output, 0, a.size, 0.0)
        diff = np.abs(a[bad].astype(np.float64) - b[bad].astype(np.float64))
    diff = np.where(np.isnan(diff), np.inf, diff)
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    return Difference(output, n, a.size, float(diff.max()), first)


def takes_keyword(fn, name: str) -> bool:
    """Whether ``fn`` accepts the keyword argument ``name`` (by name or through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any((p.name == name and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)) or p.kind == p.VAR_KEYWORD
               for p in params)


def _forward(module, args: dict, **kw) -> dict:
    """y, states (and snapshots when asked for with ``snapshots=K``) of the port's forward; y
    alone with ``update_cache=True`` (its result's states are the cache's business)."""
    if not kw.get("update_cache"):
        got = dict(ports.call_op(module, SCAN, args, keywords=kw).arrays)
        return {"snapshots": None, **got} if "snapshots" in kw else got
    out = module.ssm_scan(*ports.args_of(args), **kw)
    snaps = out.get("snapshots") if isinstance(out, dict) else getattr(out, "snapshots", None)
    return {"y": ports.host(out.y), **({"snapshots": None if snaps is None else ports.host(snaps)}
                                      if "snapshots" in kw else {})}


def _backward(module, args: dict, g_y, g_states) -> dict | None:
    """The port's gradients by name (d_s: the float32 scatter-add of d_s0 when it gives none);
    None for a port whose ssm_scan_back raises NotImplementedError."""
    from ._common import _scatter

    try:
        got = dict(ports.call_op(module, SCAN, args, {"g_y": g_y, "g_states": g_states}).arrays)
    except NotImplementedError:
        return None
    if "d_s" not in got:
        got["d_s"] = _scatter(got["d_s0"], args["s"], args.get("ids"))
    return got


def _ordered_scatter(d_s0: np.ndarray, ids, R: int) -> np.ndarray:
    """Row r = 0 + d_s0[i] + ... over the i with ids[i] == r, i ascending, in d_s0's dtype."""
    out = np.zeros((R, *d_s0.shape[1:]), dtype=d_s0.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        for i, r in enumerate(np.asarray(ids).tolist()):
            out[r] = out[r] + d_s0[i]
    return out


def _pick(a: dict, case: Case, rows) -> tuple[dict, np.ndarray, np.ndarray]:
    """The inputs (whole cache, ids of the chosen sequences) and loss gradients of the sequences
    ``rows`` of ``case``, in that order."""
    rows = np.asarray(rows, dtype=np.int64)
    sub = {**a, "ids": np.asarray(case.ids)[rows], **{k: a[k][rows] for k in PER_TOKEN}}
    return sub, case.g_y[rows], case.g_states[rows]


def batch_report(module, case: Case, *, target: int | None = None, members=None, snapshots: int | None = None,
                 backward: bool = True) -> InvarianceReport:
    """Sequence i of ``case`` (drawn) alone (S = 1, its cache row), against the same sequence at
    position i of the case, and at each of its positions in a shuffled batch of 1 to 3 copies of
    it among 0 to S + 1 companions drawn from the case's sequences, every sequence with its ids
    row and its rows of g_y, g_states. A port that takes ``snapshots`` is asked for K in 1..T + 2
    slots. Overrides of the draws: ``target`` (i), ``members`` (the batch, as rows of the case),
    ``snapshots`` (K; 0: none asked for); ``backward`` False: the forward only."""
    rng = case_rng(case, "batch_invariant")
    d = case.dims
    S, T, R = d["S"], d["T"], d["R"]
    a = case.args()
    i0 = int(rng.integers(0, S)) if target is None else int(target)
    if members is None:
        members = [i0] * int(rng.integers(1, 4)) + rng.integers(0, S, int(rng.integers(0, S + 2))).tolist()
        members = [members[j] for j in rng.permutation(len(members))]
    members = [int(m) for m in members]
    at = [j for j, m in enumerate(members) if m == i0]       # a companion may be sequence i0 too
    kw = _snapshots(module, rng, T, snapshots)
    rep = InvarianceReport("batch", f"sequence {i0} alone, at {i0} of the case, at {at} of the batch "
                                    f"{members} (case rows)" + (f", snapshots={kw['snapshots']}" if kw else ""))
    alone_args, alone_gy, alone_gs = _pick(a, case, [i0])
    alone = _forward(module, alone_args, **kw)
    runs = [(_pick(a, case, list(range(S))), [i0]), (_pick(a, case, members), at)]
    for (args, _, _), where in runs:
        got = _forward(module, args, **kw)
        for j in where:
            rep.add("y", got["y"][j], alone["y"][0])
            rep.add("states", got["states"][j], alone["states"][0])
            if kw:
                rep.add("snapshots", got["snapshots"][:, j], alone["snapshots"][:, 0])
    if not kw:
        rep.not_compared["snapshots"] = "the port takes no snapshots keyword"
    g_alone = _backward(module, alone_args, alone_gy, alone_gs) if backward else None
    if g_alone is None:
        why = "no backward" if backward else "forward only"
        rep.not_compared.update({k: why for k in (*OWN_GRADS, "d_s", "d_A")})
        return rep
    for (args, gy, gs), where in runs:
        g = _backward(module, args, gy, gs)
        for j in where:
            for k in OWN_GRADS:
                rep.add(k, g[k][j], g_alone[k][0])
        rep.add("d_s", g["d_s"], _ordered_scatter(g["d_s0"], args["ids"], R))
    rep.not_compared["d_A"] = D_A_NOTE
    return rep


def _snapshots(module, rng, T: int, k: int | None) -> dict:
    """{"snapshots": K} for a port that takes the keyword (K drawn in 1..T + 2 unless given; 0:
    none asked for), else {}."""
    drawn = int(rng.integers(1, T + 3))
    if not takes_keyword(module.ssm_scan, "snapshots") or k == 0:
        return {}
    return {"snapshots": drawn if k is None else int(k)}


def _cuts(rng, T: int) -> list[int]:
    """Split points 0 < c < T of the tokens: up to three drawn ones, then the last 0 to 3
    tokens one call each (a decode loop)."""
    if T < 2:
        return []
    cuts = set(rng.integers(1, T, int(rng.integers(1, 4))).tolist())
    steps = int(rng.integers(0, min(T - 1, 3) + 1))
    cuts |= {T - k for k in range(1, steps + 1)}
    return sorted(cuts)


def split_report(module, case: Case, *, cuts=None, in_cache: bool | None = None, snapshots: int | None = None,
                 backward: bool = True) -> InvarianceReport:
    """One call over tokens [0, T) against consecutive calls over the parts between drawn split
    points (:func:`_cuts`; with T >= 2 at least one cut), each starting from the state the last
    one reached: through the cache with ``update_cache=True`` when the port takes it and the ids
    are distinct (drawn half the time), else through ``states`` (``s`` = the states, ids None).
    A port that takes ``snapshots`` is asked for K slots in 1..T + 2 in the one call and the
    last part: slots k up to the last part's length are compared. Backward: the parts last
    first, each with g_states = the next part's d_s0. Overrides of the draws: ``cuts`` (split points
    in 0..T, sorted), ``in_cache`` (True needs a port that takes update_cache and distinct ids),
    ``snapshots`` (K; 0: none asked for); ``backward`` False: the forward only."""
    rng = case_rng(case, "split_invariant")
    d = case.dims
    S, T = d["S"], d["T"]
    a = case.args()
    ids = np.asarray(case.ids)
    bounds = [0, *(_cuts(rng, T) if cuts is None else [int(c) for c in cuts]), T]
    parts = list(itertools.pairwise(bounds))
    kw = _snapshots(module, rng, T, snapshots)
    drawn = bool(rng.integers(0, 2))
    if in_cache is None:
        in_cache = drawn and takes_keyword(module.ssm_scan, "update_cache") and len(set(ids.tolist())) == S
    rep = InvarianceReport("split", f"tokens {parts}" + (" through the cache (update_cache=True)" if in_cache
                                                         else " through states")
                           + (f", snapshots={kw['snapshots']}" if kw else ""))
    whole = _forward(module, a, **kw)

    def part_args(lo, hi, start):
        if start is None:
            return {**a, **{k: a[k][:, lo:hi] for k in PER_TOKEN}}
        return {**a, "s": start, "ids": None, **{k: a[k][:, lo:hi] for k in PER_TOKEN}}

    starts, ys, start, last = [], [], None, {}
    cache = a["s"].copy() if in_cache else None
    for j, (lo, hi) in enumerate(parts):
        starts.append(start)
        pkw = dict(kw) if j == len(parts) - 1 else {}
        if in_cache:
            pa = {**part_args(lo, hi, None), "s": cache, "ids": a["ids"]}
            last = _forward(module, pa, update_cache=True, **pkw)
            start = cache[ids].copy()
        else:
            last = _forward(module, part_args(lo, hi, start), **pkw)
            start = last["states"]
        ys.append(last["y"])
    rep.add("y", np.concatenate(ys, axis=1), whole["y"])
    rep.add("states", start, whole["states"])
    if kw:
        k_last = parts[-1][1] - parts[-1][0]
        upto = min(k_last, kw["snapshots"] - 1) + 1
        if last.get("snapshots") is None and kw["snapshots"] == 1:   # update_cache with K == 1: none
            rep.add("snapshots", start[None], whole["snapshots"])
        else:
            rep.add("snapshots", last["snapshots"][:upto], whole["snapshots"][:upto])
    else:
        rep.not_compared["snapshots"] = "the port takes no snapshots keyword"
    gw = _backward(module, a, case.g_y, case.g_states) if backward else None
    if gw is None:
        why = "no backward" if backward else "forward only"
        rep.not_compared.update({k: why for k in (*SPLIT_GRADS, "d_A")})
        return rep
    g_states, grads = case.g_states, []
    for (lo, hi), st in reversed(list(zip(parts, starts, strict=True))):
        g = _backward(module, part_args(lo, hi, st), case.g_y[:, lo:hi], g_states)
        grads.insert(0, g)
        g_states = g["d_s0"]
    for k in ("d_x", "d_dt", "d_B", "d_C"):
        rep.add(k, np.concatenate([g[k] for g in grads], axis=1), gw[k])
    rep.add("d_s0", grads[0]["d_s0"], gw["d_s0"])
    rep.add("d_s", grads[0]["d_s"], gw["d_s"])
    rep.not_compared["d_A"] = D_A_NOTE
    return rep


# The drawn set ``ssm-scan check`` reports on (make_problem's arguments; the arrangements are drawn
# from the case): a small Mamba-2 with groups and shuffled rows, a Mamba-1 with shared rows, and a
# Mamba-2 of 64 tokens (long enough for a backend to choose another plan by batch size).
CHECK_CASES = (
    dict(S=3, T=5, H=4, P=3, N=5, G=2, ids="permutation", variant="mamba2"),
    dict(S=3, T=17, H=2, P=4, N=8, G=1, ids="duplicates", variant="mamba1"),
    dict(S=4, T=64, H=4, P=16, N=16, G=1, ids="permutation", variant="mamba2"),
)


def check_reports(module, kind: str, seed: int) -> list[InvarianceReport]:
    """The ``kind`` ("batch" or "split") reports of ``module`` on each of :data:`CHECK_CASES`, drawn
    from ``seed``: what ``ssm-scan check`` prints as information (the scan's declared
    ``invariance``)."""
    from ..cases import make_problem

    report = {"batch": batch_report, "split": split_report}[kind]
    return [report(module, make_problem(seed + k, **c)) for k, c in enumerate(CHECK_CASES)]


def _raise(name: str, rep: InvarianceReport, case: Case) -> None:
    bad = rep.differing()
    if bad:
        lines = "\n  ".join(rep.compared[k].message() for k in bad)
        raise PropertyFailed(f"{name} fails for {case.label} ({rep.arrangement}):\n  {lines}")


def batch_invariant(module, case: Case, tol: dict) -> bool:
    """:func:`batch_report`: raises PropertyFailed when a compared output differs in any bit.
    ``tol`` is not used: invariance is exact."""
    _raise("batch_invariant", batch_report(module, case), case)
    return True


def split_invariant(module, case: Case, tol: dict) -> bool:
    """:func:`split_report`: raises PropertyFailed when a compared output differs in any bit.
    ``tol`` is not used: invariance is exact."""
    _raise("split_invariant", split_report(module, case), case)
    return True


def invariant_port(module):
    """``module`` in its invariant mode (ssm_vk's ``invariant=True``): a port whose ssm_scan,
    ssm_scan_back and supports pass invariant=True (their signatures stay the module's, so the
    properties see which other keywords it takes); None for a port whose functions do not take
    the keyword."""
    import functools
    import types

    names = ("ssm_scan", "ssm_scan_back", "supports")
    if not all(takes_keyword(getattr(module, f, None), "invariant") for f in names):
        return None
    return types.SimpleNamespace(NAME=ports.port_name(module),
                                 **{f: functools.partial(getattr(module, f), invariant=True) for f in names})
