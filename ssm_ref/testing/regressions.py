"""Saved failing cases: one JSON file per case, replayed by the test suite on every backend.

A file holds the case's exact arrays (so it replays bit for bit whatever numpy's random streams
do in the future), the recipe that made it (``make_problem`` arguments with the seed: the
readable reproducer), the property that failed, the backend it failed on and the message:

    {"format": "ssm-scan regression 1",
     "property": "nonfinite_pattern", "found_on": "ssm_vk", "message": "...", "note": "...",
     "regime": "nonfinite", "ids_pattern": "permutation",
     "recipe": {"seed": 1321529464, "S": 1, "T": 3, ...} or null,
     "arrays": {"s": {"dtype": "<f4", "shape": [2, 3, 3, 3], "base64": "..."}, ..., "ids": ... or null,
                "g_y": {...}, "g_states": {...}, "g_snapshots": {...} (K > 1 only: its K is the case's)}}

Arrays are raw little-endian bytes in base64 (float32 ``<f4``, ids ``<i8``), C order.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .cases import INPUT_NAMES, Case

__all__ = ["FORMAT", "Regression", "load_all", "load_case", "save_case"]

FORMAT = "ssm-scan regression 1"


@dataclass(frozen=True)
class Regression:
    """A loaded regression file: the case, the property it failed, where, and why."""

    path: Path
    case: Case
    property: str
    found_on: str
    message: str
    note: str


def _encode(a: np.ndarray) -> dict:
    a = np.ascontiguousarray(a)
    le = a.astype(a.dtype.newbyteorder("<"), copy=False)
    return {"dtype": le.dtype.str, "shape": list(a.shape), "base64": base64.b64encode(le.tobytes()).decode()}


def _decode(name: str, d: dict) -> np.ndarray:
    dtype = np.dtype(d["dtype"])
    if dtype.str not in ("<f4", "<i8"):
        raise ValueError(f"{name}: expected dtype <f4 (or <i8 for ids), got {dtype.str}")
    raw = base64.b64decode(d["base64"])
    shape = tuple(int(v) for v in d["shape"])
    if len(raw) != dtype.itemsize * int(np.prod(shape)):
        raise ValueError(f"{name}: {len(raw)} bytes do not hold shape {shape} of {dtype.str}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


def file_name(case: Case, prop: str, found_on: str) -> str:
    """``<backend>-<property>-<regime>-<seed or digest>.json`` with only [A-Za-z0-9_.-]."""
    if case.recipe:
        key = case.recipe["seed"]
    else:
        key = zlib.crc32(b"".join(np.ascontiguousarray(v).tobytes() for v in case.inputs.values() if v is not None))
    raw = f"{found_on}-{prop}-{case.regime}-{key}.json"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)


def save_case(case: Case, directory, *, prop: str, found_on: str, message: str = "", note: str = "") -> Path:
    """Write ``case`` as a regression file in ``directory`` (created if missing); returns its path.
    An existing file of the same name is overwritten (same backend, property and seed)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    arrays = {k: (None if case.inputs[k] is None else _encode(case.inputs[k])) for k in (*INPUT_NAMES, "ids")}
    arrays["g_y"], arrays["g_states"] = _encode(case.g_y), _encode(case.g_states)
    if case.g_snapshots is not None:
        arrays["g_snapshots"] = _encode(case.g_snapshots)
    doc = {"format": FORMAT, "property": prop, "found_on": found_on, "message": message, "note": note,
           "regime": case.regime, "ids_pattern": case.ids_pattern, "variant": case.variant,
           "recipe": case.recipe, "arrays": arrays}
    path = d / file_name(case, prop, found_on)
    path.write_text(_dumps(doc))
    return path


def _dumps(doc: dict) -> str:
    """JSON with one line per top-level key and one line per array (diff-friendly)."""
    def block(items, indent):
        pad = " " * indent
        return ",\n".join(f"{pad}{json.dumps(k)}: {v}" for k, v in items)

    top = [(k, json.dumps(v)) for k, v in doc.items() if k != "arrays"]
    arrays = block([(k, json.dumps(v)) for k, v in doc["arrays"].items()], 2)
    return "{\n" + block([*top, ("arrays", "{\n" + arrays + "\n }")], 1) + "\n}\n"


def load_case(path) -> Regression:
    """Read one regression file. Raises ValueError for another format or inconsistent arrays."""
    p = Path(path)
    doc = json.loads(p.read_text())
    if doc.get("format") != FORMAT:
        raise ValueError(f"{p}: expected format {FORMAT!r}, got {doc.get('format')!r}")
    arr = doc["arrays"]
    inputs = {k: (None if arr.get(k) is None else _decode(k, arr[k])) for k in (*INPUT_NAMES, "ids")}
    g_y, g_states = _decode("g_y", arr["g_y"]), _decode("g_states", arr["g_states"])
    S, T, H, P = inputs["x"].shape
    R, N = inputs["s"].shape[0], inputs["s"].shape[3]
    G = inputs["B"].shape[2]
    g_snapshots = _decode("g_snapshots", arr["g_snapshots"]) if arr.get("g_snapshots") is not None else None
    K = 1 if g_snapshots is None else int(g_snapshots.shape[0])
    variant = "mamba1" if inputs["A"].shape == (H, N) and N != 1 else doc.get("variant", "mamba2")
    case = Case(dims=dict(S=S, T=T, H=H, P=P, N=N, G=G, R=R), variant=variant,
                ids_pattern=doc.get("ids_pattern", "explicit"), inputs=inputs, g_y=g_y, g_states=g_states,
                regime=doc.get("regime", "typical"), recipe=doc.get("recipe"), K=K, g_snapshots=g_snapshots)
    return Regression(path=p, case=case, property=doc["property"], found_on=doc.get("found_on", ""),
                      message=doc.get("message", ""), note=doc.get("note", ""))


def load_all(directory) -> list[Regression]:
    """Every ``*.json`` regression in ``directory``, sorted by name (none if it does not exist)."""
    d = Path(directory)
    return [load_case(p) for p in sorted(d.glob("*.json"))] if d.is_dir() else []
