"""mamba_ssm's own pure-PyTorch Mamba-3 references, taken at test time from the mamba_ssm source
tree named by the environment variable SSM_MAMBA_REPO (nothing of it enters this repository):

    mamba3_siso_fwd_ref, mamba3_siso_step_ref    tests/ops/triton/test_mamba3_siso.py
    mamba3_MIMO_step_ref, mamba3_MIMO_chunk_ref  tests/ops/tilelang/test_mamba3_mimo.py
    rms_norm_ref, RMSNorm                        mamba_ssm/ops/triton/layernorm_gated.py
    apply_rotary_qk_inference_reference          mamba_ssm/ops/triton/mamba3/mamba3_mimo_rotary_step.py
    Mamba3                                       mamba_ssm/modules/mamba3.py

Those files import Triton, TileLang and CUDA kernels at the top, so they are not imported: the
functions and classes named are read with ``ast`` and executed, as written, in a namespace holding
what they use. mamba_ssm's Mamba3 layer is built the same way, its kernel imports replaced by
mamba_ssm's references: ``mamba3_siso_combined`` by mamba3_siso_fwd_ref, ``mamba3_mimo`` by
mamba3_MIMO_chunk_ref (fed the chunk-local cumulative decays and the cumulative angles the
kernels' wrappers compute), RMSNormGated by RMSNorm over rms_norm_ref; it has no decoding step
here (its step needs the CuTe kernel).

``float64()`` is a context in which the references compute in float64: ``.float()`` widens to
float64 and every float32 dtype they name (``.to(torch.float32)``, ``dtype=torch.float32``) is
float64 instead.
"""

from __future__ import annotations

import ast
import itertools
import math
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Optional, Tuple  # noqa: UP035 (the names mamba_ssm's code uses)

ENV = "SSM_MAMBA_REPO"

FILES = {
    "tests/ops/triton/test_mamba3_siso.py": ["_segsum", "mamba3_siso_step_ref", "mamba3_siso_fwd_ref"],
    "tests/ops/tilelang/test_mamba3_mimo.py": ["_pad_zeros", "mamba3_MIMO_step_ref", "apply_angle_dt_reference",
                                              "mamba3_MIMO_chunk_ref"],
    "mamba_ssm/ops/triton/layernorm_gated.py": ["rms_norm_ref", "RMSNorm"],
    "mamba_ssm/ops/triton/mamba3/mamba3_mimo_rotary_step.py": ["apply_rotary_qk_inference_reference"],
}
LAYER = "mamba_ssm/modules/mamba3.py"


class Unavailable(RuntimeError):
    """The source tree is not there or lacks what is read (the message says why)."""


def root() -> Path:
    path = os.environ.get(ENV)
    if not path:
        raise Unavailable(f"{ENV} is not set (a mamba_ssm source tree with tests/ops/triton/test_mamba3_siso.py)")
    p = Path(path)
    missing = [f for f in [*FILES, LAYER] if not (p / f).is_file()]
    if missing:
        raise Unavailable(f"{ENV}={path} lacks {', '.join(missing)}")
    return p


def _defs(path: Path, names: list[str], namespace: dict) -> None:
    """Execute the top-level ``def``s and ``class``es called ``names`` of ``path`` into ``namespace``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
    found = {n.name for n in nodes}
    if found != set(names):
        raise Unavailable(f"{path}: no top-level {sorted(set(names) - found)}")
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), namespace)


def _namespace() -> dict:
    import torch
    import torch.nn.functional as F  # noqa: N812 (the name mamba_ssm's code uses)
    from torch import Tensor, nn

    try:
        from einops import rearrange, repeat
    except ImportError as e:
        raise Unavailable("einops is not installed (mamba_ssm's references use it)") from e
    return {"torch": torch, "F": F, "nn": nn, "Tensor": Tensor, "math": math, "rearrange": rearrange,
            "repeat": repeat, "Optional": Optional, "Tuple": Tuple}  # noqa: UP006


def load() -> SimpleNamespace:
    """The references of the tree in SSM_MAMBA_REPO, and ``Mamba3``, mamba_ssm's layer on them."""
    import torch

    base = root()
    ns = _namespace()
    for rel, names in FILES.items():
        _defs(base / rel, names, ns)

    def rmsnorm_fn(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True):
        return ns["rms_norm_ref"](x, weight, bias, z=z, eps=eps, group_size=group_size,
                                  norm_before_gate=norm_before_gate)

    ns["rmsnorm_fn"] = rmsnorm_fn

    def siso_combined(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None, Input_States=None,
                      chunk_size=64, return_final_states=False, cu_seqlens=None):
        out, finals = ns["mamba3_siso_fwd_ref"](Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, Input_States,
                                                chunk_size=chunk_size, dtype=torch.float64, cu_seqlens=cu_seqlens)
        return (out, *finals) if return_final_states else out

    def mimo(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z, chunk_size,
             rotary_dim_divisor, dtype, return_state=False, cu_seqlens=None, fuse_pregate_headwise_rms_norm=False,
             outproj_norm_weight=None, outproj_norm_eps=1e-5):
        if return_state:
            raise NotImplementedError("mamba3_MIMO_chunk_ref has no angle state: return_state is not built here")
        dA_cs, dA_cs_rev = chunk_decays(ADT, chunk_size, cu_seqlens)
        angles = ns["apply_angle_dt_reference"](Angles, DT.transpose(1, 2))
        out, _, _ = ns["mamba3_MIMO_chunk_ref"](
            Q, K, V, Q_bias, K_bias, MIMO_V, MIMO_Out, Z, MIMO_Z, angles, dA_cs, dA_cs_rev, DT, Trap, D,
            chunk_size=chunk_size, rotary_dim_divisor=rotary_dim_divisor, dtype=torch.float64,
            contract_mimo_out=MIMO_Out is not None, cu_seqlens=cu_seqlens,
            fused_norm=fuse_pregate_headwise_rms_norm, outproj_norm_weight=outproj_norm_weight,
            outproj_norm_eps=outproj_norm_eps)
        return out

    layer = {**ns, "RMSNormGated": ns["RMSNorm"], "mamba3_siso_combined": siso_combined,
             "mamba3_mimo_combined": mimo, "apply_rotary_qk_inference_fwd": None, "mamba3_step_fn": None}
    tree = ast.parse((base / LAYER).read_text(), filename=str(base / LAYER))
    keep = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(base / LAYER), "exec"), layer)
    ns["Mamba3"] = layer["Mamba3"]
    ns["mimo_combined"], ns["siso_combined"] = mimo, siso_combined
    return SimpleNamespace(**ns, root=base)


def chunk_decays(ADT, chunk_size: int, cu_seqlens=None):
    """The kernels' chunk-local cumulative decays of ADT (b, h, l): inclusive cumsum within each
    chunk, and what is left of the chunk after each token (zero-padded to whole chunks, then cut);
    with cu_seqlens, each packed sequence's chunks start at its first token (as the varlen kernels'
    do)."""
    import torch

    if cu_seqlens is not None:
        cu = [int(v) for v in cu_seqlens]
        parts = [chunk_decays(ADT[..., a:b], chunk_size) for a, b in itertools.pairwise(cu)]
        return torch.cat([p[0] for p in parts], -1), torch.cat([p[1] for p in parts], -1)
    b, h, L = ADT.shape
    pad = (-L) % chunk_size
    a = torch.nn.functional.pad(ADT, (0, pad)).reshape(b, h, -1, chunk_size)
    cs = a.cumsum(-1)
    rev = cs[..., -1:] - cs
    return cs.reshape(b, h, -1)[..., :L], rev.reshape(b, h, -1)[..., :L]


def float64():
    """A context in which mamba_ssm's references compute in float64 (module docstring)."""
    import torch

    def widen(v):
        return torch.float64 if v is torch.float32 else v

    class _Float64(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.Tensor.float:
                return args[0].double()
            args = tuple(widen(a) for a in args)
            kwargs = {k: widen(v) for k, v in kwargs.items()}
            return func(*args, **kwargs)

    return _Float64()
