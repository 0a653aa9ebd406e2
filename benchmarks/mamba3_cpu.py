"""ssm_fast's Mamba-3 scan on the CPU: forward + backward beside ssm_fast's Mamba-2 scan and
beside mamba_ssm's own PyTorch reference of the Mamba-3 SISO forward, in several fresh processes.

    python benchmarks/mamba3_cpu.py                         # 3 processes, shapes small,long
    python benchmarks/mamba3_cpu.py --mamba-src /work/mamba-src --md out.md --json out.json

Per shape (S, T, H, P, N; G = 1, SISO, F = N/2 rotated pairs, no start state) each process times,
rounds interleaved, the best of ``--reps`` calls of:

* ``m3``: ``ssm_fast.mamba3_scan`` then ``ssm_fast.mamba3_scan_back`` (g_y only);
* ``m2``: ``ssm_fast.ssm_scan`` then ``ssm_fast.ssm_scan_back`` with A of shape (H,) -- the
  Mamba-2 scan of the same S, T, H, P, N, x, B and C (ggml's softplus of dt inside);
* ``torch`` (with ``--mamba-src`` or SSM_MAMBA_REPO): mamba_ssm's ``mamba3_siso_fwd_ref`` (from
  its tests/ops/triton/test_mamba3_siso.py, loaded from that tree without importing mamba_ssm or
  triton) on torch CPU float32 tensors, forward and autograd's backward of sum(y * g_y). It
  computes y as a masked T x T attention product per sequence and head, so its time grows as T^2;
  it is timed on ``--torch-reps`` calls (1 by default at T = 2048: seconds each).

The ratios are formed within each process (both sides of a ratio from the same process); the
table gives median (min-max) over the processes (benchmarks/processes.py). Before timing, each
process checks that mamba_ssm's y and ssm_fast's agree (norm-relative difference printed): the
inputs are converted as the op's definition says (lam = sigmoid(Trap), dtheta = pi tanh(Angles) DT,
dA = ADT).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import processes  # noqa: E402

SHAPES = {   # S, T, H, P, N
    "small": (2, 256, 8, 64, 64),
    "long": (2, 2048, 8, 64, 64),
}


def load_mamba_ref(repo: str) -> dict:
    """mamba3_siso_fwd_ref and its helper _segsum from ``repo``/tests/ops/triton/test_mamba3_siso.py:
    the two function definitions taken from the file's syntax tree and executed with the names they
    use (torch, F, math, einops' repeat), so that neither mamba_ssm nor triton is imported."""
    import typing

    import einops
    import torch
    import torch.nn.functional as nnf

    path = Path(repo) / "tests" / "ops" / "triton" / "test_mamba3_siso.py"
    tree = ast.parse(path.read_text())
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("_segsum", "mamba3_siso_fwd_ref")]
    ns = {"torch": torch, "F": nnf, "math": math, "repeat": einops.repeat, "rearrange": einops.rearrange,
          "Optional": typing.Optional, "Tuple": tuple}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), ns)
    return ns


def inputs(shape, seed=0):
    """The Mamba-3 problem in mamba_ssm's raw terms and in the op's, and the Mamba-2 problem."""
    S, T, H, P, N = shape
    F = N // 2
    rng = np.random.default_rng(seed)
    f32 = np.float32
    raw = dict(
        x=rng.standard_normal((S, T, H, P)).astype(f32),
        dt=rng.uniform(0.01, 0.1, (S, T, H)).astype(f32),
        A=-rng.uniform(0.5, 2.0, (H,)).astype(f32),
        trap=rng.standard_normal((S, T, H)).astype(f32),
        angles=rng.standard_normal((S, T, H, F)).astype(f32),
        B=(0.3 * rng.standard_normal((S, T, 1, N))).astype(f32),
        C=(0.3 * rng.standard_normal((S, T, 1, N))).astype(f32),
        B_bias=(0.3 * rng.standard_normal((H, N))).astype(f32),
        C_bias=(0.3 * rng.standard_normal((H, N))).astype(f32),
    )
    m3 = dict(x=raw["x"], dt=raw["dt"], dA=(raw["dt"] * raw["A"]).astype(f32),
              lam=(1 / (1 + np.exp(-raw["trap"]))).astype(f32), B=raw["B"], C=raw["C"],
              B_bias=raw["B_bias"], C_bias=raw["C_bias"],
              dtheta=(np.pi * np.tanh(raw["angles"]) * raw["dt"][..., None]).astype(f32))
    m2 = dict(s=None, x=raw["x"], dt=rng.uniform(-1, 1, (S, T, H)).astype(f32), A=raw["A"], B=raw["B"], C=raw["C"])
    g_y = rng.standard_normal((S, T, H, P)).astype(f32)
    return raw, m3, m2, g_y


def torch_call(ns, raw, g_y, backward: bool):
    """mamba_ssm's reference forward (and autograd's backward) on CPU float32 tensors; returns y."""
    import torch

    t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in raw.items()}
    leaves = dict(Q=t["C"], K=t["B"], V=t["x"], ADT=(t["dt"] * t["A"]).permute(0, 2, 1),
                  DT=t["dt"].permute(0, 2, 1), Trap=t["trap"].permute(0, 2, 1), Q_bias=t["C_bias"],
                  K_bias=t["B_bias"], Angles=t["angles"])
    leaves = {k: v.contiguous().requires_grad_(backward) for k, v in leaves.items()}
    with torch.set_grad_enabled(backward):
        y, _ = ns["mamba3_siso_fwd_ref"](**leaves)
        if backward:
            (y * torch.from_numpy(g_y)).sum().backward()
    return y.detach().numpy()


def best(fn, reps: int) -> float:
    out = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t0)
    return out


def child(args) -> dict:
    import ssm_fast
    import ssm_fast.mamba3

    ssm_fast.warmup()
    ssm_fast.mamba3.warmup()
    ns = load_mamba_ref(args.mamba_src) if args.mamba_src else None
    if ns is not None:
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
    rep = {"threads": ssm_fast.get_num_threads(), "cpu": _cpu(), "shapes": {}}
    for name in args.shapes.split(","):
        rep["shapes"][name] = _measure(args, name, ns, ssm_fast)
    return rep


def _measure(args, name: str, ns, ssm_fast) -> dict:
    """One shape's agreement check and timings in this process."""
    shape = SHAPES[name]
    raw, m3, m2, g_y = inputs(shape)
    m3f = lambda: ssm_fast.mamba3_scan(**m3)                          # noqa: E731
    m3b = lambda: ssm_fast.mamba3_scan_back(**m3, g_y=g_y)            # noqa: E731
    m2f = lambda: ssm_fast.ssm_scan(**m2)                             # noqa: E731
    m2b = lambda: ssm_fast.ssm_scan_back(**m2, g_y=g_y)               # noqa: E731
    row = {"shape": shape}
    if ns is not None:   # agreement first
        y_t = torch_call(ns, raw, g_y, backward=False)
        y_f = m3f().y
        row["torch_y_rel_diff"] = float(np.linalg.norm(y_t - y_f) / np.linalg.norm(y_t))
        print(f"{name}: mamba_ssm's y vs ssm_fast's: {row['torch_y_rel_diff']:.1e} norm-relative", flush=True)
    for f in (m3f, m3b, m2f, m2b):
        f()
    times = {k: [] for k in ("m3_fwd", "m3_bwd", "m2_fwd", "m2_bwd", "torch_fwd", "torch_fwdbwd")}
    for _ in range(args.rounds):
        times["m3_fwd"].append(best(m3f, args.reps))
        times["m3_bwd"].append(best(m3b, args.reps))
        times["m2_fwd"].append(best(m2f, args.reps))
        times["m2_bwd"].append(best(m2b, args.reps))
    if ns is not None:
        reps = args.torch_reps if shape[1] >= 1024 else max(args.torch_reps, 3)
        torch_call(ns, raw, g_y, True)                                # its first call is slower
        times["torch_fwd"].append(best(lambda: torch_call(ns, raw, g_y, False), reps))
        times["torch_fwdbwd"].append(best(lambda: torch_call(ns, raw, g_y, True), reps))
    row.update({k: min(v) for k, v in times.items() if v})
    print(f"{name}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in row.items() if k.endswith(("fwd", "bwd"))),
          flush=True)
    return row


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def table(reports: list[dict], shapes: list[str]) -> str:
    ok = [r for r in reports if "failed" not in r]
    lines = ["| shape (S, T, H, P, N) | Mamba-3 fwd+bwd, ms | Mamba-2 fwd+bwd, ms | Mamba-3 / Mamba-2 | "
             "mamba_ssm ref fwd+bwd (torch CPU), ms | mamba_ssm ref / Mamba-3 |",
             "|---|---|---|---|---|---|"]
    for name in shapes:
        rows = [r["shapes"][name] for r in ok if name in r.get("shapes", {})]
        if not rows:
            continue
        m3 = [1e3 * (x["m3_fwd"] + x["m3_bwd"]) for x in rows]
        m2 = [1e3 * (x["m2_fwd"] + x["m2_bwd"]) for x in rows]
        ratio = [a / b for a, b in zip(m3, m2, strict=True)]
        tt = [1e3 * x["torch_fwdbwd"] for x in rows if "torch_fwdbwd" in x]
        tr = [1e3 * x["torch_fwdbwd"] / a for x, a in zip(rows, m3, strict=True) if "torch_fwdbwd" in x]
        lines.append(f"| {name} {tuple(rows[0]['shape'])} | {processes.fmt(processes.spread(m3))} | "
                     f"{processes.fmt(processes.spread(m2))} | {processes.fmt(processes.spread(ratio), 2)} | "
                     f"{processes.fmt(processes.spread(tt))} | {processes.fmt(processes.spread(tr), 1)} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="small,long", help="comma-separated subset of " + ", ".join(SHAPES))
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--torch-reps", type=int, default=1, help="calls of the torch reference at T >= 1024")
    ap.add_argument("--mamba-src", default=os.environ.get("SSM_MAMBA_REPO"),
                    help="a state-spaces/mamba tree (default: $SSM_MAMBA_REPO); none: no torch column")
    ap.add_argument("--json", help="(the parent) all processes' reports; (a child) its own")
    ap.add_argument("--md", help="write the table here too")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        rep = child(args)
        Path(args.json).write_text(json.dumps(rep))
        return 0
    argv = [*processes.without(sys.argv[1:], ("--json", "--md", "--processes")), "--child"]
    reports = processes.children(__file__, argv, args.processes)
    out = table(reports, args.shapes.split(","))
    ok = [r for r in reports if "failed" not in r]
    head = (f"{len(ok)} of {len(reports)} processes; CPU: {ok[0]['cpu'] if ok else '?'}, "
            f"{ok[0]['threads'] if ok else '?'} threads")
    if not args.mamba_src:
        head += "; no --mamba-src: no torch column"
    print("\n" + head + "\n\n" + out)
    if args.md:
        Path(args.md).write_text(head + "\n\n" + out + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1))
    return 0 if len(ok) == len(reports) else 1


if __name__ == "__main__":
    raise SystemExit(main())
