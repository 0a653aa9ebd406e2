"""Wall time per call of a Mamba-3 decode step on ssm_vk (T = 1, update_cache=True): host arrays and
host caches (the caches' rows read back and written on the host), DeviceArrays with DeviceArray
caches (the rows written on the device; a repeat runs through its kept replay), and the prepared
call (``prepare_mamba3_scan(..., update_cache=True).run()``).

    python benchmarks/vk_mamba3_decode.py [--S 1] [--H 2] [--P 4] [--N 8] [--M 1] [--calls 300] [--modes ...]

The median of ``--calls`` calls after 20 warm-up calls, in microseconds. ``--tree DIR`` is not
taken: run it with PYTHONPATH set to the checkout to time. A checkout without DeviceArray caches
(before they were taken) times the host mode alone (``--modes host``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    for k, v in (("S", 1), ("H", 2), ("P", 4), ("N", 8), ("M", 1), ("F", 2), ("R", 4), ("calls", 300)):
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--modes", default="host,device,prepared")
    args = ap.parse_args()
    import ssm_vk
    from ssm_ref.testing import mamba3_cases

    mimo = args.M if args.M > 1 else None
    case = mamba3_cases.make_case(1, S=args.S, T=1, H=args.H, P=args.P, N=args.N, G=1, M=mimo, F=args.F, R=args.R,
                                  ids="permutation")
    a = {**case.args(), **case.keywords}
    dev = {k: ssm_vk.to_device(v) if isinstance(v, np.ndarray) and k != "ids" else v for k, v in a.items()}
    calls = {"host": lambda: ssm_vk.mamba3_scan(**a, update_cache=True),
             "device": lambda: ssm_vk.mamba3_scan(**dev, update_cache=True)}
    if "prepared" in args.modes:
        step = ssm_vk.prepare_mamba3_scan(**dev, update_cache=True)
        calls["prepared"] = step.run
    info = ssm_vk.runtime.get_context().info
    print(f"{info.name}: S={args.S} H={args.H} P={args.P} N={args.N} M={args.M} F={args.F} R={args.R}; "
          f"median of {args.calls} calls")
    for mode in args.modes.split(","):
        fn = calls[mode]
        for _ in range(20):
            fn()
        times = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        print(f"{mode:9s} {statistics.median(times) * 1e6:8.1f} us per call")


if __name__ == "__main__":
    main()
