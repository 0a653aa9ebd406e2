"""Finding and loading a ggml build through ctypes: the few ggml functions ssm_ggml calls, and
which of the two generations of ``ggml_ssm_scan`` the build has.

Where the libraries come from, first match wins:
  1. the ``lib`` argument of :func:`load` (``ssm_ggml.use(lib=...)``),
  2. the environment variable ``SSM_GGML_LIB``,
  3. the ``lib/`` folder of the ``ggml-python`` package (``pip install ggml-python``), when installed.
Each names the folder that holds ``libggml*.so`` (``.dylib`` on macOS), or the path of libggml itself.

The two generations of ggml_ssm_scan. Snapshots from 2026-08 on (ggml-org/ggml 66d09fae, "recurrent
state rollback") take a trailing ``int64_t K`` (the number of state snapshots written after y);
older ones end at ``ids``. ctypes cannot see a C signature, and ggml's version number is bumped
too rarely to tell, so the build is asked by its behaviour: a metadata-only call with the
trailing argument K = 2 on a one-element Mamba-2 problem makes a result of
``nelements(x) + 2 * nelements(states)`` floats in the K generation and of
``nelements(x) + nelements(states)`` in the older one, which never reads the extra argument.
Passing an argument a C function does not declare is harmless on every caller-cleans-up calling
convention (x86-64 System V and Windows x64, AArch64), the ones ggml is built for.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import sys
from ctypes import POINTER, c_bool, c_char_p, c_int, c_int64, c_size_t, c_void_p
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GGML_TYPE_F32", "GGML_TYPE_I32", "GgmlLibrary", "GgmlNotFound", "find", "load", "missing_device"]


def missing_device(name: str, folder, have: list[str]) -> str:
    """The message for a device ``name`` the build does not list (``have``), with the way out when
    it is a Vulkan device ggml left out."""
    text = f"device: ggml has no device {name!r} in {folder} (its devices: {', '.join(have) or 'none'})"
    if name.startswith("Vulkan"):
        text += ("; ggml's Vulkan backend lists no CPU-type device (such as Mesa's lavapipe) unless "
                 "GGML_VK_VISIBLE_DEVICES names it, e.g. GGML_VK_VISIBLE_DEVICES=0, and none at all in a "
                 "build without -DGGML_VULKAN=ON")
    return text

ENV = "SSM_GGML_LIB"
GGML_TYPE_F32 = 0
GGML_TYPE_I32 = 26
GGML_STATUS_SUCCESS = 0
_EXT = ".dylib" if sys.platform == "darwin" else ".so"
# Load order: ggml-base first (the others link it), the backends, then ggml (the registry).
_BASE, _MAIN = "libggml-base", "libggml"

API_K = "ggml_ssm_scan(ctx, s, x, dt, A, B, C, ids, K)"
API_NO_K = "ggml_ssm_scan(ctx, s, x, dt, A, B, C, ids)"


class GgmlNotFound(RuntimeError):
    """No ggml build could be found or loaded; the message says where it looked and how to build one."""


class InitParams(ctypes.Structure):
    """struct ggml_init_params."""

    _fields_ = [("mem_size", c_size_t), ("mem_buffer", c_void_p), ("no_alloc", c_bool)]


# name: (restype, argtypes); all live in libggml-base or libggml except the CPU backend's own.
_FUNCS = {
    "ggml_init": (c_void_p, [InitParams]),
    "ggml_free": (None, [c_void_p]),
    "ggml_tensor_overhead": (c_size_t, []),
    "ggml_graph_overhead": (c_size_t, []),
    "ggml_new_tensor": (c_void_p, [c_void_p, c_int, c_int, POINTER(c_int64)]),
    # always declared with the trailing K: an older build ignores it (module docstring)
    "ggml_ssm_scan": (c_void_p, [c_void_p] * 8 + [c_int64]),
    "ggml_new_graph": (c_void_p, [c_void_p]),
    "ggml_build_forward_expand": (None, [c_void_p, c_void_p]),
    "ggml_nelements": (c_int64, [c_void_p]),
    "ggml_nbytes": (c_size_t, [c_void_p]),
    "ggml_backend_dev_count": (c_size_t, []),
    "ggml_backend_dev_get": (c_void_p, [c_size_t]),
    "ggml_backend_dev_name": (c_char_p, [c_void_p]),
    "ggml_backend_dev_description": (c_char_p, [c_void_p]),
    "ggml_backend_dev_by_name": (c_void_p, [c_char_p]),
    "ggml_backend_dev_init": (c_void_p, [c_void_p, c_char_p]),
    "ggml_backend_dev_supports_op": (c_bool, [c_void_p, c_void_p]),
    "ggml_backend_alloc_ctx_tensors": (c_void_p, [c_void_p, c_void_p]),
    "ggml_backend_buffer_free": (None, [c_void_p]),
    "ggml_backend_tensor_set": (None, [c_void_p, c_void_p, c_size_t, c_size_t]),
    "ggml_backend_tensor_get": (None, [c_void_p, c_void_p, c_size_t, c_size_t]),
    "ggml_backend_graph_compute": (c_int, [c_void_p, c_void_p]),
    "ggml_backend_synchronize": (None, [c_void_p]),
    "ggml_backend_free": (None, [c_void_p]),
}
_OPTIONAL = {
    "ggml_version": (c_char_p, []),
    "ggml_commit": (c_char_p, []),
    "ggml_backend_cpu_set_n_threads": (None, [c_void_p, c_int]),
    "ggml_backend_load_all_from_path": (None, [c_char_p]),
    # ggmlR's backward: (ctx, s, x, dt, A, B, C, ids, g) -> packed d_s0 | d_x | d_dt | d_A | d_B | d_C
    "ggml_ssm_scan_back": (c_void_p, [c_void_p] * 9),
}


def _folder_of(path: Path) -> Path:
    return path.parent if path.is_file() else path


def _package_lib() -> Path | None:
    """ggml-python's lib/ folder, found without importing the package (which loads its own copy)."""
    try:
        spec = importlib.util.find_spec("ggml")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        lib = Path(root) / "lib"
        if any(lib.glob(f"{_MAIN}*{_EXT}*")):
            return lib
    return None


def find(lib: str | os.PathLike | None = None) -> tuple[Path, str]:
    """(folder holding libggml*, how it was found). Raises GgmlNotFound."""
    tried = []
    for how, value in (("the lib argument", lib), (ENV, os.environ.get(ENV))):
        if value:
            folder = _folder_of(Path(value).expanduser())
            if any(folder.glob(f"{_MAIN}*{_EXT}*")):
                return folder.resolve(), f"{how} ({value})"
            raise GgmlNotFound(f"{how} names {value}, which holds no {_MAIN}{_EXT}")
        tried.append(how)
    pkg = _package_lib()
    if pkg is not None:
        return pkg.resolve(), "the ggml-python package"
    tried.append("the ggml-python package")
    raise GgmlNotFound(f"no ggml build found (looked at: {', '.join(tried)}). Build one with tools/build_ggml.sh "
                       f"and set {ENV} to the folder it prints, or pip install ggml-python")


@dataclass(frozen=True)
class BuildInfo:
    """What is known of a build: ggml's version and commit strings (when the build exports
    them) and, for a build of tools/build_ggml.sh, its ggml-build.json (source, cmake flags)."""

    folder: str
    found_by: str
    version: str
    commit: str
    api: str
    backward: bool
    recipe: dict

    def describe(self) -> str:
        src = self.recipe.get("source", "")
        flags = self.recipe.get("flags", "")
        return (f"ggml {self.version or '?'} (commit {self.commit or '?'}) from {self.folder}"
                + (f", built from {src}" if src else "") + (f" with {flags}" if flags else "")
                + f"; {self.api}; backward: {'ggml_ssm_scan_back' if self.backward else 'none'}")


class GgmlLibrary:
    """The loaded libraries: ``fn`` holds the ctypes functions by ggml's names (optional ones
    only when exported), ``has_k`` whether ggml_ssm_scan takes the trailing K, ``info`` a BuildInfo."""

    def __init__(self, folder: Path, found_by: str):
        self.folder = folder
        self._handles = []
        files = sorted(folder.glob(f"libggml*{_EXT}"))
        if not files:
            files = sorted(p for p in folder.glob(f"libggml*{_EXT}.*") if p.is_file())
        names = {p.name.split(_EXT)[0]: p for p in files}
        order = ([names[_BASE]] if _BASE in names else []) \
            + [p for n, p in names.items() if n not in (_BASE, _MAIN)] + ([names[_MAIN]] if _MAIN in names else [])
        for path in order:  # RTLD_GLOBAL: each later library finds the earlier ones by soname
            try:
                self._handles.append(ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL))
            except OSError as e:
                if path.name.startswith(_MAIN + _EXT) or path.name.startswith(_BASE):
                    raise GgmlNotFound(f"cannot load {path}: {e}") from e
                # a backend library whose driver is missing (libcuda, libvulkan): that device is absent
        self.fn = {}
        for name, (res, args) in {**_FUNCS, **_OPTIONAL}.items():
            f = self._lookup(name)
            if f is None:
                if name in _FUNCS:
                    raise GgmlNotFound(f"{folder}: no ggml function {name} in {[p.name for p in order]} "
                                       "(not a ggml build, or one too old for ggml_backend_dev_*)")
                continue
            f.restype, f.argtypes = res, args
            self.fn[name] = f
        if "ggml_backend_load_all_from_path" in self.fn and self.fn["ggml_backend_dev_count"]() == 0:
            self.fn["ggml_backend_load_all_from_path"](str(folder).encode())  # a GGML_BACKEND_DL build
        self.has_k = self._probe_k()
        self.info = BuildInfo(folder=str(folder), found_by=found_by, version=self._text("ggml_version"),
                              commit=self._text("ggml_commit"), api=API_K if self.has_k else API_NO_K,
                              backward="ggml_ssm_scan_back" in self.fn, recipe=_recipe(folder))

    def _lookup(self, name: str):
        for h in reversed(self._handles):
            try:
                return getattr(h, name)
            except AttributeError:
                continue
        return None

    def _text(self, name: str) -> str:
        f = self.fn.get(name)
        return f().decode(errors="replace") if f is not None else ""

    def context(self, n_tensors: int, graph: bool = False) -> int:
        """A metadata-only ggml context for ``n_tensors`` tensors (and one graph)."""
        size = n_tensors * self.fn["ggml_tensor_overhead"]() + (self.fn["ggml_graph_overhead"]() if graph else 0)
        ctx = self.fn["ggml_init"](InitParams(size + 1024, None, True))
        if not ctx:
            raise MemoryError("ggml_init returned NULL")
        return ctx

    def new_tensor(self, ctx: int, ggml_type: int, ne: tuple) -> int:
        arr = (c_int64 * len(ne))(*ne)
        t = self.fn["ggml_new_tensor"](ctx, ggml_type, len(ne), arr)
        if not t:
            raise MemoryError("ggml_new_tensor returned NULL")
        return t

    def _probe_k(self) -> bool:
        """True when ggml_ssm_scan takes the trailing K (module docstring)."""
        ctx = self.context(8)
        try:
            f32 = GGML_TYPE_F32
            s = self.new_tensor(ctx, f32, (1, 1, 1, 1))
            x = self.new_tensor(ctx, f32, (1, 1, 1, 1))
            dt = self.new_tensor(ctx, f32, (1, 1, 1))
            A = self.new_tensor(ctx, f32, (1, 1))
            B = self.new_tensor(ctx, f32, (1, 1, 1, 1))
            C = self.new_tensor(ctx, f32, (1, 1, 1, 1))
            ids = self.new_tensor(ctx, GGML_TYPE_I32, (1,))
            out = self.fn["ggml_ssm_scan"](ctx, s, x, dt, A, B, C, ids, 2)
            n = self.fn["ggml_nelements"](out)
        finally:
            self.fn["ggml_free"](ctx)
        if n not in (2, 3):
            raise GgmlNotFound(f"{self.folder}: ggml_ssm_scan made {n} floats for a one-element problem; "
                               "expected 2 (no K argument) or 3 (K = 2): an unknown generation of the op")
        return n == 3

    def devices(self) -> list[tuple[str, str]]:
        """(name, description) of every ggml backend device of this build: ("CPU", ...), ("Vulkan0", ...)."""
        out = []
        for i in range(self.fn["ggml_backend_dev_count"]()):
            d = self.fn["ggml_backend_dev_get"](i)
            name, desc = self.fn["ggml_backend_dev_name"](d), self.fn["ggml_backend_dev_description"](d)
            out.append((name.decode(), desc.decode(errors="replace")))
        return out


def _recipe(folder: Path) -> dict:
    """tools/build_ggml.sh's ggml-build.json beside the lib folder, when there is one."""
    for p in (folder.parent / "ggml-build.json", folder / "ggml-build.json"):
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            continue
    return {}


_loaded: dict[Path, GgmlLibrary] = {}


def load(lib: str | os.PathLike | None = None) -> GgmlLibrary:
    """The ggml build (see the module docstring for where it is looked for), loaded once. One build
    per process: every ggml build names its libraries alike (libggml-base.so.0, ...), and the
    dynamic loader resolves a second build's against the first one's, so the second would run the
    first's code; GgmlNotFound says so (a worker process, ``use(..., isolate=True)``, loads its own)."""
    folder, how = find(lib)
    if folder not in _loaded and _loaded:
        (held,) = _loaded
        raise GgmlNotFound(f"{folder}: this process has loaded the ggml build at {held}, and ggml's libraries "
                           "of every build share their names (libggml-base.so.0, ...): a second build would run "
                           "the first one's code. Use ssm_ggml.use(..., isolate=True) (each build in a worker "
                           "process of its own), or another process")
    if folder not in _loaded:
        _loaded[folder] = GgmlLibrary(folder, how)
    return _loaded[folder]
