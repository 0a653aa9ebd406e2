"""The machine: versions of what we run on, the CPU, and float32 peaks where they can be known."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

# Floating-point operations per state update (one element of one state, one token), an FMA
# counting 2, as docs/BENCHMARKS.md ("The floor") counts the Mamba-2 kernels' inner loops.
# Forward: st*a, then + B*u as an FMA, then y's FMA = 5. Backward (recomputes the forward states,
# then walks back): recompute 3; walk: lam, gamma, sum of q, d_C, d_B as FMAs and the decay's
# multiply = 11; 14 in all. exp (Mamba-1) and the work per token rather than per state element are
# left out, so the floor below is a lower bound on time.
FLOPS_PER_UPDATE = {"fwd": 5, "bwd": 14}

# float32 FMA peaks measured on devices we ran (docs/BENCHMARKS.md: 8 independent FMA chains an invocation,
# timestamps). Matched against the Vulkan device name.
MEASURED_GPU_PEAKS = {
    "H200": (56.6e12, "measured on an NVIDIA H200 (docs/BENCHMARKS.md, \"NVIDIA H200\")"),
}


def version_of(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def package_version() -> str:
    """The installed ssm-scan version, or ssm_ref's when run from a checkout."""
    v = version_of("ssm-scan")
    if v is not None:
        return v
    import ssm_ref

    return f"{ssm_ref.__version__} (checkout, not installed)"


@cache
def glslc_version() -> str | None:
    """First line of ``glslc --version`` plus its path; None when glslc is not on PATH."""
    path = shutil.which("glslc")
    if path is None:
        return None
    try:
        run = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{path}: does not run ({e})"
    first = (run.stdout or run.stderr).strip().splitlines()[:1]
    return f"{first[0] if first else '?'} ({path})"


def versions() -> dict:
    """Versions of the package and of everything it runs on."""
    out = {
        "ssm-scan": package_version(),
        "python": platform.python_version(),
        "numpy": version_of("numpy"),
        "numba": version_of("numba"),
        "vulkan (binding)": version_of("vulkan"),
        "cffi": version_of("cffi"),
        "matplotlib": version_of("matplotlib"),
        "glslc": glslc_version(),
    }
    return out


def version_text() -> str:
    """``ssm-scan --version``: one line per component, from package metadata (nothing imported
    but what the command needs; torch and jax are named only when installed)."""
    import importlib.util

    v = versions()
    lines = [f"ssm-scan {v['ssm-scan']}", f"Python {v['python']} ({platform.python_implementation()})"]
    for name, key in (("numpy", "numpy"), ("numba", "numba"), ("vulkan (the Python binding)", "vulkan (binding)")):
        lines.append(f"{name} {v[key] or 'not installed'}")
    lines.append(f"glslc {v['glslc'] or 'not on PATH (the packaged SPIR-V is used)'}")
    for dist in ("torch", "jax"):
        if importlib.util.find_spec(dist) is not None:
            lines.append(f"{dist} {version_of(dist) or '(version unknown)'}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Cpu:
    model: str
    cores: int          # logical CPUs this process may use
    mhz: float | None
    lanes: int | None   # float32 lanes of the widest vector FMA (16 AVX-512, 8 AVX2+FMA, 4 SSE/NEON)
    isa: str

    @property
    def peak_flops(self) -> float | None:
        """float32 peak estimate: cores x clock x lanes x 2 (an FMA is 2 flops) x 2 FMA units per
        core (most server x86 cores of the last decade); None when the clock or ISA is unknown."""
        if not self.mhz or not self.lanes:
            return None
        return self.cores * self.mhz * 1e6 * self.lanes * 2 * 2

    def peak_note(self) -> str:
        if self.peak_flops is None:
            return "unknown (no clock or vector width in /proc/cpuinfo)"
        return (f"estimate: {self.cores} cores x {self.mhz / 1000:.2f} GHz x {self.lanes} lanes ({self.isa}) "
                "x 2 flops/FMA x 2 FMA units")

    def label(self) -> str:
        return f"{self.model} ({self.cores} cores)"


@cache
def cpu() -> Cpu:
    text = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        pass
    model = _field(text, "model name") or _field(text, "Model") or platform.processor() or platform.machine()
    mhz_s = _field(text, "cpu MHz")
    mhz = float(mhz_s) if mhz_s and re.fullmatch(r"[\d.]+", mhz_s) else None
    flags = set((_field(text, "flags") or _field(text, "Features") or "").split())
    if "avx512f" in flags:
        lanes, isa = 16, "AVX-512"
    elif "avx2" in flags and "fma" in flags:
        lanes, isa = 8, "AVX2+FMA"
    elif "asimd" in flags or "sse2" in flags:
        lanes, isa = 4, "NEON" if "asimd" in flags else "SSE2"
    else:
        lanes, isa = None, "?"
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return Cpu(model=model.strip(), cores=cores, mhz=mhz, lanes=lanes, isa=isa)


def _field(text: str, key: str) -> str | None:
    m = re.search(rf"^{re.escape(key)}\s*:\s*(.*)$", text, re.MULTILINE)
    return m.group(1).strip() if m else None


def device_peak(info) -> tuple[float | None, str]:
    """(float32 peak in flop/s, where the number comes from) for a Vulkan device. A CPU device
    (lavapipe) runs on this machine's cores, so it gets the CPU estimate."""
    for key, (peak, note) in MEASURED_GPU_PEAKS.items():
        if key in info.name:
            return peak, note
    if info.type == "cpu":
        c = cpu()
        return c.peak_flops, "a CPU device: the CPU's estimate"
    return None, "unknown for this device (no measurement on record)"
