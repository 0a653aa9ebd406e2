"""ssm_torch with backend="ssm_vk" on CUDA tensors: wall time per call through the shared arena
(ssm_torch/cuda.py: no trip through host memory) beside the same call on the tensors moved to the
host and back (``.cpu()``, the CPU-tensor path, ``.to("cuda")``), forward and forward + backward,
rounds interleaved in one process; and how far the two paths' outputs are apart (both are ssm_vk's
numbers: the tests hold them to the float64 oracle).

    python benchmarks/torch_cuda.py [--shapes demo,mid,train] [--reps 20] [--rounds 3] [--json out.json]
    python benchmarks/torch_cuda.py --phases [--shapes train,long]

``--phases``: where a CUDA-tensor forward and backward spend their wall time (each part ended by
a synchronisation, so the parts add up to a little more than the call): torch's copies into the
arena and the wait for its stream ("in"), ssm_vk's call ("vk", with its GPU time), torch's copies
out ("out") and the rest (autograd, the op's checks); beside them the same ssm_vk call again on
the arena's arrays, and on DeviceArrays of its own (``ssm_vk.to_device``): the price of the
exported memory and of the bridge, apart. Then the parts alone and in turn, which show what the
GPU charges to switch between CUDA's work and Vulkan's: torch's copies into the arena alone and
right after a Vulkan call, a 16-element CUDA add alone and right after a Vulkan call, the
forward's Vulkan call after that add and after the copies (docs/TORCH.md, "On a GPU").

Needs a GPU that CUDA (torch) and Vulkan both see (ssm_torch.cuda.available). Shapes are those of
vk_gpu_check.py. Each timing is the median of ``--reps`` calls, each call ended by
torch.cuda.synchronize().
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from vk_gpu_check import SHAPES, inputs

import ssm_torch
from ssm_torch import cuda

NAMES = ("s", "x", "dt", "A", "B", "C")


def through_host(t: dict, backward: bool, gy, gs):
    host = {k: v.detach().cpu().requires_grad_(backward) for k, v in t.items()}
    y, states = ssm_torch.ssm_scan(*(host[k] for k in NAMES), backend="ssm_vk")
    if backward:
        ((y * gy.cpu()).sum() + (states * gs.cpu()).sum()).backward()
        return [host[k].grad.to("cuda") for k in NAMES]
    return [y.to("cuda"), states.to("cuda")]


def on_gpu(t: dict, backward: bool, gy, gs):
    leaves = {k: v.detach().requires_grad_(backward) for k, v in t.items()}
    y, states = ssm_torch.ssm_scan(*(leaves[k] for k in NAMES), backend="ssm_vk")
    if backward:
        ((y * gy).sum() + (states * gs).sum()).backward()
        return [leaves[k].grad for k in NAMES]
    return [y, states]


def timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def phases(t: dict, gy, gs, reps: int) -> dict:
    """ms per part of a CUDA-tensor forward and backward (medians of ``reps``); see --phases."""
    import ssm_vk
    from ssm_vk import run as vk_run

    marks, calls = [], {}
    side_cls = cuda.CudaSide
    before, after = side_cls.before_vulkan, side_cls.after_reads

    def before_vulkan(self):
        before(self)
        marks.append(("in", time.perf_counter(), None))

    def after_reads(self, arena):
        after(self, arena)
        self.stream().synchronize()
        marks.append(("out", time.perf_counter(), None))

    def wrap(name, f):
        def call(*a, **k):
            r = f(*a, **k)
            marks.append(("vk", time.perf_counter(), vk_run.last_gpu_ns()))
            calls[name] = (f, a, k)
            return r
        return call

    scan, back = ssm_vk.ssm_scan, ssm_vk.ssm_scan_back
    side_cls.before_vulkan, side_cls.after_reads = before_vulkan, after_reads
    ssm_vk.ssm_scan, ssm_vk.ssm_scan_back = wrap("fwd", scan), wrap("bwd", back)
    parts = {f"{op} {k}": [] for op in ("fwd", "bwd") for k in ("in", "vk", "vk gpu", "out", "rest", "total")}
    try:
        for _ in range(reps + 2):
            leaves = {k: v.detach().requires_grad_() for k, v in t.items()}
            row = {}
            for op in ("fwd", "bwd"):
                marks.clear()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                if op == "fwd":
                    y, states = ssm_torch.ssm_scan(*(leaves[k] for k in NAMES), backend="ssm_vk")
                else:
                    torch.autograd.backward((y, states), (gy, gs))
                torch.cuda.synchronize()
                t1 = time.perf_counter()
                at = dict((m[0], m[1:]) for m in marks)
                row[f"{op} in"] = at["in"][0] - t0
                row[f"{op} vk"] = at["vk"][0] - at["in"][0]
                row[f"{op} vk gpu"] = (at["vk"][1] or 0) * 1e-9
                row[f"{op} out"] = at["out"][0] - at["vk"][0]
                row[f"{op} rest"] = t1 - at["out"][0]
                row[f"{op} total"] = t1 - t0
            for k, v in row.items():
                parts[k].append(v)
    finally:
        side_cls.before_vulkan, side_cls.after_reads = before, after
        ssm_vk.ssm_scan, ssm_vk.ssm_scan_back = scan, back
    out = {k: statistics.median(v[2:]) * 1e3 for k, v in parts.items()}

    def again(f, a, k):   # the same call, timed alone: wall and GPU ms
        walls, gpus = [], []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            f(*a, **k)
            walls.append(time.perf_counter() - t0)
            gpus.append((vk_run.last_gpu_ns() or 0) * 1e-6)
        return statistics.median(walls) * 1e3, statistics.median(gpus)

    # the parts alone and in turn: does the GPU's switch between CUDA's and Vulkan's work cost?
    from ssm_torch import _arena
    from ssm_vk import runtime as rt
    from ssm_vk.arrays import DeviceArray
    side = cuda._side_for(t["x"].device)
    arena = _arena.arena(rt.get_context(), side)
    stream = side.stream()
    tiny = torch.zeros(16, device="cuda")

    def copy_in():
        for name in NAMES:
            arena.slots[name].view(side, tuple(t[name].shape)).copy_(t[name])
        stream.synchronize()

    def cuda_tiny():
        tiny.add_(1.0)
        stream.synchronize()

    f, a, k = calls["fwd"]

    def pair(first, second):   # ms of ``second`` right after ``first``
        times = []
        for _ in range(reps):
            first()
            t0 = time.perf_counter()
            second()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3

    def vk():
        f(*a, **k)

    out["copy in alone"] = pair(copy_in, copy_in)
    out["copy in after vk"] = pair(vk, copy_in)
    out["tiny cuda alone"] = pair(cuda_tiny, cuda_tiny)
    out["tiny cuda after vk"] = pair(vk, cuda_tiny)
    out["fwd vk after tiny cuda"] = pair(cuda_tiny, vk)
    out["fwd vk after copy in"] = pair(copy_in, vk)
    out["torch sync alone"] = pair(stream.synchronize, stream.synchronize)
    for op in ("fwd", "bwd"):   # "again": the call after itself (Vulkan work before it)
        f, a, k = calls[op]
        out[f"{op} again on the arena"], out[f"{op} again on the arena gpu"] = again(f, a, k)
        own = tuple(ssm_vk.to_device(x.numpy()) if isinstance(x, DeviceArray) else x for x in a)
        kw = {n: v for n, v in k.items() if n != "out"}
        out[f"{op} on own DeviceArrays"], out[f"{op} on own DeviceArrays gpu"] = again(f, own, kw)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="demo,mid,train")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--phases", action="store_true", help="where the wall time goes (see the docstring)")
    args = ap.parse_args()
    cuda.require("cuda")
    rows = []
    if args.phases:
        for name in args.shapes.split(","):
            arrays, gy, gs = inputs(SHAPES[name])
            t = {k: torch.from_numpy(v).to("cuda") for k, v in arrays.items()}
            gy, gs = torch.from_numpy(gy).to("cuda"), torch.from_numpy(gs).to("cuda")
            r = phases(t, gy, gs, args.reps)
            rows.append({"shape": name, **r})
            print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "phases": rows}, f, indent=1)
        return
    for name in args.shapes.split(","):
        arrays, gy, gs = inputs(SHAPES[name])
        t = {k: torch.from_numpy(v).to("cuda") for k, v in arrays.items()}
        gy, gs = torch.from_numpy(gy).to("cuda"), torch.from_numpy(gs).to("cuda")
        for backward in (False, True):
            what = "fwd+bwd" if backward else "fwd"
            apart = max(float((a - b).abs().max()) for a, b in zip(on_gpu(t, backward, gy, gs),
                                                                  through_host(t, backward, gy, gs), strict=True))
            runs = {"gpu": [], "host": []}
            call = {"gpu": on_gpu, "host": through_host}
            for _ in range(args.rounds):   # interleaved: a drift of the clocks touches both
                for path, fn in call.items():
                    runs[path].append(timed(lambda f=fn, a=(t, backward, gy, gs): f(*a), args.reps))
            row = {"shape": name, "op": what, "gpu_ms": min(runs["gpu"]), "host_ms": min(runs["host"]),
                   "rounds": runs, "max_abs_apart": apart, "where": str(ssm_torch.last_where())}
            rows.append(row)
            print(f"{name:8s} {what:8s} CUDA tensors {row['gpu_ms']:9.3f} ms   through the host "
                  f"{row['host_ms']:9.3f} ms   outputs apart by {apart:.2e}", flush=True)
    print(f"device: {torch.cuda.get_device_name()}; {rows[-1]['where']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
