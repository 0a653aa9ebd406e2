"""Finding the backends a command runs: the three of this package, or a port under test: any
module with the port interface (docs/PORTING.md, "The port interface": NAME, ssm_scan,
ssm_scan_back, supports), named as an importable module (the current directory included) or as
the path of a .py file, or ggml's own op on one of its devices: ``ssm_ggml:DEVICE`` (ssm_ggml;
``ssm_ggml`` alone is ``ssm_ggml:CPU``). ``check``, ``fuzz`` and ``bench`` all load them here."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ssm_ref import ops
from ssm_ref.backend_names import BACKENDS, lookup, refusal
from ssm_ref.testing import ports

from .common import UsageError

# The built-in backends (ssm_ref.backend_names, whose names and short names --backend takes as
# ssm_torch's and ssm_jax's backend= do), in the order a command without --backend runs them.
KNOWN = tuple(sorted(BACKENDS, key=("ssm_ref", "ssm_fast", "ssm_vk").index))
INTERFACE = ports.INTERFACE
GGML = "ssm_ggml"
GGML_ALIASES = ("ssm_ggml", "ggml")
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_HOW = "a port needs NAME, ssm_scan, ssm_scan_back and supports: docs/PORTING.md, \"The port interface\""


@dataclass
class Backend:
    """A backend module, or the reason it cannot run here (``module`` None)."""

    name: str
    module: ModuleType | None
    reason: str = ""
    requested: bool = False   # named on the command line (then it must run)

    @property
    def available(self) -> bool:
        return self.module is not None

    @property
    def is_vulkan(self) -> bool:
        return self.name == "ssm_vk"

    def device(self):
        """The Vulkan DeviceInfo ssm_vk uses (None for CPU backends)."""
        if not self.is_vulkan or self.module is None:
            return None
        return self.module.runtime.get_context().info

    def where(self) -> str:
        """Where it runs, in ggml's words, with the device's name."""
        if self.name.startswith(GGML + ":") and self.module is not None:
            dev = self.name.partition(":")[2]
            desc = dict(self.module.devices()).get(dev, "")
            return f"{dev} ({desc})" if desc else dev
        info = self.device()
        return "CPU" if info is None else f"{info.where} ({info.name})"


def is_path(name: str) -> bool:
    """True when ``--backend`` names a file (``port.py``, ``dir/port``) rather than a module."""
    return name.endswith(".py") or "/" in name or (os.sep in name) or bool(os.altsep and os.altsep in name)


def _add_path(folder: str) -> None:
    """Make ``folder`` importable (at the end of sys.path: installed modules keep their names)."""
    if folder not in sys.path and not (folder == os.getcwd() and "" in sys.path):
        sys.path.append(folder)


def _load_file(name: str) -> ModuleType:
    path = Path(name).expanduser()
    if path.is_dir():
        raise UsageError(f"--backend {name}: a directory; give a .py file or a module name")
    if not path.is_file():
        raise UsageError(f"--backend {name}: no such file")
    stem = re.sub(r"\W", "_", path.stem) or "port"
    modname = stem if stem not in sys.modules else f"_ssm_scan_port_{stem}"
    spec = importlib.util.spec_from_file_location(modname, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"--backend {name}: not a Python file")
    mod = importlib.util.module_from_spec(spec)
    _add_path(str(path.resolve().parent))          # the port's own imports of its neighbours
    sys.modules[modname] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        del sys.modules[modname]
        raise UsageError(f"--backend {name}: importing it raised {ports.error_text(e)}") from e
    return mod


def load_ggml(name: str, requested: bool, isolate: bool) -> Backend:
    """``ssm_ggml[:DEVICE]`` (or ``ggml[:DEVICE]``): ssm_ggml on that ggml device (default CPU), its
    calls in a worker process when ``isolate``. No ggml build, or no such device: the Backend
    comes back without a module and the reason (a FAIL when requested)."""
    _, _, device = name.partition(":")
    device = device or "CPU"
    label = f"{GGML}:{device}"
    try:
        mod = importlib.import_module(GGML)
    except Exception as e:
        return Backend(label, None, f"cannot be imported ({ports.error_text(e)})", requested)
    try:
        mod.use(device, isolate=isolate)
    except (mod.GgmlNotFound, mod.GgmlAbort, ValueError) as e:
        return Backend(label, None, str(e).splitlines()[0], requested)
    return Backend(label, mod, "", requested)


def is_ggml(name: str) -> bool:
    return name.partition(":")[0] in GGML_ALIASES


def _unknown(name: str, why: str) -> UsageError:
    """A ``--backend`` that is neither a built-in backend nor a port: ``why``, then what ssm_torch's
    and ssm_jax's ``backend=`` say of it too (ssm_ref.backend_names.refusal), then the ports."""
    return UsageError(f"--backend {name}: {why}; {refusal(name)} -- or a port of yours: a module on PYTHONPATH or "
                      "in the current directory, or the path of a .py file")


def load(name: str, requested: bool = False, ggml_isolate: bool = False, op: str = "ssm_scan") -> Backend:
    """The backend ``name``: one of :data:`KNOWN` or its short name, a module path (looked up on sys.path
    and in the current directory), or the path of a .py file.

    Raises UsageError for a name that is no module or file, a port whose import raises, or one that
    lacks the interface. A known backend that cannot run here (not built yet; no Vulkan device)
    comes back with ``module=None`` and the reason. ``ssm_ggml:DEVICE`` is :func:`load_ggml`'s.
    """
    if is_ggml(name):
        b = load_ggml(name, requested, ggml_isolate)
        if op != "ssm_scan" and b.module is not None and not hasattr(b.module, op):
            return Backend(b.name, None, f"does not compute {op}", requested)
        return b
    if is_path(name):
        mod = _load_file(name)
        label = re.sub(r"\.py$", "", Path(name).name)
    else:
        name = lookup(name) or name
        label = name
        if not _MODULE.fullmatch(name):
            raise _unknown(name, "not a module name or the path of a .py file")
        _add_path(os.getcwd())
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if name in KNOWN:
                return Backend(name, None, f"not installed ({e})", requested)
            if e.name and name != e.name and not name.startswith(e.name + "."):  # found, but it imports a missing one
                raise UsageError(f"--backend {name}: importing it raised {ports.error_text(e)}") from e
            raise _unknown(name, "no such module") from None
        except Exception as e:
            if name in KNOWN:
                return Backend(name, None, f"cannot be imported ({ports.error_text(e)})", requested)
            raise UsageError(f"--backend {name}: importing it raised {ports.error_text(e)}") from e
    try:   # (a port's module may declare its op: importing it registered it)
        the_op = ops.get(op)
    except ValueError as e:
        raise UsageError(f"--op {op}: {str(e).removeprefix('op: ')} (an op is declared in ssm_ref.ops or by the "
                         f"module of a port that computes it: {label} declares none)") from None
    problems = ports.interface_problems(mod, the_op)
    if problems:
        if label in KNOWN and op != "ssm_scan" and not hasattr(mod, the_op.name):
            return Backend(label, None, f"does not compute {op}", requested)
        if label in KNOWN:
            return Backend(label, None, f"not built yet ({', '.join(problems)})", requested)
        raise UsageError(f"--backend {label}: the module {', '.join(problems)} ({_HOW})")
    if label == "ssm_vk":
        ok, why = mod.runtime.available()
        if not ok:
            return Backend(label, None, f"no Vulkan device ({why})", requested)
        try:
            mod.runtime.get_context()
        except ValueError as e:  # SSM_VK_DEVICE out of range: the user's setting
            raise UsageError(str(e)) from None
        except mod.runtime.VulkanUnavailable as e:
            return Backend(label, None, f"no Vulkan device ({e})", requested)
    return Backend(label, mod, "", requested)


def require(backs: list[Backend]) -> list[Backend]:
    """``backs`` unchanged, or UsageError (exit code 2) for the first one named by ``--backend``
    that cannot run here, with the reason: a machine without that backend is an environment the
    request does not fit, not a failed check."""
    for b in backs:
        if b.requested and not b.available:
            raise UsageError(f"--backend {b.name}: not available here: {b.reason}")
    return backs


def resolve(names: list[str] | None, device: str | None = None, ggml_isolate: bool = False,
            op: str = "ssm_scan") -> list[Backend]:
    """The backends of ``--backend`` (every known one when None: ssm_ggml only when named), in
    order. ``device`` sets SSM_VK_DEVICE first (before any Vulkan context exists);
    ``ggml_isolate`` runs ssm_ggml's calls in a worker process (check and fuzz). ``op``: the op
    they must compute (ssm_ref.ops); without names, the built-in backends that do not compute it
    come back unavailable, with that reason."""
    if device is not None:
        if not re.fullmatch(r"\d+", str(device)):
            raise UsageError(f"--device {device}: expected a device index (see ssm-scan info)")
        os.environ["SSM_VK_DEVICE"] = str(device)
    if not names:
        return [load(n, op=op) for n in KNOWN]
    out = []
    for n in names:
        b = load(n, requested=True, ggml_isolate=ggml_isolate, op=op)
        if b.name not in [o.name for o in out]:
            out.append(b)
    return out
