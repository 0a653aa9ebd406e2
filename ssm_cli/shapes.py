"""The named problem shapes of ``ssm-scan bench`` (and ``info``), parsing ``--shape``/``--sweep``,
and inputs drawn as ggmlR's R test draws them.

Letters as in docs/SPEC.md: N d_state, P head_dim, H n_head, G n_group, T tokens per sequence,
S sequences, R rows of the state cache. Mamba-1 has A of shape (H, N) and P = 1 (one channel per
head, ggml's layout for it); Mamba-2 has A of shape (H,).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import numpy as np

from .common import UsageError

AXES = ("N", "P", "H", "G", "T", "S")


@dataclass(frozen=True)
class Shape:
    name: str
    N: int
    P: int
    H: int
    G: int
    T: int
    S: int
    mamba1: bool = False
    note: str = ""

    @property
    def variant(self) -> str:
        return "Mamba-1" if self.mamba1 else "Mamba-2"

    @property
    def updates(self) -> int:
        """State updates of one forward: S*T*H*P*N (one multiply-add into one state element)."""
        return self.S * self.T * self.H * self.P * self.N

    @property
    def dims(self) -> dict:
        return {a: getattr(self, a) for a in AXES}

    def label(self) -> str:
        return " ".join(f"{a}={getattr(self, a)}" for a in AXES) + f" ({self.variant})"

    def with_axis(self, axis: str, value: int) -> Shape:
        return dataclasses.replace(self, **{axis: value})

    def check(self) -> Shape:
        """UsageError unless the sizes make a problem ssm_ref accepts."""
        for a in AXES:
            v = getattr(self, a)
            if v < (0 if a in "NPHT" else 1):
                raise UsageError(f"shape {self.name}: {a} must be >= {0 if a in 'NPHT' else 1}, got {v}")
        if self.H % self.G:
            raise UsageError(f"shape {self.name}: H % G must be 0 (each group is shared by H/G heads), "
                             f"got H = {self.H}, G = {self.G}")
        return self


# The benchmark shapes (issue: bench). Mamba-2 unless marked.
SHAPES = {s.name: s for s in (
    Shape("demo", N=128, P=64, H=16, G=1, T=64, S=1, note="Mamba-2 layer, one short sequence"),
    Shape("prefill", N=128, P=64, H=24, G=1, T=512, S=1, note="prompt prefill"),
    Shape("batch", N=128, P=64, H=24, G=2, T=128, S=4, note="4 sequences, 2 groups"),
    Shape("mamba1", N=16, P=1, H=1536, G=1, T=512, S=1, mamba1=True, note="Mamba-1: A (H, N), d_inner = H"),
    Shape("train", N=128, P=64, H=24, G=1, T=2048, S=8, note="a training batch"),
    Shape("long", N=128, P=64, H=24, G=1, T=16384, S=1, note="one long sequence"),
)}

# A custom shape is one word, ``custom:`` and the sizes in the Python API's order (ssm_ref.Dims:
# S, T, H, P, N, then G, default 1) or by name in any order, optionally ``,mamba1``. The form
# before -- ``custom N,P,H,G,T,S`` in ggml's order, as two words or the six numbers alone -- is
# told apart by its syntax (not by its numbers, which can fit either order) and refused, with its
# translation: read in the new order, it would silently run another shape.
ORDER = ("S", "T", "H", "P", "N", "G")
CUSTOM_HELP = "custom:S,T,H,P,N[,G][,mamba1] (the Python API's order; or by name: custom:S=1,T=64,H=16,P=64,N=128)"
_VARIANT = {"mamba1": True, "m1": True, "mamba2": False, "m2": False}
_GGML_ORDER = re.compile(r"(\d+(?:,\d+){5})(?:,(mamba1|mamba2|m1|m2))?")


def parse_shapes(tokens: list[str] | None) -> list[Shape]:
    """``--shape`` values: names of :data:`SHAPES`, or ``custom:S,T,H,P,N[,G][,mamba1]`` (or the
    sizes by name, ``custom:S=1,T=64,H=16,P=64,N=128``). Raises UsageError, also for ggml's order
    of the former ``custom N,P,H,G,T,S`` (naming both orders and the translation)."""
    out: list[Shape] = []
    items = [item for tok in tokens or ["demo"] for item in tok.split()]
    for k, item in enumerate(items):
        if item in SHAPES:
            out.append(SHAPES[item])
        elif item.startswith("custom:"):
            out.append(parse_custom(item))
        elif item == "custom" and k + 1 < len(items) and _GGML_ORDER.fullmatch(items[k + 1]):
            raise UsageError(_ggml_order_message(f"custom {items[k + 1]}", items[k + 1]))
        elif item == "custom":
            raise UsageError(f"--shape custom: expected the sizes in the same word, {CUSTOM_HELP}")
        elif _GGML_ORDER.fullmatch(item) and not (k and items[k - 1] == "custom"):
            raise UsageError(_ggml_order_message(item, item))
        elif not (k and items[k - 1] == "custom"):
            raise UsageError(f"--shape {item}: expected one of {', '.join(SHAPES)} or {CUSTOM_HELP}")
    return out


def _ggml_order_message(shown: str, numbers: str) -> str:
    parts = numbers.split(",")
    N, P, H, G, T, S = parts[:6]
    tail = f",{parts[6]}" if len(parts) == 7 else ""
    return (f"--shape {shown}: a custom shape is written custom:S,T,H,P,N[,G] (the Python API's order), no "
            f"longer N,P,H,G,T,S (ggml's order); read in ggml's order, this is custom:{S},{T},{H},{P},{N},{G}{tail}")


def parse_custom(item: str) -> Shape:
    """``custom:S,T,H,P,N[,G][,mamba1]`` or ``custom:S=..,T=..,H=..,P=..,N=..[,G=..][,mamba1]``."""
    body = item.partition(":")[2]
    parts = [x.strip() for x in body.split(",")] if body else []
    mamba1 = False
    if parts and parts[-1].lower() in _VARIANT:
        mamba1 = _VARIANT[parts.pop().lower()]
    bad = f"--shape {item}: expected {CUSTOM_HELP}"
    named = [x for x in parts if "=" in x]
    if named and len(named) != len(parts):
        raise UsageError(f"{bad}: all sizes by position or all by name, not both")
    if named:
        sizes = {}
        for x in named:
            key, _, value = x.partition("=")
            key = key.strip().upper()
            if key not in ORDER or key in sizes or not value.strip().isdigit():
                raise UsageError(f"{bad}: {x!r} is not one of S=, T=, H=, P=, N=, G= with an integer, each once")
            sizes[key] = int(value)
        missing = [a for a in ORDER[:5] if a not in sizes]
        if missing:
            raise UsageError(f"{bad}: {', '.join(missing)} missing (only G may be left out: 1)")
    else:
        if len(parts) not in (5, 6) or not all(x.isdigit() for x in parts):
            raise UsageError(f"{bad}: five or six integers")
        sizes = dict(zip(ORDER, map(int, parts), strict=False))
    sizes.setdefault("G", 1)
    return Shape(item, mamba1=mamba1, **sizes).check()


def parse_sweep(text: str | None) -> tuple[str, list[int]] | None:
    """``--sweep T=16,64,256`` -> ("T", [16, 64, 256])."""
    if text is None:
        return None
    m = re.fullmatch(r"([A-Za-z])=(\d+(?:,\d+)*)", text.strip())
    if not m or m.group(1).upper() not in AXES:
        raise UsageError(f"--sweep {text}: expected AXIS=v1,v2,... with AXIS one of {', '.join(ORDER)}, "
                         "e.g. T=16,64,256")
    values = sorted({int(v) for v in m.group(2).split(",")})
    return m.group(1).upper(), values


def default_sweep(shape: Shape) -> tuple[str, list[int]]:
    """What ``--plot`` sweeps when ``--sweep`` is not given: T at 1/16, 1/4 and 1 of the shape's."""
    return "T", sorted({max(1, shape.T // 16), max(1, shape.T // 4), shape.T})


def swept(shape: Shape, sweep: tuple[str, list[int]] | None) -> list[Shape]:
    if sweep is None:
        return [shape]
    axis, values = sweep
    return [shape.with_axis(axis, v).check() for v in values]


def make_inputs(shape: Shape, seed: int = 0, *, R: int | None = None, ids: str = "none"):
    """(kwargs of ssm_scan, g_y, g_states): float32 inputs with the R test's distributions
    (s, B, C ~ U(-0.5, 0.5), x ~ U(-1, 1), dt ~ U(-0.5, 0.5), A ~ -U(0.2, 1.0), g ~ U(-1, 1)).

    ``ids``: "none" (ids=None, R = S), "permutation" (S distinct rows of R, shuffled) or
    "duplicates" (some sequences share a row).
    """
    S, T, H, P, N, G = shape.S, shape.T, shape.H, shape.P, shape.N, shape.G
    R = R if R is not None else S
    rng = np.random.default_rng(seed)

    def u(lo, hi, size):
        return rng.uniform(lo, hi, size).astype(np.float32)

    a_shape = (H, N) if shape.mamba1 else (H,)
    if ids == "none":
        idv = None
    elif ids == "permutation":
        idv = rng.permutation(R)[:S].astype(np.int64)
    elif ids == "duplicates":
        idv = rng.integers(0, R, S).astype(np.int64)
        idv[-1] = idv[0]
    else:
        raise ValueError(f"ids: unknown pattern {ids!r}")
    kw = dict(s=u(-0.5, 0.5, (R, H, P, N)), x=u(-1, 1, (S, T, H, P)), dt=u(-0.5, 0.5, (S, T, H)),
              A=-u(0.2, 1.0, a_shape), B=u(-0.5, 0.5, (S, T, G, N)), C=u(-0.5, 0.5, (S, T, G, N)), ids=idv)
    return kw, u(-1, 1, (S, T, H, P)), u(-1, 1, (S, H, P, N))


def empty_inputs(shape: Shape) -> dict:
    """Uninitialised float32 inputs of ``shape`` (np.empty: pages are not touched, so asking
    ``supports()`` about a 100 MB problem costs nothing)."""
    S, T, H, P, N, G = shape.S, shape.T, shape.H, shape.P, shape.N, shape.G
    e = np.empty
    return dict(s=e((S, H, P, N), np.float32), x=e((S, T, H, P), np.float32), dt=e((S, T, H), np.float32),
                A=e((H, N) if shape.mamba1 else (H,), np.float32), B=e((S, T, G, N), np.float32),
                C=e((S, T, G, N), np.float32))
