"""The driver's compile statistics of every kernel a forward and backward build, per shape and
tuning variant: registers per thread and what else the driver reports, and how many workgroups
of each kernel the registers leave room for on one SM.

    SSM_VK_PIPELINE_STATS=1 python benchmarks/vk_pipeline_stats.py [--shapes train] \\
        [--variants ";KS=8;VEC_IN=0"] [--json out.json] [--dump DIR]

``--dump DIR``: also what the driver made of each kernel's code (its internal representations,
where it shows them), one file per kernel and representation.

Needs a device offering VK_KHR_pipeline_executable_properties (NVIDIA's and AMD's drivers do;
Mesa's lavapipe 22.3 does not). The occupancy estimate uses the register file and thread limits
of an NVIDIA Hopper SM (64 K registers, 2048 threads, allocated per warp in units of 256) and
applies only where the driver reports a register count.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("SSM_VK_PIPELINE_STATS", "1")   # before the Vulkan context is made

import ssm_vk
from ssm_vk import config
from ssm_vk import engine as vk_engine
from ssm_vk import runtime as rt

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from vk_gpu_check import SHAPES, inputs

SM_REGISTERS, SM_THREADS, WARP, REG_UNIT = 65536, 2048, 32, 256   # NVIDIA sm_90
SHOWN = ("MODE", "RBLK", "CBLK", "KS", "ROWG", "VEC_IN", "HEADLOOP", "CL", "WG")


def registers(stats: dict) -> int | None:
    """The register count among a driver's statistics (by name), or None."""
    for name, value in stats.items():
        low = name.lower()
        if "register" in low and "spill" not in low and isinstance(value, int) and value > 0:
            return value
    return None


def per_sm(regs: int, threads: int) -> int:
    """Workgroups of ``threads`` that ``regs`` registers per thread leave room for on one SM."""
    warps = -(-threads // WARP)
    per_warp = -(-regs * WARP // REG_UNIT) * REG_UNIT
    return min(SM_REGISTERS // (per_warp * warps), SM_THREADS // (warps * WARP))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="train")
    ap.add_argument("--variants", default="", help="';'-separated SSM_VK_TUNE settings (first: the defaults)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--dump", default=None, help="folder for the kernels' internal representations")
    args = ap.parse_args(argv)
    dump = Path(args.dump) if args.dump else None
    if dump:
        dump.mkdir(parents=True, exist_ok=True)
    ctx = rt.get_context()
    if not ctx.pipeline_stats:
        print(f"no compile statistics: {ctx.pipeline_stats_missing}", file=sys.stderr)
        return 2
    print(f"device: {ctx.info.name}, {ctx.info.driver}", flush=True)
    rows = []
    for name in args.shapes.split(","):
        a, g_y, g_states = inputs(SHAPES[name])
        dev = {k: ssm_vk.to_device(v) for k, v in a.items()}
        dgy, dgs = ssm_vk.to_device(g_y), ssm_vk.to_device(g_states)
        for var in args.variants.split(";") if args.variants else [""]:
            seen = {id(k) for k in ctx.cached_kernels()}
            with config.configure(tune=config.parse_tune(var, "--variants")):
                vk_engine.clear(ctx)
                ssm_vk.ssm_scan(**dev, dt_softplus="log1p")
                ssm_vk.ssm_scan_back(**dev, ids=None, g_y=dgy, g_states=dgs, dt_softplus="log1p")
            for k in ctx.cached_kernels():
                if id(k) in seen:
                    continue
                stats = k.statistics()
                threads = k.local_size[0] * k.local_size[1] * k.local_size[2]
                regs = registers(stats)
                row = dict(shape=name, variant=var or "default", kernel=k.name, threads=threads,
                           defines={d: v for d, v in k.defines.items() if d in SHOWN}, stats=stats,
                           workgroups_per_sm=per_sm(regs, threads) if regs else None)
                if dump:
                    stem = f"{len(rows):03d}-{k.name}-" + "-".join(f"{d}{v}" for d, v in row["defines"].items())
                    for index, rep, _, content in k.representations():
                        safe = "".join(ch if ch.isalnum() else "_" for ch in rep)
                        out = dump / f"{stem}-{index}-{safe}.{'txt' if isinstance(content, str) else 'bin'}"
                        if isinstance(content, str):
                            out.write_text(content)
                        else:
                            out.write_bytes(content)
                        row.setdefault("representations", []).append(out.name)
                rows.append(row)
                shown = " ".join(f"{d}={v}" for d, v in row["defines"].items())
                print(f"{name} {var or 'default':14s} {k.name:18s} {shown:40s} threads {threads:4d} "
                      f"regs {regs} -> {row['workgroups_per_sm']} per SM | "
                      + ", ".join(f"{s}={v}" for s, v in stats.items()), flush=True)
        for v in (*dev.values(), dgy, dgs):
            v.release()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=ctx.info.name, driver=ctx.info.driver, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
