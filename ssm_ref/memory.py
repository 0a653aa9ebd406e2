"""Host memory: how much a call may plan on, and the check every backend makes before allocating.

The rule (docs/RELIABILITY.md, "Limits"): a call whose host memory need -- the converted copies of
its inputs, its outputs, and its backend's workspace (``ssm_ref``'s backward keeps T+1 states) --
exceeds the host memory limit raises ValueError before it allocates anything. The limit is
``$SSM_HOST_MEMORY_BYTES`` when set, else the machine's physical memory, lowered to the cgroup's
memory limit when one is set (a container). Memory that other processes hold at the time is not
foreseen: numpy then raises MemoryError, or the kernel's OOM killer steps in.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from .environ import EnvVar

__all__ = ["HOST_MEMORY_ENV", "check_host_memory", "host_memory_bytes"]

HOST_MEMORY_ENV = "SSM_HOST_MEMORY_BYTES"
_HOST_MEMORY = EnvVar(HOST_MEMORY_ENV)
_CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


@functools.cache
def _machine_bytes() -> tuple[int, str]:
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    best, source = physical, "physical memory"
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < best:
            best, source = int(text), f"cgroup limit {path}"
    return best, source


def host_memory_bytes() -> tuple[int, str]:
    """(bytes a call may plan on, where that number comes from)."""
    env = _HOST_MEMORY.get().strip()
    if env:
        try:
            value = int(env)
        except ValueError:
            raise ValueError(f"{HOST_MEMORY_ENV}: expected a number of bytes, got {env!r}") from None
        if value <= 0:
            raise ValueError(f"{HOST_MEMORY_ENV}: expected a positive number of bytes, got {value}")
        return value, HOST_MEMORY_ENV
    return _machine_bytes()


def check_host_memory(name: str, dims_text: str, parts: dict[str, int]) -> None:
    """Raise ValueError when the byte counts in ``parts`` sum to more than the host memory limit.

    ``name`` starts the message (the argument the sizes chiefly come from), ``dims_text`` shows
    the problem's sizes; ``parts`` maps what needs the memory (e.g. "outputs") to bytes.
    """
    need = sum(parts.values())
    have, source = host_memory_bytes()
    if need > have:
        detail = ", ".join(f"{k} {v}" for k, v in parts.items() if v)
        raise ValueError(f"{name}: the problem {dims_text} needs {need} bytes of host memory ({detail}), "
                         f"more than the {have} bytes this process may use ({source}); nothing was allocated")
