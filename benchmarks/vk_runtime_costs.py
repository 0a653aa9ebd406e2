"""Fixed costs of the Vulkan runtime from Python: submit+wait, descriptor sets, shader builds.

    PYTHONPATH=. python benchmarks/vk_runtime_costs.py [--validation]

Prints medians in microseconds (ms for glslc). Uses tests/glsl/saxpy.comp and a throw-away
SPIR-V cache, so the first compile really runs glslc.
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import tempfile
import time
from pathlib import Path

import numpy as np

from ssm_vk import runtime as rt
from ssm_vk.runtime import shaders

GLSL = Path(__file__).resolve().parents[1] / "tests" / "glsl"


def median_us(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--validation", action="store_true", help="run under the validation layer")
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--big-mib", type=int, default=64, help="size of the bulk transfer timed")
    args = ap.parse_args()
    os.environ["SSM_SCAN_CACHE"] = tempfile.mkdtemp(prefix="ssm-spirv-bench-")

    t = time.perf_counter()
    shaders.compile_shader("saxpy", {"OFFSET": 1.0}, search_path=GLSL)
    glslc_ms = (time.perf_counter() - t) * 1e3
    hit_us = median_us(lambda: shaders.compile_shader("saxpy", {"OFFSET": 1.0}, search_path=GLSL), 50)

    ctx = rt.get_context(validation=args.validation)
    n = 4096
    k = rt.Kernel.get(ctx, "saxpy", bindings=3, push_size=8, local_size=64, spec=(1.0,), search_path=GLSL)
    bufs = [rt.Buffer(ctx, 4 * n) for _ in range(3)]
    for b in bufs:
        rt.fill(b, 0)
    push = struct.pack("<If", n, 1.0)

    seq = rt.Sequence(ctx)
    seq.dispatch(k, bufs, push, groups=n // 64)
    seq.finish()
    seq.submit()
    submit_us = median_us(seq.submit, args.repeat)
    empty = rt.Sequence(ctx)
    empty.finish()
    empty.submit()
    empty_us = median_us(empty.submit, args.repeat)

    hit = median_us(lambda: k.descriptor_set(bufs), args.repeat)
    offsets = iter(range(0, 10**9, 64))  # a new (buffer, offset, range) list each call: always a miss

    def miss():
        off = next(offsets) % (4 * n - 64)
        k.descriptor_set([bufs[0], (bufs[1], off, 64), bufs[2]])

    miss_us = median_us(miss, min(args.repeat, 60))

    def generic():  # record + submit + wait from scratch, what an uncached call path pays
        with rt.oneshot(ctx) as s:
            s.dispatch(k, bufs, push, groups=n // 64)

    generic_us = median_us(generic, args.repeat)
    x = np.ones(n, np.float32)
    up_us = median_us(lambda: rt.upload(bufs[0], x), args.repeat)
    down_us = median_us(lambda: rt.download(bufs[0], (n, np.float32)), args.repeat)

    big = np.ones(args.big_mib << 18, np.float32)
    with rt.Buffer(ctx, big.nbytes) as bb:
        rt.upload(bb, big)  # the staging buffer, if any, is made outside the timing
        big_up = median_us(lambda: rt.upload(bb, big), 5) * 1e-6
        big_down = median_us(lambda: rt.download(bb, (big.size, np.float32)), 5) * 1e-6
    path = "staged" if not bufs[0].mappable else "mapped"

    print(f"device: {ctx.info.name} ({ctx.info.driver}); validation={ctx.validation}")
    print(f"glslc compile (saxpy.comp):                  {glslc_ms:8.1f} ms")
    print(f"compile_shader disk-cache hit:               {hit_us:8.1f} us")
    print(f"pre-recorded submit+wait (one dispatch):     {submit_us:8.1f} us")
    print(f"pre-recorded submit+wait (empty sequence):   {empty_us:8.1f} us")
    print(f"one-shot record+submit+wait (one dispatch):  {generic_us:8.1f} us")
    print(f"descriptor set, cache hit:                   {hit:8.1f} us")
    print(f"descriptor set, cache miss (3 writes):       {miss_us:8.1f} us")
    print(f"upload 16 KiB / download 16 KiB:             {up_us:8.1f} / {down_us:.1f} us")
    print(f"upload / download {args.big_mib} MiB ({path}):         {big.nbytes / big_up / 1e9:8.2f} / "
          f"{big.nbytes / big_down / 1e9:.2f} GB/s")
    rt.close()


if __name__ == "__main__":
    main()
