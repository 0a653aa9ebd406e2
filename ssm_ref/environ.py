"""Environment variables the backends read on every call, read cheaply.

A setting read from the environment at each call takes effect at the next call after it changes
(``os.environ[...] = ...``, ``del``, pytest's ``monkeypatch.setenv``). A device-resident call of
ssm_vk reads three (the planner's knobs, the subgroup switch, the host memory limit).
``os.environ.get`` of a variable that is not set raises and catches ``KeyError`` twice (its
``Mapping.get``): about 8 k CPU instructions a read, 20.7 k per device-resident call, 17% of a
forward's Python (docs/BENCHMARKS.md). :class:`EnvVar` reads the same mapping -- ``os.environ``'s
own store, which ``os.environ[...] = ...``, ``del``, ``putenv`` through ``os.environ`` and
``monkeypatch.setenv`` all update -- with one dict look-up. That store is a private attribute of
CPython's ``os._Environ``, so the read is guarded: where the store is not a dict keyed by the
encoded name (another platform, ``os.environ`` replaced by another mapping), it falls back to
``os.environ.get``. The answer is always what ``os.environ.get`` gives.
"""

from __future__ import annotations

import os

__all__ = ["EnvVar"]

_ENVIRON = type(os.environ)   # os._Environ
_POSIX = os.name == "posix"   # elsewhere the store's keys are spelled otherwise (upper-cased on Windows)


class EnvVar:
    """One environment variable: ``EnvVar("SSM_VK_TUNE").get()`` is ``os.environ.get("SSM_VK_TUNE", "")``."""

    __slots__ = ("_key", "name")

    def __init__(self, name: str):
        self.name = name
        self._key = os.fsencode(name) if _POSIX else None

    def get(self, default: str = "") -> str:
        env = os.environ
        if self._key is not None and type(env) is _ENVIRON:
            store = env._data
            if type(store) is dict:
                value = store.get(self._key)
                return default if value is None else env.decodevalue(value)
        return env.get(self.name, default)

    def __repr__(self) -> str:
        return f"EnvVar({self.name!r})"
