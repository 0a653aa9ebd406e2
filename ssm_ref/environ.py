"""Environment variables the backends read on every call.

A setting read from the environment at each call takes effect at the next call after it changes
(``os.environ[...] = ...``, ``del``, pytest's ``monkeypatch.setenv``). :class:`EnvVar` names one
such variable once, where it is declared, and reads it with ``os.environ.get``. A device-resident
call of ssm_vk reads three (the planner's knobs, the subgroup switch, the host memory limit); an
unset one costs about 8 k CPU instructions to read (``Mapping.get`` raises and catches
``KeyError`` twice; docs/BENCHMARKS.md).
"""

from __future__ import annotations

import os

__all__ = ["EnvVar"]


class EnvVar:
    """One environment variable: ``EnvVar("SSM_VK_TUNE").get()`` is ``os.environ.get("SSM_VK_TUNE", "")``."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def get(self, default: str = "") -> str:
        return os.environ.get(self.name, default)

    def __repr__(self) -> str:
        return f"EnvVar({self.name!r})"
