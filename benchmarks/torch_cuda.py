"""ssm_torch with backend="ssm_vk" on CUDA tensors: wall time per call through the shared arena
(ssm_torch/cuda.py: no trip through host memory) beside the same call on the tensors moved to the
host and back (``.cpu()``, the CPU-tensor path, ``.to("cuda")``), forward and forward + backward,
rounds interleaved in one process; and how far the two paths' outputs are apart (both are ssm_vk's
numbers: the tests hold them to the float64 oracle).

    python benchmarks/torch_cuda.py [--shapes demo,mid,train] [--reps 20] [--rounds 3] [--json out.json]

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="demo,mid,train")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    cuda.require("cuda")
    rows = []
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
