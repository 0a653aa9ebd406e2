"""Every setting of ssm_vk in one place: the environment variables and the planner's tuning knobs,
each typed, documented and validated.

An unknown knob or an illegal value is a ``ValueError`` naming the variable, raised by the first
call that reads it -- before any work (``supports()`` and the scan functions alike). Values are
parsed once per distinct setting, so a call pays a few dictionary look-ups. :func:`configure`
overrides the environment for tests and sweeps.

The environment variables are declared in :data:`ENV` and the knobs in :data:`KNOBS`, each once:
name, default, legal values and meaning. docs/API.md's table of ssm_vk's environment variables
and docs/KERNELS.md's table of the knobs are made from them (``python tools/settings_tables.py``;
tests/docs/test_settings_tables.py checks that the docs hold what it writes).

One module of ~440 lines on purpose: every setting in one place is the point of it.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ssm_ref.environ import EnvVar

__all__ = ["DEFAULTS", "ENV", "EnvSetting", "KNOBS", "Knob", "Settings", "env_table_markdown", "knob_table_markdown",
           "invariant_mode", "cache_dir", "configure", "profile", "settings", "spin_us",
           "timeout_s", "validation", "device_env", "check_environment", "pipeline_stats"]


def _rule(test, text: str):
    """A knob's rule: "" for a legal value, else ``text`` (what a legal one is; also the docs')."""
    def ok(v: int) -> str:
        return "" if test(v) else text
    ok.text = text
    return ok


def _pow2(lo: int, hi: int):
    return _rule(lambda v: lo <= v <= hi and v & (v - 1) == 0, f"a power of two from {lo} to {hi}")


def _between(lo: int, hi: int):
    return _rule(lambda v: lo <= v <= hi, f"an integer from {lo} to {hi}")


def _zero_or_between(lo: int, hi: int):
    return _rule(lambda v: v == 0 or lo <= v <= hi, f"0 or an integer from {lo} to {hi}")


def _one_of(*values: int):
    return _rule(lambda v: v in values, "one of " + ", ".join(map(str, values)))


@dataclass(frozen=True)
class Knob:
    """A planner knob: its default (an int, or None: the planner chooses it from the problem's
    size and the device, as ``doc`` says), its rule (a function giving "" for a legal value, else
    what a legal one is) and what it sets."""

    default: int | None
    rule: object
    doc: str


# The planner's knobs (SSM_VK_TUNE). Each replaces a choice of the planner; the planner still
# keeps every device limit (a knob never makes a workgroup larger than the device allows).
KNOBS: dict[str, Knob] = {
    # token-sequential kernels (ssm_vk.sequential.sequential_planner)
    "LN": Knob(None, _pow2(1, 256), "lanes per state row, at most (default: by N, the subgroup and the direction; "
               "fewer when N or the subgroup is smaller)"),
    "ROW_SUM": Knob(None, _between(0, 3), "how a row is summed: 0 shared memory, 1 clustered, 2 xor butterfly, 3 "
                    "subgroupAdd (default: the fastest the device offers; a knob is taken where the device offers it)"),
    "K": Knob(None, _between(1, 256), "checkpoint interval of the backward, tokens (default 8; 4 for Mamba-1)"),
    "WG": Knob(128, _pow2(1, 1024), "threads per workgroup, at most (halved until the device's limits hold)"),
    "TB": Knob(None, _between(1, 64), "tokens per load block of the forward (default: by the row's layout; 1 for one "
               "token, 8 for a Mamba-2 forward of few threads)"),
    "TBR": Knob(None, _between(1, 64), "tokens per shared-memory reduction round of the backward (default: up to 4, as "
                "shared memory allows; lowered to divide K)"),
    "SPREAD": Knob(1, _one_of(0, 1), "1: one lane per token computes its step, read by subgroup shuffles, where the "
                   "device has them (Mamba-1 only in the backward); 0: every lane of a row computes each step"),
    "HSUM": Knob(1, _one_of(0, 1), "1: the backward sums a workgroup's heads of one group into one d_B / d_C partial "
                 "(Mamba-1); 0: partials per head"),
    "DEC": Knob(None, _one_of(0, 1), "the decode kernel (one token, Mamba-2: the state in 16-byte loads, a head's step "
                "and B, C shared by its rows); 0: never; 1: wherever it applies, a step of few threads too (default: "
                "where the step has 2^18 threads or more)"),
    "DEC_IT": Knob(None, _pow2(1, 1024), "channels each row slot of the decode kernel takes in turn (default: doubled "
                   "while the step keeps 2^18 threads)"),
    "TCHUNK": Knob(None, _zero_or_between(2, 1 << 30), "tokens per time chunk of the forward and backward parallel "
                   "over time (used when it divides T into two or more chunks); 0: never (default: Mamba-1 on a GPU, "
                   "where the scan would run too few threads)"),
    # Mamba-1 kernels with time in a workgroup's threads (ssm_vk.m1.m1_planner)
    "M1": Knob(None, _one_of(0, 1), "the Mamba-1 kernels with time in threads; 0: never; 1: wherever they apply, a CPU "
               "device too (default: wherever they apply on a GPU)"),
    "M1_NW": Knob(None, _pow2(1, 64), "time slices (subgroups) per workgroup of those kernels, at most (default 4 "
                  "forward, 32 its one pass, 16 backward)"),
    "M1_BNW": Knob(None, _pow2(1, 64), "time slices (subgroups) per workgroup of their backward, at most (default: "
                   "M1_NW's)"),
    "M1_TI": Knob(4, _one_of(2, 4, 8, 16), "tokens per slice of their backward"),
    "M1_FTI": Knob(None, _between(1, 1 << 20), "tokens per slice of their forward (default: enough slices for about "
                   "2^18 threads, at least 8 tokens each)"),
    "M1_SNW": Knob(2, _pow2(1, 64), "slices per workgroup of their backward's summary over time chunks (at most the "
                   "backward's)"),
    "M1_TB": Knob(None, _one_of(1, 2, 4, 8, 16), "tokens per block of loads of their forward (default 8 / M1_SPS)"),
    "M1_SPS": Knob(None, _pow2(1, 64), "time slices per subgroup of their forward (at most the subgroup size; default "
                   "1, in one pass doubled while it has at most 2^17 threads and 16 tokens per slice)"),
    "M1_ONE_TI": Knob(64, _between(0, 1 << 20), "their forward runs in one pass where its sequences fit one "
                      "workgroup's slices of at most this many tokens each; 0: never"),
    "M1_NB": Knob(None, _one_of(1, 2, 4), "state values per round of their backward's walk back (default 4, or 2 or 1: "
                  "the most that divides N; a value that does not divide N is lowered to 1)"),
    # chunked Mamba-2 kernels (ssm_vk.chunked.chunked_planner)
    "CHUNK": Knob(None, _one_of(0, 16, 32, 48, 64), "chunk length in tokens; 0: never the chunked kernels (default 32 "
                  "up to 1024 tokens in all, else 64)"),
    "CHUNK_MIN_T": Knob(None, _between(0, 1 << 40), "shortest sequence the chunked kernels take (default 64 forward, "
                        "with 128 tokens in all, and 32 backward)"),
    "KS": Knob(None, _pow2(1, 64), "contraction slice of the GEMM kernels, must divide the chunk length (default 16 "
               "forward, 8 backward)"),
    "GWG": Knob(256, _pow2(64, 1024), "threads of the GEMM kernels"),
    "ROWG": Knob(16, _pow2(1, 64), "row groups of the GEMM kernels' thread grid (must divide GWG)"),
    "DBC_RBLK": Knob(64, _pow2(16, 128), "row block of the d_B / d_C products"),
    "DBC_CBLK": Knob(64, _pow2(16, 128), "column block of the d_B / d_C products"),
    "ZF_RBLK": Knob(64, _pow2(16, 128), "row block of the chunk-state products"),
    "ZF_CBLK": Knob(128, _pow2(16, 128), "column block of the chunk-state products"),
    "DBC_FOLD": Knob(1, _one_of(0, 1), "1: d_B and d_C take the chunk's own tokens once per group of heads (their M o "
                     "GU summed over the group first); 0: once per head"),
    "DB_HPART": Knob(1, _between(1, 1024), "heads of a group whose d_B products one workgroup adds into one part when "
                     "they run per head (lowered to 1 where it does not divide the heads of a group)"),
    "DC_HPART": Knob(1, _between(1, 1024), "the same for d_C"),
    "HEADLOOP": Knob(None, _one_of(0, 1), "1: d_B and d_C loop over a group's heads in one workgroup; 0: per head, "
                     "then summed (default: 1 where that leaves 1024 workgroups or more)"),
    "VEC_OUT": Knob(1, _one_of(0, 1), "0: float stores in the GEMM epilogues instead of 16-byte ones"),
    "VEC_IN": Knob(1, _one_of(0, 1), "0: the chunked forward's y product stages its operands with float loads instead "
                   "of 16-byte ones"),
    "KEEP_STATES": Knob(1, _one_of(0, 1), "0: the backward always recomputes the chunk states its forward left"),
    "PASS_PB": Knob(None, _between(1, 64), "chunks whose loads the state pass issues together (default: the smallest "
                    "of 2, 8, 32 that holds all of a sequence's chunks, else 32)"),
    # chunked Mamba-3 kernels (ssm_vk.mamba3.mamba3_chunked_planner)
    "M3_CHUNK": Knob(None, _between(0, 64), "chunk length of the Mamba-3 chunked forward, tokens, at most 64 / M; 0: "
                     "never the chunked kernels (default 64 / M)"),
    "M3_CHUNK_MIN_T": Knob(None, _between(0, 1 << 40), "shortest sequence the Mamba-3 chunked forward takes "
                           "(default 64; 128 on a CPU device)"),
    "M3_CHUNK_BWD_MIN_T": Knob(None, _between(0, 1 << 40), "shortest sequence the Mamba-3 chunked backward takes "
                               "(default 64; 128 on a CPU device)"),
    # token-sequential Mamba-3 forward and decode (ssm_vk.mamba3.mamba3_planner)
    "M3_STAGE": Knob(None, _one_of(8, 16, 32), "loads in flight per invocation while the Mamba-3 forward's state "
                     "rows come in through shared memory (each invocation reads them, then stores them); default 8, "
                     "16 from 2048 workgroups"),
    "M3_STEP": Knob(0, _one_of(0, 1), "1: a Mamba-3 forward of one token (a decode step) on the one-token kernel "
                    "instead of the token-sequential one (default 0: the one-token kernel is untimed on a GPU)"),
}


@dataclass(frozen=True)
class Settings:
    """What the planner and the caches depend on: the knobs set (name -> int), the subgroup
    switch and the mode (``invariant``: the calls of ``invariant=True``, whose plans
    ssm_vk.registry.plan makes from the per-sequence problem alone). ``key`` identifies them (part
    of every cache key that depends on a plan: the decisions, the lanes, the workspaces), so an
    invariant call never takes a default call's plan."""

    tune: tuple          # sorted (name, value) pairs
    no_subgroup: bool
    invariant: bool = False
    key: tuple = field(init=False, repr=False, compare=False)   # (tune, no_subgroup, invariant), made once

    def __post_init__(self):
        object.__setattr__(self, "key", (self.tune, self.no_subgroup, self.invariant))
        object.__setattr__(self, "_twin", None)

    def knob(self, name: str) -> int | None:
        """The knob's value: as set, else its declared default (:data:`KNOBS`; None: the planner
        chooses). Planning only (once per new shape)."""
        for k, v in self.tune:
            if k == name:
                return v
        return KNOBS[name].default

    def has(self, name: str) -> bool:
        return any(k == name for k, _ in self.tune)

    def with_knobs(self, **tune) -> Settings:
        """These settings with the given knobs set too (replacing any set before)."""
        return Settings(tuple(sorted({**dict(self.tune), **tune}.items())), self.no_subgroup, self.invariant)

    def invariant_twin(self) -> Settings:
        """These settings in the invariant mode (made once, then kept beside them)."""
        twin = self._twin
        if twin is None:
            twin = Settings(self.tune, self.no_subgroup, True)
            object.__setattr__(self, "_twin", twin)
        return twin


def invariant_mode(knobs: Settings, invariant) -> Settings:
    """The settings of a call given ``invariant`` (True: the invariant mode, docs/SPEC.md section
    3.2; False: ``knobs`` as they are); ValueError naming ``invariant`` for any other value."""
    if invariant is True:
        return knobs.invariant_twin()
    if invariant is False:
        return knobs
    raise ValueError(f"invariant: expected True or False, got {invariant!r}")


DEFAULTS = Settings((), False)   # no knob set, subgroups on



@dataclass(frozen=True)
class EnvSetting:
    """An environment variable of ssm_vk: its default and what it does (both as the docs show
    them). The reader function of each (below) parses and checks it."""

    default: str
    doc: str


ENV: dict[str, EnvSetting] = {
    "SSM_VK_DEVICE": EnvSetting(
        "the first discrete GPU, else integrated, virtual, a CPU implementation",
        "the Vulkan device's index (`ssm_vk.devices()`); read when the context is made"),
    "SSM_VK_TIMEOUT_S": EnvSetting(
        "60 on a GPU, 600 on a CPU implementation",
        "seconds a wait on the device may take before `VulkanTimeout`. A CPU implementation such as lavapipe "
        "compiles a kernel on its first dispatch, inside the wait: the first call of a large kernel (a Mamba-3 "
        "backward) can take a minute or more on a busy machine"),
    "SSM_VK_SPIN_US": EnvSetting(
        "200 on a GPU, 0 on a CPU implementation",
        "microseconds a wait on the GPU polls before it sleeps in the driver (0: never polls). Polling catches a "
        "short call's end sooner (an H200's empty submit and wait: 40 us sleeping, 14 polling) at the cost of one "
        "busy core for up to that long per wait; on a CPU implementation such as lavapipe it would take a core "
        "from the work. A recorded call whose last run took longer than this (up to 10 ms) polls a quarter longer "
        "than that run instead, so a call past the setting does not sleep and wake late each time (an H100: up to 0.15 "
        "ms less per call of 0.5-3 ms); the core stays busy that long"),
    "SSM_VK_COPY_THREADS": EnvSetting(
        "the CPUs the process may use, at most 8",
        "CPU threads that copy a host-array call's data into and out of the staging memory of a discrete GPU "
        "(copies from 4 MiB are split; 1: the calling thread alone). One thread copies at the link's speed "
        "or below (6 GB/s on an H200's host, whose link moves 44), so the host's copies would at least double a "
        "large call's transfer time"),
    "SSM_VK_VALIDATION": EnvSetting(
        "off", "1: run under the Khronos validation layer, messages kept in `ctx.validation_messages` "
        "([VULKAN.md](VULKAN.md), \"Test seams\")"),
    "SSM_VK_NO_SUBGROUP": EnvSetting("off", "1: no subgroup operations (the shared-memory row sums)"),
    "SSM_VK_PROFILE": EnvSetting("off", "1: a timestamp after each step of the chunked kernels (benchmarks)"),
    "SSM_VK_PIPELINE_STATS": EnvSetting(
        "off", "1: keep the driver's compile statistics of every kernel (`Kernel.statistics()`) and its internal "
        "code (`Kernel.representations()`) where the device offers `VK_KHR_pipeline_executable_properties`; read "
        "when the context is made"),
    "SSM_VK_TUNE": EnvSetting(
        "none", "overrides of the kernel planner's choices, `NAME=int,...` ([KERNELS.md](KERNELS.md), \"Tuning "
        "knobs\")"),
    "SSM_SCAN_CACHE": EnvSetting("`~/.cache/ssm-scan/spirv/`", "where compiled SPIR-V is cached"),
}

_TUNE = EnvVar("SSM_VK_TUNE")
_NO_SUBGROUP = EnvVar("SSM_VK_NO_SUBGROUP")
_TIMEOUT = EnvVar("SSM_VK_TIMEOUT_S")
_SPIN = EnvVar("SSM_VK_SPIN_US")
_COPY_THREADS = EnvVar("SSM_VK_COPY_THREADS")
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


# The wait's limit where SSM_VK_TIMEOUT_S is unset: on a GPU, and on a CPU implementation (which
# compiles each kernel inside the wait of its first dispatch, ENV's note).
TIMEOUT_S_GPU = 60.0
TIMEOUT_S_CPU = 600.0


def timeout_s(cpu: bool = False) -> float:
    """SSM_VK_TIMEOUT_S as seconds (unset: TIMEOUT_S_CPU on a CPU implementation, ``cpu``, else
    TIMEOUT_S_GPU): a finite number > 0, else ValueError."""
    raw = _TIMEOUT.get().strip()
    if not raw:
        return TIMEOUT_S_CPU if cpu else TIMEOUT_S_GPU
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


def copy_threads() -> int:
    """SSM_VK_COPY_THREADS: an int from 1 to 256, or 0 when unset (the default's); else ValueError."""
    raw = _COPY_THREADS.get().strip()
    if not raw:
        return 0
    if not (raw.isdigit() and 1 <= int(raw) <= 256):
        raise ValueError(f"SSM_VK_COPY_THREADS: expected a number of threads from 1 to 256, "
                         f"got {_COPY_THREADS.get()!r}")
    return int(raw)


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
    copy_threads()
    validation()
    profile()
    pipeline_stats()


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def knob_table_markdown() -> str:
    """The knobs of :data:`KNOBS` as the Markdown table docs/KERNELS.md shows."""
    rows = ["| knob | default | legal values | what it sets |", "|---|---|---|---|"]
    for name, k in KNOBS.items():
        default = "planner" if k.default is None else str(k.default)
        rows.append(f"| `{name}` | {default} | {_cell(k.rule.text)} | {_cell(k.doc)} |")
    return "\n".join(rows) + "\n"


def env_table_markdown() -> str:
    """ssm_vk's environment variables of :data:`ENV` as the Markdown table docs/API.md shows."""
    rows = ["| variable | default | effect |", "|---|---|---|"]
    for name, e in ENV.items():
        rows.append(f"| `{name}` | {_cell(e.default)} | {_cell(e.doc)} |")
    return "\n".join(rows) + "\n"
