"""The floors of a host-array call's data movement on the machine at hand, and what moving it by
host-pointer import (VK_EXT_external_memory_host: the device copies straight from and into the
caller's pages, no CPU copy) would cost instead.

    python benchmarks/host_floor.py [--sizes 8,64,256] [--calls mid,train] [--reps 7] [--json out.json]

Per size (MiB), the median of ``--reps`` wall times, as GB/s:

- ``gpu copy staging->device`` / ``device->staging``: one vkCmdCopyBuffer between a staging buffer
  (host memory, what ssm_vk's host calls copy through) and a device buffer, submitted and waited.
- ``host->staging`` / ``staging->host (warm)``: the CPU copy between a numpy array and the
  staging buffer's mapping, one thread (numpy) and ssm_vk's threaded copy (runtime.hostcopy,
  SSM_VK_COPY_THREADS).
- ``first-touch fill``: writing a newly allocated array (its pages faulted in as they are
  written); ``staging->fresh array``: what a result's download costs (a new array each time).
- ``import warm`` / ``import fresh``: making a Vulkan buffer over an array's pages (the pages
  of an array written before; of a new, untouched array), freed after; ``gpu copy import->device``
  / ``device->import``: a copy between such a buffer and a device buffer (the link, from pages the
  driver pinned on import).
- ``torch pageable->cuda`` / ``pinned->cuda`` / ``cuda->pageable``: torch's own copies, where a
  CUDA build of torch sees a GPU (what a PyTorch user's ``.to("cuda")`` gets).

Per call shape (``--calls``: mid (1, 512, 48, 64, 128), train (8, 2048, 24, 64, 128); Mamba-2, G = 1),
the data movement of a host-array forward + backward without the compute, each call's inputs in
and outputs out in one submission, as ssm_vk moves it (``staged``: the CPU copies the inputs into
one staging buffer and the outputs out of it into new arrays; the backward's inputs are all
copied, where ssm_vk compares the forward's six with memcmp instead) and as import would
(``imported``: each input's and each new output array's pages imported, copied by the device,
freed), beside the link's floor for those bytes (bytes / the 64-MiB device copy's rate).

The prediction it serves: a host-array call now costs the CPU copies (their GB/s) plus the
link; with import it would cost the imports plus the link. Import wins where ``imported`` stays
well under ``staged`` at the sizes of real calls.
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
from ssm_vk.plan.sizes import input_shapes, output_shapes
from ssm_vk.runtime import binding, device, hostcopy
from ssm_vk.runtime.commands import oneshot
from ssm_vk.runtime.external import physical_device
from ssm_vk.runtime.memory import Buffer, serials

HOST_ALLOCATION = 0x80   # VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT


def import_alignment(ctx) -> int | None:
    """minImportedHostPointerAlignment, or None where the device does not offer the extension."""
    physical = physical_device(ctx)
    if device.HOST_MEMORY_EXTENSION not in device.device_extensions(physical):
        return None
    vk = binding.require()
    ffi = vk.ffi
    host = ffi.new("VkPhysicalDeviceExternalMemoryHostPropertiesEXT*", {
        "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT})
    props = ffi.new("VkPhysicalDeviceProperties2*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                                     "pNext": host})
    vk.vkGetPhysicalDeviceProperties2(physical, props)
    return int(host.minImportedHostPointerAlignment)


class Imported(Buffer):
    """A Buffer over the pages of a host array (the aligned range around its bytes, which start at
    ``offset``): copies to and from it move the array's own memory. Keeps the array alive; freed
    by close() (the pages stay the array's)."""

    def __init__(self, ctx, array: np.ndarray, align: int):
        vk = binding.require()
        ffi, lib = vk.ffi, vk.lib
        ptr = array.ctypes.data
        start = ptr - ptr % align
        size = -(-(ptr + array.nbytes - start) // align) * align
        self.ctx, self.array, self.offset = ctx, array, ptr - start
        self.size, self.serial, self.staging, self.closed, self.mappable = size, next(serials), False, False, False
        self._buffer = self._memory = self._mapped = None
        self._alloc_size = size
        handle = ctx.handle
        external = ffi.new("VkExternalMemoryBufferCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO, "handleTypes": HOST_ALLOCATION})
        info = vk.VkBufferCreateInfo(pNext=external, size=size, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE,
                                     usage=vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
        self._buffer = vk.vkCreateBuffer(handle, info, None)
        try:
            req = vk.vkGetBufferMemoryRequirements(handle, self._buffer)
            pointer = ffi.cast("void*", start)
            host = ffi.new("VkMemoryHostPointerPropertiesEXT*", {
                "sType": vk.VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT})
            get_props = _functions(ctx)
            get_props(handle, HOST_ALLOCATION, pointer, host)
            bits = int(req.memoryTypeBits) & int(host.memoryTypeBits)
            if not bits:
                raise RuntimeError(f"no memory type for imported host memory (buffer {int(req.memoryTypeBits):#x}, "
                                   f"host pointer {int(host.memoryTypeBits):#x})")
            index = (bits & -bits).bit_length() - 1
            imp = ffi.new("VkImportMemoryHostPointerInfoEXT*", {
                "sType": vk.VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT, "handleType": HOST_ALLOCATION,
                "pHostPointer": pointer})
            alloc = vk.VkMemoryAllocateInfo(pNext=imp, allocationSize=max(size, int(req.size)), memoryTypeIndex=index)
            self._memory = vk.vkAllocateMemory(handle, alloc, None)
            ctx.track_allocation(self._alloc_size, +1)
            lib.vkBindBufferMemory(handle, self._buffer, self._memory, 0)
        except BaseException:
            self._release()
            raise


_FUNCTIONS: dict = {}


def _functions(ctx):
    fn = _FUNCTIONS.get(id(ctx))
    if fn is None:
        fn = _FUNCTIONS[id(ctx)] = binding.require().vkGetDeviceProcAddr(ctx.handle,
                                                                       "vkGetMemoryHostPointerPropertiesEXT")
    return fn


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


def measure(ctx, mib: int, reps: int, align: int | None) -> dict:
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
        if align is not None:
            def import_close(a):
                Imported(ctx, a, align).close()
            rows["import warm"] = median_s(lambda: import_close(host), reps)
            rows["import fresh"] = median_s(lambda: import_close(np.empty(n, np.uint8)), reps)
            with Imported(ctx, host, align) as src:
                rows["gpu copy import->device"] = median_s(
                    lambda: gpu_copy(ctx, src, dev, n, src_offset=src.offset), reps)
            out = np.empty(n, np.uint8)
            out.fill(0)
            with Imported(ctx, out, align) as dst:
                rows["gpu copy device->import"] = median_s(
                    lambda: gpu_copy(ctx, dev, dst, n, dst_offset=dst.offset), reps)
            gpu_copy(ctx, staging, dev, n)          # the device buffer now holds the staging bytes
            check = np.empty(n, np.uint8)
            with Imported(ctx, check, align) as dst:
                gpu_copy(ctx, dev, dst, n, dst_offset=dst.offset)
            if not np.array_equal(check, window):
                raise AssertionError(f"{mib} MiB: the bytes copied into imported pages differ from the source")
            with Imported(ctx, host, align) as src:
                gpu_copy(ctx, src, dev, n, src_offset=src.offset)
            gpu_copy(ctx, dev, staging, n)
            if not np.array_equal(window, host):
                raise AssertionError(f"{mib} MiB: the bytes copied from imported pages differ from the source")
    rows.update(torch_rows(n, reps))
    return {k: {"ms": v * 1e3, "GBps": n / v / 1e9} for k, v in rows.items()}


CALLS = {"mid": (1, 512, 48, 64, 128), "train": (8, 2048, 24, 64, 128)}


def call_movement(ctx, name: str, reps: int, align: int | None, link_gbps: float) -> dict:
    """ms of a host forward + backward's data movement at shape ``name``, staged and imported."""
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
        def staged():
            results = []
            for ins, outs in calls:
                at, slots = 0, []
                for k, a in ins.items():
                    hostcopy.copy(window[at:at + a.nbytes], a.reshape(-1).view(np.uint8))
                    slots.append(("in", k, at, a.nbytes))
                    at += a.nbytes
                for k, v in outs.items():
                    n = int(np.prod(v)) * 4
                    slots.append(("out", k, at, n))
                    at += n
                with oneshot(ctx) as seq:
                    for kind, k, off, n in slots:
                        if kind == "in":
                            seq.copy(staging, buffers["in:" + k], n, src_offset=off)
                        else:
                            seq.copy(buffers["out:" + k], staging, n, dst_offset=off)
                for kind, k, off, n in slots:
                    if kind == "out":
                        out = np.empty(outs[k], np.float32)
                        hostcopy.copy(out.reshape(-1).view(np.uint8), window[off:off + n])
                        results.append(out)
            return results

        def imported():
            results = []
            for ins, outs in calls:
                made = [np.empty(v, np.float32) for v in outs.values()]
                imps = [Imported(ctx, a, align) for a in ins.values()] + [Imported(ctx, o, align) for o in made]
                try:
                    with oneshot(ctx) as seq:
                        for imp, k in zip(imps, list(ins) + list(outs), strict=True):
                            n = imp.array.nbytes
                            if imp.array is ins.get(k):
                                seq.copy(imp, buffers["in:" + k], n, src_offset=imp.offset)
                            else:
                                seq.copy(buffers["out:" + k], imp, n, dst_offset=imp.offset)
                finally:
                    for imp in imps:
                        imp.close()
                results += made
            return results

        rows = {"link floor": nbytes / (link_gbps * 1e9), "staged": median_s(staged, reps)}
        if align is not None:
            a, b = staged(), imported()
            if not all(np.array_equal(x, y) for x, y in zip(a, b, strict=True)):
                raise AssertionError(f"{name}: imported and staged movements disagree")
            rows["imported"] = median_s(imported, reps)
    finally:
        for b in buffers.values():
            b.close()
        staging.close()
    return {"bytes": nbytes, **{k: v * 1e3 for k, v in rows.items()}}


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
    align = import_alignment(ctx)
    print(f"device: {ctx.info.name}; copy threads {hostcopy.threads()}; CPUs {os.cpu_count()}; "
          f"host-pointer import: {f'alignment {align}' if align else 'not offered'}")
    for i, (flags, heap) in enumerate(ctx.memory_types):
        print(f"  memory type {i} flags {flags:#x} heap {heap} ({ctx.memory_heaps[heap][0] / 2**30:.1f} GiB)")
    results = {}
    for mib in (int(s) for s in args.sizes.split(",")):
        results[mib] = measure(ctx, mib, args.reps, align)
        for name, r in results[mib].items():
            print(f"{mib:5d} MiB  {name:34s} {r['ms']:9.3f} ms {r['GBps']:8.2f} GB/s")
        sys.stdout.flush()
    link = max((r["gpu copy staging->device"]["GBps"] for r in results.values()), default=None)
    calls = {}
    for name in filter(None, args.calls.split(",")):
        if link is None:
            link = results.setdefault(64, measure(ctx, 64, args.reps, align))["gpu copy staging->device"]["GBps"]
        calls[name] = call_movement(ctx, name, args.reps, align, link)
        r = calls[name]
        print(f"call {name:6s} fwd+bwd data {r['bytes'] / 1e6:8.1f} MB: link floor {r['link floor']:8.3f} ms, staged "
              f"{r['staged']:8.3f} ms" + (f", imported {r['imported']:8.3f} ms" if "imported" in r else ""))
    for message in ctx.validation_messages:
        print("validation:", message)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": ctx.info.name, "import_alignment": align, "copy_threads": hostcopy.threads(),
                       "sizes_mib": results, "calls": calls}, f, indent=1)


if __name__ == "__main__":
    main()
