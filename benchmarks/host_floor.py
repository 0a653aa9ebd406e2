"""The floors of a host-array call's data movement on the machine at hand: what the host's memory,
the CPU's copies and the link each allow, beside torch's own copies of pageable memory.

    python benchmarks/host_floor.py [--sizes 8,64,256] [--calls mid,train] [--reps 7] [--json out.json]

Per size (MiB), the median of ``--reps`` wall times, as GB/s:

- ``gpu copy staging->device`` / ``device->staging``: one vkCmdCopyBuffer between a staging buffer
  (host memory, what ssm_vk's host calls copy through) and a device buffer, submitted and waited.
- ``host->staging`` / ``staging->host (warm)``: the CPU copy between a numpy array and the
  staging buffer's mapping, one thread (numpy) and ssm_vk's threaded copy (runtime.hostcopy,
  SSM_VK_COPY_THREADS).
- ``first-touch fill``: writing a newly allocated array (its pages faulted in as they are
  written); ``staging->fresh array``: what a result's download costs (a new array each time).
- ``torch pageable->cuda`` / ``pinned->cuda`` / ``cuda->pageable``: torch's own copies, where a
  CUDA build of torch sees a GPU (what a PyTorch user's ``.to("cuda")`` gets).

Per call shape (``--calls``: mid (1, 512, 48, 64, 128), train (8, 2048, 24, 64, 128); Mamba-2, G = 1),
the data movement of a host-array forward + backward without the compute, each call's inputs in
and outputs out in one submission, as ssm_vk moves it (``staged``: the CPU copies the inputs into
one staging buffer and the outputs out of it into new arrays; the backward's inputs are all
copied, where ssm_vk compares the forward's six with memcmp instead), beside the link's floor for
those bytes (bytes / the 64-MiB device copy's rate), the staged movement's three parts (CPU copies
in, the submission, CPU copies out into new arrays) and, with a CUDA torch, ``torch pageable``:
the same inputs moved by torch's ``.to("cuda")`` and outputs by ``.cpu()`` (CUDA's own floor for
pageable host memory).

Moving the caller's pages without the CPU's copies (VK_EXT_external_memory_host: import the
array's pages, the device copies from and into them) was measured with this script at 9dbf3ed and
lost: docs/TORCH.md, "Host data on a GPU".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from ssm_ref.checks import Dims
from ssm_vk import runtime as rt
from ssm_vk.runtime import hostcopy
from ssm_vk.runtime.commands import oneshot
from ssm_vk.runtime.memory import Buffer
from ssm_vk.sizing import input_shapes, output_shapes


def median_s(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gpu_copy(ctx, src, dst, nbytes, src_offset=0, dst_offset=0):
    with oneshot(ctx) as seq:
        seq.copy(src, dst, nbytes, src_offset=src_offset, dst_offset=dst_offset)


def measure(ctx, mib: int, reps: int) -> dict:
    n = mib << 20
    rows = {}
    rng = np.random.default_rng(mib)
    host = rng.integers(0, 255, n, dtype=np.uint8)
    warm = np.empty(n, np.uint8)
    warm.fill(1)
    with Buffer(ctx, n, staging=True) as staging, Buffer(ctx, n) as dev:
        window = np.frombuffer(staging.mapping, np.uint8, n)
        rows["gpu copy staging->device"] = median_s(lambda: gpu_copy(ctx, staging, dev, n), reps)
        rows["gpu copy device->staging"] = median_s(lambda: gpu_copy(ctx, dev, staging, n), reps)
        rows["host->staging, 1 thread"] = median_s(lambda: np.copyto(window, host), reps)
        rows["host->staging, threads"] = median_s(lambda: hostcopy.copy(window, host), reps)
        rows["staging->host (warm), 1 thread"] = median_s(lambda: np.copyto(warm, window), reps)
        rows["staging->host (warm), threads"] = median_s(lambda: hostcopy.copy(warm, window), reps)
        rows["first-touch fill"] = median_s(lambda: np.empty(n, np.uint8).fill(2), reps)
        rows["staging->fresh array, threads"] = median_s(lambda: hostcopy.copy(np.empty(n, np.uint8), window), reps)
    rows.update(torch_rows(n, reps))
    return {k: {"ms": v * 1e3, "GBps": n / v / 1e9} for k, v in rows.items()}


CALLS = {"mid": (1, 512, 48, 64, 128), "train": (8, 2048, 24, 64, 128)}


def call_movement(ctx, name: str, reps: int, link_gbps: float) -> dict:
    """ms of a host forward + backward's data movement at shape ``name``: staged, its parts, the floors."""
    S, T, H, P, N = CALLS[name]
    d = Dims(S=S, T=T, H=H, P=P, N=N, G=1, R=S, mamba1=False, a_shape=(H,))
    rng = np.random.default_rng(1)
    calls = []
    for backward in (False, True):
        ins = {k: rng.standard_normal(v, dtype=np.float32) for k, v in input_shapes(d, backward).items()}
        outs = dict(output_shapes(d, backward))
        calls.append((ins, outs))
    nbytes = sum(a.nbytes for ins, _ in calls for a in ins.values()) + \
        sum(int(np.prod(v)) * 4 for _, outs in calls for v in outs.values())
    dev = {}
    for ins, outs in calls:
        for k, a in ins.items():
            dev["in:" + k] = max(dev.get("in:" + k, 0), a.nbytes)
        for k, v in outs.items():
            dev["out:" + k] = max(dev.get("out:" + k, 0), int(np.prod(v)) * 4)
    buffers = {k: Buffer(ctx, n) for k, n in dev.items()}
    for k, b in buffers.items():   # outputs the copies read: defined bytes (finite floats)
        if k.startswith("out:"):
            rt.upload(b, rng.standard_normal(b.size // 4, dtype=np.float32))
    staging = Buffer(ctx, max(sum(a.nbytes for a in ins.values()) + sum(int(np.prod(v)) * 4 for v in outs.values())
                              for ins, outs in calls), staging=True)
    window = np.frombuffer(staging.mapping, np.uint8, staging.size)
    try:
        parts = {"staged: CPU copies in": [], "staged: GPU copies": [], "staged: CPU copies out": []}

        def staged():
            results = []
            for ins, outs in calls:
                t0 = time.perf_counter()
                at, slots = 0, []
                for k, a in ins.items():
                    hostcopy.copy(window[at:at + a.nbytes], a.reshape(-1).view(np.uint8))
                    slots.append(("in", k, at, a.nbytes))
                    at += a.nbytes
                for k, v in outs.items():
                    n = int(np.prod(v)) * 4
                    slots.append(("out", k, at, n))
                    at += n
                t1 = time.perf_counter()
                with oneshot(ctx) as seq:
                    for kind, k, off, n in slots:
                        if kind == "in":
                            seq.copy(staging, buffers["in:" + k], n, src_offset=off)
                        else:
                            seq.copy(buffers["out:" + k], staging, n, dst_offset=off)
                t2 = time.perf_counter()
                for kind, k, off, n in slots:
                    if kind == "out":
                        out = np.empty(outs[k], np.float32)
                        hostcopy.copy(out.reshape(-1).view(np.uint8), window[off:off + n])
                        results.append(out)
                t3 = time.perf_counter()
                for part, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                    parts[part].append(dt)
            return results

        rows = {"link floor": nbytes / (link_gbps * 1e9), "staged": median_s(staged, reps)}
        for part, times in parts.items():   # per call: the forward's and the backward's parts add up
            half = len(times) // 2 * 2
            rows[part] = statistics.median(a + b for a, b in zip(times[0:half:2], times[1:half:2], strict=True))
        rows.update(torch_movement(calls, reps))
    finally:
        for b in buffers.values():
            b.close()
        staging.close()
    return {"bytes": nbytes, **{k: v * 1e3 for k, v in rows.items()}}


def torch_movement(calls, reps: int) -> dict:
    """s of the same data moved by CUDA's own copies from and to pageable memory (torch's
    ``.to("cuda")`` of each input, ``.cpu()`` of each output into a new tensor): the floor a CUDA
    user's host data meets. {} without a CUDA torch."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    ins = [torch.from_numpy(a) for c, _ in calls for a in c.values()]
    outs = [torch.zeros(v, device="cuda") for _, o in calls for v in o.values()]

    def move():
        moved = [t.to("cuda") for t in ins]
        back = [t.cpu() for t in outs]
        torch.cuda.synchronize()
        return moved, back
    return {"torch pageable": median_s(move, reps)}


def torch_rows(n: int, reps: int) -> dict:
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    cpu = torch.empty(n, dtype=torch.uint8).fill_(3)
    pinned = cpu.pin_memory()
    gpu = cpu.to("cuda")

    def sync(fn):
        def run():
            fn()
            torch.cuda.synchronize()
        return run
    sync(lambda: gpu.copy_(cpu))()
    return {"torch pageable->cuda": median_s(sync(lambda: gpu.copy_(cpu)), reps),
            "torch pinned->cuda": median_s(sync(lambda: gpu.copy_(pinned, non_blocking=True)), reps),
            "torch cuda->pageable": median_s(sync(lambda: cpu.copy_(gpu)), reps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,64,256", help="MiB, comma-separated")
    ap.add_argument("--calls", default="mid,train", help=f"call shapes of {', '.join(CALLS)}, or ''")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args()
    ctx = rt.get_context()
    print(f"device: {ctx.info.name}; copy threads {hostcopy.threads()}; CPUs {os.cpu_count()}")
    for i, (flags, heap) in enumerate(ctx.memory_types):
        print(f"  memory type {i} flags {flags:#x} heap {heap} ({ctx.memory_heaps[heap][0] / 2**30:.1f} GiB)")
    results = {}
    for mib in (int(s) for s in args.sizes.split(",")):
        results[mib] = measure(ctx, mib, args.reps)
        for name, r in results[mib].items():
            print(f"{mib:5d} MiB  {name:34s} {r['ms']:9.3f} ms {r['GBps']:8.2f} GB/s")
        sys.stdout.flush()
    link = max((r["gpu copy staging->device"]["GBps"] for r in results.values()), default=None)
    calls = {}
    for name in filter(None, args.calls.split(",")):
        if link is None:
            link = results.setdefault(64, measure(ctx, 64, args.reps))["gpu copy staging->device"]["GBps"]
        calls[name] = call_movement(ctx, name, args.reps, link)
        r = calls[name]
        print(f"call {name:6s} fwd+bwd data {r['bytes'] / 1e6:8.1f} MB: " +
              ", ".join(f"{k} {v:.3f} ms" for k, v in r.items() if k != "bytes"))
    for message in ctx.validation_messages:
        print("validation:", message)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": ctx.info.name, "copy_threads": hostcopy.threads(),
                       "sizes_mib": results, "calls": calls}, f, indent=1)


if __name__ == "__main__":
    main()
