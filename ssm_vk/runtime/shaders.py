"""GLSL → SPIR-V: :func:`compile_shader` with a packaged set, a disk cache and ``glslc``.

Where SPIR-V comes from, in order (:func:`compile_shader`; :func:`unavailable` says beforehand
whether it would succeed, by doing the same work):

1. **Package data** ``ssm_vk/spirv/`` (written by :func:`build_all`, shipped in wheels): found by
   (name, target, defines) through ``index.json``. Each entry records the digest of the source it
   was built from and the digest and length of its own bytes: an entry whose source differs from
   the shipped or edited one is ignored, a file whose bytes differ from the index is refused
   (logged, naming the file) and never loaded.
2. **Disk cache** ``$SSM_SCAN_CACHE`` or ``~/.cache/ssm-scan/spirv/``:
   ``<name>-<source key>/<compiler key>.entry``. The source key hashes the variant (name, target,
   defines) with the source text and every file it ``#include``s; the compiler key hashes
   ``glslc --version``. An entry holds a header with both keys and the digest and length of the
   SPIR-V after it, all checked on every load (spirv_cache.py): a truncated, altered or misplaced
   (swapped) entry is rebuilt with glslc, or -- without glslc -- refused with the file named.
   Without glslc, any compiler's intact build of the same source key is taken.
3. **glslc** ``--target-env=vulkan1.1 -O`` (SPIR-V 1.3, the first with subgroup operations),
   slow enough a call to be cached (docs/VULKAN.md, "Costs measured on lavapipe"); its output goes
   into the disk cache.

The GLSL sources are package data of ``ssm_vk`` (the shared ``ssm_vk/glsl/`` and each kernel
family's ``ssm_vk/<family>/glsl/``), so an installed package compiles any variant when glslc is on
PATH.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import config
from . import spirv_cache
from .spirv import module_problem

TARGET_ENV = "vulkan1.1"
CACHE_ENV = "SSM_SCAN_CACHE"
PACKAGE_GLSL = Path(__file__).resolve().parents[1] / "glsl"    # ssm_vk/glsl/: the shared kernels and includes
# The default search path, which is also the -I list: the shared glsl/, then each kernel family's
# (ssm_vk/<family>/glsl/: found by the folder, so a new family's shaders need no entry here).
# Package data, like the SPIR-V below.
PACKAGE_GLSL_DIRS = (PACKAGE_GLSL, *sorted(PACKAGE_GLSL.parent.glob("*/glsl")))
PACKAGED_SPIRV = Path(__file__).resolve().parents[1] / "spirv"  # ssm_vk/spirv/, package data
GLSLC_TIMEOUT_S = 300

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
    """``search_path`` (None, a dir, or dirs) as a list of Paths; None means the package's shared
    glsl/ and every family's (PACKAGE_GLSL_DIRS)."""
    if search_path is None:
        return list(PACKAGE_GLSL_DIRS)
    if isinstance(search_path, str | os.PathLike):
        search_path = [search_path]
    return [Path(p) for p in search_path]


def find_source(name: str, search_path=None) -> Path | None:
    """``<dir>/<name>.comp`` for the first search dir that has it (default: PACKAGE_GLSL_DIRS)."""
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


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cache_dir() -> Path:
    """``$SSM_SCAN_CACHE`` if set, else ``~/.cache/ssm-scan/spirv`` (ssm_vk.config)."""
    return config.cache_dir()


@functools.lru_cache(maxsize=8)
def _compiler_key(glslc: str, mtime_ns: int, size: int) -> str:
    run = subprocess.run([glslc, "--version"], capture_output=True, timeout=GLSLC_TIMEOUT_S, check=False)
    if run.returncode != 0:
        raise ShaderBuildError(f"{glslc} --version failed (exit {run.returncode})", run.stderr.decode(errors="replace"))
    return _short_hash(run.stdout.decode(errors="replace"))[:16]


def _glslc_key() -> tuple[str, str] | tuple[None, None]:
    """(glslc's path, its compiler key), or (None, None) when glslc is not on PATH."""
    glslc = shutil.which("glslc")
    if glslc is None:
        return None, None
    st = os.stat(glslc)
    return glslc, _compiler_key(glslc, st.st_mtime_ns, st.st_size)


# -- package data --------------------------------------------------------------------------------

_index_lock = threading.Lock()
_index_memo: dict = {}   # index.json path -> ((mtime_ns, size), parsed index)


def _packaged_index() -> dict:
    """The parsed ``index.json`` of the packaged SPIR-V ({} when there is none), read once per
    change of the file."""
    path = PACKAGED_SPIRV / "index.json"
    try:
        st = path.stat()
    except OSError:
        return {}
    stamp = (st.st_mtime_ns, st.st_size)
    with _index_lock:
        memo = _index_memo.get(path)
        if memo is not None and memo[0] == stamp:
            return memo[1]
    try:
        index = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        spirv_cache.warn_once(f"ssm_vk: the packaged SPIR-V index {path} is unreadable ({exc}); it is not used")
        index = {}
    if not isinstance(index, dict):
        index = {}
    with _index_lock:
        _index_memo.clear()
        _index_memo[path] = (stamp, index)
    return index


def _packaged(variant: str, digest: str | None) -> tuple[bytes | None, str]:
    """(the packaged build of ``variant``, "") or (None, why it cannot be used; "" when there is
    none). A build of another source than ``digest`` (an edited checkout) is no build of it."""
    entry = _packaged_index().get(variant)
    if not isinstance(entry, dict) or (digest is not None and entry.get("source") != digest):
        return None, ""
    path = PACKAGED_SPIRV / str(entry.get("file", ""))
    try:
        data = path.read_bytes()
    except OSError as exc:
        return None, f"the packaged SPIR-V {path} cannot be read ({exc})"
    why = module_problem(data)
    if not why and (len(data) != entry.get("size") or _sha256(data) != entry.get("sha256")):
        why = "its length or sha256 differs from index.json"
    if why:
        return None, f"the packaged SPIR-V {path} is damaged ({why})"
    return data, ""


# -- resolution ----------------------------------------------------------------------------------

def cache_folder(name: str, defines: Mapping[str, object] | None = None, *, search_path=None) -> Path:
    """The disk-cache folder of a variant (its ``.entry`` files: one per compiler that built it);
    raises FileNotFoundError when the variant has no source."""
    dirs = search_dirs(search_path)
    source = find_source(name, dirs)
    if source is None:
        raise FileNotFoundError(f"shader {name}.comp not found in {', '.join(map(str, dirs))}")
    variant = _variant_id(name, normalize_defines(defines))
    return cache_dir() / f"{name}-{_short_hash(variant, source_digest(source, dirs))}"


def compile_shader(name: str, defines: Mapping[str, object] | None = None, *, search_path=None) -> bytes:
    """SPIR-V for ``<name>.comp`` compiled with ``-D`` ``defines``, searched in ``search_path``
    (a dir or list of dirs; default: the package's ``glsl/``), which are also the ``-I`` dirs.

    Raises ValueError/TypeError for a bad name or defines, FileNotFoundError when neither the
    source nor packaged SPIR-V exists, ShaderBuildError (with glslc's stderr) when glslc fails,
    GlslcMissing when glslc is needed but absent (the message names a damaged cache entry or
    packaged file when one was found and refused).
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"shader name: expected a file name without directories, got {name!r}")
    return _compile(name, normalize_defines(defines), search_dirs(search_path))


def unavailable(name: str, defines: Mapping[str, object] | None = None, *, search_path=None) -> str:
    """Why :func:`compile_shader` fails for these arguments, or "" when it succeeds -- found out by
    calling it (a variant not yet built is compiled now and cached, as the call would), so the
    answer is the call's own: no source and no packaged build, no glslc and no intact packaged or
    cached build, glslc rejecting the source."""
    try:
        compile_shader(name, defines, search_path=search_path)
    except (FileNotFoundError, ShaderBuildError) as exc:
        first = str(exc).split("\n", 1)[0]
        error = next((line.strip() for line in getattr(exc, "stderr", "").splitlines() if "error" in line), "")
        return f"{first}: {error}" if error else first
    return ""


def _compile(name: str, defs: tuple[tuple[str, str], ...], dirs: list[Path]) -> bytes:
    source = find_source(name, dirs)
    digest = source_digest(source, dirs) if source is not None else None
    variant = _variant_id(name, defs)
    packaged, refused = _packaged(variant, digest)
    if packaged is not None:
        stats.packaged_hits += 1
        return packaged
    if refused:
        spirv_cache.warn_once(f"ssm_vk: {refused}; it is not loaded")
    if source is None:
        raise FileNotFoundError(f"shader {name}.comp not found in {', '.join(map(str, dirs))} "
                                f"and no {'intact ' if refused else ''}packaged SPIR-V for {variant!r}")
    source_key = _short_hash(variant, digest)
    folder = cache_dir() / f"{name}-{source_key}"  # = cache_folder()
    glslc, compiler_key = _glslc_key()
    if glslc is None:
        spirv, damaged = spirv_cache.newest_intact(folder, source_key)
        if spirv is not None:
            stats.disk_hits += 1
            return spirv
        refusals = "; ".join(filter(None, [refused, damaged]))
        raise GlslcMissing(f"glslc is not on PATH and no {'intact ' if refusals else ''}packaged or cached SPIR-V "
                           f"exists for {variant!r} in {folder}" + (f" ({refusals})" if refusals else "")
                           + "; install glslc (Debian: apt-get install glslc)")
    path = folder / f"{compiler_key}.entry"
    spirv, why = spirv_cache.read_entry(path, source_key, compiler_key)
    if spirv is not None:
        stats.disk_hits += 1
        return spirv
    if why:
        spirv_cache.damaged(path, why)
    spirv = _run_glslc(glslc, source, dirs, defs)
    spirv_cache.store(path, spirv_cache.entry(source_key, compiler_key, spirv))
    return spirv


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
    if module_problem(run.stdout):
        raise ShaderBuildError(f"glslc wrote no SPIR-V for {source}", stderr)
    return run.stdout


def build_all(variants: Iterable[tuple[str, Mapping[str, object] | None]], out_dir=None, *,
              search_path=None, jobs: int | None = None) -> list[Path]:
    """Compile every (name, defines) variant into ``out_dir`` (default: the package's spirv/) and
    write its ``index.json`` (per variant: the file, the source digest, the file's length and
    sha256), for installs that must work without glslc. ``jobs`` glslc processes run at once
    (default: the CPUs this process may use). Returns the files written, in the variants' order.
    Raises what :func:`compile_shader` raises.
    """
    from concurrent.futures import ThreadPoolExecutor

    out = Path(out_dir) if out_dir is not None else PACKAGED_SPIRV
    dirs = search_dirs(search_path)
    out.mkdir(parents=True, exist_ok=True)
    todo = []
    for name, defines in variants:
        defs = normalize_defines(defines)
        source = find_source(name, dirs)
        if source is None:
            raise FileNotFoundError(f"shader {name}.comp not found in {', '.join(map(str, dirs))}")
        todo.append((name, defs, source))
    if jobs is None:
        jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # glslc runs as a process: threads suffice
        built = list(pool.map(lambda t: _compile(t[0], t[1], dirs), todo))
    index, written = {}, []
    for (name, defs, source), spirv in zip(todo, built, strict=True):
        variant = _variant_id(name, defs)
        path = out / f"{name}-{_short_hash(variant)[:16]}.spv"
        path.write_bytes(spirv)
        index[variant] = {"file": path.name, "source": source_digest(source, dirs), "size": len(spirv),
                          "sha256": _sha256(spirv)}
        written.append(path)
    (out / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    keep = {p.name for p in written}
    for stale in out.glob("*.spv"):  # an earlier build's files: the index no longer names them
        if stale.name not in keep:
            stale.unlink()
    return written
