"""GLSL → SPIR-V: :func:`compile_shader` with a packaged set, a disk cache and ``glslc``.

Where SPIR-V comes from, in order:

1. **Package data** ``ssm_vk/spirv/`` (written by :func:`build_all`, shipped in wheels): found by
   (name, target, defines) through ``index.json``. Each entry records the digest of the source it
   was built from; in a checkout whose source differs (an edited shader) the entry is ignored. A
   wheel has no GLSL, so there the entry is used as is, and glslc is not needed.
2. **Disk cache** ``$SSM_SCAN_CACHE`` or ``~/.cache/ssm-scan/spirv/``:
   ``<name>-<source key>/<compiler key>.spv``. The source key hashes the source text with every
   file it ``#include``s, the defines and the target; the compiler key hashes ``glslc --version``.
   Without glslc, any compiler's build of the same source key is taken.
3. **glslc** ``--target-env=vulkan1.1 -O`` (SPIR-V 1.3, the first with subgroup operations),
   about 0.1 s a call; its output goes into the disk cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

TARGET_ENV = "vulkan1.1"
CACHE_ENV = "SSM_SCAN_CACHE"
REPO_GLSL = Path(__file__).resolve().parents[2] / "glsl"       # the checkout's glsl/ folder
PACKAGED_SPIRV = Path(__file__).resolve().parents[1] / "spirv"  # ssm_vk/spirv/, package data
SPIRV_MAGIC = b"\x03\x02\x23\x07"
GLSLC_TIMEOUT_S = 300

log = logging.getLogger("ssm_vk")

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_MACRO = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)


class ShaderBuildError(RuntimeError):
    """glslc rejected a shader; ``stderr`` holds its diagnostics."""

    def __init__(self, message: str, stderr: str = ""):
        super().__init__(f"{message}\n{stderr}".rstrip())
        self.stderr = stderr


class GlslcMissing(ShaderBuildError):
    """A shader must be compiled but ``glslc`` is not on PATH (and no cached or packaged SPIR-V fits)."""


@dataclass
class CompileStats:
    """How each compile_shader call was served (for tests and tuning)."""

    glslc_runs: int = 0
    disk_hits: int = 0
    packaged_hits: int = 0


stats = CompileStats()


def normalize_defines(defines: Mapping[str, object] | None) -> tuple[tuple[str, str], ...]:
    """Defines as sorted (name, text) pairs: None or "" → "" (``-DNAME``), bool → 1/0, int, finite
    float, or a str without whitespace. Idempotent. Raises TypeError/ValueError otherwise."""
    if defines is None:
        return ()
    if not isinstance(defines, Mapping):
        raise TypeError(f"defines: expected a mapping of macro names to values, got {type(defines).__name__}")
    out = []
    for key, value in defines.items():
        if not isinstance(key, str) or not _MACRO.fullmatch(key):
            raise ValueError(f"defines: {key!r} is not a macro name")
        if value is None:
            text = ""
        elif isinstance(value, bool):
            text = "1" if value else "0"
        elif isinstance(value, int):
            text = str(value)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(f"defines: {key}={value} is not a finite number")
            text = repr(value)
        elif isinstance(value, str) and not any(c.isspace() for c in value):
            text = value
        else:
            raise ValueError(f"defines: {key}={value!r}: expected None, bool, int, float or a str without whitespace")
        out.append((key, text))
    return tuple(sorted(out))


def search_dirs(search_path) -> list[Path]:
    """``search_path`` (None, a dir, or dirs) as a list of Paths; None means the checkout's glsl/."""
    if search_path is None:
        return [REPO_GLSL]
    if isinstance(search_path, str | os.PathLike):
        search_path = [search_path]
    return [Path(p) for p in search_path]


def find_source(name: str, search_path=None) -> Path | None:
    """``<dir>/<name>.comp`` for the first search dir that has it (default: the checkout's glsl/)."""
    for d in search_dirs(search_path):
        path = d / f"{name}.comp"
        if path.is_file():
            return path
    return None


def source_digest(path: Path, include_dirs: list[Path]) -> str:
    """sha256 over the source and, recursively, every file it includes (as glslc resolves them:
    beside the including file, then the -I dirs). An unresolved include enters by name only."""
    h = hashlib.sha256()
    seen: set[Path] = set()

    def visit(p: Path) -> None:
        p = p.resolve()
        if p in seen:
            return
        seen.add(p)
        text = p.read_bytes()
        h.update(b"%d:%s\0" % (len(text), text))
        for inc in _INCLUDE.findall(text.decode("utf-8", "replace")):
            found = next((d / inc for d in [p.parent, *include_dirs] if (d / inc).is_file()), None)
            if found is None:
                h.update(b"missing:" + inc.encode() + b"\0")
            else:
                visit(found)

    visit(path)
    return h.hexdigest()


def _variant_id(name: str, defines: tuple[tuple[str, str], ...]) -> str:
    return f"{name}|{TARGET_ENV}|" + ";".join(f"{k}={v}" for k, v in defines)


def _short_hash(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def cache_dir() -> Path:
    """``$SSM_SCAN_CACHE`` if set, else ``~/.cache/ssm-scan/spirv``."""
    env = os.environ.get(CACHE_ENV, "").strip()
    return Path(env) if env else Path.home() / ".cache" / "ssm-scan" / "spirv"


@functools.lru_cache(maxsize=8)
def _compiler_key(glslc: str, mtime_ns: int, size: int) -> str:
    run = subprocess.run([glslc, "--version"], capture_output=True, timeout=GLSLC_TIMEOUT_S, check=False)
    if run.returncode != 0:
        raise ShaderBuildError(f"{glslc} --version failed (exit {run.returncode})", run.stderr.decode(errors="replace"))
    return _short_hash(run.stdout.decode(errors="replace"))[:16]


def _packaged(variant: str, digest: str | None) -> bytes | None:
    index = PACKAGED_SPIRV / "index.json"
    if not index.is_file():
        return None
    entry = json.loads(index.read_text()).get(variant)
    if entry is None or (digest is not None and entry["source"] != digest):
        return None
    return (PACKAGED_SPIRV / entry["file"]).read_bytes()


def compile_shader(name: str, defines: Mapping[str, object] | None = None, *, search_path=None) -> bytes:
    """SPIR-V for ``<name>.comp`` compiled with ``-D`` ``defines``, searched in ``search_path``
    (a dir or list of dirs; default: the checkout's ``glsl/``), which are also the ``-I`` dirs.

    Raises ValueError/TypeError for a bad name or defines, FileNotFoundError when neither the
    source nor packaged SPIR-V exists, ShaderBuildError (with glslc's stderr) when glslc fails,
    GlslcMissing when glslc is needed but absent.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"shader name: expected a file name without directories, got {name!r}")
    return _compile(name, normalize_defines(defines), search_dirs(search_path))


def _compile(name: str, defs: tuple[tuple[str, str], ...], dirs: list[Path]) -> bytes:
    source = find_source(name, dirs)
    digest = source_digest(source, dirs) if source is not None else None
    variant = _variant_id(name, defs)
    packaged = _packaged(variant, digest)
    if packaged is not None:
        stats.packaged_hits += 1
        return packaged
    if source is None:
        raise FileNotFoundError(f"shader {name}.comp not found in {', '.join(map(str, dirs))} "
                                f"and no packaged SPIR-V for {variant!r}")
    folder = cache_dir() / f"{name}-{_short_hash(variant, digest)}"
    glslc = shutil.which("glslc")
    if glslc is None:
        spirv = _newest_cached(folder)
        if spirv is not None:
            stats.disk_hits += 1
            return spirv
        raise GlslcMissing(f"glslc is not on PATH and no cached SPIR-V exists for {variant!r} in {folder}; "
                           "install glslc (Debian: apt-get install glslc)")
    st = os.stat(glslc)
    cached = folder / f"{_compiler_key(glslc, st.st_mtime_ns, st.st_size)}.spv"
    spirv = _read_spirv(cached)
    if spirv is not None:
        stats.disk_hits += 1
        return spirv
    spirv = _run_glslc(glslc, source, dirs, defs)
    _store(cached, spirv)
    return spirv


def _newest_cached(folder: Path) -> bytes | None:
    """The newest intact build in a source key's cache folder, by any compiler (None if none)."""
    built = sorted(folder.glob("*.spv"), key=lambda p: p.stat().st_mtime_ns) if folder.is_dir() else []
    for path in reversed(built):
        spirv = _read_spirv(path)
        if spirv is not None:
            return spirv
    return None


def unavailable(name: str, defines: Mapping[str, object] | None = None, *, search_path=None) -> str:
    """Why :func:`compile_shader` would fail for want of glslc, or "" when it would not: the
    variant is packaged, cached on disk, or glslc is on PATH. (Whether glslc then accepts the
    source is not foreseen: a compile error is a defect and raises ShaderBuildError.)"""
    if shutil.which("glslc") is not None:
        return ""
    defs, dirs = normalize_defines(defines), search_dirs(search_path)
    source = find_source(name, dirs)
    digest = source_digest(source, dirs) if source is not None else None
    variant = _variant_id(name, defs)
    if _packaged(variant, digest) is not None:
        return ""
    if source is not None and _newest_cached(cache_dir() / f"{name}-{_short_hash(variant, digest)}") is not None:
        return ""
    return f"glslc is not on PATH and no packaged or cached SPIR-V exists for {variant!r}"


def _read_spirv(path: Path) -> bytes | None:
    """A cached module, or None when absent or damaged (a truncated file is rebuilt, not loaded)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return data if data.startswith(SPIRV_MAGIC) and len(data) % 4 == 0 else None


def _run_glslc(glslc: str, source: Path, dirs: list[Path], defs) -> bytes:
    cmd = [glslc, f"--target-env={TARGET_ENV}", "-O"]
    for d in [source.parent, *dirs]:
        cmd += ["-I", str(d)]
    cmd += [f"-D{k}" + (f"={v}" if v else "") for k, v in defs]
    cmd += [str(source), "-o", "-"]
    stats.glslc_runs += 1
    try:
        run = subprocess.run(cmd, capture_output=True, timeout=GLSLC_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ShaderBuildError(f"glslc took over {GLSLC_TIMEOUT_S} s on {source}") from exc
    stderr = run.stderr.decode(errors="replace")
    if run.returncode != 0:
        raise ShaderBuildError(f"glslc failed on {source} (exit {run.returncode}): {' '.join(cmd)}", stderr)
    if not run.stdout.startswith(SPIRV_MAGIC) or len(run.stdout) % 4:
        raise ShaderBuildError(f"glslc wrote no SPIR-V for {source}", stderr)
    return run.stdout


def _store(path: Path, data: bytes) -> None:
    """Write atomically (processes may share the cache); a read-only cache only costs speed."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("ssm_vk: cannot write the SPIR-V cache %s: %s", path, exc)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def build_all(variants: Iterable[tuple[str, Mapping[str, object] | None]], out_dir=None, *,
              search_path=None) -> list[Path]:
    """Compile every (name, defines) variant into ``out_dir`` (default: the package's spirv/) and
    write its ``index.json``, for wheels that must work without glslc. Returns the files written.
    Raises what :func:`compile_shader` raises.
    """
    out = Path(out_dir) if out_dir is not None else PACKAGED_SPIRV
    dirs = search_dirs(search_path)
    out.mkdir(parents=True, exist_ok=True)
    index, written = {}, []
    for name, defines in variants:
        defs = normalize_defines(defines)
        source = find_source(name, dirs)
        if source is None:
            raise FileNotFoundError(f"shader {name}.comp not found in {', '.join(map(str, dirs))}")
        variant = _variant_id(name, defs)
        spirv = _compile(name, defs, dirs)  # a matching packaged entry is the same build: fine to reuse
        path = out / f"{name}-{_short_hash(variant)[:16]}.spv"
        path.write_bytes(spirv)
        index[variant] = {"file": path.name, "source": source_digest(source, dirs)}
        written.append(path)
    (out / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return written

