"""ggml's SSM_SCAN on one of its devices (default CUDA0) held to the float64 oracle on a fixed set of
problems that reach each path of ggml's CUDA kernel, beside ggml's CPU backend and ssm_vk; then,
optionally, ``ssm-scan fuzz`` of that device (docs/PORTING.md, "ggml's CUDA backend").

    SSM_GGML_LIB=build/ggml/NAME/lib python benchmarks/ggml_oracle.py [--backend ssm_ggml:CUDA0]
        [--out DIR] [--quick] [--only NAME,...] [--budget-s 300] [--fuzz-minutes M] [--threads N]
        [--no-cpu] [--no-vk] [--list]

On the GPU host, benchmarks/gpu_ggml_cuda.sh builds ggml with CUDA and runs this.

The paths (ggml-org/ggml src/ggml-cuda/ssm-scan.cu and supports_op, as of 2026-08), the ``CUDA path``
column being what that source would choose for the shape (read from the shape, not observed):

- ``scan``: the token-sequential Mamba-2 kernel (d_state 128 or 256, head_dim % 16 == 0): every
  T <= 128 (decode T = 1 included), and every K > 1 (the chunked path takes K == 1 only);
- ``ssd``: the chunked SSD prefill (Mamba-2, K == 1, 128 < T <= 8192, head_dim % 8 == 0, an NVIDIA
  GPU of compute capability 7.5 or newer): chunks of 256 tokens, float16 matrices through cuBLAS;
- ``mamba1``: the Mamba-1 kernel (d_state 16, head_dim 1, n_head % 128 == 0, one group, K == 1).

Per problem: the inputs of ``ssm_ref.testing.cases.make_problem`` (seed 0; the typical regime,
ggmlR's value ranges, unless the name says ``ld``: long_decay, A ~ -U(1e-3, 1e-2)); the float64
oracle, ``ssm_fast.oracle64`` (numba, parallel over (sequence, head)), with ``ssm_ref`` in float64
beside it on problems of at most --crosscheck-updates S*T*H*P*N (their agreement is held to
``ssm_ref.tolerance.F64_TOL``; a disagreement makes the exit code 1). Then each column runs the same
problem with K = the problem's snapshots: ggml's device (ssm_ggml, in a worker process, so an abort
is a finding with ggml's message), ggml's CPU backend of the same build (--no-cpu: left out), and
ssm_vk when a Vulkan device is present (--no-vk: left out).

Per output (y, states and, for K > 1, the snapshot slots k < T: the ones ggml writes, compared
in every column) the norm-relative error ||got - want|| / ||want|| against float64, and the share
of ssm_ref.tolerance's bound it used, with the bound the testing kit applies (F32_TOL scaled by
T / 16 beyond 16 tokens: ``ssm_ref.testing.properties._common.tol_for``); PASS when every output
is within. ggml's own measure beside it: the NMSE of test-backend-ops (sum (a - b)^2 / sum a^2
over the whole output: y, then the written state slots) against float64, and for the device
against ggml's CPU (what test-backend-ops itself compares), with test_ssm_scan's bound: 2e-7 for
Mamba-2 (head_dim > 1), 1e-7 for Mamba-1. ``seconds`` are the wall time of one call each
(the first call of a device includes its setup; transfers to and from the worker included): no
benchmark.

Problems left when --budget-s has passed are listed as not run. --fuzz-minutes M then runs two
``ssm-scan fuzz --supported-only --save DIR/findings/...`` of the device, about 2/3 of M on
shapes that reach the chunked path (Mamba-2, N = 128, P = 64, T 129..1024, long_decay up to 1024
tokens) and 1/3 on Mamba-1 (N = 16, P = 1, one group, H up to 256): the fuzzer draws H = G * (1..
max-H-per-G) with no lower bound, so an H that is a multiple of 128 (the only ones ggml's CUDA
Mamba-1 kernel takes) comes in about 1 of 100 draws; the rest are declined by supports_op and
counted as such in the fuzz's report. Each fuzz's output is kept in DIR/fuzz-*.log.

Writes DIR/ggml_oracle.json and DIR/ggml_oracle.md, both rewritten after every problem (a run cut
short leaves what it finished). Exit code 0 whenever the measurement ran, whatever ggml's errors
(they are the finding); 1 when the script itself could not run (no ggml build, no such device, a
bad argument), the two float64 oracles disagree, or a fuzz was refused its arguments.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ssm_ref  # noqa: E402
from ssm_ref.testing.cases import make_problem  # noqa: E402
from ssm_ref.testing.properties._common import tol_for  # noqa: E402
from ssm_ref.tolerance import F32_TOL, F64_TOL, compare, share_text  # noqa: E402

# ggml-cuda/ssm-scan.cu: SSM_SSD_MIN_TOKENS (the scan kernel up to it), SSM_SSD_MAX_TOKENS.
SSD_MIN_T, SSD_MAX_T = 128, 8192
# test-backend-ops, test_ssm_scan::max_nmse_err: float16 intermediates of the SSD path for head_dim > 1.
GGML_NMSE = {"mamba2": 2e-7, "mamba1": 1e-7}


@dataclass(frozen=True)
class Problem:
    name: str
    S: int
    T: int
    H: int
    P: int
    N: int
    G: int = 1
    K: int = 1
    variant: str = "mamba2"
    regime: str = "typical"
    R: int | None = None          # cache rows (None: S); ids pick S of them in shuffled order

    @property
    def updates(self) -> int:
        return self.S * self.T * self.H * self.P * self.N

    @property
    def path(self) -> str:
        """The CUDA path ggml's source picks for this shape (ggml_cuda_op_ssm_scan)."""
        if self.variant == "mamba1":
            return "mamba1"
        if self.K == 1 and SSD_MIN_T < self.T <= SSD_MAX_T and self.P % 8 == 0:
            return "ssd"
        return "scan"

    def case(self):
        return make_problem(0, S=self.S, T=self.T, H=self.H, P=self.P, N=self.N, G=self.G,
                            R=self.R or self.S, ids="permutation", variant=self.variant, regime=self.regime,
                            K=self.K)


def _m2(tag: str, T: int, S: int, H: int, P: int = 64, N: int = 128, **kw) -> Problem:
    k = kw.get("K", 1)
    ld = "-ld" if kw.get("regime") == "long_decay" else ""
    pre = f"k{k}-" if k > 1 else ""
    return Problem(f"{pre}{tag}-T{T}-S{S}{ld}", S, T, H, P, N, **kw)


def _m1(H: int, T: int, S: int) -> Problem:
    return Problem(f"m1-h{H}-T{T}-S{S}", S, T, H, 1, 16, variant="mamba1")


def full_problems() -> list[Problem]:
    """Mamba-2 at model sizes: h128p64 (128 heads of 64: Nemotron-H-like, G = 1; g8 with 8
    groups), h128p80 (head_dim 80: Nemotron-Nano-9B-like, test-backend-ops' SSD shapes), h24p64 and
    h48p64 (Mamba-2 130m / 780m-like), h32n256 (d_state 256: Falcon-H1's). Mamba-1: d_inner 1024,
    1536, 2048 as heads of one channel."""
    ps: list[Problem] = []
    # token-sequential kernel: decode (T = 1, S of R cache rows), short prompts, the last T before SSD
    ps += [_m2("dec-h128p64", 1, 4, 128, R=8), _m2("dec-h32n256", 1, 4, 32, N=256, R=8),
           _m2("dec-h24p64", 1, 1, 24),
           _m2("h24p64", 32, 4, 24), _m2("h128p64", 128, 1, 128), _m2("h32n256", 128, 2, 32, N=256)]
    # the chunked SSD prefill
    ps += [_m2("h128p64", T, 1, 128) for T in (129, 256, 300, 512, 1000, 2048, 8192)]
    ps += [_m2("h128p64", T, 4, 128) for T in (300, 2048)]
    ps += [_m2("h128p80", T, 1, 128, P=80) for T in (256, 512, 2048)]
    ps += [_m2("h24p64", T, 4, 24) for T in (129, 300, 1000, 8192)]
    ps += [_m2("h48p64", 512, 1, 48), _m2("h48p64", 2048, 4, 48)]
    ps += [_m2("h32n256", T, 1, 32, N=256) for T in (129, 512, 2048, 8192)] + [_m2("h32n256", 1000, 4, 32, N=256)]
    ps += [Problem("h128p64g8-T1000-S1", 1, 1000, 128, 64, 128, G=8)]
    ps += [_m2("h128p64", 2048, 1, 128, regime="long_decay"), _m2("h24p64", 8192, 1, 24, regime="long_decay")]
    # Mamba-1
    ps += [_m1(1024, T, 4) for T in (1, 32, 512)] + [_m1(1536, T, 1) for T in (1, 32, 512, 2048)]
    ps += [_m1(2048, T, 2) for T in (1, 32, 512)]
    # K state snapshots (the scan kernel at every T)
    ps += [_m2("dec-h128p64", 1, 4, 128, R=8, K=2), _m2("h128p64", 2, 2, 128, K=4),
           _m2("h24p64", 129, 1, 24, K=4), _m2("h128p64", 512, 1, 128, K=2), _m2("h24p64", 1000, 4, 24, K=4),
           _m2("h32n256", 300, 2, 32, N=256, K=4)]
    # the largest: 4 sequences of 8192 tokens at 128 heads (x 1 GiB in float32)
    ps += [_m2("h128p64", 8192, 4, 128)]
    return ps


def quick_problems() -> list[Problem]:
    """Every path at small sizes, for a CPU device (a test of the script)."""
    return [_m2("dec-h4p16", 1, 2, 4, P=16, R=3), _m2("h2p16", 32, 2, 2, P=16),
            _m2("h2p16", 129, 2, 2, P=16), _m2("h2p64", 300, 1, 2), _m2("h2n256", 129, 1, 2, P=16, N=256),
            _m2("h2p16", 300, 1, 2, P=16, regime="long_decay"),
            _m1(128, 32, 2), _m1(128, 129, 1),
            _m2("h2p16", 129, 1, 2, P=16, K=2), _m2("h2p16", 2, 2, 2, P=16, K=4)]


# --------------------------------------------------------------------------------------------- columns

class GgmlColumns:
    """ssm_ggml on the chosen device and on the same build's CPU device, in one worker process.

    ``ssm_ggml.use`` frees every ggml backend and ends the worker (a CUDA context and its cuBLAS
    handle each time), so the CPU column switches the configured device in place instead: the
    worker keeps a backend per device, and ssm_ggml reads the device from its configuration on
    every call."""

    def __init__(self, device: str, lib: str | None, threads: int | None):
        import ssm_ggml

        self.g = ssm_ggml
        self.device = device
        self.info = ssm_ggml.use(device, lib=lib, threads=threads, isolate=True)

    def run(self, device: str, args: dict, K: int):
        cfg = self.g.config()
        keep = cfg.device
        cfg.device = device
        try:
            r = self.g.ssm_scan(**args, snapshots=K)
        finally:
            cfg.device = keep
        return r


def vk_column(enabled: bool):
    """ssm_vk's module when a Vulkan device is present (and not left out), else (None, why)."""
    if not enabled:
        return None, "left out (--no-vk)"
    try:
        import ssm_vk

        ok, why = ssm_vk.runtime.available()
        if not ok:
            return None, f"no Vulkan device ({why})"
        dev = ssm_vk.runtime.get_context().info
        return ssm_vk, f"{dev.name} ({dev.type})"
    except Exception as e:  # any failure to start Vulkan means: no such column
        return None, f"no Vulkan device ({type(e).__name__}: {e})"


# --------------------------------------------------------------------------------------------- measures

def _host(a) -> np.ndarray:
    return np.asarray(a.numpy() if hasattr(a, "numpy") and not isinstance(a, np.ndarray) else a)


def outputs_of(r, K: int, T: int) -> dict:
    """y, states and (K > 1) the snapshot slots k < T, as host arrays."""
    out = {"y": _host(r.y), "states": _host(r.states)}
    if K > 1:
        out["snapshots"] = _host(r.snapshots)[:min(K, T)]
    return out


def nmse(got: dict, want: dict) -> float:
    """test-backend-ops' NMSE of a column against a reference, over the output ggml writes: y then
    the state slots (``states`` alone for K = 1, the written snapshot slots, slot 0 = states,
    for K > 1). Non-finite entries where the reference has none: inf."""
    slots = ["y", "snapshots" if "snapshots" in want else "states"]
    num = den = 0.0
    for k in slots:
        a = np.asarray(want[k], dtype=np.float64)
        b = np.asarray(got[k], dtype=np.float64)
        if a.size == 0:
            continue
        if not np.isfinite(b).all() and np.isfinite(a).all():
            return math.inf
        d = b - a
        num += float(np.sum(d * d))
        den += float(np.sum(a * a))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def judge(got: dict, want: dict, tol: dict) -> dict:
    res = {}
    for k, w in want.items():
        c = compare(k, got[k], w, tol[k])
        res[k] = {"rel": c.rel, "used": c.used, "ok": c.ok, "rel_bound": c.rel_bound, "max_rel": c.max_rel,
                  "detail": c.detail or c.worst()}
    return res


# --------------------------------------------------------------------------------------------- report

def _fmt(v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if math.isinf(v):
        return "inf"
    return "0" if v == 0 else f"{v:.1e}"


def _cell(col: dict | None, out: str) -> str:
    if not col:
        return "-"
    if col.get("error"):
        return "ERROR"
    o = col["outputs"].get(out)
    if o is None:
        return "-"
    share = share_text(o["used"], short=True)
    where = "" if col.get("where_ok", True) else f" [{col['where']}]"
    return f"{_fmt(o['rel'])} ({share}){'' if o['ok'] else ' FAIL'}{where}"


def markdown(report: dict) -> str:
    cols = report["columns"]
    names = [c["label"] for c in cols]
    lines = [f"# ggml's SSM_SCAN on {report['device']} against the float64 oracle", ""]
    b = report["build"]
    lines += [f"- date: {report['date']}; host: {report['host']}",
              f"- ggml build: {b.get('folder')} (ggml {b.get('version')}, {b.get('api')}); "
              f"source: {(b.get('recipe') or {}).get('source', 'unknown')}",
              f"- cmake flags: {(b.get('recipe') or {}).get('flags', 'unknown')}",
              f"- device: {report['device']} ({report['device_description']}); GPU: {report.get('gpu') or '-'}",
              "- columns: " + "; ".join(f"{c['label']}: {c['what']}" for c in cols),
              f"- oracle: ssm_fast.oracle64 (float64); ssm_ref float64 beside it up to "
              f"{report['crosscheck_updates']:.2g} updates (S*T*H*P*N): {report['crosscheck']}",
              "- cell: norm-relative error vs float64 (share of ssm_ref.tolerance's bound, scaled by T as "
              "the testing kit does); FAIL beyond the bound; [CPU] when the device declined the shape and "
              "it ran on the CPU (ggml's CPU backend; ssm_fast for ssm_vk); CUDA path: the path ggml's CUDA "
              "source picks for the shape", ""]
    head = "| problem | CUDA path | S T H P N G K | output | bound (rel) | " + " | ".join(names) + " |"
    lines += [head, "|" + "---|" * (5 + len(names))]
    rows = sorted(report["rows"], key=lambda r: r["index"])       # the problems' order, grouped by path
    for row in rows:
        d = row["dims"]
        dims = f"{d['S']} {d['T']} {d['H']} {d['P']} {d['N']} {d['G']} {d['K']}"
        label = row["name"] + (" (long_decay)" if row["regime"] == "long_decay" else "")
        if row.get("skipped"):
            why = row["skipped"].splitlines()[0]
            lines.append(f"| {label} | {row['path']} | {dims} | ({why}) | - | " + " | ".join("not run" for _ in names)
                         + " |")
            continue
        for out, rb in row["rel_bound"].items():
            cells = [_cell(row["columns"].get(n), out) for n in names]
            lines.append(f"| {label} | {row['path']} | {dims} | {out} | {_fmt(rb)} | " + " | ".join(cells) + " |")
    lines += ["", "## ggml's own measure: NMSE of the whole output (test-backend-ops)", ""]
    dev = names[0]
    extra = names[1:]
    has_cpu = "ggml CPU" in extra          # the device's NMSE against ggml's CPU, test-backend-ops' comparison
    head = (["problem", "CUDA path", "ggml's bound"] + [f"{n} vs float64" for n in names]
            + ([f"{dev} vs ggml CPU"] if has_cpu else [])
            + [f"{dev} within ggml's bound ({'vs CPU / ' if has_cpu else ''}vs float64)", f"{dev} within ours"])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        if row.get("skipped"):
            continue
        c = row["columns"]
        dcol = c.get(dev) or {}
        vals = [_fmt((c.get(n) or {}).get("nmse")) if not (c.get(n) or {}).get("error") else "ERROR"
                for n in [dev, *extra]]
        vs_cpu = dcol.get("nmse_vs_cpu")
        bound = row["ggml_nmse_bound"]
        mine = "ERROR" if dcol.get("error") else ("yes" if dcol.get("ok") else "no")
        own = "ERROR" if dcol.get("error") else (
            (f"{'-' if vs_cpu is None else ('yes' if vs_cpu <= bound else 'no')} / " if has_cpu else "")
            + f"{'yes' if dcol.get('nmse', math.inf) <= bound else 'no'}")
        lines.append(f"| {row['name']} | {row['path']} | {bound:.0e} | " + " | ".join(vals)
                     + (f" | {_fmt(vs_cpu)}" if has_cpu else "") + f" | {own} | {mine} |")
    lines += ["", "## Summary", ""] + [f"- {s}" for s in report["summary"]]
    errs = [(row["name"], n, col["error"]) for row in report["rows"] for n, col in row.get("columns", {}).items()
            if col and col.get("error")]
    if errs:
        lines += ["", "## Errors", ""] + [f"- {p} on {n}: `{e.splitlines()[0][:300]}`" for p, n, e in errs]
    fails = [(row["name"], n, k, o["detail"]) for row in report["rows"] for n, col in row.get("columns", {}).items()
             if col and not col.get("error") for k, o in col["outputs"].items() if not o["ok"]]
    if fails:
        lines += ["", "## Worst elements of the outputs beyond the bound", ""]
        lines += [f"- {p} {k} on {n}: {d}" for p, n, k, d in fails]
    for f in report.get("fuzz", []):
        lines += ["", f"## ssm-scan fuzz: {f['what']}", "", f"`{' '.join(f['command'])}`", "",
                  (f"exit code {f['returncode']}{' (timed out)' if f.get('timed_out') else ''}; "
                   f"{f['seconds']:.0f} s; " if f["returncode"] is not None else "stopped before it ended; ")
                  + f"output in {f['log']}", "", "```", *f["tail"], "```"]
    for n in report.get("notes", []):
        lines += ["", n]
    return "\n".join(lines) + "\n"


def summary(report: dict) -> list[str]:
    rows = [r for r in report["rows"] if not r.get("skipped")]
    out = []
    for c in report["columns"]:
        n = c["label"]
        ran = [r for r in rows if r["columns"].get(n)]
        if not ran:
            continue
        err = [r["name"] for r in ran if r["columns"][n].get("error")]
        ok = [r for r in ran if not r["columns"][n].get("error")]
        within = [r for r in ok if r["columns"][n]["ok"]]
        own = [r for r in ok if r["columns"][n]["nmse"] <= r["ggml_nmse_bound"]]
        by_path = {}
        for r in ok:
            p = by_path.setdefault(r["path"], [0, 0])
            p[0] += r["columns"][n]["ok"]
            p[1] += 1
        paths = ", ".join(f"{p} {a}/{b}" for p, (a, b) in sorted(by_path.items()))
        line = (f"{n}: {len(within)} of {len(ok)} problems within ssm_ref.tolerance ({paths}); "
                f"{len(own)} of {len(ok)} within ggml's NMSE bound against float64")
        if n == report["columns"][0]["label"]:
            vs = [r for r in ok if r["columns"][n].get("nmse_vs_cpu") is not None]
            own_cpu = [r for r in vs if r["columns"][n]["nmse_vs_cpu"] <= r["ggml_nmse_bound"]]
            if vs:
                line += f", {len(own_cpu)} of {len(vs)} against ggml's CPU (test-backend-ops' comparison)"
        if err:
            line += f"; errors on {len(err)}: {', '.join(err)}"
        out.append(line)
    skipped = [r for r in report["rows"] if r.get("skipped")]
    if skipped:
        out.append("not run: " + "; ".join(f"{r['name']} ({r['skipped'].splitlines()[0]})" for r in skipped))
    return out


# --------------------------------------------------------------------------------------------- fuzz

def fuzz_runs(device: str, out: Path, minutes: float) -> list[dict]:
    """The two fuzz commands of the module docstring, ``minutes`` shared 2 : 1."""
    backend = f"ssm_ggml:{device}"
    base = [sys.executable, "-m", "ssm_cli", "fuzz", "--backend", backend, "--supported-only", "--seed", "0"]
    chunked = ["--variant", "mamba2", "--min-N", "128", "--max-N", "128", "--min-P", "64", "--max-P", "64",
               "--min-T", "129", "--max-T", "1024", "--max-T-long", "1024", "--max-elements", "4000000"]
    mamba1 = ["--variant", "mamba1", "--min-N", "16", "--max-N", "16", "--max-P", "1", "--max-G", "1",
              "--max-H-per-G", "256", "--min-T", "1", "--max-T", "600", "--max-elements", "2000000"]
    runs = [("chunked", "Mamba-2 shapes that reach the chunked SSD path (N 128, P 64, T 129..1024)", chunked,
             minutes * 2 / 3),
            ("mamba1", "Mamba-1 (N 16, P 1, G 1, H 1..256: a multiple of 128 in about 1 of 100 draws)", mamba1,
             minutes / 3)]
    return [dict(tag=t, what=w, command=[*base, "--minutes", f"{m:.2f}", *extra, "--save",
                                         str(out / "findings" / t)], minutes=m)
            for t, w, extra, m in runs]


def run_fuzz(spec: dict, out: Path, env: dict) -> dict:
    """One fuzz command, its output in DIR/fuzz-TAG.log, stopped a while after its minutes. It runs
    in a process group of its own (the same session, so the command that started this script
    still ends it), killed whole, ggml's worker included, when this script stops it or is stopped."""
    log = out / f"fuzz-{spec['tag']}.log"
    t0 = time.monotonic()
    timed_out = False
    with open(log, "w") as f:
        p = subprocess.Popen(spec["command"], stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env, process_group=0)
        try:
            rc = p.wait(timeout=spec["minutes"] * 60 + 45)        # shrinking a failure takes a while
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
            rc = p.wait()
    text = log.read_text(errors="replace").splitlines()
    return dict(spec, returncode=rc, timed_out=timed_out, seconds=time.monotonic() - t0,
                log=log.name, tail=text[-60:])


# --------------------------------------------------------------------------------------------- main

def _gpu_name() -> str:
    if not shutil.which("nvidia-smi"):
        return ""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return r.stdout.strip().replace("\n", "; ")
    except (OSError, subprocess.SubprocessError):
        return ""


def measure(prob: Problem, ggml: GgmlColumns, columns: list[dict], vk, crosscheck_updates: float) -> dict:
    case = prob.case()
    args = case.args()
    K, T = prob.K, prob.T
    from ssm_fast.oracle64 import scan64

    t0 = time.perf_counter()
    want = outputs_of(scan64(**args, snapshots=K), K, T)
    row = {"name": prob.name, "path": prob.path, "variant": prob.variant, "regime": prob.regime,
           "dims": {**case.dims, "K": K}, "updates": prob.updates, "recipe": case.recipe,
           "oracle_s": time.perf_counter() - t0, "ggml_nmse_bound": GGML_NMSE[prob.variant], "columns": {}}
    if prob.updates <= crosscheck_updates:
        ref = outputs_of(ssm_ref.ssm_scan(**args, dtype=np.float64, snapshots=K), K, T)
        t64 = tol_for(F64_TOL, case)
        cmp = judge(want, ref, t64)
        row["crosscheck"] = {"ok": all(c["ok"] for c in cmp.values()),
                             "used": max(c["used"] for c in cmp.values())}
    tol = tol_for(F32_TOL, case)
    row["rel_bound"] = {k: float(compare(k, w, w, tol[k]).rel_bound) for k, w in want.items()}
    gots = {}
    for col in columns:
        t1 = time.perf_counter()
        res: dict = {}
        try:
            if col["kind"] == "vk":
                r = vk.ssm_scan(**args, snapshots=K)
            else:
                r = ggml.run(col["device"], args, K)
            got = outputs_of(r, K, T)
            # a declined shape runs on the CPU: ggml's CPU backend, or ssm_fast for ssm_vk (where "CPU")
            where_ok = str(r.where) == col["device"] if col["kind"] == "ggml" else str(r.where) != "CPU"
            res = {"where": str(r.where), "where_ok": where_ok,
                   "outputs": judge(got, want, tol), "nmse": nmse(got, want)}
            res["ok"] = all(o["ok"] for o in res["outputs"].values())
            gots[col["label"]] = got
        except Exception as e:  # ggml's abort, a failed compute, an overrun: a finding
            res = {"error": f"{type(e).__name__}: {e}", "ok": False}
        res["seconds"] = time.perf_counter() - t1
        row["columns"][col["label"]] = res
    dev, cpu = columns[0]["label"], "ggml CPU"
    if dev != cpu and dev in gots and cpu in gots:
        row["columns"][dev]["nmse_vs_cpu"] = nmse(gots[dev], gots[cpu])   # ggml CPU as test-backend-ops' reference
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="ssm_ggml:CUDA0", help="ssm_ggml:DEVICE (default ssm_ggml:CUDA0)")
    ap.add_argument("--lib", default=None, help="the ggml build's lib folder (default: $SSM_GGML_LIB)")
    ap.add_argument("--out", default="out/ggml-oracle", help="folder for ggml_oracle.json, .md and the fuzz logs")
    ap.add_argument("--quick", action="store_true", help="every path at small sizes (a test on a CPU device)")
    ap.add_argument("--only", default="", help="comma-separated problem names (--list shows them)")
    ap.add_argument("--list", action="store_true", help="print the problems and exit")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="start no problem after this many seconds (the fuzz runs after, on its own time)")
    ap.add_argument("--fuzz-minutes", type=float, default=0.0, help="then fuzz the device this long (0: no fuzz)")
    ap.add_argument("--threads", type=int, default=min(os.cpu_count() or 1, 16),
                    help="threads of ggml's CPU backend (default: the cores, at most 16)")
    ap.add_argument("--crosscheck-updates", type=float, default=2.5e8,
                    help="run ssm_ref float64 beside the oracle up to this many S*T*H*P*N")
    ap.add_argument("--no-cpu", action="store_true", help="leave out ggml's CPU column")
    ap.add_argument("--no-vk", action="store_true", help="leave out ssm_vk")
    a = ap.parse_args(argv)
    # a SIGTERM (the time limit of gpu_ggml_cuda.sh) ends this process through its finally blocks,
    # so that a running fuzz is stopped with it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))

    t_start = time.monotonic()
    probs = quick_problems() if a.quick else full_problems()
    if a.only:
        want = a.only.split(",")
        unknown = [n for n in want if n not in {p.name for p in probs}]
        if unknown:
            ap.error(f"--only: unknown problem(s) {unknown}; --list shows them")
        probs = [p for p in probs if p.name in want]
    if a.list:
        for p in probs:
            print(f"{p.name:28s} {p.path:6s} S={p.S} T={p.T} H={p.H} P={p.P} N={p.N} G={p.G} K={p.K} "
                  f"{p.regime} updates={p.updates:.2e}")
        return 0
    if not a.backend.startswith("ssm_ggml:") or a.backend == "ssm_ggml:":
        ap.error(f"--backend: expected ssm_ggml:DEVICE (ssm_ggml:CUDA0, ssm_ggml:CPU), got {a.backend!r}")
    device = a.backend.split(":", 1)[1]
    lib = a.lib or os.environ.get("SSM_GGML_LIB")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    try:
        ggml = GgmlColumns(device, lib, a.threads)
    except Exception as e:  # no build, no such device: the script cannot run
        print(f"ggml_oracle: cannot use ggml's {device}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    info = ggml.info
    desc = dict(info["devices"]).get(device, "")
    if not info["has_k"]:
        print(f"ggml_oracle: the build at {info['build']['folder']} takes no K: the K > 1 problems will fail "
              "with the reason (a build of ggml-org/ggml 66d09fae, 2026-08-14, or newer has K)", file=sys.stderr)
    columns = [dict(label=f"ggml {device}", kind="ggml", device=device, what=f"ssm_ggml on {device} ({desc})")]
    if not a.no_cpu and device != "CPU":
        columns.append(dict(label="ggml CPU", kind="ggml", device="CPU",
                            what=f"ssm_ggml on the same build's CPU backend, {a.threads} threads"))
    vk, vk_what = vk_column(not a.no_vk)
    if vk is not None:
        columns.append(dict(label="ssm_vk", kind="vk", device=None, what=f"ssm_vk on {vk_what}"))
    report = {"date": _dt.datetime.now().isoformat(timespec="seconds"), "device": device,
              "device_description": desc,
              "host": f"{platform.node()}, {os.cpu_count()} cores, {platform.platform()}", "gpu": _gpu_name(),
              "build": info["build"], "has_k": info["has_k"],
              "columns": [{k: v for k, v in c.items() if not k.startswith("_")} for c in columns],
              "crosscheck_updates": a.crosscheck_updates, "crosscheck": "-", "rows": [], "summary": [],
              "fuzz": [], "notes": [] if vk is not None else [f"ssm_vk: {vk_what}."],
              "problems": [asdict(p) for p in probs]}
    print(f"ggml {info['build'].get('version')} at {info['build']['folder']}; device {device} ({desc}); "
          f"columns: {', '.join(c['label'] for c in columns)}", flush=True)

    def write():
        report["summary"] = summary(report)
        cc = [r["crosscheck"] for r in report["rows"] if "crosscheck" in r]
        if cc:
            report["crosscheck"] = (f"{sum(c['ok'] for c in cc)} of {len(cc)} problems agree within "
                                    f"ssm_ref.tolerance.F64_TOL (at most {max(c['used'] for c in cc):.1%} of it)")
        (out / "ggml_oracle.json").write_text(json.dumps(report, indent=1, default=float))
        (out / "ggml_oracle.md").write_text(markdown(report))

    def not_run(i: int, prob: Problem, why: str) -> dict:
        return {"index": i, "name": prob.name, "path": prob.path, "regime": prob.regime,
                "dims": {"S": prob.S, "T": prob.T, "H": prob.H, "P": prob.P, "N": prob.N, "G": prob.G, "K": prob.K},
                "skipped": why}

    # cheapest first, so that a budget cut leaves the most problems measured (the tables keep the
    # problems' own order, grouped by path)
    for i, prob in sorted(enumerate(probs), key=lambda ip: ip[1].updates):
        if time.monotonic() - t_start > a.budget_s:
            report["rows"].append(not_run(i, prob, f"over the {a.budget_s:.0f} s budget"))
            continue
        try:
            row = measure(prob, ggml, columns, vk, a.crosscheck_updates)
            row["index"] = i
        except Exception:  # the script's own failure on one problem: recorded, the run goes on
            report["rows"].append(not_run(i, prob, "the script failed: " + traceback.format_exc(limit=3)))
            print(f"{prob.name}: the script failed\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            write()
            continue
        report["rows"].append(row)
        parts = []
        for c in columns:
            col = row["columns"][c["label"]]
            if col.get("error"):
                parts.append(f"{c['label']}: ERROR {col['error'].splitlines()[0][:120]}")
                continue
            errs = " ".join(f"{k} {_fmt(o['rel'])}{'' if o['ok'] else '!'}" for k, o in col["outputs"].items())
            parts.append(f"{c['label']}[{col['where']}]: {errs} nmse {_fmt(col['nmse'])} {col['seconds']:.1f}s")
        print(f"{prob.name:26s} {prob.path:6s} oracle {row['oracle_s']:.1f}s | " + " | ".join(parts), flush=True)
        write()

    script_broke = any(r.get("skipped", "").startswith("the script failed") for r in report["rows"])
    disagree = [r["name"] for r in report["rows"] if "crosscheck" in r and not r["crosscheck"]["ok"]]
    if disagree:
        report["notes"].append(f"ssm_fast.oracle64 and ssm_ref float64 DISAGREE on {', '.join(disagree)}: "
                               "the errors above are not measured against a trusted oracle.")
    write()

    if a.fuzz_minutes > 0:
        ggml.g.close()                          # the fuzz's own worker takes the GPU
        env = dict(os.environ)
        if lib:
            env["SSM_GGML_LIB"] = str(Path(lib).resolve())
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        for spec in fuzz_runs(device, out.resolve(), a.fuzz_minutes):
            print(f"fuzz ({spec['tag']}, {spec['minutes']:.2f} min): {' '.join(spec['command'][1:])}", flush=True)
            # listed before it runs: a run stopped by the time limit still names its log
            report["fuzz"].append(dict(spec, returncode=None, timed_out=False, seconds=0.0,
                                       log=f"fuzz-{spec['tag']}.log", tail=["(stopped before it ended: see the log)"]))
            write()
            res = run_fuzz(spec, out, env)
            report["fuzz"][-1] = res
            print("\n".join(res["tail"][-25:]), flush=True)
            write()
    fuzz_refused = [f["tag"] for f in report["fuzz"] if f["returncode"] in (2, 3)]

    print("\n".join(report["summary"]))
    print(f"written: {out / 'ggml_oracle.md'}, {out / 'ggml_oracle.json'}")
    if script_broke or disagree or fuzz_refused:
        print(f"ggml_oracle: the script did not run cleanly (failed problems: {script_broke}, oracles disagree: "
              f"{disagree}, fuzz refused: {fuzz_refused})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
