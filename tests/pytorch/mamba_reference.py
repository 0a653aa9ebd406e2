"""mamba_ssm's own pure-PyTorch reference functions, taken at test time from its published sdist.

The sdist is downloaded once with pip into a cache (``$SSM_TEST_CACHE/mamba_ssm``, else pytest's
cache), unpacked there, and nothing of it enters the repository. mamba_ssm's modules import CUDA
extensions and Triton at the top, so they are not imported: each reference function is read from
its file with ``ast`` and executed, as written, in a namespace holding what it uses (torch,
torch.nn.functional as F, einops' rearrange and repeat).

    selective_scan_ref          mamba_ssm/ops/selective_scan_interface.py   Mamba-1
    segsum, ssd_minimal_discrete mamba_ssm/modules/ssd_minimal.py            Mamba-2 (SSD, chunked)
    selective_state_update_ref  mamba_ssm/ops/triton/selective_state_update.py   decoding

``float64()`` is a context in which ``Tensor.float()`` widens to float64 instead: selective_scan_ref
casts its inputs with ``.float()``, and under it the same code runs as a float64 oracle.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

VERSION = "2.3.2.post1"
REQUIREMENT = f"mamba-ssm=={VERSION}"
SDIST = f"mamba_ssm-{VERSION}.tar.gz"

FUNCTIONS = {
    "mamba_ssm/ops/selective_scan_interface.py": ["selective_scan_ref"],
    "mamba_ssm/modules/ssd_minimal.py": ["segsum", "ssd_minimal_discrete"],
    "mamba_ssm/ops/triton/selective_state_update.py": ["selective_state_update_ref"],
}


class Unavailable(RuntimeError):
    """The sdist could not be had or read (the message says why)."""


def cache_dir(pytest_cache=None) -> Path:
    root = os.environ.get("SSM_TEST_CACHE")
    if root:
        path = Path(root) / "mamba_ssm"
        path.mkdir(parents=True, exist_ok=True)
        return path
    return Path(pytest_cache.mkdir("mamba_ssm"))


def fetch(dest: Path) -> Path:
    """The unpacked source tree of the sdist under ``dest`` (downloaded when not there yet)."""
    root = dest / f"mamba_ssm-{VERSION}"
    if all((root / f).is_file() for f in FUNCTIONS):
        return root
    sdist = dest / SDIST
    if not sdist.is_file():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
               "-q", "-d", str(dest), REQUIREMENT]
        env = {**os.environ, "MAMBA_SKIP_CUDA_BUILD": "TRUE"}
        try:
            run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
        except subprocess.TimeoutExpired as e:
            raise Unavailable(f"pip download {REQUIREMENT} ran past 600 s") from e
        if run.returncode != 0 or not sdist.is_file():
            raise Unavailable(f"pip download {REQUIREMENT} failed (exit {run.returncode}):\n"
                              f"{run.stdout[-2000:]}{run.stderr[-2000:]}")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.removeprefix(f"mamba_ssm-{VERSION}/") in FUNCTIONS]
        tar.extractall(dest, members=members, filter="data")
    if not all((root / f).is_file() for f in FUNCTIONS):
        raise Unavailable(f"{sdist} does not hold {', '.join(FUNCTIONS)}")
    return root


def _functions(path: Path, names: list[str], namespace: dict) -> None:
    """Execute the top-level ``def``s called ``names`` of ``path`` into ``namespace``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    found = {n.name for n in defs}
    if found != set(names):
        raise Unavailable(f"{path}: no top-level function {sorted(set(names) - found)}")
    code = compile(ast.Module(body=defs, type_ignores=[]), str(path), "exec")
    exec(code, namespace)


def load(root: Path) -> SimpleNamespace:
    """The reference functions of the source tree ``root``."""
    import torch
    import torch.nn.functional as F  # noqa: N812 (the name mamba_ssm's code uses)

    try:
        from einops import rearrange, repeat
    except ImportError as e:
        raise Unavailable("einops is not installed (mamba_ssm's references use it): pip install einops") from e
    out = {}
    for rel, names in FUNCTIONS.items():
        namespace = {"torch": torch, "F": F, "rearrange": rearrange, "repeat": repeat}
        _functions(root / rel, names, namespace)
        out.update({n: namespace[n] for n in names})
    return SimpleNamespace(**out, root=root)


def float64():
    """A context in which ``tensor.float()`` gives float64 (selective_scan_ref then runs in float64)."""
    import torch

    class _Float64(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.Tensor.float:
                return args[0].double()
            return func(*args, **(kwargs or {}))

    return _Float64()
