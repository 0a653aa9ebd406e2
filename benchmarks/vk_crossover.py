"""Where the chunked kernels overtake the token-sequential ones: forward and backward GPU time
(timestamps, median) of both, over sequence lengths, for Mamba-2 shapes with device-resident
inputs. The result sets ssm_vk.plan.chunked.CHUNK_MIN_T.

    python benchmarks/vk_crossover.py [--T 16,32,...] [--S 1] [--H 24] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys

import ssm_vk
from ssm_vk import config
from ssm_vk import engine as vk_engine
from ssm_vk import runtime as rt

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from vk_gpu_check import inputs
from vk_speed import measure

PATHS = {"sequential": {"CHUNK": 0}, "chunked64": {"CHUNK": 64, "CHUNK_MIN_T": 1},
         "chunked32": {"CHUNK": 32, "CHUNK_MIN_T": 1}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", default="16,32,64,128,256,512,1024")
    ap.add_argument("--S", type=int, default=1)
    ap.add_argument("--H", type=int, default=24)
    ap.add_argument("--P", type=int, default=64)
    ap.add_argument("--N", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    ctx = rt.get_context()
    print(f"device: {ctx.info.name}, {ctx.info.driver}", flush=True)
    rows = []
    for T in (int(t) for t in args.T.split(",")):
        a, g_y, g_states = inputs((args.S, T, args.H, args.P, args.N, 1, "mamba2"))
        dev = {k: ssm_vk.to_device(v) for k, v in a.items()}
        dgy, dgs = ssm_vk.to_device(g_y), ssm_vk.to_device(g_states)
        line = {"T": T}
        for name, knobs in PATHS.items():
            tuned = config.configure(tune=dict(knobs))
            vk_engine.clear(ctx)
            _, fg, _, _ = measure(lambda dev=dev: ssm_vk.ssm_scan(**dev), args.reps)
            _, bg, _, _ = measure(lambda dev=dev, dgy=dgy, dgs=dgs: ssm_vk.ssm_scan_back(
                **dev, ids=None, g_y=dgy, g_states=dgs), args.reps)
            line[name] = (fg, bg)
            tuned.restore()
        rows.append(line)
        print(f"T={T:6d} " + "  ".join(f"{k} fwd {v[0]:8.1f} bwd {v[1]:8.1f} us" for k, v in line.items() if k != "T"),
              flush=True)
        for v in (*dev.values(), dgy, dgs):
            v.release()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=ctx.info.name, driver=ctx.info.driver, S=args.S, H=args.H, P=args.P, N=args.N,
                           rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
