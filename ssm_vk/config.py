"""Every setting of ssm_vk in one place: the environment variables and the planner's tuning knobs,
each typed, documented and validated.

An unknown knob or an illegal value is a ``ValueError`` naming the variable, raised by the first
call that reads it -- before any work (``supports()`` and the scan functions alike). Values are
parsed once per distinct setting, so a call pays a few dictionary look-ups. :func:`configure`
overrides the environment for tests and sweeps.

=====================  =====================================================================
variable               meaning
=====================  =====================================================================
SSM_VK_DEVICE          the Vulkan device index to use (default: first discrete GPU, else
                       integrated, else a CPU implementation); read when the context is made
SSM_VK_TIMEOUT_S       seconds a wait on the GPU may take before VulkanTimeout (default 60)
SSM_VK_SPIN_US         microseconds a wait polls the GPU before it sleeps in the driver
                       (default 200 on a GPU, 0 on a CPU implementation; 0 never polls;
                       a sequence whose last run took longer, up to 1 ms, polls that long)
SSM_VK_VALIDATION      1: run under the Khronos validation layer (tests; default off)
SSM_VK_NO_SUBGROUP     1: use no subgroup operations (the shared-memory row sums)
SSM_VK_PROFILE         1: a timestamp after each step of the chunked kernels (benchmarks)
SSM_VK_PIPELINE_STATS  1: keep the driver's compile statistics of every kernel (registers,
                       instructions, ...: ``Kernel.statistics()``) and its internal code
                       (``Kernel.representations()``), where the device offers
                       VK_KHR_pipeline_executable_properties; read when the context is made
SSM_VK_TUNE            the planner's knobs, ``NAME=int,...`` (table :data:`KNOBS`)
SSM_SCAN_CACHE         the SPIR-V cache folder (default ~/.cache/ssm-scan/spirv)
=====================  =====================================================================
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ssm_ref.environ import EnvVar

__all__ = ["DEFAULTS", "KNOBS", "Knob", "Settings", "cache_dir", "configure", "profile", "settings", "spin_us",
           "timeout_s", "validation", "device_env", "check_environment", "pipeline_stats"]


def _pow2(lo: int, hi: int):
    def ok(v: int) -> str:
        return "" if lo <= v <= hi and v & (v - 1) == 0 else f"a power of two from {lo} to {hi}"
    return ok


def _between(lo: int, hi: int):
    def ok(v: int) -> str:
        return "" if lo <= v <= hi else f"an integer from {lo} to {hi}"
    return ok


def _zero_or_between(lo: int, hi: int):
    def ok(v: int) -> str:
        return "" if v == 0 or lo <= v <= hi else f"0 or an integer from {lo} to {hi}"
    return ok


def _one_of(*values: int):
    def ok(v: int) -> str:
        return "" if v in values else "one of " + ", ".join(map(str, values))
    return ok


@dataclass(frozen=True)
class Knob:
    """A planner knob: what it sets, and its rule (a function giving "" for a legal value, else
    what a legal one is)."""

    doc: str
    rule: object


# The planner's knobs (SSM_VK_TUNE). Each replaces a choice of the planner; the planner still
# keeps every device limit (a knob never makes a workgroup larger than the device allows).
KNOBS: dict[str, Knob] = {
    # token-sequential kernels (ssm_vk.plan.sequential)
    "LN": Knob("lanes per state row, at most (fewer when N or the subgroup is smaller)", _pow2(1, 256)),
    "ROW_SUM": Knob("how a row is summed: 0 shared memory, 1 clustered, 2 xor butterfly, 3 subgroupAdd "
                    "(taken where the device offers it)", _between(0, 3)),
    "K": Knob("checkpoint interval of the backward, tokens", _between(1, 256)),
    "WG": Knob("threads per workgroup, at most (halved until the device's limits hold)", _pow2(1, 1024)),
    "TB": Knob("tokens per load block of the forward", _between(1, 64)),
    "TBR": Knob("tokens per shared-memory reduction round of the backward (lowered to divide K)",
                _between(1, 64)),
    "SPREAD": Knob("0: every lane of a row computes each token's step (1, the default: one lane per token, read by "
                   "subgroup shuffles, where the device has them; Mamba-1 only in the backward)", _one_of(0, 1)),
    "HSUM": Knob("0: the backward's d_B / d_C partials per head (1, the default: a workgroup's heads of one group "
                 "summed into one; Mamba-1)", _one_of(0, 1)),
    "DEC": Knob("0: never the decode kernel (one token, Mamba-2: the state in 16-byte loads, a head's step and "
                "B, C shared by its rows); 1: wherever it applies, a step of few threads too (default: by size)",
                _one_of(0, 1)),
    "DEC_IT": Knob("channels each row slot of the decode kernel takes in turn (default: by the problem's size)",
                   _pow2(1, 1024)),
    "TCHUNK": Knob("tokens per time chunk of the forward parallel over time (used when it divides T into "
                   "two or more chunks); 0: never", _zero_or_between(2, 1 << 30)),
    # Mamba-1 kernels with time in a workgroup's threads (ssm_vk.plan.m1)
    "M1": Knob("0: never the Mamba-1 kernels with time in threads; 1: wherever they apply, a CPU device too",
               _one_of(0, 1)),
    "M1_NW": Knob("time slices (subgroups) per workgroup of those kernels, at most (default 4 forward, 32 its one "
                  "pass, 16 backward)",
                  _pow2(1, 64)),
    "M1_BNW": Knob("time slices (subgroups) per workgroup of their backward, at most (default: M1_NW's)",
                   _pow2(1, 64)),
    "M1_TI": Knob("tokens per slice of their backward (default 4)", _one_of(2, 4, 8, 16)),
    "M1_FTI": Knob("tokens per slice of their forward (default: by the problem's size)", _between(1, 1 << 20)),
    "M1_SNW": Knob("slices per workgroup of their backward's summary over time chunks (at most the backward's)",
                   _pow2(1, 64)),
    "M1_TB": Knob("tokens per block of loads of their forward", _one_of(1, 2, 4, 8, 16)),
    "M1_SPS": Knob("time slices per subgroup of their forward (at most the subgroup size; default 1, in one pass "
                   "more where it has few threads)", _pow2(1, 64)),
    "M1_ONE_TI": Knob("their forward runs in one pass where its sequences fit one workgroup's slices of at most "
                      "this many tokens each (default 64); 0: never", _between(0, 1 << 20)),
    "M1_NB": Knob("state values per round of their backward's walk back (default 4, or 2 or 1: the most that "
                  "divides N; a value that does not divide N is lowered to 1)",
                  _one_of(1, 2, 4)),
    # chunked Mamba-2 kernels (ssm_vk.plan.chunked)
    "CHUNK": Knob("chunk length in tokens; 0: never the chunked kernels", _one_of(0, 16, 32, 48, 64)),
    "CHUNK_MIN_T": Knob("shortest sequence the chunked kernels take", _between(0, 1 << 40)),
    "KS": Knob("contraction slice of the GEMM kernels (must divide the chunk length)", _pow2(1, 64)),
    "GWG": Knob("threads of the GEMM kernels", _pow2(64, 1024)),
    "ROWG": Knob("row groups of the GEMM kernels' thread grid (must divide GWG)", _pow2(1, 64)),
    "DBC_RBLK": Knob("row block of the d_B / d_C products", _pow2(16, 128)),
    "DBC_CBLK": Knob("column block of the d_B / d_C products", _pow2(16, 128)),
    "ZF_RBLK": Knob("row block of the chunk-state products", _pow2(16, 128)),
    "ZF_CBLK": Knob("column block of the chunk-state products", _pow2(16, 128)),
    "DBC_FOLD": Knob("1: d_B and d_C take the chunk's own tokens once per group of heads (their M o GU summed "
                     "over the group first); 0: once per head", _one_of(0, 1)),
    "DB_HPART": Knob("heads of a group whose d_B products one workgroup adds into one part when they run per head "
                     "(default 1; lowered to 1 where it does not divide the heads of a group)", _between(1, 1024)),
    "DC_HPART": Knob("the same for d_C", _between(1, 1024)),
    "HEADLOOP": Knob("1: d_B and d_C loop over a group's heads in one workgroup; 0: per head, then summed",
                     _one_of(0, 1)),
    "VEC_OUT": Knob("0: float stores in the GEMM epilogues instead of 16-byte ones", _one_of(0, 1)),
    "VEC_IN": Knob("0: the chunked forward's y product stages its operands with float loads instead of 16-byte "
                   "ones", _one_of(0, 1)),
    "KEEP_STATES": Knob("0: the backward always recomputes the chunk states its forward left", _one_of(0, 1)),
    "PASS_PB": Knob("chunks whose loads the state pass issues together", _between(1, 64)),
}


@dataclass(frozen=True)
class Settings:
    """What the planner and the caches depend on: the knobs set (name -> int) and the subgroup
    switch. ``key`` identifies them (part of every cache key that depends on a plan)."""

    tune: tuple          # sorted (name, value) pairs
    no_subgroup: bool
    key: tuple = field(init=False, repr=False, compare=False)   # (tune, no_subgroup), made once

    def __post_init__(self):
        object.__setattr__(self, "key", (self.tune, self.no_subgroup))

    def knob(self, name: str, default):
        for k, v in self.tune:
            if k == name:
                return v
        return default

    def has(self, name: str) -> bool:
        return any(k == name for k, _ in self.tune)

    def with_knobs(self, **tune) -> Settings:
        """These settings with the given knobs set too (replacing any set before)."""
        return Settings(tuple(sorted({**dict(self.tune), **tune}.items())), self.no_subgroup)


DEFAULTS = Settings((), False)   # no knob set, subgroups on

_TUNE = EnvVar("SSM_VK_TUNE")
_NO_SUBGROUP = EnvVar("SSM_VK_NO_SUBGROUP")
_TIMEOUT = EnvVar("SSM_VK_TIMEOUT_S")
_SPIN = EnvVar("SSM_VK_SPIN_US")
_VALIDATION = EnvVar("SSM_VK_VALIDATION")
_PROFILE = EnvVar("SSM_VK_PROFILE")
_PIPELINE_STATS = EnvVar("SSM_VK_PIPELINE_STATS")
_CACHE = EnvVar("SSM_SCAN_CACHE")
_DEVICE = EnvVar("SSM_VK_DEVICE")

_lock = threading.Lock()
_override: dict = {}          # configure(): "tune" (a dict of knobs), "no_subgroup" (bool)
_generation = 0               # bumped by configure(), part of the parse cache's key
_parsed: dict = {}            # (raw values, generation) -> Settings


def parse_tune(text: str, what: str = "SSM_VK_TUNE") -> dict:
    """``"LN=8,WG=128"`` -> {"LN": 8, "WG": 128}; ValueError naming ``what`` for an unknown knob,
    a value that is no integer, a repeated knob or a value its rule refuses."""
    out: dict = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq:
            raise ValueError(f"{what}: {item!r} is not NAME=value")
        _check_knob(what, name, value.strip(), out)
    return out


def _check_knob(what: str, name: str, value, out: dict) -> None:
    knob = KNOBS.get(name)
    if knob is None:
        raise ValueError(f"{what}: unknown knob {name!r} (known: {', '.join(KNOBS)})")
    if name in out:
        raise ValueError(f"{what}: {name} given twice")
    try:
        v = int(value, 10) if isinstance(value, str) else value
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError
    except (TypeError, ValueError):
        raise ValueError(f"{what}: {name}={value!r} is not an integer") from None
    why = knob.rule(v)
    if why:
        raise ValueError(f"{what}: {name}={v}: {name} ({knob.doc}) must be {why}")
    out[name] = v


def _flag(var: EnvVar, truthy=("1",), falsy=("", "0")) -> bool:
    raw = var.get().strip().lower()
    if raw in truthy:
        return True
    if raw in falsy:
        return False
    raise ValueError(f"{var.name}: expected {' or '.join(repr(t) for t in (*truthy, *falsy) if t)}, got {var.get()!r}")


def settings() -> Settings:
    """The planner's settings now (the environment under :func:`configure`'s overrides). Raises
    ValueError naming the variable for an illegal value."""
    raw = (_TUNE.get(), _NO_SUBGROUP.get(), _generation)
    hit = _parsed.get(raw)
    if hit is not None:
        return hit
    tune = parse_tune(raw[0])
    no_subgroup = _flag(_NO_SUBGROUP)
    with _lock:
        over = dict(_override)
    if "tune" in over:
        tune.update(over["tune"])
    if "no_subgroup" in over:
        no_subgroup = over["no_subgroup"]
    s = Settings(tuple(sorted(tune.items())), bool(no_subgroup))
    if len(_parsed) > 64:
        _parsed.clear()
    _parsed[raw] = s
    return s


class _Configured:
    """What :func:`configure` returns: ``restore()`` (or the end of a ``with`` block) puts the
    previous overrides back."""

    def __init__(self, previous: dict):
        self._previous = previous

    def restore(self) -> None:
        global _generation
        with _lock:
            _override.clear()
            _override.update(self._previous)
            _generation += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def configure(*, tune: dict | None = None, no_subgroup: bool | None = None) -> _Configured:
    """Override the environment for the planner: ``tune`` knobs (name -> int, applied over
    SSM_VK_TUNE's; {} clears the override), ``no_subgroup``. Validated at once (ValueError).
    Returns a handle whose ``restore()`` undoes it; also a context manager::

        with ssm_vk.config.configure(tune={"CHUNK": 16}):
            ...
    """
    global _generation
    checked: dict | None = None
    if tune is not None:
        if not isinstance(tune, dict):
            raise TypeError(f"configure: tune must be a dict of knob -> int, got {type(tune).__name__}")
        checked = {}
        for name, value in tune.items():
            _check_knob("configure(tune=...)", name, value, checked)
    if no_subgroup is not None and not isinstance(no_subgroup, bool):
        raise TypeError(f"configure: no_subgroup must be a bool, got {no_subgroup!r}")
    with _lock:
        previous = dict(_override)
        if checked is not None:
            _override["tune"] = checked
        if no_subgroup is not None:
            _override["no_subgroup"] = no_subgroup
        _generation += 1
    return _Configured(previous)


def timeout_s() -> float:
    """SSM_VK_TIMEOUT_S as seconds (default 60): a finite number > 0, else ValueError."""
    raw = _TIMEOUT.get().strip()
    if not raw:
        return 60.0
    try:
        v = float(raw)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"SSM_VK_TIMEOUT_S: expected a number of seconds > 0, got {_TIMEOUT.get()!r}")
    return v


def spin_us(default: float) -> float:
    """SSM_VK_SPIN_US as microseconds (``default`` when unset): a finite number >= 0, at most
    1e6, else ValueError."""
    raw = _SPIN.get().strip()
    if not raw:
        return float(default)
    try:
        v = float(raw)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and 0 <= v <= 1e6):
        raise ValueError(f"SSM_VK_SPIN_US: expected microseconds from 0 to 1000000, got {_SPIN.get()!r}")
    return v


def validation() -> bool:
    """SSM_VK_VALIDATION: 1/true/yes/on or 0/false/no/off (default off)."""
    return _flag(_VALIDATION, truthy=("1", "true", "yes", "on"), falsy=("", "0", "false", "no", "off"))


def profile() -> bool:
    """SSM_VK_PROFILE=1: timestamps between the chunked kernels' steps."""
    return _flag(_PROFILE)


def pipeline_stats() -> bool:
    """SSM_VK_PIPELINE_STATS=1: pipelines keep their compile statistics and internal code
    (runtime.introspect)."""
    return _flag(_PIPELINE_STATS)


def device_env() -> str:
    """SSM_VK_DEVICE as given ("" when unset); checked against the devices when a context is made."""
    return _DEVICE.get().strip()


def cache_dir() -> Path:
    """SSM_SCAN_CACHE if set, else ~/.cache/ssm-scan/spirv."""
    raw = _CACHE.get().strip()
    return Path(raw) if raw else Path.home() / ".cache" / "ssm-scan" / "spirv"


def check_environment() -> None:
    """Validate every variable of the table above now (ValueError naming the first bad one)."""
    settings()
    timeout_s()
    spin_us(0)
    validation()
    profile()
    pipeline_stats()
