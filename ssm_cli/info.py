"""``ssm-scan info``: versions, backends, Vulkan devices, and where each backend runs which shapes."""

from __future__ import annotations

import dataclasses
import json
import os

from . import backends as bk
from . import common, machine
from .shapes import SHAPES, Shape, empty_inputs
from .table import bytes_, flops, table

HELP = "versions, backends, Vulkan devices, and where each backend runs the benchmark shapes"
DESCRIPTION = """Print the versions, the backends and the Vulkan devices here, and where each backend runs.

Shows what this installation runs on: package and library versions, glslc, the CPU,
every backend (and why one is unavailable), every Vulkan device with the limits that matter, and
for the benchmark shapes where each backend runs the forward and the backward (supports()), beside
what ggml's Vulkan forward and ggmlR's Vulkan backward would do with them (their documented
limits, docs/SPEC.md)."""

OPS = (("fwd", "ssm_scan"), ("bwd", "ssm_scan_back"))

# Shapes whose placement info reports: the benchmark shapes plus two that ggml's Vulkan kernels
# send to the CPU (d_state outside {128, 256}; head_dim not a multiple of 16).
EXTRA_SHAPES = (
    Shape("n64", N=64, P=64, H=16, G=1, T=64, S=1, note="d_state 64"),
    Shape("p8", N=128, P=8, H=16, G=1, T=64, S=1, note="head_dim 8"),
)


def add_arguments(p) -> None:
    common.add_json(p)
    common.add_verbose(p)


def ggml_vulkan(shape: Shape, op: str, max_range: int | None) -> str:
    """What ggml's Vulkan forward (ssm_scan.comp) and ggmlR's Vulkan backward (ssm_scan_back.comp)
    do with ``shape``, from their documented limits (docs/SPEC.md, section 13): "GPU", or
    "CPU: why" for the cases they leave to the CPU, or a warning when the backward's scratch
    exceeds the device's binding range (its gradients then come out wrong: docs/SPEC.md, section 13)."""
    if shape.mamba1:
        return "CPU: Mamba-1"
    if shape.N not in (128, 256):
        return f"CPU: d_state {shape.N}"
    if op == "fwd" and shape.P % 16:
        return f"CPU: head_dim {shape.P} % 16"
    if op == "bwd":
        scratch = shape.S * shape.H * shape.P * (shape.T + 1) * shape.N * 4
        if max_range is not None and scratch > max_range:
            return f"GPU, scratch {bytes_(scratch)} > range (!)"
    return "GPU"


def _support(b: bk.Backend, shape: Shape, op: str) -> dict:
    if not b.available:
        return {"ok": None, "where": "-", "reason": b.reason}
    from ssm_ref.testing import ports

    try:
        s = ports.support(b.module.supports(op, *ports.args_of(empty_inputs(shape))))  # positional, ids None
    except Exception as e:  # a port's supports() must not stop the report
        return {"ok": False, "where": "error", "reason": f"{type(e).__name__}: {e}"}
    where = "CPU"
    if b.is_vulkan:
        where = b.device().where if s.ok else "CPU"
    out = {"ok": bool(s.ok), "where": where, "reason": s.reason}
    if b.is_vulkan and s.ok:
        out["plan"] = _vk_plan(b, shape, op)
    return out


def _vk_plan(b: bk.Backend, shape: Shape, op: str) -> dict:
    """ssm_vk's plan, the very one its supports() decision made (ssm_vk.decision, cached): lane
    layout, how many windows the problem is cut into, and whether the chunked kernels run it."""
    from ssm_ref import check_forward
    from ssm_ref.testing import ports
    from ssm_vk import config, support

    p = check_forward(*ports.args_of(empty_inputs(shape)), keep_device=True)
    fp = support.decision(op, p, config.settings()).planned.first
    chunked = fp.family.name == "chunked"
    # the token-sequential plan: the call's own, or the one that stands by to recompute its inf or nan
    seq = fp.rerun if fp.rerun is not None and fp.rerun.family is not fp.family else fp
    windows = (fp if chunked else seq).plan.windows
    return {"layout": dataclasses.asdict(seq.plan.layout), "windows": len(windows), "time_split": seq.plan.time_split,
            "chunked": chunked}


ROW_SUMS = {0: "shared memory", 1: "clustered subgroupAdd", 2: "xor shuffles", 3: "subgroupAdd"}


def _cell(sup: dict) -> str:
    if sup["ok"] is None:
        return "-"
    if not sup["ok"]:
        return "CPU (fallback)" if sup["where"] != "error" else "error"
    w = sup["where"]
    n = sup.get("plan", {}).get("windows", 1)
    return f"{w}, {n} windows" if n > 1 else w


def gather() -> dict:
    """Everything info reports, as plain data."""
    c = machine.cpu()
    report = {
        "versions": machine.versions(),
        "cpu": {**dataclasses.asdict(c), "peak_flops": c.peak_flops, "peak_note": c.peak_note()},
        "numba_threads": _numba_threads(),
        "environment": {k: os.environ.get(k) for k in ("SSM_VK_DEVICE", "VK_DRIVER_FILES", "VK_ICD_FILENAMES",
                                                         "SSM_SCAN_CACHE", "NUMBA_NUM_THREADS")
                        if os.environ.get(k)},
    }
    backs = bk.resolve(None)
    report["backends"] = [{"name": b.name, "available": b.available, "reason": b.reason,
                           "where": b.where() if b.available else None} for b in backs]
    report["vulkan"] = _vulkan()
    report["spirv"] = _spirv()
    vk = next((b for b in backs if b.is_vulkan and b.available), None)
    max_range = vk.device().max_storage_buffer_range if vk else None
    rows = []
    for shape in (*SHAPES.values(), *EXTRA_SHAPES):
        row = {"shape": shape.name, "dims": shape.dims, "variant": shape.variant, "updates": shape.updates,
               "backends": {}, "ggml_vulkan": {op: ggml_vulkan(shape, op, max_range) for op, _ in OPS}}
        for b in backs:
            row["backends"][b.name] = {op: _support(b, shape, full) for op, full in OPS}
        rows.append(row)
    report["support"] = rows
    return report


def _numba_threads() -> int | None:
    try:
        import numba

        return int(numba.config.NUMBA_NUM_THREADS)
    except Exception:  # numba missing or broken: info still reports the rest
        return None


def _vulkan() -> dict:
    from ssm_vk import runtime as rt
    from ssm_vk.runtime import device

    ok, reason = rt.available()
    out = {"available": ok, "reason": reason, "devices": [], "selected": None}
    if not ok:
        return out
    infos = rt.list_devices()
    out["devices"] = [dataclasses.asdict(d) for d in infos]
    try:
        out["selected"] = device.choose(infos).index
    except ValueError as e:
        raise common.UsageError(str(e)) from None
    for d, info in zip(out["devices"], infos, strict=True):
        peak, note = machine.device_peak(info)
        d["peak_flops"], d["peak_note"] = peak, note
    return out


def _spirv() -> dict:
    from ssm_vk.runtime import shaders

    index = shaders.PACKAGED_SPIRV / "index.json"
    n = len(json.loads(index.read_text())) if index.is_file() else 0
    cache = shaders.cache_dir()
    cached = len(list(cache.glob("*/*.entry"))) if cache.is_dir() else 0
    return {"packaged_dir": str(shaders.PACKAGED_SPIRV), "packaged_variants": n,
            "cache_dir": str(cache), "cached_variants": cached}


def render(r: dict) -> str:
    out = []
    v = r["versions"]
    out.append(f"ssm-scan {v['ssm-scan']}")
    libs = " · ".join(f"{k} {v[k] or 'not installed'}" for k in ("python", "numpy", "numba", "vulkan (binding)",
                                                                  "cffi", "matplotlib"))
    out.append(f"  {libs}")
    out.append(f"  glslc: {v['glslc'] or 'not found (needed to build shaders that are not packaged or cached)'}")
    c = r["cpu"]
    peak = f"{flops(c['peak_flops'])} float32" if c["peak_flops"] else "unknown"
    out.append(f"  CPU: {c['model']}, {c['cores']} cores usable, numba threads {r['numba_threads']}; "
               f"peak {peak} ({c['peak_note']})")
    s = r["spirv"]
    out.append(f"  SPIR-V: {s['packaged_variants']} packaged variants ({s['packaged_dir']}), "
               f"{s['cached_variants']} cached ({s['cache_dir']})")
    for k, val in r["environment"].items():
        out.append(f"  {k}={val}")

    out.append("")
    out.append("backends")
    out.append(table(["name", "status", "runs on"],
                     [[b["name"], "available" if b["available"] else f"not available: {b['reason']}",
                       b["where"] or "-"] for b in r["backends"]], indent="  "))

    vk = r["vulkan"]
    out.append("")
    if not vk["available"]:
        out.append(f"Vulkan: not available: {vk['reason']}")
    else:
        out.append("Vulkan devices (* = the one ssm_vk uses; SSM_VK_DEVICE or --device picks another)")
        for d in vk["devices"]:
            mark = "*" if d["index"] == vk["selected"] else " "
            api = ".".join(str(x) for x in d["api_version"])
            out.append(f"{mark} {d['index']}  {d['name']}  ({d['type']}; driver {d['driver']}; Vulkan {api})")
            ops = " ".join(sorted(d["subgroup_ops"])) or "none"
            out.append(f"     subgroup size {d['subgroup_size']}, operations: {ops}")
            out.append(f"     memory: {bytes_(d['device_local_bytes'])} device-local; maxMemoryAllocationSize "
                       f"{bytes_(d['max_memory_allocation_size'])}; maxStorageBufferRange "
                       f"{bytes_(d['max_storage_buffer_range'])}")
            out.append(f"     compute: shared memory {bytes_(d['max_shared_memory'])}; workgroup <= "
                       f"{d['max_workgroup_invocations']} invocations; groups <= "
                       f"{tuple(d['max_workgroup_count'])}; push constants {d['max_push_constants_size']} B")
            ts = f"yes ({d['timestamp_period']:g} ns/tick)" if d["timestamps"] else "no"
            peak = f"{flops(d['peak_flops'])} ({d['peak_note']})" if d["peak_flops"] else d["peak_note"]
            out.append(f"     timestamps {ts}; float32 atomics {'yes' if d['float_atomics'] else 'no'}; "
                       f"float64 {'yes' if d['shader_float64'] else 'no'}; float32 peak {peak}")

    out.append("")
    names = [b["name"] for b in r["backends"]]
    out.append("where each backend runs (supports() on these shapes; ggml/ggmlR: their documented limits)")
    headers = ["shape", "variant", "N", "P", "H", "G", "T", "S"]
    for n in names:
        headers += [f"{n} fwd", f"{n} bwd"] if n == "ssm_vk" else [n]
    headers += ["ggml Vulkan fwd", "ggmlR Vulkan bwd"]
    rows = []
    reasons: dict[str, set] = {}
    for row in r["support"]:
        cells = [row["shape"], row["variant"], *(str(row["dims"][a]) for a in "NPHGTS")]
        for n in names:
            sup = row["backends"][n]
            if n == "ssm_vk":
                cells += [_cell(sup["fwd"]), _cell(sup["bwd"])]
            else:
                cells.append(_cell(sup["fwd"]) if sup["fwd"]["where"] == sup["bwd"]["where"]
                             else f"{_cell(sup['fwd'])}/{_cell(sup['bwd'])}")
            for op in ("fwd", "bwd"):
                if sup[op]["ok"] is False:
                    reasons.setdefault(n, set()).add(f"{row['shape']} {op}: {sup[op]['reason']}")
        cells += [row["ggml_vulkan"]["fwd"], row["ggml_vulkan"]["bwd"]]
        rows.append(cells)
    out.append(table(headers, rows, right={2, 3, 4, 5, 6, 7}, indent="  "))
    for n, rs in reasons.items():
        for line in sorted(rs):
            out.append(f"  {n} sends {line}")
    if any("range (!)" in row["ggml_vulkan"]["bwd"] for row in r["support"]):
        out.append("  (!) ggmlR's backward scratch S*H*P*(T+1)*N floats exceeds this device's maxStorageBufferRange; "
                   "on the H200 that gave silently wrong gradients (docs/BENCHMARKS.md)")
    layouts: dict[tuple, dict] = {}
    for row in r["support"]:
        sup = row["backends"].get("ssm_vk", {})
        for op in ("fwd", "bwd"):
            plan = sup.get(op, {}).get("plan")
            if plan:
                layouts.setdefault((row["variant"], row["dims"]["N"]), {})[op] = plan["layout"]
    for (variant, n), per in sorted(layouts.items()):
        lay = per.get("fwd") or per["bwd"]
        wgs = "/".join(str(per[op]["WG"]) for op in ("fwd", "bwd") if op in per)
        out.append(f"  ssm_vk kernels for {variant} N={n}: {lay['LN']} lanes per state row, row sums by "
                   f"{ROW_SUMS[lay['ROW_SUM']]}, {wgs} threads per workgroup (fwd/bwd)")
    return "\n".join(out)


def run(args) -> int:
    common.check_json_dest(args)
    report = gather()
    common.say(args, render(report))
    common.write_json(args, report)
    return common.EXIT_OK
