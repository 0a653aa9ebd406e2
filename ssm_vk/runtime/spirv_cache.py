"""The entries of the SPIR-V disk cache (shaders.py's second source, after the packaged SPIR-V):
their format, their checked reading and their atomic writing.

An entry (``<compiler key>.entry`` in the folder shaders.py names for a variant) holds a header
-- :data:`ENTRY_MAGIC`, then one line of JSON with the variant's source key, the compiler key and
the length and sha256 of the SPIR-V -- and the SPIR-V after it. Every load checks all of it: a
truncated, altered or misplaced (swapped) entry is no build of the variant; :func:`damaged` logs
it once and removes it. Processes share the cache, so an entry is written whole or not at all.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from pathlib import Path

from .spirv import module_problem

ENTRY_MAGIC = b"ssm-scan spirv cache entry 1\n"

log = logging.getLogger("ssm_vk")

_warned: set = set()
_warned_lock = threading.Lock()


def warn_once(message: str) -> None:
    """Log ``message`` as a warning of ``ssm_vk``, once per process (also shaders.py's about the
    packaged SPIR-V)."""
    with _warned_lock:
        if message in _warned:
            return
        _warned.add(message)
    log.warning("%s", message)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entry(source_key: str, compiler_key: str, spirv: bytes) -> bytes:
    """The bytes of the entry of ``spirv``, the build of ``source_key`` by ``compiler_key``."""
    meta = {"source_key": source_key, "compiler_key": compiler_key, "size": len(spirv), "sha256": _sha256(spirv)}
    return ENTRY_MAGIC + json.dumps(meta, sort_keys=True).encode() + b"\n" + spirv


def read_entry(path: Path, source_key: str, compiler_key: str | None) -> tuple[bytes | None, str]:
    """(the SPIR-V of the cache entry at ``path``, "") when it is intact and is the build of
    ``source_key`` (by ``compiler_key`` unless None); (None, "") when there is no such file;
    (None, what is wrong) when the file is damaged or belongs to another variant."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        return None, f"unreadable ({exc})"
    if not data.startswith(ENTRY_MAGIC):
        return None, "no entry header"
    head, sep, spirv = data[len(ENTRY_MAGIC):].partition(b"\n")
    try:
        meta = json.loads(head) if sep else None
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        return None, "a damaged entry header"
    if meta.get("source_key") != source_key or (compiler_key is not None and meta.get("compiler_key") != compiler_key):
        return None, "the entry of another variant or compiler (a moved or swapped file)"
    if len(spirv) != meta.get("size") or _sha256(spirv) != meta.get("sha256"):
        return None, f"{len(spirv)} bytes whose length or sha256 differs from its header (truncated or altered)"
    why = module_problem(spirv)
    return (None, why) if why else (spirv, "")


def damaged(path: Path, why: str) -> str:
    """Log a damaged cache entry once, remove it (best effort), and return the reason."""
    reason = f"the SPIR-V cache entry {path} is damaged ({why})"
    warn_once(f"ssm_vk: {reason}; it is not loaded")
    try:
        path.unlink()
    except OSError:
        pass
    return reason


def newest_intact(folder: Path, source_key: str) -> tuple[bytes | None, str]:
    """The newest intact build of ``source_key`` in its folder by any compiler: (SPIR-V, ""),
    (None, "") when there is none, (None, why) when only damaged entries were found."""
    try:
        built = sorted(folder.glob("*.entry"), key=lambda p: p.stat().st_mtime_ns) if folder.is_dir() else []
    except OSError:
        built = []
    problems = []
    for path in reversed(built):
        spirv, why = read_entry(path, source_key, None)
        if spirv is not None:
            return spirv, ""
        if why:
            problems.append(damaged(path, why))
    return None, "; ".join(problems)


def store(path: Path, data: bytes) -> None:
    """Write atomically (processes may share the cache); a read-only cache only costs speed."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        warn_once(f"ssm_vk: cannot write the SPIR-V cache {path.parent}: {exc}")
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
