"""ssm_ggml: ggml's own GGML_OP_SSM_SCAN (https://github.com/ggml-org/ggml), run on any of its
backend devices through ctypes, behind the interface of ssm_ref, ssm_fast and ssm_vk -- so that
``ssm-scan check``, ``fuzz`` and ``bench`` test a ggml build against the float64 oracle.

    import ssm_ggml
    ssm_ggml.use("CPU", lib="build/ggml/sdist-0.0.45/lib")    # or SSM_GGML_LIB; "Vulkan0", "CUDA0", ...
    r = ssm_ggml.ssm_scan(s, x, dt, A, B, C, ids)           # ScanResult, where = the ggml device

Shapes (N d_state, P head_dim, H n_head, G n_group, T tokens, S sequences, R cache rows):
s (R,H,P,N), x (S,T,H,P), dt (S,T,H), A (H,) | (H,1) Mamba-2 or (H,N) Mamba-1, B and C (S,T,G,N),
ids (S,) integers in [0, R) or None -- those of ssm_ref.ssm_scan, mapped onto ggml's tensors as
llama.cpp's Mamba-2 and Mamba-1 graphs build them (ssm_ggml.graph). Inputs are checked by
ssm_ref's validator before ggml sees them and are never written.

State snapshots (``snapshots=K``, docs/SPEC.md section 3.1) need a build whose ggml_ssm_scan takes
K (ggml-org/ggml 66d09fae, 2026-08-14, on: ``build_info()["has_k"]``; ``tools/build_ggml.sh --sdist
llama-cpp-python==0.3.36`` builds one); on an older build K > 1 is refused (supports gives the
reason, ssm_scan raises ValueError), and so is K > 1 with a Mamba-1 A, which ggml asserts against.
ggml writes the slots k < T; the slots k >= T it leaves unwritten hold NaN here. ``SNAPSHOTS``,
the port interface's declaration (ssm_ref.testing.ports), is "ggml" on a build with K, else None.

Where a device's ``supports_op`` declines a shape, the forward runs on ggml's CPU backend
instead (as ggml's scheduler would place it); the result says ``where="CPU"`` and supports()
gives the reason. ggml has no backward of the op: ssm_scan_back raises NotImplementedError,
unless the build exports ggmlR's ``ggml_ssm_scan_back``. With ``use(..., isolate=True)`` every
call runs in a worker process (ssm_ggml.worker), so a GGML_ASSERT or a segfault raises
:class:`GgmlAbort` with ggml's message instead of ending this process.

Same functions: ssm_ref.ssm_scan, ssm_fast.ssm_scan, ssm_vk.ssm_scan.
"""

from __future__ import annotations

import atexit
import logging
import os
from dataclasses import dataclass, field

import numpy as np

from ssm_ref import (
    ScanGrads,
    ScanResult,
    Support,
    check_backward,
    check_dt_softplus,
    check_forward,
    check_op,
    check_snapshots,
)
from ssm_ref.checks import MISSING
from ssm_ref.ops import SCAN
from ssm_ref.packing import pack_forward, unpack_backward, unpack_forward, unpack_snapshots

from .graph import GgmlError, OutputOverrun
from .lib import API_NO_K, ENV, GgmlNotFound, missing_device
from .worker import GgmlAbort, Worker

NAME = "ssm_ggml"

__all__ = ["ENV", "NAME", "SNAPSHOTS", "GgmlAbort", "GgmlError", "GgmlNotFound", "OutputOverrun", "Probe",
           "build_info", "config", "devices", "probe", "ssm_scan", "ssm_scan_back", "supports", "use"]

log = logging.getLogger(NAME)
_F32 = np.float32
_NO_BACKWARD = "ggml has no SSM_SCAN_BACK"
K_BUILD_HINT = "tools/build_ggml.sh --sdist llama-cpp-python==0.3.36 builds one (ggml 0.25.3)"


def __getattr__(name: str):
    # SNAPSHOTS depends on the build in use, so it is asked of it on each read (build_info is cached).
    if name == "SNAPSHOTS":
        try:
            return "ggml" if build_info()["has_k"] else None
        except (GgmlNotFound, GgmlAbort, OSError):
            return None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class Config:
    """What :func:`use` set: the ggml device, the library folder (None: SSM_GGML_LIB, then
    ggml-python), the CPU backend's threads (None: ggml's default), and whether calls run in
    a worker process."""

    device: str = "CPU"
    lib: str | None = None
    threads: int | None = None
    isolate: bool = False
    _worker: Worker | None = field(default=None, repr=False)
    _info: dict | None = field(default=None, repr=False)


_config = Config()
_logged: set = set()


def config() -> Config:
    return _config


def use(device: str = "CPU", *, lib: str | os.PathLike | None = None, threads: int | None = None,
        isolate: bool = False) -> dict:
    """Choose the ggml build and device every later call uses; returns :func:`build_info`.

    device: a ggml device name ("CPU", "Vulkan0", "CUDA0", "Metal", ...: ``devices()`` lists them).
    lib: the folder holding libggml*.so (or the path of libggml.so); default: $SSM_GGML_LIB, then
    the ggml-python package. threads: the CPU backend's thread count. isolate: run every call in a
    worker process (an abort raises GgmlAbort). Raises GgmlNotFound (no build), ValueError (no
    such device), GgmlAbort (the build aborts while loading, with isolate)."""
    global _config
    if not isinstance(device, str) or not device:
        raise ValueError(f"device: expected a ggml device name such as 'CPU' or 'Vulkan0', got {device!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads: expected a positive int or None, got {threads!r}")
    close()
    _logged.clear()                      # a new configuration logs its fallbacks and findings afresh
    _config = Config(device=device, lib=None if lib is None else str(lib), threads=threads, isolate=bool(isolate))
    info = build_info()
    names = [n for n, _ in info["devices"]]
    if device not in names:
        raise ValueError(missing_device(device, info["build"]["folder"], names))
    return info


def _request(req: dict) -> dict:
    req = {"lib": _config.lib, "device": _config.device, "threads": _config.threads, **req}
    if _config.isolate:
        if _config._worker is None:
            _config._worker = Worker()
        return _config._worker.call(req)
    from .engine import execute

    return execute(req)


def build_info() -> dict:
    """{"build": {folder, found_by, version, commit, api, backward, recipe}, "devices": [(name,
    description)], "has_k": bool} of the build in use (loaded on first call)."""
    if _config._info is None:
        _config._info = _request({"kind": "info"})
    return _config._info


def devices() -> list[tuple[str, str]]:
    """(name, description) of every device of the ggml build in use."""
    return [tuple(d) for d in build_info()["devices"]]


def close() -> None:
    """End the worker and free ggml's graphs and backends (called at exit)."""
    if _config._worker is not None:
        _config._worker.close()
        _config._worker = None
    from .engine import reset

    reset()


atexit.register(close)


def _shapes(p) -> dict:
    return {"s": p.s.shape, "x": p.x.shape, "dt": p.dt.shape, "A": p.A.shape, "B": p.B.shape, "C": p.C.shape,
            "S": p.dims.S}


def _arrays(p) -> dict:
    return {"s": p.s, "x": p.x, "dt": p.dt, "A": p.A, "B": p.B, "C": p.C, "ids": p.ids.astype(np.int32)}


def _softplus_reason(dt_softplus) -> str:
    check_dt_softplus(dt_softplus)
    if dt_softplus == "ggml":
        return ""
    return (f"ggml's SSM_SCAN computes its own softplus, log(1 + exp(dt)) with the identity above 20 "
            f"(dt_softplus='ggml'); dt_softplus={dt_softplus!r} is not what it computes")


def _placement(p, backward: bool) -> tuple[str, str]:
    """(device to run on, why not the chosen one: "" when it runs there)."""
    dev = _config.device
    K = p.dims.K
    if _request({"kind": "supports", "shapes": _shapes(p), "backward": backward, "K": K})["ok"]:
        return dev, ""
    why = f"ggml's {dev} declines this op for these shapes (its supports_op: false)"
    if dev == "CPU":
        return dev, why
    ok_cpu = _request({"kind": "supports", "device": "CPU", "shapes": _shapes(p), "backward": backward,
                       "K": K})["ok"]
    return ("CPU" if ok_cpu else dev), why


def _snapshots_reason(p) -> str:
    """Why ggml cannot write this problem's K > 1 state slots ("" when it can, or K == 1)."""
    if p.dims.K == 1:
        return ""
    info = build_info()
    if not info["has_k"]:
        return (f"snapshots={p.dims.K}: the ggml build at {info['build']['folder']} has {API_NO_K}, without K "
                f"(ggml before ggml-org/ggml 66d09fae, 2026-08-14); state snapshots need a newer build: "
                f"{K_BUILD_HINT}")
    if p.dims.mamba1:
        return (f"snapshots={p.dims.K}: ggml's ggml_ssm_scan asserts K == 1 for Mamba-1 (A of shape (H, N)); "
                "it writes snapshots for Mamba-2 only")
    return ""


def supports(op, s, x, dt, A, B, C=MISSING, ids=None, *, dt_softplus="ggml", snapshots=1) -> Support:
    """Whether ggml's chosen device runs this case: ssm_ref's validator (bad input raises as in
    ssm_scan), then ggml's own ``ggml_backend_dev_supports_op`` on the op built for these shapes.
    The backward: only where the build exports ggmlR's ggml_ssm_scan_back. A forward that the
    device declines runs on ggml's CPU (the reason says so). ``snapshots=K`` > 1: only on a build
    whose ggml_ssm_scan takes K, and for Mamba-2 (the reason says which)."""
    check_op(op)
    p = check_forward(s, x, dt, A, B, C, ids, snapshots=check_snapshots(snapshots))
    why = _softplus_reason(dt_softplus) or _snapshots_reason(p)
    if why:
        return Support(False, why)
    if op == "ssm_scan_back" and not build_info()["build"]["backward"]:
        return Support(False, f"{_NO_BACKWARD} (the build at {build_info()['build']['folder']} exports no "
                              "ggml_ssm_scan_back; ggmlR's builds do)")
    where, why = _placement(p, op == "ssm_scan_back")
    if not why:
        return Support(True, f"ggml's {where} runs it")
    if where != _config.device:
        return Support(False, f"{why}; it runs on ggml's CPU instead")
    return Support(False, why)


def _run(p, backward: bool, extra: dict | None = None) -> tuple[np.ndarray, str]:
    where, why = _placement(p, backward)
    if why:
        if where == _config.device:
            raise GgmlError(why)
        if why not in _logged:
            _logged.add(why)
            log.warning("ssm_ggml: %s; running on ggml's CPU", why)
    arrays = {**_arrays(p), **(extra or {})}
    out = _request({"kind": "run", "device": where, "shapes": _shapes(p), "backward": backward,
                    "K": 1 if backward else p.dims.K, "arrays": arrays})
    return out["packed"], where


def ssm_scan(s, x, dt, A, B, C=MISSING, ids=None, *, dt_softplus="ggml", snapshots=1) -> ScanResult:
    """Forward selective scan by ggml's SSM_SCAN on the device chosen with :func:`use`.

    Arguments and result as ssm_ref.ssm_scan: float32 ScanResult(y (S,T,H,P), states (S,H,P,N),
    snapshots (K,S,H,P,N)), where = the ggml device that ran it ("CPU", "Vulkan0", ...), backend =
    "ssm_ggml". ``snapshots=K``: ggml's K state slots; it writes the slots k < T (slot 0 the
    final states), the slots k >= T it leaves unwritten are NaN (docs/SPEC.md section 3.1). Raises
    TypeError / ValueError for bad input (ssm_ref's checks) before ggml is called; ValueError for
    a dt_softplus other than "ggml", and for K > 1 on a build without K or with a Mamba-1 A (the
    message says which); OutputOverrun when ggml wrote past its output (the message says how far
    its result is from ssm_ref's float64 one); GgmlAbort when ggml stopped the worker
    (isolate=True); GgmlError for a failed graph compute."""
    p = check_forward(s, x, dt, A, B, C, ids, snapshots=check_snapshots(snapshots))
    why = _softplus_reason(dt_softplus)
    if why:
        raise ValueError(f"dt_softplus: {why}")
    why = _snapshots_reason(p)
    if why:
        raise ValueError(why)
    try:
        packed, where = _run(p, False)
    except OutputOverrun as e:
        raise OutputOverrun(e.device, e.packed, e.changed, e.first, _oracle_note(p, e.packed)) from None
    _note_unwritten(packed, p.dims, where)
    y, states = unpack_forward(packed, p.dims)
    snaps = unpack_snapshots(packed, p.dims) if p.dims.K > 1 else states[None].copy()
    return ScanResult(y=y.copy(), states=states.copy(), where=where, backend=NAME, snapshots=snaps)


def _note_unwritten(packed: np.ndarray, dims, where: str) -> None:
    """Log (once per device and output) that ggml left output floats unwritten: they are NaN. The
    snapshot slots k >= T are not counted: ggml never writes them (docs/SPEC.md section 3.1)."""
    from .graph import unwritten

    mask = unwritten(packed)
    if not mask.any():
        return
    n_y = dims.S * dims.T * dims.H * dims.P
    row = dims.S * dims.H * dims.P * dims.N
    written = min(dims.K, dims.T) if dims.K > 1 else 1
    parts = [("y", mask[:n_y]), ("states", mask[n_y:n_y + row])]
    if written > 1:
        parts.append(("snapshots", mask[n_y + row:n_y + written * row]))
    for name, part in parts:
        key = (where, name)
        if part.any() and key not in _logged:
            _logged.add(key)
            log.warning("ssm_ggml: ggml's %s left %d of %d floats of %s unwritten (they read as NaN), e.g. "
                        "for S=%d T=%d H=%d P=%d N=%d", where, int(part.sum()), part.size, name,
                        dims.S, dims.T, dims.H, dims.P, dims.N)


def _oracle_note(p, packed: np.ndarray) -> str:
    """How far a packed forward is from ssm_ref's float64 one: for an overrun's message."""
    import ssm_ref

    want = ssm_ref.ssm_scan(p.s, p.x, p.dt, p.A.reshape(p.dims.a_shape), p.B, p.C, p.ids, dtype=np.float64)
    got = unpack_forward(packed, p.dims)
    parts = []
    for name, g, w in zip(SCAN.output_names, got, (want.y, want.states), strict=True):
        with np.errstate(invalid="ignore"):
            diff = np.abs(g.astype(np.float64) - w)
        if diff.size == 0:
            continue
        if np.isnan(diff).all():
            parts.append(f"{name}: no finite entry")
            continue
        k = int(np.nanargmax(diff))
        idx = np.unravel_index(k, diff.shape)
        parts.append(f"{name} differs from ssm_ref's float64 result by up to {diff.flat[k]:.3g} at "
                     f"{tuple(int(i) for i in idx)} (got {g[idx]:.9g}, want {w[idx]:.9g})")
    return "; ".join(parts)


def ssm_scan_back(s, x, dt, A, B, C=MISSING, ids=None, g_y=None, g_states=None, *, dt_softplus="ggml",
                  g_snapshots=None) -> ScanGrads:
    """Backward of :func:`ssm_scan`, where the build has one (ggmlR's ``ggml_ssm_scan_back``):
    ScanGrads as ssm_ref.ssm_scan_back, with d_s the scatter-add of ggml's d_s0 by ids (computed
    here; ggmlR returns d_s0 only). Raises NotImplementedError for a build without it (upstream
    ggml: it has no SSM_SCAN_BACK), and for ``g_snapshots`` (or a packed g_y with K > 1 slots):
    no ggml has a backward of the snapshots; after the checks of ssm_ref."""
    p = check_backward(s, x, dt, A, B, C, ids, g_y, g_states, g_snapshots=g_snapshots)
    why = _softplus_reason(dt_softplus)
    if why:
        raise ValueError(f"dt_softplus: {why}")
    info = build_info()["build"]
    if not info["backward"]:
        raise NotImplementedError(f"{_NO_BACKWARD} (the build at {info['folder']} exports no ggml_ssm_scan_back)")
    if p.g_snapshots is not None:
        raise NotImplementedError(f"{_NO_BACKWARD} of the state snapshots (g_snapshots): ggmlR's "
                                  "ggml_ssm_scan_back takes the final states' gradient alone")
    g = pack_forward(p.g_y, p.g_states)
    packed, where = _run(p, True, {"g": g})
    grads = {k: v.copy() for k, v in unpack_backward(packed, p.dims).items()}
    d_s = np.zeros(p.s.shape, dtype=_F32)
    np.add.at(d_s, p.ids, grads["d_s0"])
    return ScanGrads(d_s=d_s, **grads, where=where, backend=NAME)


@dataclass(frozen=True)
class Probe:
    """What ggml did with inputs taken as given (:func:`probe`): ``ok`` when it returned,
    ``packed`` its output (None when it stopped), ``error`` the failure's text ("" when ok),
    ``assertion`` ggml's GGML_ASSERT line, ``stderr`` all ggml printed."""

    ok: bool
    where: str
    packed: np.ndarray | None
    error: str = ""
    assertion: str = ""
    stderr: str = ""


def probe(s, x, dt, A, B, C, ids=None, *, device: str | None = None, K: int = 1) -> Probe:
    """Run ggml's SSM_SCAN on inputs *without* ssm_ref's validator, always in a worker process:
    for finding out what ggml itself does with a case this library rejects (H % G != 0, an id
    out of range, K > 1 on a Mamba-1 A). Arrays are only converted (float32; ids int32, default
    arange(S)); A of shape (H,) is given to ggml as (H, 1). Never raises for ggml's behaviour:
    an abort, a failed compute or an overrun come back in the Probe."""
    arr = {k: np.ascontiguousarray(v, dtype=_F32) for k, v in zip("s x dt A B C".split(), (s, x, dt, A, B, C),
                                                                   strict=True)}
    if arr["A"].ndim == 1:
        arr["A"] = arr["A"].reshape(-1, 1)
    S = arr["x"].shape[0]
    arr["ids"] = np.ascontiguousarray(np.arange(S) if ids is None else ids, dtype=np.int32)
    shapes = {k: arr[k].shape for k in "s x dt A B C".split()}
    shapes["S"] = int(arr["ids"].shape[0])
    dev = device or _config.device
    w = Worker()
    try:
        out = w.call({"kind": "run", "lib": _config.lib, "device": dev, "threads": _config.threads,
                      "shapes": shapes, "backward": False, "K": int(K), "arrays": arr})
        return Probe(True, dev, out["packed"])
    except GgmlAbort as e:
        return Probe(False, dev, None, str(e).splitlines()[0], e.assertion, e.stderr)
    except OutputOverrun as e:
        return Probe(False, dev, e.packed, str(e))
    except (GgmlError, ValueError, RuntimeError) as e:
        return Probe(False, dev, None, f"{type(e).__name__}: {e}")
    finally:
        w.close()
