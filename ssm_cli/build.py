"""``ssm-scan build-shaders``: precompile the SPIR-V variants ssm_vk uses into package data.

ssm_vk picks a token-sequential kernel variant (glsl file + defines) per problem from the device's
subgroup size and operations, its shared memory and workgroup limits, d_state N and the Mamba
variant (ssm_vk/sequential/: plan.py, kernels.py); head count, head_dim, T and S only change push
constants and grids, and N enters only through how many lanes share a state row and how many
values each lane holds, so every N from 1 to 256 takes a few hundred variants in all; as many
again are those of K > 1 state snapshots and of the invariant mode, which run on these kernels
alone (ssm_vk.registry.modes_matrix plans them with the planner itself). The chunked
Mamba-2 kernels (ssm_vk/chunked/chunked_planner.py) are compiled per head_dim P, d_state N and chunk length
(32, 64) and do not depend on the device profile: they are built for every P in ``--p`` and N in
``--chunked-n``; a shape whose chunked variant is missing runs on the token-sequential kernels
instead (the support decision says so). ``ssm_vk.runtime.shaders`` looks the variants up in
``ssm_vk/spirv/index.json`` first, which the package ships (pyproject: package data), so a wheel
built after this runs those shapes without glslc. The default matrix is what ``make dist`` ships
(docs/INSTALL.md). The command's help (:data:`DESCRIPTION`) says what a user needs; this docstring
is how it works.
"""

from __future__ import annotations

from pathlib import Path

from . import common
from .table import bytes_

HELP = "precompile the SPIR-V kernel variants for common shapes (package data for wheels)"
DESCRIPTION = """Precompile the SPIR-V kernel variants ssm_vk uses for common shapes, for wheels to ship.

ssm_vk looks a kernel up in its packaged SPIR-V first, so a wheel built after this runs those shapes
without glslc; any other shape is compiled with glslc on first use (and cached), or, for the chunked
Mamba-2 kernels, runs on the token-sequential ones. The default builds this device's variants for
every d_state N from 1 to 256 (also those of snapshots=K and invariant=True), and the chunked ones
for head_dim P in 32, 64, 128 and N in 64, 128, 256: what make dist ships (docs/INSTALL.md). Needs
glslc; "local" needs a Vulkan device.

  ssm-scan build-shaders                       this device's variants into ssm_vk/spirv/
  ssm-scan build-shaders --subgroup-sizes local,8,16,32,64   also the common GPU profiles (a wheel)
  ssm-scan build-shaders --out /tmp/spv --n 16,128"""

DEFAULT_N = "1-256"
DEFAULT_CHUNKED_N = "64,128,256"
DEFAULT_P = "32,64,128"
# Profiles assumed for devices other than the local one: every subgroup operation class (NVIDIA,
# AMD and Intel GPUs offer clustered reductions; lavapipe does not -- build on it with "local"),
# 1024 invocations per workgroup and 1024 along x, and each of the shared-memory sizes common
# among GPUs (the backward's workgroup size depends on it).
ALL_OPS = frozenset({"basic", "vote", "arithmetic", "ballot", "shuffle", "shuffle_relative", "clustered", "quad"})
COMMON_SHARED = (32 << 10, 48 << 10, 64 << 10)


def add_arguments(p) -> None:
    p.add_argument("--out", metavar="DIR",
                   help="where to write the .spv files and index.json (default: the package's ssm_vk/spirv/, "
                        "which wheels ship)")
    p.add_argument("--n", default=DEFAULT_N, metavar="N1,N2-N3,...",
                   help=f"d_state values (and ranges) to build the token-sequential kernels for (default {DEFAULT_N})")
    p.add_argument("--chunked-n", default=DEFAULT_CHUNKED_N, metavar="N1,N2,...",
                   help=f"d_state values to build the chunked Mamba-2 kernels for (default {DEFAULT_CHUNKED_N})")
    p.add_argument("--p", default=DEFAULT_P, metavar="P1,P2,...",
                   help=f"head_dim values to build the chunked Mamba-2 kernels for (default {DEFAULT_P})")
    p.add_argument("--subgroup-sizes", default="local", metavar="LIST",
                   help="'local' (this machine's Vulkan device, exactly) and/or subgroup sizes of other GPUs, "
                        "e.g. local,8,16,32,64 for a wheel (default: local)")
    common.add_verbose(p)


def profiles(spec: str) -> list[tuple[str, object]]:
    """(label, ssm_vk.sizing.Limits) for each entry of ``--subgroup-sizes``."""
    from ssm_vk import config
    from ssm_vk import runtime as rt
    from ssm_vk.sizing import Limits

    out = []
    for item in common.split_list([spec], "--subgroup-sizes"):
        if item == "local":
            ok, why = rt.available()
            if not ok:
                raise common.UsageError(f"--subgroup-sizes local: no Vulkan device here ({why}); "
                                        "give subgroup sizes instead, e.g. 8,16,32,64")
            info = rt.get_context().info
            lim = Limits.of(info, config.settings().no_subgroup)
            out.append((f"local: {info.name}, subgroup {info.subgroup_size}", lim))
            continue
        (sg,) = common.int_list(item, "--subgroup-sizes", minimum=1)
        if sg & (sg - 1) or not 4 <= sg <= 128:
            raise common.UsageError(f"--subgroup-sizes: {sg} is not a power of two in [4, 128]")
        for shared in COMMON_SHARED:
            out.append((f"subgroup {sg}, {shared >> 10} KiB shared", Limits(
                subgroup_size=sg, subgroup_ops=ALL_OPS, max_workgroup_invocations=1024, max_shared_memory=shared,
                max_workgroup_size=(1024, 1024, 64), max_workgroup_count=(65535, 65535, 65535),
                max_storage_buffer_range=1 << 27,
                max_memory_allocation_size=1 << 30, min_storage_buffer_offset_alignment=256)))
    return out


def variants(limits_list, n_values: list[int], p_values: tuple = (), chunked_n=None) -> list[tuple[str, dict]]:
    """Every (shader, defines) of the packaged matrix: ssm_vk.registry.matrix_all (every op's)
    under the knobs set now (none, for a wheel)."""
    from ssm_vk import config, registry

    return registry.matrix_all(limits_list, n_values, p_values, chunked_n, config.settings())


def n_list(text: str, what: str) -> list[int]:
    """``"1-8,16,128"`` -> [1, ..., 8, 16, 128] (ranges inclusive); UsageError for anything else."""
    out = []
    for item in common.split_list([text], what):
        lo, dash, hi = item.partition("-")
        (a,) = common.int_list(lo, what, minimum=1)
        (b,) = common.int_list(hi, what, minimum=1) if dash else (a,)
        if b < a:
            raise common.UsageError(f"{what}: empty range {item!r}")
        out += [n for n in range(a, b + 1) if n not in out]
    return out


def _ranges(values: list[int]) -> str:
    parts, run = [], []
    for v in [*sorted(values), None]:
        if run and (v is None or v != run[-1] + 1):
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
            run = []
        if v is not None:
            run.append(v)
    return ", ".join(parts)


def run(args) -> int:
    from ssm_vk.runtime import shaders

    out = Path(args.out) if args.out else shaders.PACKAGED_SPIRV
    common.writable_dir(out, "--out")       # before minutes of glslc
    n_values = n_list(args.n, "--n")
    chunked_n = n_list(args.chunked_n, "--chunked-n")
    p_values = common.int_list(args.p, "--p", minimum=1)
    profs = profiles(args.subgroup_sizes)
    todo = variants([lim for _, lim in profs], n_values, tuple(p_values), chunked_n)
    written = shaders.build_all(todo, out)
    total = sum(p.stat().st_size for p in written)
    print(f"wrote {len(written)} SPIR-V variants ({bytes_(total)}) and index.json to {out}")
    print(f"  token-sequential kernels (Mamba-1 and Mamba-2, forward and backward; also with state snapshots and in "
          f"the invariant mode) for N = {_ranges(n_values)}; "
          f"chunked Mamba-2 kernels for P = {_ranges(p_values)} x N = {_ranges(chunked_n)}; Mamba-3 token-sequential "
          f"kernels (mamba3_scan) for the packaged N x M among those N")
    for label, _ in profs:
        if label.startswith("local"):
            print(f"  for {label}")
    others = sorted({lim.subgroup_size for label, lim in profs if not label.startswith("local")})
    if others:
        print(f"  for subgroup sizes {', '.join(map(str, others))} (every subgroup operation class, 1024 "
              f"invocations) x {', '.join(str(m >> 10) for m in COMMON_SHARED)} KiB of shared memory")
    return common.EXIT_OK
