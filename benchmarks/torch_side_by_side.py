"""The PyTorch user's side by side: one training step (forward + backward) of the scan through each
path a PyTorch user has, wall time (and GPU time where the device has timestamps), with the ratio
of each torch path to the backend's own host-array call and the torch ops each path adds.

    python benchmarks/torch_side_by_side.py [--backends ssm_vk,ssm_fast] [--shapes tiny,demo,m1-tiny]
        [--rounds 5] [--reps 10] [--mamba-src PATH] [--paths device,mamba_ssm,mamba2-cuda] [--json out.json]
        [--processes 3]

The whole measurement runs in ``--processes`` fresh processes (3 by default; benchmarks/processes.py)
and the summary gives, per path, the median over the processes and their range: mamba_ssm's Triton
kernels time their configurations anew in each process, and its time moves between processes. The
JSON keeps each process's own results.

Paths, per shape (S, T, H, P, N; G = 1) and backend:

- ``host``: the backend on numpy arrays, ``ssm_scan(None, ...)`` then ``ssm_scan_back(None, ...,
  g_y, g_states)``, ``dt_softplus="log1p"`` -- the call the torch paths wrap (the issue's
  "host-array call"); ratios are to this.
- ``device`` (ssm_vk): the same on DeviceArrays uploaded once (no transfers).
- ``op``: ``ssm_torch.ssm_scan(None, ...)`` on CPU tensors, ``torch.autograd.backward`` with the
  same g_y and g_states.
- ``mamba2`` (Mamba-2 shapes): ``ssm_torch.mamba.mamba_chunk_scan_combined`` as Mamba-2 calls it:
  D (H,), z, dt_bias, ``dt_softplus=True``, the default ``dt_limit``, final states returned, the
  backward through out and the final states. ``mamba1`` (``m1-*`` shapes, P = 1, A (H, N)):
  ``selective_scan_fn`` with D, z, delta_bias, ``delta_softplus=True``, the last state returned.
  Both beside ``host`` of the same scan, so the ratio includes the glue (bias, D, z), which the
  host call does not compute.
- ``mamba_ssm`` (Mamba-2 shapes, with CUDA and mamba_ssm importable, or ``--mamba-src`` a
  state-spaces/mamba source tree loaded as benchmarks/vs_mamba_ssm.py loads it): its Triton
  ``mamba_chunk_scan_combined`` with the same arguments on CUDA tensors; wall time includes
  ``torch.cuda.synchronize()``, GPU time is CUDA events around the step.
- ``mamba2-cuda`` (``ssm_vk``, Mamba-2 shapes, where torch's CUDA device is the Vulkan device:
  ``ssm_torch.cuda.available``): the ``mamba2`` drop-in on CUDA tensors (no trip through host
  memory), timed like ``mamba_ssm``; its GPU column is CUDA events around the step, which span
  the Vulkan work the call waits for.

Timing: ``--rounds`` rounds, the paths in a rotated order each round, each path warmed by two calls
then ``--reps`` timed steps; medians over all rounds. Ratios are speed ratios, formed within one
process: ``host / path`` (the host-array call's time over the path's; below 1: the path is slower)
and ``mamba_ssm / path`` (above 1: the path is faster than mamba_ssm). GPU time (ssm_vk): ``ssm_vk.run.last_gpu_ns()``
of the forward plus the backward ("-" where the device has no timestamps); wall - GPU is the time
spent off the device (Python, torch ops, transfers), where the torch paths' overhead shows even
when the device time swings (lavapipe shares the CPU). On a CPU with few cores run it with
``OMP_WAIT_POLICY=PASSIVE`` as well: PyTorch's OpenMP threads otherwise spin after each torch op
on the cores the backend's threads need (docs/TORCH.md, "Performance"); the header line says
which policy ran.

Op counts (``--counts``, on by default): the aten ops each torch path runs besides the scan's own
operators, forward and backward, counted with a TorchDispatchMode on the backend: "compute" (ops
that read or write tensor data) and "views" (views, detach), and the copies the operator makes
when it converts a tensor that is not contiguous float32 (its inputs and incoming gradients).
For ``mamba2`` also with strided x, B, C, dt (split from one projection, as transformers' Mamba-2
passes them). These counts do not depend on the machine; docs/TORCH.md quotes them.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ssm_torch
from ssm_torch import _bridge
from ssm_torch import cuda as vk_cuda
from ssm_torch.mamba import mamba_chunk_scan_combined, selective_scan_fn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from processes import Spread, children, fmt, spread, without

SHAPES = {  # name: (S, T, H, P, N); m1-*: Mamba-1 (P = 1, H channels)
    "tiny": (1, 32, 4, 16, 32),
    "demo": (1, 64, 16, 64, 128),
    "mid": (1, 512, 48, 64, 128),
    "m1-tiny": (1, 64, 64, 1, 16),
    "m1-512": (1, 512, 1536, 1, 16),
    "train": (8, 2048, 24, 64, 128),
    "long": (1, 16384, 24, 64, 128),
}
VIEWS = {"view", "_unsafe_view", "unsqueeze", "squeeze", "transpose", "permute", "expand", "detach", "alias",
         "as_strided", "slice", "select", "t"}
FORM = "log1p"


def problem(shape, seed=0) -> dict:
    """float32 numpy inputs in ssm-scan's layout, the glue's D, z, bias, and the gradients."""
    S, T, H, P, N = shape
    rng = np.random.default_rng(seed)

    def u(*sh, lo=-1.0, hi=1.0):
        return rng.uniform(lo, hi, sh).astype(np.float32)

    m1 = P == 1
    return dict(m1=m1, x=u(S, T, H, P), dt=u(S, T, H, lo=-3.0, hi=0.0),
                A=u(H, N, lo=-1.0, hi=-0.2) if m1 else u(H, lo=-1.0, hi=-0.2), B=u(S, T, 1, N), C=u(S, T, 1, N),
                D=u(H), z=u(S, T, H, P), bias=u(H, lo=-0.5, hi=0.5), g_y=u(S, T, H, P), g_states=u(S, H, P, N))


# -- the paths: each a function () -> (forward, backward) seconds of wall, and GPU ns or None ---------

def _gpu_ns(backend):
    if backend != "ssm_vk":
        return None
    from ssm_vk import run as vk_run
    return vk_run.last_gpu_ns()


def _timed(fwd, bwd, backend):
    t0 = time.perf_counter()
    r = fwd()
    t1 = time.perf_counter()
    gf = _gpu_ns(backend)          # read between the calls, outside the wall time
    t2 = time.perf_counter()
    bwd(r)
    t3 = time.perf_counter()
    gb = _gpu_ns(backend)
    return (t1 - t0) + (t3 - t2), (None if gf is None or gb is None else (gf + gb))


def host_path(p, backend, device=False):
    mod = _bridge.backend_module(backend)
    a = {k: p[k] for k in ("x", "dt", "A", "B", "C")}
    gy, gs = p["g_y"], p["g_states"]
    s = None
    if device:
        import ssm_vk
        a = {k: ssm_vk.to_device(v) for k, v in a.items()}
        s = ssm_vk.to_device(np.zeros_like(p["g_states"]))
        gy, gs = ssm_vk.to_device(gy), ssm_vk.to_device(gs)

    def fwd():
        return mod.ssm_scan(s, **a, dt_softplus=FORM)

    def bwd(_):
        mod.ssm_scan_back(s, **a, g_y=gy, g_states=gs, dt_softplus=FORM)

    return lambda: _timed(fwd, bwd, backend)


def _leaves(p, names, device="cpu"):
    return {k: torch.tensor(p[k], device=device).requires_grad_() for k in names}


def op_path(p, backend):
    t = _leaves(p, ("x", "dt", "A", "B", "C"))
    gy, gs = torch.tensor(p["g_y"]), torch.tensor(p["g_states"])

    def fwd():
        return ssm_torch.ssm_scan(None, **t, backend=backend, dt_softplus=FORM)

    def bwd(r):
        torch.autograd.backward(r, (gy, gs))
        for v in t.values():
            v.grad = None

    return lambda: _timed(fwd, bwd, backend)


def mamba2_inputs(p, device="cpu", strided=False):
    """The Mamba-2 drop-in's arguments (leaves requiring grad); ``strided``: x, B, C and dt as
    views of one (S, T, H*P + 2N + H) projection, as transformers' Mamba2Mixer splits them."""
    t = _leaves(p, ("A", "D", "z", "bias"), device)
    if strided:
        S, T, H, P = p["x"].shape
        N = p["B"].shape[-1]
        proj = torch.tensor(np.concatenate([p["x"].reshape(S, T, H * P), p["B"].reshape(S, T, N),
                                            p["C"].reshape(S, T, N), p["dt"]], axis=-1), device=device)
        proj.requires_grad_()
        xs, Bs, Cs, dts = torch.split(proj, [H * P, N, N, H], dim=-1)
        t.update(proj=proj, x=xs.reshape(S, T, H, P), B=Bs.reshape(S, T, 1, N), C=Cs.reshape(S, T, 1, N), dt=dts)
    else:
        t.update(_leaves(p, ("x", "dt", "B", "C"), device))
    return t


def mamba2_call(t, fn=mamba_chunk_scan_combined, **kw):
    return fn(t["x"], t["dt"], t["A"], t["B"], t["C"], 256, D=t["D"], z=t["z"], dt_bias=t["bias"],
              dt_softplus=True, return_final_states=True, **kw)


def _zero_grads(t):
    for v in t.values():
        if v.is_leaf:
            v.grad = None


def mamba2_path(p, backend):
    t = mamba2_inputs(p)
    gy, gs = torch.tensor(p["g_y"]), torch.tensor(p["g_states"])

    def fwd():
        return mamba2_call(t, backend=backend)

    def bwd(r):
        torch.autograd.backward(r, (gy, gs))
        _zero_grads(t)

    return lambda: _timed(fwd, bwd, backend)


def mamba1_inputs(p):
    """selective_scan_fn's arguments in mamba_ssm's layout: u, delta, z (batch, d_inner, L);
    B, C (batch, dstate, L)."""
    tr = {"u": p["x"][..., 0].transpose(0, 2, 1), "delta": p["dt"].transpose(0, 2, 1), "A": p["A"],
          "B": p["B"][:, :, 0].transpose(0, 2, 1), "C": p["C"][:, :, 0].transpose(0, 2, 1), "D": p["D"],
          "z": p["z"][..., 0].transpose(0, 2, 1), "delta_bias": p["bias"]}
    return {k: torch.tensor(np.ascontiguousarray(v)).requires_grad_() for k, v in tr.items()}


def mamba1_path(p, backend):
    t = mamba1_inputs(p)
    gy = torch.tensor(np.ascontiguousarray(p["g_y"][..., 0].transpose(0, 2, 1)))
    gs = torch.tensor(p["g_states"][:, :, 0])

    def fwd():
        return selective_scan_fn(**t, delta_softplus=True, return_last_state=True, backend=backend)

    def bwd(r):
        torch.autograd.backward(r, (gy, gs))
        _zero_grads(t)

    return lambda: _timed(fwd, bwd, backend)


def peer_module(src):
    """mamba_ssm's Triton mamba_chunk_scan_combined: installed, or from the source tree ``src``
    (benchmarks/vs_mamba_ssm.py's loader); None without CUDA or either."""
    if not torch.cuda.is_available():
        return None, "no CUDA device"
    if src:
        sys.path.insert(0, __file__.rsplit("/", 1)[0])
        from pathlib import Path

        from vs_mamba_ssm import peer_package
        peer_package(Path(src))
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined as peer
    except ImportError as e:
        return None, f"mamba_ssm not importable ({e}); pass --mamba-src"
    return peer, "mamba_ssm"


def peer_path(p, peer, **kw):
    """A Mamba-2 drop-in's step on CUDA tensors: mamba_ssm's (``peer``), or ssm_torch's with
    ``backend="ssm_vk"`` in ``kw``."""
    t = mamba2_inputs(p, "cuda")
    gy, gs = torch.tensor(p["g_y"], device="cuda"), torch.tensor(p["g_states"], device="cuda")
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]

    def step():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ev[0].record()
        r = mamba2_call(t, peer, **kw)
        torch.autograd.backward(r, (gy, gs))
        ev[1].record()
        torch.cuda.synchronize()
        w = time.perf_counter() - t0
        _zero_grads(t)
        return w, ev[0].elapsed_time(ev[1]) * 1e6

    return step


# -- op counts ---------------------------------------------------------------------------------------

class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)] += 1
        return func(*args, **(kwargs or {}))


class _Copies:
    """Counts the operator's conversions that copy (a tensor handed to the backend that is not a
    contiguous tensor of the working dtype), through ssm_torch._bridge._host where it exists."""

    def __init__(self):
        self.n = 0

    def __enter__(self):
        self.orig = getattr(_bridge, "_host", None)
        if self.orig is not None:
            def host(t, work, _orig=self.orig):
                if t.dtype != work or not t.is_contiguous():
                    self.n += 1
                return _orig(t, work)
            _bridge._host = host
        return self

    def __exit__(self, *exc):
        if self.orig is not None:
            _bridge._host = self.orig


def _split(ops: collections.Counter) -> dict:
    scan = {k: v for k, v in ops.items() if k.startswith("scan")}
    views = sum(v for k, v in ops.items() if k in VIEWS)
    compute = sum(ops.values()) - views - sum(scan.values())
    return {"compute": compute, "views": views, "ops": dict(ops)}


def count_ops(path: str, p, backend: str, strided=False) -> dict:
    """{"forward": ..., "backward": ...}: each {"compute", "views", "copies", "ops"}."""
    if path == "op":
        t = _leaves(p, ("x", "dt", "A", "B", "C"))
        g = (torch.tensor(p["g_y"]), torch.tensor(p["g_states"]))

        def fwd():
            return ssm_torch.ssm_scan(None, **t, backend=backend, dt_softplus=FORM)
    elif path == "mamba2":
        t = mamba2_inputs(p, strided=strided)
        g = (torch.tensor(p["g_y"]), torch.tensor(p["g_states"]))

        def fwd():
            return mamba2_call(t, backend=backend)
    else:
        t = mamba1_inputs(p)
        g = (torch.tensor(np.ascontiguousarray(p["g_y"][..., 0].transpose(0, 2, 1))),
             torch.tensor(p["g_states"][:, :, 0]))

        def fwd():
            return selective_scan_fn(**t, delta_softplus=True, return_last_state=True, backend=backend)
    torch.autograd.backward(fwd(), g)   # first call: plans, compiles
    _zero_grads(t)
    res = {}
    with _Copies() as cp, _Count() as c:
        r = fwd()
    res["forward"] = {**_split(c.ops), "copies": cp.n}
    with _Copies() as cp, _Count() as c:
        torch.autograd.backward(r, g)
    res["backward"] = {**_split(c.ops), "copies": cp.n}
    _zero_grads(t)
    return res


# -- main ----------------------------------------------------------------------------------------------

def run_shape(name, shape, backend, rounds, reps, peer, only=None) -> dict:
    p = problem(shape)
    paths = {"host": host_path(p, backend)}
    if backend == "ssm_vk":
        paths["device"] = host_path(p, backend, device=True)
    if p["m1"]:
        paths["mamba1"] = mamba1_path(p, backend)
    else:
        paths["op"] = op_path(p, backend)
        paths["mamba2"] = mamba2_path(p, backend)
        if peer is not None:
            paths["mamba_ssm"] = peer_path(p, peer)
        if backend == "ssm_vk" and torch.cuda.is_available() and vk_cuda.available("cuda")[0]:
            paths["mamba2-cuda"] = peer_path(p, mamba_chunk_scan_combined, backend=backend)
    if only:
        paths = {k: v for k, v in paths.items() if k in only}
    walls = {k: [] for k in paths}
    gpus = {k: [] for k in paths}
    order = list(paths)
    for rnd in range(rounds):
        k0 = rnd % len(order)
        for k in order[k0:] + order[:k0]:
            fn = paths[k]
            fn()
            fn()
            for _ in range(reps):
                w, g = fn()
                walls[k].append(w * 1e3)
                if g is not None:
                    gpus[k].append(g / 1e6)
    out = {"shape": name, "dims": shape, "backend": backend, "paths": {}}
    base = statistics.median(walls["host"]) if "host" in paths else None
    peer = statistics.median(walls["mamba_ssm"]) if "mamba_ssm" in paths else None
    for k in paths:
        wall = statistics.median(walls[k])
        gpu = statistics.median(gpus[k]) if gpus[k] else None
        out["paths"][k] = {"wall_ms": wall, "gpu_ms": gpu, "host_speed": None if base is None else base / wall,
                           "peer_speed": None if peer is None else peer / wall,
                           "off_gpu_ms": None if gpu is None else wall - gpu}
    return out


def summarise(reports: list) -> list[dict]:
    """Per (backend, shape, path) over the processes: wall, GPU and off-GPU time and the two speed
    ratios as spreads (benchmarks/processes.py) of the per-process medians."""
    keyed: dict = {}
    for rep in reports:
        for r in rep.get("results", []):
            for k, v in r["paths"].items():
                keyed.setdefault((r["backend"], r["shape"], k), []).append(v)
    return [dict(backend=b, shape=sh, path=k, processes=len(vs),
                 **{f: spread(v.get(f) for v in vs) for f in ("wall_ms", "gpu_ms", "off_gpu_ms", "host_speed",
                                                              "peer_speed")})
            for (b, sh, k), vs in keyed.items()]


def print_table(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print("| path | wall ms | GPU ms | wall - GPU ms | host / path | mamba_ssm / path |")
    print("|---|---|---|---|---|---|")
    for v in rows:
        print(f"| {v['path']} | {fmt(v['wall_ms'], 3)} | {fmt(v['gpu_ms'], 3)} | {fmt(v['off_gpu_ms'], 3)} "
              f"| {fmt(v['host_speed'], 2)} | {fmt(v['peer_speed'], 2)} |")


def several(a, argv: list[str]) -> int:
    child = without(argv, ("--json", "--processes"))
    reports = children(__file__, [*child, "--processes", "1"], a.processes, rest_extra=["--no-counts"])
    rows = summarise(reports)
    print(f"\n# {a.processes} processes: the median over the processes (their range where they differ); speed "
          "ratios formed within each process")
    for b, sh in dict.fromkeys((r["backend"], r["shape"]) for r in rows):
        S, T, H, P, N = SHAPES[sh]
        print_table(f"{b}, {sh} (S={S}, T={T}, H={H}, P={P}, N={N}), forward + backward:",
                    [r for r in rows if (r["backend"], r["shape"]) == (b, sh)])
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(argv=argv, processes=reports, rows=rows), fh, indent=1,
                      default=lambda o: o.as_dict() if isinstance(o, Spread) else str(o))
    return 0 if rows and not any("failed" in r for r in reports) else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="ssm_vk,ssm_fast")
    ap.add_argument("--shapes", default="tiny,demo,m1-tiny")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--mamba-src", default=None, help="a state-spaces/mamba source tree (mamba_ssm not installed)")
    ap.add_argument("--no-counts", dest="counts", action="store_false")
    ap.add_argument("--paths", default=None, help="a comma list of the paths to time (default: all that run here; "
                    "without host the / host column is empty)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--processes", type=int, default=3, help="fresh processes, one after another (default 3)")
    argv = sys.argv[1:] if argv is None else list(argv)
    a = ap.parse_args(argv)
    if a.processes < 1:
        ap.error("--processes: expected at least 1")
    if a.processes > 1:
        return several(a, argv)
    only = set(a.paths.split(",")) if a.paths else None
    peer, why = peer_module(a.mamba_src)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, OMP_WAIT_POLICY "
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}; mamba_ssm: {'loaded' if peer is not None else why}")
    results = []
    for backend in a.backends.split(","):
        for name in a.shapes.split(","):
            r = run_shape(name, SHAPES[name], backend, a.rounds, a.reps, peer, only)
            if a.counts:
                p = problem(SHAPES[name])
                kinds = ("mamba1",) if p["m1"] else ("op", "mamba2", "mamba2-strided")
                r["counts"] = {k: count_ops(k.removesuffix("-strided"), p, backend, strided=k.endswith("strided"))
                               for k in kinds}
            results.append(r)
            S, T, H, P, N = SHAPES[name]
            print_table(f"{backend}, {name} (S={S}, T={T}, H={H}, P={P}, N={N}), forward + backward:",
                        summarise([{"results": [r]}]))
            for k, c in r.get("counts", {}).items():
                f, b = c["forward"], c["backward"]
                print(f"  {k}: torch ops besides the scan forward {f['compute']} (+{f['views']} views), backward "
                      f"{b['compute']} (+{b['views']} views); operator copies forward {f['copies']}, backward "
                      f"{b['copies']}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"argv": argv, "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
