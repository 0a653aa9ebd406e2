"""The largest problem each backend accepts, by the rules it applies before any allocation.

    python benchmarks/largest.py            # this machine: host memory, and its Vulkan device if any
    python benchmarks/largest.py --h200     # also the H200's limits (docs/VULKAN.md)

For each shape family (S, H, P, N, G fixed; T grows) it bisects the largest T that:
  ssm_ref / ssm_fast -- fits the host memory rule (ssm_ref.memory: input copies, outputs, the
                        backend's workspace: ssm_ref's backward keeps T+1 states, ssm_fast's its
                        d_B / d_C partial slabs);
  ssm_vk             -- plans within the device's limits and fits ssm_vk/plan/budget.py (every buffer within
                        maxMemoryAllocationSize, all within the device-local heap); beyond it the
                        call runs on the CPU (ssm_fast) and says why.
Numbers only: nothing is allocated.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from ssm_ref import Dims, host_memory_bytes
from ssm_ref.checks import output_elems
from ssm_ref.scan import backward_workspace, forward_workspace
from ssm_vk.plan import Limits, TooLarge, budget, plan

FAMILIES = {  # (S, H, P, N, G): the benchmark shapes of docs/BENCHMARKS.md
    "demo/long (S=1, H=24, P=64, N=128)": (1, 24, 64, 128, 1),
    "train (S=8, H=24, P=64, N=128)": (8, 24, 64, 128, 1),
    "small rows (S=1, H=16, P=64, N=16)": (1, 16, 64, 16, 1),
}
ALL_OPS = frozenset({"basic", "vote", "arithmetic", "ballot", "shuffle", "shuffle_relative", "clustered", "quad"})
H200 = (Limits(subgroup_size=32, subgroup_ops=ALL_OPS, max_workgroup_invocations=1024, max_shared_memory=48 << 10,
               max_workgroup_count=(2**31 - 1, 65535, 65535), max_storage_buffer_range=2**32 - 1,
               max_memory_allocation_size=2**32, min_storage_buffer_offset_alignment=16), 140 * 10**9, "H200")


class _Info:
    def __init__(self, lim, heap, name):
        self.max_memory_allocation_size, self.device_local_bytes, self.name = lim.max_memory_allocation_size, heap, name


def _dims(S, T, H, P, N, G) -> Dims:
    return Dims(S=S, T=T, H=H, P=P, N=N, G=G, R=S, mamba1=False, a_shape=(H,))


def _workspace(d: Dims, backward: bool, reference: bool) -> int:
    f32 = np.dtype(np.float32)
    if reference:
        return (backward_workspace if backward else forward_workspace)(d, f32)
    if not backward:
        return 0
    import ssm_fast
    return ssm_fast.backward_workspace(d, f32)


def _host_ok(d: Dims, backward: bool, reference: bool, have: int) -> bool:
    return d.S * 8 + output_elems(d, backward) * 4 + _workspace(d, backward, reference) <= have


def _device_ok(d: Dims, backward: bool, lim: Limits, heap: int, name: str) -> bool:
    try:
        pl = plan(d, lim, backward=backward)
    except TooLarge:
        return False
    return not budget.check(_Info(lim, heap, name), budget.buffers(d, pl, lim, backward))


def _host_rule(shape, backward, reference, have):
    S, H, P, N, G = shape
    return lambda T: _host_ok(_dims(S, T, H, P, N, G), backward, reference, have)


def _device_rule(shape, backward, lim, heap, name):
    S, H, P, N, G = shape
    return lambda T: _device_ok(_dims(S, T, H, P, N, G), backward, lim, heap, name)


def _largest_T(ok) -> int:
    lo, hi = 0, 1
    while ok(hi) and hi < 2**40:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--h200", action="store_true", help="also the H200's device limits")
    ap.add_argument("--host-bytes", type=int, default=None, help="host memory to assume (default: this machine)")
    args = ap.parse_args()
    have, source = (args.host_bytes, "--host-bytes") if args.host_bytes else host_memory_bytes()
    devices = []
    try:
        from ssm_vk import runtime as rt
        ok, _ = rt.available()
        if ok:
            ctx = rt.get_context()
            devices.append((Limits.of(ctx.info), ctx.info.device_local_bytes, ctx.info.name))
    except Exception as exc:  # no Vulkan here: host numbers only
        print(f"(no Vulkan device: {exc})")
    if args.h200:
        devices.append(H200)
    print(f"host memory: {have} bytes ({source})")
    for label, shape in FAMILIES.items():
        print(f"\n{label}: largest T")
        for op, backward in (("forward", False), ("backward", True)):
            ref = _largest_T(_host_rule(shape, backward, True, have))
            fast = _largest_T(_host_rule(shape, backward, False, have))
            print(f"  {op:8s} ssm_ref {ref:>10}   ssm_fast {fast:>10}", end="")
            for lim, heap, name in devices:
                t = _largest_T(_device_rule(shape, backward, lim, heap, name))
                print(f"   ssm_vk on {name.split(' (')[0]} {t:>9}", end="")
            print()

if __name__ == "__main__":
    main()
