"""The requests ssm_ggml makes of ggml, run in this process or in the worker (ssm_ggml.worker):
each is a plain dict in and a plain dict out, so both paths run the same code.

    {"kind": "info", "lib": ...}                                     -> build and devices
    {"kind": "supports", "lib", "device", "threads", "shapes", "backward"} -> {"ok": bool}
    {"kind": "run", "lib", "device", "threads", "shapes", "backward", "K", "arrays"}
                                                                      -> {"packed": 1-D float32}

``shapes``: the numpy shapes of s, x, dt, A (2-D), B, C and S; ``arrays`` the inputs as float32
(ids int32; g, the packed loss gradient, for the backward). Graphs are kept per (device, shapes,
op) for the next call with the same shapes (the fuzzer's properties call a shape several times).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

from .graph import Device, ScanGraph
from .lib import load

__all__ = ["execute", "reset"]

_GRAPHS_KEPT = 8
_devices: dict = {}
_graphs: OrderedDict = OrderedDict()


def _device(req: dict) -> Device:
    lib = load(req.get("lib"))
    key = (lib.folder, req["device"], req.get("threads"))
    if key not in _devices:
        _devices[key] = Device(lib, req["device"], req.get("threads"))
    return _devices[key]


def _shape_key(shapes: dict) -> tuple:
    return tuple((k, tuple(v) if isinstance(v, list | tuple) else v) for k, v in sorted(shapes.items()))


def _graph(req: dict) -> ScanGraph:
    dev = _device(req)
    key = (id(dev), _shape_key(req["shapes"]), bool(req.get("backward")), int(req.get("K", 1)))
    g = _graphs.get(key)
    if g is None:
        g = ScanGraph(dev, req["shapes"], backward=bool(req.get("backward")), K=int(req.get("K", 1)))
        _graphs[key] = g
        while len(_graphs) > _GRAPHS_KEPT:
            _graphs.popitem(last=False)[1].close()
    else:
        _graphs.move_to_end(key)
    return g


def execute(req: dict) -> dict:
    """Answer one request (the module docstring lists them). Raises what ggml's steps raise:
    GgmlNotFound, ValueError (no such device), GgmlError, OutputOverrun."""
    kind = req["kind"]
    if kind == "info":
        lib = load(req.get("lib"))
        return {"build": dataclasses.asdict(lib.info), "devices": lib.devices(), "has_k": lib.has_k}
    if kind == "supports":
        if req.get("backward") and "ggml_ssm_scan_back" not in load(req.get("lib")).fn:
            return {"ok": False}
        return {"ok": _graph(req).supported()}
    if kind == "run":
        return {"packed": _graph(req).run(req["arrays"])}
    raise ValueError(f"unknown request kind {kind!r}")


def reset() -> None:
    """Free every graph and backend this process made."""
    while _graphs:
        _graphs.popitem()[1].close()
    for d in _devices.values():
        d.close()
    _devices.clear()
