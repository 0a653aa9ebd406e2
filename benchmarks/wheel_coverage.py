"""What an install without glslc runs on this machine's Vulkan device: for each benchmark shape,
forward and backward, the support decision (and whether the chunked kernels take it) with only the
packaged SPIR-V (ssm_vk/spirv/, as `make dist` ships it) and an empty shader cache, then the call.

    PATH=<no glslc> SSM_SCAN_CACHE=<empty dir> python benchmarks/wheel_coverage.py [demo,mid,...]
"""

from __future__ import annotations

import shutil
import sys

import numpy as np

import ssm_ref
import ssm_vk
from ssm_vk import config, decision
from ssm_vk import runtime as rt
from ssm_vk.plan import Limits
from ssm_vk.runtime import shaders

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from vk_gpu_check import SHAPES, inputs


def main() -> int:
    assert shutil.which("glslc") is None, "run without glslc on PATH"
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(SHAPES)
    ctx = rt.get_context()
    info = ctx.info
    print(f"{info.name}, subgroup {info.subgroup_size}; packaged: {shaders.PACKAGED_SPIRV}")
    bad = 0
    for name in names:
        shape = SHAPES[name]
        a, g_y, g_states = inputs(shape)
        for op in ("ssm_scan", "ssm_scan_back"):
            sup = ssm_vk.supports(op, **a)
            dims = ssm_ref.check_forward(**a).dims
            chunked = decision.choose_plan(ctx, dims, Limits.of(ctx.info), op == "ssm_scan_back",
                                           config.settings()).chunked is not None
            try:
                r = (ssm_vk.ssm_scan(**a) if op == "ssm_scan"
                     else ssm_vk.ssm_scan_back(**a, ids=None, g_y=g_y, g_states=g_states))
                where, finite = r.where, bool(np.isfinite(r.y if op == "ssm_scan" else r.d_x).all())
            except Exception as exc:  # what this check is for
                where, finite = f"RAISED {type(exc).__name__}: {exc}", False
            ok = bool(sup) and where.startswith("Vulkan") and finite
            bad += not ok
            print(f"{name:7s} {op:14s} {'ok' if ok else 'MISS':4s} {where:8s} "
                  f"{'chunked' if sup and chunked else ''} {'' if sup else sup.reason}", flush=True)
    print(f"{bad} shape(s) not on the device without glslc")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
