"""ssm_vk beside mamba_ssm (state-spaces/mamba) on one NVIDIA GPU: Mamba-2, Mamba-1 and decode steps,
forward and forward + backward, interleaved round by round, in several fresh processes, with the
error of both against the float64 oracle.

    python benchmarks/vs_mamba_ssm.py --mamba-src PATH [--processes 3] [--workloads m2-train,dec-16]
        [--rounds 5] [--reps 20] [--json out.json] [--md out.md] [--build-dir DIR] [--budget-s 480]
        [--no-peer] [--build-only] [--small] [--clocks CLOCKS.csv] [--invariant] [--no-accuracy]
    python benchmarks/vs_mamba_ssm.py --merge a.json b.json [--md out.md] [--json out.json]

Several processes (``--processes N``, 3 by default): the whole measurement runs in N fresh
interpreters one after another (benchmarks/processes.py), because mamba_ssm's Triton kernels time
their configurations anew in each process and its time at one shape moves between processes. Each
row reports, over the processes, the median and the range (minimum-maximum) of each side's median
time and of the ratio, the ratio always formed within one process. The float64 check runs in the
first process only. The JSON keeps every process's own report. ``--merge`` summarises the JSON of
runs made in separate commands (one process or several each) the same way. ``--processes 1``: one
process, its own table (what each process of a run prints).

On the GPU host: ``. benchmarks/gpu_env.sh`` first (Vulkan loader, wheels, the clock log).

mamba_ssm's code is not part of this repository: it is loaded at run time from ``--mamba-src``, a
source tree of state-spaces/mamba (``mamba_ssm/`` and ``csrc/selective_scan/`` at least).

- Mamba-2 (``m2-*``, one A per head): ``mamba_chunk_scan_combined`` (Triton, chunk 256, initial and
  final states, ``dt_softplus=True``). Its package is copied into a temporary folder with an empty
  ``mamba_ssm/__init__.py``, so none of its CUDA extensions is needed.
- Mamba-1 (``m1-*``, P = 1, A (H, N)): the CUDA kernel ``selective_scan_cuda``, built from
  ``csrc/selective_scan`` with ``torch.utils.cpp_extension.load`` and the nvcc flags of mamba's
  setup.py for this GPU's compute capability only, then called through mamba's own
  ``selective_scan_fn`` (or ``fwd`` / ``bwd`` directly when that module does not import). The build
  runs in a child process killed at the time budget; ninja keeps what it finished in
  ``--build-dir``, so a second run continues it. The build takes minutes: where commands are cut
  at 600 s, run ``--build-only`` as a command of its own first, on the same host. mamba's
  Mamba-1 scan starts from zero (ssm_vk gets s = 0) and its backward ignores the gradient of the
  last state (both get g_states = 0).
- Decode (``dec-*``, T = 1, S sequences reading S of R cache rows): ``selective_state_update``
  (Triton) with ``state_batch_indices``, head dim tied (stride-0 dt, A, D, dt_bias), updating the
  cache in place; ssm_vk returns the S new states.

What is timed, per workload and op: ``--rounds`` rounds, mamba_ssm then ssm_vk in even rounds and
the reverse in odd ones, each side ``--warm-s`` of back-to-back calls (the clocks ramp under load)
then ``--reps`` timed calls on device-resident inputs. GPU time: mamba_ssm's is CUDA events recorded
before and after the call on its stream (gaps between its kernel launches included); ssm_vk's is the
timestamps of its recorded command buffer (``ssm_vk.run.last_gpu_ns``), forward plus backward for
fwd+bwd. Wall time: the call and, for mamba_ssm, ``torch.cuda.synchronize()`` (ssm_vk's calls
return when the GPU is done). mamba_ssm's fwd+bwd is its autograd path (``torch.autograd.grad``
with given gradients of y and the final states). Medians over all rounds; ratio = mamba_ssm's time /
ssm_vk's time, a speed ratio (above 1: ssm_vk faster). The ``prepared`` ops (decode steps, the demo step) time
ssm_vk's same call prepared once (``ssm_vk.prepare_scan`` / ``prepare_scan_back``) and replayed
with ``run()``, beside the peer's same call: what an engine's loop pays per call.

Accuracy, once per workload (after the timing): the norm-relative error of y, the final states and
(fwd+bwd) d_x, d_dt, d_A, d_B, d_C, d_s of both against ``ssm_ref`` in float64 with
``dt_softplus="log1p"`` (ssm_vk's calls use that form too, as torch's softplus). Above
``--check-updates`` updates (S*T*H*P*N) the check runs on the first sequences and tokens only
(noted in the table), since the float64 oracle runs on one core and keeps T+1 states.

Shapes: S sequences, T tokens, H heads (Mamba-1: channels), P head dim, N state size, G groups
(1 here), R cache rows.

``--invariant`` times a third side in the same rounds: ssm_vk with ``invariant=True`` (docs/SPEC.md
section 3.2), its GPU (wall) time, its cost against the default (invariant / default) and its
error against the oracle (docs/BENCHMARKS.md's table of what the invariant mode costs).

Every workload runs in its own try block; workloads left when ``--budget-s`` has passed are
skipped with a note. ``--no-peer`` runs the ssm_vk side alone (no torch needed); ``--small``
divides every workload's T and H by 8 (a quick run on a CPU Vulkan device such as lavapipe).
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import glob
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

import ssm_ref
import ssm_vk
from ssm_vk import run as vk_run

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import vs_mamba3 as m3
from processes import Spread, children, fmt, spread, without
from vk_gpu_check import inputs, rel, vk_timed, warm

FORM = "log1p"   # dt_softplus of every ssm_vk and oracle call: torch's and mamba's softplus
GRADS = ("d_x", "d_dt", "d_A", "d_B", "d_C", "d_s")
CHUNK = 256      # mamba_chunk_scan_combined's chunk_size
DEC_P, DEC_N = 64, 128

WORKLOADS = {  # name: (family, dims); mamba2 / mamba1: S, T, H, P, N; decode: S of R rows, H
    "m2-demo": ("mamba2", dict(S=1, T=64, H=16, P=64, N=128)),
    "m2-train": ("mamba2", dict(S=8, T=2048, H=24, P=64, N=128)),
    "m2-long": ("mamba2", dict(S=1, T=16384, H=24, P=64, N=128)),
    "dec-1": ("decode", dict(S=1, R=64, H=80)),
    "dec-16": ("decode", dict(S=16, R=64, H=80)),
    "dec-128": ("decode", dict(S=128, R=256, H=48)),
    "m1-512": ("mamba1", dict(S=1, T=512, H=1536, P=1, N=16)),
    "m1-train": ("mamba1", dict(S=8, T=2048, H=1536, P=1, N=16)),
    "m1-long": ("mamba1", dict(S=1, T=16384, H=1536, P=1, N=16)),
    "m1-wide": ("mamba1", dict(S=4, T=1024, H=5120, P=1, N=16)),
    **m3.WORKLOADS,   # Mamba-3 (benchmarks/vs_mamba3.py): m3-* and m3dec-*
}
M3 = ("mamba3", "m3decode")
# Where a prepared call (ssm_vk.prepare_scan: recorded once, replayed) is timed too, beside the
# peer's same call: the decode steps and the demo training step, whose wall time is mostly the host's.
OPS = {"dec-1": ("fwd", "fwd prepared"), "dec-16": ("fwd", "fwd prepared"), "dec-128": ("fwd", "fwd prepared"),
       "m2-demo": ("fwd", "fwd+bwd", "fwd+bwd prepared"),
       **{n: ("fwd", "fwd prepared") for n, (fam, _) in m3.WORKLOADS.items() if fam == "m3decode"}}

# Decode and Mamba-2 come before Mamba-1: the first m1 workload waits for the CUDA build.


# -- problems (numpy, ssm_vk's layout) ---------------------------------------------------------------

def shrink(family: str, dims: dict, f: int = 8) -> dict:
    d = dict(dims)
    d["H"] = max(1, d["H"] // f)
    if "T" in d:
        d["T"] = max(8, d["T"] // f)
    return d


def problem(family: str, dims: dict, seed: int = 0) -> dict:
    """Inputs a (s, x, dt, A, B, C as ssm_ref takes them, float32), ids, g_y, g_states (None for
    decode). G = 1. Mamba-1: s = 0 and g_states = 0 (mamba's Mamba-1 has neither). Mamba-3:
    vs_mamba3.problem's."""
    if family in M3:
        return m3.problem(family, dims, seed)
    if family == "decode":
        S, R, H = dims["S"], dims["R"], dims["H"]
        rng = np.random.default_rng(seed)

        def u(lo, hi, sh):
            return rng.uniform(lo, hi, sh).astype(np.float32)

        a = dict(s=u(-0.5, 0.5, (R, H, DEC_P, DEC_N)), x=u(-1, 1, (S, 1, H, DEC_P)), dt=u(-1, 1, (S, 1, H)),
                 A=-u(0.2, 1.0, (H,)), B=u(-0.5, 0.5, (S, 1, 1, DEC_N)), C=u(-0.5, 0.5, (S, 1, 1, DEC_N)))
        ids = rng.choice(R, S, replace=False).astype(np.int64)   # (S,) distinct cache rows
        return dict(family=family, a=a, ids=ids, g_y=None, g_states=None)
    S, T, H, P, N = (dims[k] for k in "STHPN")
    a, g_y, g_states = inputs((S, T, H, P, N, 1, family), seed)
    if family == "mamba1":
        a["s"] = np.zeros_like(a["s"])                # (S, H, 1, N)
        g_states = np.zeros_like(g_states)            # (S, H, 1, N)
    return dict(family=family, a=a, ids=None, g_y=g_y, g_states=g_states)


def check_slice(p: dict, cap: float) -> tuple[dict, str]:
    """``p`` itself when it has at most ``cap`` updates, else its first sequences (2, or 1 when
    that leaves fewer than 512 tokens) and tokens (a multiple of 64), with a note saying which."""
    if p["family"] in M3:
        return m3.check_slice(p, cap)
    if p["family"] == "decode":
        return p, ""
    S, T, H, P = p["a"]["x"].shape
    N = p["a"]["B"].shape[-1]
    if S * T * H * P * N <= cap:
        return p, ""
    S2 = min(S, 2)
    if cap // (S2 * H * P * N) < 512:
        S2 = 1
    T2 = int(min(T, max(64, cap // (S2 * H * P * N) // 64 * 64)))
    if (S2, T2) == (S, T):
        return p, ""
    a = p["a"]
    a = dict(s=a["s"][:S2], x=a["x"][:S2, :T2], dt=a["dt"][:S2, :T2], A=a["A"], B=a["B"][:S2, :T2],
             C=a["C"][:S2, :T2])
    q = dict(p, a=a, g_y=p["g_y"][:S2, :T2], g_states=p["g_states"][:S2])
    return q, f"checked on S={S2}, T={T2}"


def oracle(p: dict, backward: bool) -> dict:
    if p["family"] in M3:
        return m3.oracle(p, backward)
    r = ssm_ref.ssm_scan(**p["a"], ids=p["ids"], dtype=np.float64, dt_softplus=FORM)
    out = {"y": r.y, "states": r.states}
    if backward:
        g = ssm_ref.ssm_scan_back(**p["a"], ids=p["ids"], g_y=p["g_y"], g_states=p["g_states"], dtype=np.float64,
                                  dt_softplus=FORM)
        out.update({k: getattr(g, k) for k in GRADS})
    return out


# -- ssm_vk -----------------------------------------------------------------------------------------

def ours_side(p: dict, invariant: bool = False) -> dict:
    """Timed calls of ssm_vk on device-resident inputs: {"fwd", "fwd+bwd" (not for decode): () ->
    (GPU us, wall us), "outputs": () -> numpy dict, "where": () -> str, "close"}. ids stay a numpy
    array (as an engine passes them per token; a DeviceArray of ids is read back for the range check).
    ``invariant``: every call in ssm_vk's invariant mode. Mamba-3: vs_mamba3.ours_side's."""
    if p["family"] in M3:
        if invariant:
            raise ValueError("--invariant: not for the Mamba-3 workloads")
        return m3.ours_side(p)
    dev = {k: ssm_vk.to_device(v) for k, v in p["a"].items()}
    ids = p["ids"]
    back = p["g_y"] is not None
    dgy = ssm_vk.to_device(p["g_y"]) if back else None
    dgs = ssm_vk.to_device(p["g_states"]) if back else None
    where = []

    def forward():
        return ssm_vk.ssm_scan(**dev, ids=ids, dt_softplus=FORM, invariant=invariant)

    fwd = vk_timed(forward, where=where)
    step = vk_timed(forward, lambda: ssm_vk.ssm_scan_back(**dev, ids=ids, g_y=dgy, g_states=dgs, dt_softplus=FORM,
                                                          invariant=invariant))

    prepared = {}

    def prepare(kind: str) -> tuple:
        """(forward, backward or None) prepared once (ssm_vk.prepare_scan / prepare_scan_back)."""
        if "fwd" not in prepared:
            prepared["fwd"] = (ssm_vk.prepare_scan(**dev, ids=ids, dt_softplus=FORM, invariant=invariant), None)
        if kind == "step" and "step" not in prepared:
            prepared["step"] = (prepared["fwd"][0],
                                ssm_vk.prepare_scan_back(**dev, ids=ids, g_y=dgy, g_states=dgs, dt_softplus=FORM,
                                                         invariant=invariant))
        return prepared[kind]

    def fwd_prepared():
        f, _ = prepare("fwd")
        t0 = time.perf_counter()
        f.run()
        w = time.perf_counter() - t0
        return (vk_run.last_gpu_ns() or math.nan) / 1e3, w * 1e6

    def step_prepared():
        f, b = prepare("step")
        t0 = time.perf_counter()
        f.run()
        t1 = time.perf_counter()
        gf = vk_run.last_gpu_ns() or math.nan
        t2 = time.perf_counter()
        b.run()
        t3 = time.perf_counter()
        return (gf + (vk_run.last_gpu_ns() or math.nan)) / 1e3, ((t1 - t0) + (t3 - t2)) * 1e6

    def outputs():
        r = ssm_vk.ssm_scan(**dev, ids=ids, dt_softplus=FORM, invariant=invariant)
        where.append(r.where)
        out = {"y": r.y.numpy(), "states": r.states.numpy()}
        if back:
            g = ssm_vk.ssm_scan_back(**dev, ids=ids, g_y=dgy, g_states=dgs, dt_softplus=FORM, invariant=invariant)
            where.append(g.where)
            out.update({k: getattr(g, k).numpy() for k in GRADS})
        return out

    def close():
        for f, b in prepared.values():
            for c in (f, b):
                if c is not None:
                    c.close()
        for v in (*dev.values(), dgy, dgs):
            if v is not None:
                v.release()

    side = {"fwd": fwd, "fwd prepared": fwd_prepared, "outputs": outputs,
            "where": lambda: ",".join(sorted(set(where))), "close": close}
    if back:
        side["fwd+bwd"] = step
        side["fwd+bwd prepared"] = step_prepared
    return side


# -- mamba_ssm: loading ----------------------------------------------------------------------------

def peer_package(src: Path) -> Path:
    """A temporary ``mamba_ssm`` with an empty ``__init__.py`` (the real one imports every CUDA
    extension) holding copies of ``ops/triton``, ``ops/__init__.py``, ``ops/selective_scan_interface.py``
    and ``utils``, first on sys.path. ssd_combined imports utils.torch, utils.determinism and the
    other ops/triton modules (layernorm_gated, k_activations, ssd_*); selective_state_update imports
    ops/triton/softplus; selective_scan_interface imports utils.torch and ops/triton/layer_norm."""
    pkg_src = src / "mamba_ssm"
    if not (pkg_src / "ops" / "triton").is_dir():
        raise FileNotFoundError(f"{pkg_src / 'ops' / 'triton'}: not a state-spaces/mamba source tree")
    root = Path(tempfile.mkdtemp(prefix="mamba_ssm_"))
    atexit.register(shutil.rmtree, root, True)
    pkg = root / "mamba_ssm"
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(pkg_src / "ops" / "triton", pkg / "ops" / "triton", ignore=skip)
    for rel_path in ("ops/__init__.py", "ops/selective_scan_interface.py"):
        if (pkg_src / rel_path).is_file():
            shutil.copy(pkg_src / rel_path, pkg / rel_path)
    (pkg / "ops" / "__init__.py").touch()
    if (pkg_src / "utils").is_dir():
        shutil.copytree(pkg_src / "utils", pkg / "utils", ignore=skip)
    (pkg / "__init__.py").write_text("")
    for name in [m for m in sys.modules if m == "mamba_ssm" or m.startswith("mamba_ssm.")]:
        del sys.modules[name]   # an installed mamba_ssm imported earlier would shadow the copy
    sys.path.insert(0, str(root))
    return root


def triton_ops():
    """(mamba_chunk_scan_combined, selective_state_update) from the copied package."""
    from mamba_ssm.ops.triton.selective_state_update import selective_state_update
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    return mamba_chunk_scan_combined, selective_state_update


def nvcc_flags(capability: tuple[int, int]) -> list[str]:
    """The nvcc flags of mamba's setup.py (CUDA, not ROCm), for one compute capability instead of
    its list of architectures."""
    cc = f"{capability[0]}{capability[1]}"
    return ["-O3", "-std=c++17",
            "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
            "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
            "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
            "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math",
            "--ptxas-options=-v", "-lineinfo", "--threads", "4",
            f"-gencode=arch=compute_{cc},code=sm_{cc}"]


def build_spec(src: Path, build_dir: Path, capability) -> dict:
    cs = src / "csrc" / "selective_scan"
    sources = sorted(glob.glob(str(cs / "*.cpp"))) + sorted(glob.glob(str(cs / "*.cu")))
    if not sources:
        raise FileNotFoundError(f"{cs}: no .cpp / .cu sources")
    return dict(name="selective_scan_cuda", sources=sources, extra_cflags=["-O3", "-std=c++17"],
                extra_cuda_cflags=nvcc_flags(capability), extra_include_paths=[str(cs)],
                build_directory=str(build_dir))


_CHILD = ("import json, sys\nimport torch.utils.cpp_extension as c\n"
          "c.load(verbose=True, **json.loads(sys.argv[1]))\n")


def stop_group(child: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to the child's own process group (ninja and the compilers with it), SIGKILL to what
    is left after ``grace_s``."""
    os.killpg(child.pid, signal.SIGTERM)
    child.wait()
    end = time.monotonic() + grace_s
    while time.monotonic() < end:
        try:
            os.killpg(child.pid, 0)      # anyone left in the group?
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def build_selective_scan(src: Path, build_dir: Path, timeout_s: float) -> dict:
    """Build (or find up to date) mamba's selective_scan_cuda in ``build_dir``, in a child process
    killed after ``timeout_s``, then load it here. Returns {"module" (or None), "seconds",
    "message", "flags", "log"}."""
    import torch
    from torch.utils import cpp_extension

    if timeout_s < 30:
        return {"module": None, "seconds": 0.0, "message": f"not started: {timeout_s:.0f} s of the budget left",
                "flags": [], "log": "", "max_jobs": "-", "build_dir": str(build_dir)}
    spec = build_spec(src, build_dir, torch.cuda.get_device_capability())
    build_dir.mkdir(parents=True, exist_ok=True)
    lock = build_dir / "lock"   # torch's build lock: left behind by a killed build, later loads would wait on it
    if lock.exists():
        lock.unlink()
    log_path = build_dir / "build.log"
    env = dict(os.environ)
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    info = {"module": None, "flags": spec["extra_cuda_cflags"], "log": str(log_path),
            "max_jobs": env["MAX_JOBS"], "build_dir": str(build_dir)}
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        child = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(spec)], stdout=log, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
        try:
            rc = child.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            stop_group(child)
            if lock.exists():
                lock.unlink()
            info.update(seconds=time.perf_counter() - t0,
                        message=f"not finished in {timeout_s:.0f} s (finished objects kept in {build_dir}: "
                                f"run again, or with --build-only, to continue)")
            return info
    info["seconds"] = time.perf_counter() - t0
    if rc != 0:
        tail = [ln.rstrip() for ln in open(log_path, errors="replace").readlines()[-15:] if ln.strip()]
        last = tail[-1] if tail else ""
        info["message"] = f"build failed (exit {rc}): {last}\nlast lines of {log_path}:\n" + "\n".join(tail)
        return info
    info["module"] = cpp_extension.load(**spec)   # up to date now: only loads the library
    up_to_date = "no work to do" in open(log_path, errors="replace").read()
    info["message"] = "up to date" if up_to_date else "built"
    return info


def mamba1_ops(cuda) -> tuple:
    """(fwd, step, how): fwd(u, delta, A, B, C) -> (out, last_state); step(u, delta, A, B, C, dout)
    -> (out, last_state, (du, ddelta, dA, dB, dC)), with delta_softplus=True, D = z = delta_bias =
    None. Through mamba's selective_scan_fn and torch autograd (u ... C must require grad) when
    selective_scan_interface imports, else selective_scan_cuda.fwd / bwd called directly in the
    argument order of csrc/selective_scan/selective_scan.cpp."""
    import torch

    sys.modules["selective_scan_cuda"] = cuda   # selective_scan_interface imports it by name
    try:
        from mamba_ssm.ops import selective_scan_interface as ssi

        if ssi.selective_scan_cuda is not cuda:
            raise ImportError("selective_scan_interface did not pick up the built selective_scan_cuda")
        scan = ssi.selective_scan_fn
    except Exception as e:  # any failure of their module: call the kernel directly
        how = f"selective_scan_cuda.fwd/bwd (selective_scan_fn: {type(e).__name__}: {e})"

        def fwd(u, delta, A, B, C):
            out, x, *_ = cuda.fwd(u, delta, A, B, C, None, None, None, True)
            return out, x[:, :, -1, 1::2]              # (S, H, N): last chunk's state (odd entries)

        def step(u, delta, A, B, C, dout):
            out, x, *_ = cuda.fwd(u, delta, A, B, C, None, None, None, True)
            du, ddelta, dA, dB, dC, *_ = cuda.bwd(u, delta, A, B, C, None, None, None, dout, x, None, None, True,
                                                  False)
            return out, x[:, :, -1, 1::2], (du, ddelta, dA, dB, dC)

        return fwd, step, how

    def fwd(u, delta, A, B, C):
        with torch.no_grad():
            return scan(u, delta, A, B, C, delta_softplus=True, return_last_state=True)

    def step(u, delta, A, B, C, dout):
        out, last = scan(u, delta, A, B, C, delta_softplus=True, return_last_state=True)
        return out, last, torch.autograd.grad(out, (u, delta, A, B, C), dout)

    return fwd, step, "selective_scan_fn (mamba_ssm.ops.selective_scan_interface)"


# -- mamba_ssm: layouts -----------------------------------------------------------------------------

def _tensor(v, device):
    import torch

    return torch.from_numpy(np.ascontiguousarray(v)).to(device)


def _np(t) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def m2_to_mamba(p: dict, device) -> dict:
    """Mamba-2 for mamba_chunk_scan_combined: the same layouts as ours (x (S,T,H,P), dt (S,T,H),
    A (H,), B, C (S,T,G,N)), initial_states = s (S,H,P,N); gy (S,T,H,P), gs (S,H,P,N). The inputs
    require grad (the fwd op runs under no_grad)."""
    a = p["a"]
    t = {k: _tensor(a[k], device).requires_grad_() for k in ("x", "dt", "A", "B", "C")}
    t["s0"] = _tensor(a["s"] if p["ids"] is None else a["s"][p["ids"]], device).requires_grad_()
    t["gy"], t["gs"] = _tensor(p["g_y"], device), _tensor(p["g_states"], device)
    return t


def m1_to_mamba(p: dict, device) -> dict:
    """Mamba-1 in selective_scan's layout, contiguous (what the kernel reads without a copy):
    u, delta (S, H, T); A (H, N); B, C (S, G, N, T); dout (S, H, T). Inputs require grad."""
    a = p["a"]
    t = dict(u=a["x"][..., 0].transpose(0, 2, 1),        # (S, T, H, 1) -> (S, H, T)
             delta=a["dt"].transpose(0, 2, 1),           # (S, T, H) -> (S, H, T)
             A=a["A"],                                   # (H, N)
             B=a["B"].transpose(0, 2, 3, 1),             # (S, T, G, N) -> (S, G, N, T)
             C=a["C"].transpose(0, 2, 3, 1))             # (S, T, G, N) -> (S, G, N, T)
    t = {k: _tensor(v, device).requires_grad_() for k, v in t.items()}
    t["dout"] = _tensor(p["g_y"][..., 0].transpose(0, 2, 1), device)   # (S, H, T)
    return t


def m1_from_mamba(out, last, grads=None) -> dict:
    """selective_scan's outputs in our layout: y (S,T,H,1), states (S,H,1,N), and from (du, ddelta,
    dA, dB, dC): d_x (S,T,H,1), d_dt (S,T,H), d_A (H,N), d_B, d_C (S,T,G,N). No d_s (no initial state)."""
    o = {"y": _np(out).transpose(0, 2, 1)[..., None], "states": _np(last)[:, :, None, :]}
    if grads is not None:
        du, ddelta, dA, dB, dC = (_np(g) for g in grads)
        o.update(d_x=du.transpose(0, 2, 1)[..., None], d_dt=ddelta.transpose(0, 2, 1), d_A=dA,
                 d_B=dB.transpose(0, 3, 1, 2), d_C=dC.transpose(0, 3, 1, 2))
    return o


def dec_to_mamba(p: dict, device) -> dict:
    """Decode for selective_state_update with the head dim tied (its fast path): state (R,H,P,N);
    x (S,H,P); dt (S,H,P) stride 0 over P; A (H,P,N) stride 0 over P and N; D, dt_bias (H,P) zeros,
    stride 0 over P (this version reads their strides: None fails); B, C (S,G,N); ids int32 (S,)."""
    import torch

    a = p["a"]
    S, _, H, P = a["x"].shape
    N = a["B"].shape[-1]
    zeros = torch.zeros(H, device=device)[:, None].expand(H, P)           # (H, P)
    return dict(state=_tensor(a["s"], device),                            # (R, H, P, N)
                x=_tensor(a["x"][:, 0], device),                          # (S, H, P)
                dt=_tensor(a["dt"][:, 0], device)[:, :, None].expand(S, H, P),
                A=_tensor(a["A"], device)[:, None, None].expand(H, P, N),
                D=zeros, dt_bias=zeros,
                B=_tensor(a["B"][:, 0], device), C=_tensor(a["C"][:, 0], device),   # (S, G, N)
                ids=_tensor(p["ids"].astype(np.int32), device))


def dec_from_mamba(out, state, ids) -> dict:
    """y (S,1,H,P) from out (S,H,P); states (S,H,P,N): the updated cache rows ids."""
    return {"y": _np(out)[:, None], "states": _np(state[ids.long()])}


# -- mamba_ssm: timed calls ---------------------------------------------------------------------------

def cuda_timed(fn):
    """() -> (GPU us from CUDA events around ``fn`` on the current stream, wall us of fn + synchronize)."""
    import torch

    def call():
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        w = time.perf_counter() - t0
        return e0.elapsed_time(e1) * 1e3, w * 1e6

    return call


def peer_side(p: dict, ops: dict, device="cuda") -> dict:
    """mamba_ssm's calls for problem ``p``: {"fwd", "fwd+bwd": () -> None (untimed), "outputs":
    () -> numpy dict in our layout, "how"}. ``ops``: "combined", "update", "m1" as loaded."""
    import torch

    fam = p["family"]
    if fam in M3:
        return m3.peer_side(p, ops, device)
    if fam == "mamba2":
        combined = ops["combined"]
        t = m2_to_mamba(p, device)
        kw = dict(chunk_size=CHUNK, D=None, z=None, dt_bias=None, dt_softplus=True, return_final_states=True)
        leaves = [t[k] for k in ("x", "dt", "A", "B", "C", "s0")]

        def fwd():
            with torch.no_grad():
                return combined(*leaves[:5], initial_states=t["s0"], **kw)

        def step():
            y, fs = combined(*leaves[:5], initial_states=t["s0"], **kw)
            return y, fs, torch.autograd.grad((y, fs), leaves, (t["gy"], t["gs"]))

        def outputs():
            y, fs, g = step()
            o = {"y": _np(y), "states": _np(fs)}
            o.update({k: _np(v) for k, v in zip(("d_x", "d_dt", "d_A", "d_B", "d_C", "d_s"), g, strict=True)})
            return o

        return {"fwd": fwd, "fwd+bwd": step, "outputs": outputs, "how": "mamba_chunk_scan_combined (Triton)"}
    if fam == "mamba1":
        m1_fwd, m1_step, how = ops["m1"]
        t = m1_to_mamba(p, device)
        args = [t[k] for k in ("u", "delta", "A", "B", "C")]

        def outputs():
            out, last, g = m1_step(*args, t["dout"])
            return m1_from_mamba(out, last, g)

        return {"fwd": lambda: m1_fwd(*args), "fwd+bwd": lambda: m1_step(*args, t["dout"]), "outputs": outputs,
                "how": how}
    update = ops["update"]
    t = dec_to_mamba(p, device)

    def call(state):
        return update(state, t["x"], t["dt"], t["A"], t["B"], t["C"], D=t["D"], z=None, dt_bias=t["dt_bias"],
                      dt_softplus=True, state_batch_indices=t["ids"])

    state0 = t["state"].clone()   # the cache before any call: the check starts from it

    def outputs():
        st = state0.clone()
        return dec_from_mamba(call(st), st, t["ids"])

    return {"fwd": lambda: call(t["state"]), "outputs": outputs, "how": "selective_state_update (Triton)"}


# -- measurement ------------------------------------------------------------------------------------

def interleave(sides: dict, rounds: int, reps: int, warm_s: float) -> dict:
    """Per side: {"gpu_us", "wall_us": one list per round, "spans": (time.time() start, end) of
    each round's timed calls}. Order: as given in even rounds, reversed in odd ones."""
    res = {k: {"gpu_us": [], "wall_us": [], "spans": []} for k in sides}
    names = list(sides)
    for r in range(rounds):
        for k in names if r % 2 == 0 else names[::-1]:
            fn = sides[k]
            warm(fn, warm_s)
            t0 = time.time()
            samples = [fn() for _ in range(reps)]
            res[k]["spans"].append((t0, time.time()))
            res[k]["gpu_us"].append([g for g, _ in samples])
            res[k]["wall_us"].append([w for _, w in samples])
    for v in res.values():
        v["gpu_med_us"] = statistics.median([x for rnd in v["gpu_us"] for x in rnd])
        v["wall_med_us"] = statistics.median([x for rnd in v["wall_us"] for x in rnd])
    return res


def first_call(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def errors(got: dict, want: dict) -> dict:
    return {k: rel(got[k], want[k]) for k in want if k in got}


def sm_clocks(clk, spans) -> str:
    """min/median/max SM MHz of the clock log's samples inside any of ``spans``, or "-"."""
    if not clk or not spans:
        return "-"
    v = [mhz for ts, mhz in clk if any(a - 0.05 <= ts <= b + 0.05 for a, b in spans)]
    return f"{min(v):.0f}/{statistics.median(v):.0f}/{max(v):.0f}" if v else "-"


def run_workload(name: str, args, ops: dict, notes: list, out_of_time) -> list[dict]:
    family, dims = WORKLOADS[name]
    if args.small:
        dims = shrink(family, dims)
    p = problem(family, dims)
    shape = " ".join(f"{k}={v}" for k, v in dims.items())
    if family == "decode":
        shape = f"S={dims['S']} of R={dims['R']} H={dims['H']} P={DEC_P} N={DEC_N}"
    elif family in M3:
        shape = m3.shape_text(dims)
    base = dict(workload=name, family=family, shape=shape, dims=dims)
    peer_why = ops.get("why", {}).get(family)
    ours = ours_side(p)
    inv = ours_side(p, invariant=True) if args.invariant else None
    peer = None
    if peer_why is None:
        try:
            peer = peer_side(p, ops)
        except Exception as e:
            peer_why = f"setup failed: {type(e).__name__}: {e}"
    rows = []
    op_names = OPS.get(name) or (("fwd", "fwd+bwd") if family not in ("decode", "m3decode") else ("fwd",))
    try:
        for op in () if args.accuracy_only else op_names:
            # the warm process stops only between workloads: a workload's first backward call is
            # where Triton compiles and autotunes the most (mamba3_siso_combined's: minutes)
            if out_of_time() and not args.warm_only:
                notes.append(f"{name} {op}: skipped, over the time budget")
                break
            row = dict(base, op=op, peer_how=peer["how"] if peer else None, peer_note=peer_why)
            sides = {"ours": ours[op]}
            row["ours_first_s"] = first_call(ours[op])
            peer_op = op.split()[0]   # a prepared call of ours beside the peer's same call
            if peer is not None:
                try:
                    row["peer_first_s"] = first_call(cuda_timed(peer[peer_op]))
                    sides = {"peer": cuda_timed(peer[peer_op]), **sides}
                except Exception as e:
                    row["peer_note"] = f"{op} failed: {type(e).__name__}: {e}"
                    traceback.print_exc()
            if inv is not None:
                row["inv_first_s"] = first_call(inv[op])
                sides["inv"] = inv[op]
            if args.warm_only:   # the first calls alone: they fill the compile caches on disk
                print(f"  {name} {op}: first calls done", flush=True)
                continue
            res = interleave(sides, args.rounds, args.reps, args.warm_s)
            row.update(ours=res["ours"], peer=res.get("peer"), inv=res.get("inv"))
            if row["inv"]:
                row["inv_cost_gpu"] = row["inv"]["gpu_med_us"] / row["ours"]["gpu_med_us"]
                row["inv_cost_wall"] = row["inv"]["wall_med_us"] / row["ours"]["wall_med_us"]
            if row["peer"]:
                row["ratio_gpu"] = row["peer"]["gpu_med_us"] / row["ours"]["gpu_med_us"]
                row["ratio_wall"] = row["peer"]["wall_med_us"] / row["ours"]["wall_med_us"]
            rows.append(row)
            first = f"first call: ssm_vk {row['ours_first_s']:.2f} s" + (
                f", mamba_ssm {row['peer_first_s']:.2f} s" if "peer_first_s" in row else "")
            print(f"  {name} {op}: " + line(row) + f"; {first}", flush=True)
        for row in rows:
            row["ours_where"] = ours["where"]()
            if inv is not None:
                row["inv_where"] = inv["where"]()
        if args.accuracy_only:
            rows = [dict(base, op=op, accuracy_only=True) for op in op_names]
        if not rows or out_of_time() or args.no_accuracy:
            if rows and not args.no_accuracy:
                notes.append(f"{name}: accuracy not checked, over the time budget")
            return rows
        try:
            acc = accuracy(p, peer is not None, ops, args.check_updates, args.invariant)
        except Exception as e:   # the timings stay
            traceback.print_exc()
            notes.append(f"{name}: accuracy check failed: {type(e).__name__}: {e}")
            return rows
        for row in rows:
            row.update(acc)
        print(f"  {name} errors (oracle {acc['oracle_s']:.1f} s{', ' + acc['check_note'] if acc['check_note'] else ''})"
              f": ssm_vk " + fmt_errs(acc["ours_err"]) + " | mamba_ssm " + fmt_errs(acc.get("peer_err")), flush=True)
    finally:
        ours["close"]()
        if inv is not None:
            inv["close"]()
    return rows


def accuracy(p: dict, with_peer: bool, ops: dict, cap: float, invariant: bool = False) -> dict:
    q, note = check_slice(p, cap)
    back = q["g_y"] is not None
    t0 = time.perf_counter()
    want = oracle(q, back)
    res = {"oracle_s": time.perf_counter() - t0, "check_note": note}
    ours = ours_side(q)
    try:
        res["ours_err"] = errors(ours["outputs"](), want)
        res["check_where"] = ours["where"]()
    finally:
        ours["close"]()
    if invariant:
        inv = ours_side(q, invariant=True)
        try:
            res["inv_err"] = errors(inv["outputs"](), want)
        finally:
            inv["close"]()
    if with_peer:
        try:
            got = peer_side(q, ops)["outputs"]()
            res["peer_err"] = errors(got, want)
        except Exception as e:
            res["peer_err_note"] = f"{type(e).__name__}: {e}"
    return res


# -- report -----------------------------------------------------------------------------------------

def us(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def fmt_errs(e) -> str:
    return " ".join(f"{k}={v:.1e}" for k, v in e.items()) if e else "-"


def row_err(row: dict, side: str) -> str:
    e = row.get(f"{side}_err")
    if not e:
        return "-"
    fwd = row["op"].split()[0] == "fwd"
    v = [x for k, x in e.items() if k.startswith("d_") != fwd]   # outputs and states, or the gradients
    return f"{max(v):.1e}" if v else "-"


def line(row: dict) -> str:
    o, q = row["ours"], row.get("peer")
    s = f"ssm_vk {us(o['gpu_med_us'])} ({us(o['wall_med_us'])}) us"
    if q:
        s = (f"mamba_ssm {us(q['gpu_med_us'])} ({us(q['wall_med_us'])}) us, " + s
             + f", ratio {row['ratio_gpu']:.2f} ({row['ratio_wall']:.2f})")
    v = row.get("inv")
    if v:
        s += (f"; invariant {us(v['gpu_med_us'])} ({us(v['wall_med_us'])}) us, "
              f"{row['inv_cost_gpu']:.2f}x ({row['inv_cost_wall']:.2f}x) the default")
    return s


def table(rows: list[dict], clk) -> list[str]:
    if any(r.get("inv") for r in rows):
        return [*inv_table(rows), "", *_table(rows, clk)]
    return _table(rows, clk)


def inv_table(rows: list[dict]) -> list[str]:
    """What the invariant mode costs, per workload and op: its GPU (wall) time, that over the
    default's, mamba_ssm over it, and both errors against the float64 oracle."""
    out = ["| workload | shape | op | default GPU (wall) us | invariant GPU (wall) us | invariant / default GPU (wall) "
           "| mamba_ssm / invariant GPU | err default | err invariant |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        o, v, q = r.get("ours"), r.get("inv"), r.get("peer")
        if "error" in r or not v:
            continue
        vs = f"{q['gpu_med_us'] / v['gpu_med_us']:.2f}" if q else "-"
        out.append(f"| {r['workload']} | {r['shape']} | {r['op']} | {us(o['gpu_med_us'])} ({us(o['wall_med_us'])}) "
                   f"| {us(v['gpu_med_us'])} ({us(v['wall_med_us'])}) "
                   f"| {r['inv_cost_gpu']:.2f} ({r['inv_cost_wall']:.2f}) "
                   f"| {vs} | {row_err(r, 'ours')} | {row_err(r, 'inv')} |")
    return out


def _table(rows: list[dict], clk) -> list[str]:
    out = ["| workload | shape | op | mamba_ssm GPU (wall) us | ssm_vk GPU (wall) us | ratio GPU (wall) "
           "| err mamba_ssm | err ssm_vk | SM MHz mamba_ssm; ssm_vk |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['workload']} | {r.get('shape', '')} | - | failed: {r['error']} | | | | | |")
            continue
        if r.get("accuracy_only"):   # (--accuracy-only: errors alone, in the table below)
            continue
        o, q = r["ours"], r.get("peer")
        peer = f"{us(q['gpu_med_us'])} ({us(q['wall_med_us'])})" if q else "-"
        ratio = f"{r['ratio_gpu']:.2f} ({r['ratio_wall']:.2f})" if q else "-"
        mark = " *" if r.get("check_note") else ""
        where = "" if not r.get("ours_where") or "CPU" not in r["ours_where"] else f" [{r['ours_where']}]"
        clocks = f"{sm_clocks(clk, q['spans']) if q else '-'}; {sm_clocks(clk, o['spans'])}"
        out.append(f"| {r['workload']} | {r['shape']} | {r['op']} | {peer} | {us(o['gpu_med_us'])} "
                   f"({us(o['wall_med_us'])}){where} | {ratio} | {row_err(r, 'peer')}{mark} "
                   f"| {row_err(r, 'ours')}{mark} | {clocks} |")
    return out


def tracked_tree(repo: str, dirty: bool) -> str:
    """The git tree hash of the checkout's tracked files as they are (with local changes: through
    `git stash create`, which changes nothing): the same hash as `git rev-parse COMMIT^{tree}` of
    the commit that holds exactly these files, so a run names its code even from a copy whose
    HEAD is older."""
    ref = "HEAD"
    if dirty:
        ref = subprocess.run(["git", "-C", repo, "stash", "create"], capture_output=True, text=True,
                             timeout=30).stdout.strip() or "HEAD"
    return subprocess.run(["git", "-C", repo, "rev-parse", ref + "^{tree}"], capture_output=True, text=True,
                          timeout=10).stdout.strip()


def header(args, argv: list[str], src: Path | None) -> dict:
    h = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "argv": argv}
    try:
        ctx = ssm_vk.runtime.get_context()
        h["ssm_vk_device"] = f"{ctx.info.name} ({ctx.info.driver})"
    except Exception as e:
        h["ssm_vk_device"] = f"none: {type(e).__name__}: {e}"
    h["vulkan_devices"] = [d.name for d in ssm_vk.devices()]
    h["ssm_vk_version"] = ssm_vk.__version__
    try:   # the checkout's commit, and whether its files differ from it (then the commit says little)
        repo = str(Path(__file__).resolve().parents[1])
        commit = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        h["ssm_vk_commit"] = commit + (" with local changes" if dirty else "")
        h["ssm_vk_tree"] = tracked_tree(repo, dirty)
    except (OSError, subprocess.SubprocessError):
        pass
    if shutil.which("nvidia-smi"):
        try:
            h["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                             capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    if not args.no_peer:
        try:
            import torch

            h["torch"] = f"{torch.__version__} (CUDA {torch.version.cuda})"
            h["cuda_device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
        except Exception as e:
            h["torch"] = f"none: {e}"
        try:
            import triton

            h["triton"] = triton.__version__
        except Exception as e:
            h["triton"] = f"none: {e}"
    if src is not None:
        h["mamba_src"] = str(src)
        commit = ""
        try:   # only the tree's own .git: a tree exported inside another repository must not report that one
            if (src / ".git").exists():
                commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                                        text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
        if not commit and (src / "COMMIT").is_file():   # an exported tree (git archive) has no .git
            commit = (src / "COMMIT").read_text().strip() + " (from COMMIT)"
        h["mamba_commit"] = commit or "unknown"
        init = src / "mamba_ssm" / "__init__.py"
        m = re.search(r'__version__\s*=\s*"([^"]+)"', init.read_text()) if init.is_file() else None
        h["mamba_version"] = m.group(1) if m else "unknown"
    return h


def report(h: dict, build: dict | None, rows: list, notes: list, clk) -> str:
    lines = ["# ssm_vk beside mamba_ssm", ""]
    lines += [f"- {k}: {v}" for k, v in h.items() if k != "argv"]
    lines.append(f"- command: vs_mamba_ssm.py {' '.join(h['argv'])}")
    if build:
        lines.append(f"- selective_scan_cuda: {build['message'].splitlines()[0]}, {build['seconds']:.0f} s "
                     f"(MAX_JOBS {build['max_jobs']}, {build['build_dir']})")
        lines.append(f"- nvcc flags: {' '.join(build['flags'])}")
    hows = sorted({r["peer_how"] for r in rows if r.get("peer_how")})
    if hows:
        lines.append(f"- mamba_ssm calls: {'; '.join(hows)}")
    lines += ["", *table(rows, clk), ""]
    lines.append("GPU: mamba_ssm = CUDA events around the call (its launch gaps included), ssm_vk = timestamps of its "
                 "command buffer (fwd+bwd: forward + backward); wall: the call (+ synchronize for mamba_ssm). "
                 "Medians of all rounds; ratio = mamba_ssm time / ssm_vk time, a speed ratio (> 1: ssm_vk faster). "
                 "Errors: norm-relative against float64 ssm_ref (dt_softplus log1p), fwd: max over the outputs "
                 "and final states; fwd+bwd: max of the gradients. SM MHz: min/median/max while each side's timed "
                 "calls ran.")
    checked = [r for r in rows if r.get("check_note") and r["op"].split()[0] == "fwd"]
    for r in checked:
        lines.append(f"\n\\* {r['workload']}: errors {r['check_note']}")
    lines += ["", "| workload | output | err mamba_ssm | err ssm_vk |", "|---|---|---|---|"]
    for r in rows:
        if r.get("op") != rows_last_op(r) or "ours_err" not in r:
            continue
        pe = r.get("peer_err") or {}
        for k, v in r["ours_err"].items():
            pv = f"{pe[k]:.2e}" if k in pe else "-"
            lines.append(f"| {r['workload']} | {k} | {pv} | {v:.2e} |")
    peer_notes = sorted({f"{r['workload']}: mamba_ssm {r['peer_note']}" for r in rows if r.get("peer_note")})
    peer_notes += [f"{r['workload']}: mamba_ssm check {r['peer_err_note']}" for r in rows
                   if r.get("peer_err_note") and r.get("op") == rows_last_op(r)]
    if notes or peer_notes:
        lines += ["", "Notes:", *[f"- {n}" for n in [*notes, *peer_notes]]]
    return "\n".join(lines) + "\n"


def rows_last_op(r: dict) -> str:
    return "fwd" if r.get("family") == "decode" else "fwd+bwd"


# -- several processes ------------------------------------------------------------------------------

def summarise(reports: list[dict]) -> list[dict]:
    """One row per (workload, op) over the processes' reports: each side's GPU and wall time and the
    ratios as spreads (benchmarks/processes.py) of the per-process medians; the errors from the
    process that checked them."""
    keyed: dict = {}
    for rep in reports:
        for r in rep.get("rows", []):
            keyed.setdefault((r["workload"], r.get("op")), []).append(r)
    out = []
    for (name, op), rs in keyed.items():
        ok = [r for r in rs if "error" not in r and not r.get("accuracy_only")]
        row = dict(workload=name, op=op, family=rs[0].get("family"), shape=rs[0].get("shape", ""),
                   processes=len(ok), failed=[r["error"] for r in rs if "error" in r])
        for side in ("peer", "ours", "inv"):
            for m in ("gpu", "wall"):
                row[f"{side}_{m}"] = spread(r[side][f"{m}_med_us"] for r in ok if r.get(side))
        for k in ("ratio_gpu", "ratio_wall", "inv_cost_gpu", "inv_cost_wall"):
            row[k] = spread(r.get(k) for r in ok)
        checked = next((r for r in rs if "ours_err" in r), {})
        for k in ("ours_err", "peer_err", "inv_err", "check_note", "peer_err_note"):
            if k in checked:
                row[k] = checked[k]
        row["ours_where"] = ",".join(sorted({r["ours_where"] for r in ok if r.get("ours_where")}))
        row["peer_notes"] = sorted({r["peer_note"] for r in ok if r.get("peer_note")})
        out.append(row)
    return out


def _spread_table(rows: list[dict]) -> list[str]:
    out = ["| workload | shape | op | mamba_ssm GPU us | ssm_vk GPU us | speed, GPU | mamba_ssm wall us "
           "| ssm_vk wall us | speed, wall | err mamba_ssm | err ssm_vk |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r["processes"]:
            out.append(f"| {r['workload']} | {r['shape']} | {r['op'] or '-'} | failed: {'; '.join(r['failed'])} "
                       "| | | | | | | |")
            continue
        mark = " *" if r.get("check_note") else ""
        where = "" if "CPU" not in r["ours_where"] else f" [{r['ours_where']}]"
        out.append(f"| {r['workload']} | {r['shape']} | {r['op']} | {fmt(r['peer_gpu'])} | {fmt(r['ours_gpu'])}{where} "
                   f"| {fmt(r['ratio_gpu'], 2)} | {fmt(r['peer_wall'])} | {fmt(r['ours_wall'])} "
                   f"| {fmt(r['ratio_wall'], 2)} | {row_err(r, 'peer')}{mark} | {row_err(r, 'ours')}{mark} |")
    if any(r.get("inv_gpu") for r in rows):
        out += ["", "| workload | op | default GPU us | invariant GPU us | invariant / default, GPU (time) "
                "| err default | err invariant |", "|---|---|---|---|---|---|---|"]
        out += [f"| {r['workload']} | {r['op']} | {fmt(r['ours_gpu'])} | {fmt(r['inv_gpu'])} "
                f"| {fmt(r['inv_cost_gpu'], 2)} | {row_err(r, 'ours')} | {row_err(r, 'inv')} |"
                for r in rows if r.get("inv_gpu")]
    return out


def spread_report(reports: list[dict], rows: list[dict], argv: list[str]) -> str:
    """The summary of several processes: where and what ran once, then the table."""
    heads = [rep.get("header", {}) for rep in reports if rep.get("header")]
    h = heads[0] if heads else {}
    lines = ["# ssm_vk beside mamba_ssm, several processes", ""]
    for k in ("ssm_vk_device", "nvidia_smi", "ssm_vk_version", "torch", "triton", "mamba_version"):
        if k in h:
            lines.append(f"- {k}: {h[k]}")
    for k in ("date", "ssm_vk_commit", "ssm_vk_tree"):
        vals = sorted({hh.get(k, "?") for hh in heads})
        lines.append(f"- {k}: {', '.join(vals)}")
    timed = [r for r in reports if not any(x.get("accuracy_only") for x in r.get("rows", []))]
    lines.append(f"- timed processes: {len(timed)} ({sum('failed' in r for r in timed)} failed); "
                 f"command: vs_mamba_ssm.py {' '.join(argv)}")
    for rep in reports:
        if "failed" in rep:
            lines.append(f"- process {rep.get('process', '?')}: {rep['failed']}")
    lines += ["", *_spread_table(rows), ""]
    lines.append("Each cell: the median over the processes of each process's median time (us), and in brackets "
                 "the range (lowest-highest process) where they differ. GPU time: mamba_ssm = CUDA events around "
                 "the call (its launch gaps included), ssm_vk = Vulkan timestamps around its recorded commands "
                 "(fwd+bwd: forward + backward); wall: the Python call (+ torch.cuda.synchronize for mamba_ssm). "
                 "Speed = mamba_ssm's time / ssm_vk's time, formed within each process (above 1: ssm_vk faster). "
                 "Errors (a process of its own, after the timed ones): norm-relative against float64 ssm_ref "
                 "(dt_softplus log1p); fwd: the "
                 "larger of y and states; fwd+bwd: the largest gradient.")
    for r in rows:
        if r.get("check_note") and r["op"].split()[0] == "fwd":
            lines.append(f"\n\\* {r['workload']}: errors {r['check_note']}")
    notes = sorted({f"{r['workload']}: mamba_ssm {n}" for r in rows for n in r.get("peer_notes", [])})
    notes += [n for rep in reports for n in rep.get("notes", [])]
    if notes:
        lines += ["", "Notes:", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


def several(args, argv: list[str]) -> int:
    """``--processes N`` > 1, or ``--merge``: run (or read) the processes, then summarise."""
    if args.merge:
        reports = []
        for path in args.merge:
            rep = json.loads(Path(path).read_text())
            reports += rep.get("processes", [rep])
    else:
        child = [*without(argv, ("--processes", "--json", "--md", "--budget-s")), "--processes", "1"]
        t0 = time.monotonic()
        names = [n for n in args.workloads.split(",") if n]
        if not args.no_peer and any(WORKLOADS[n][0] == "mamba1" for n in names):
            # mamba_ssm's Mamba-1 kernel is built once, here, so no process spends its share on it
            subprocess.run([sys.executable, __file__, *without(child, ("--processes",)), "--build-only",
                            "--budget-s", f"{args.budget_s * 0.6:.0f}"])
        # One untimed process first: the first process to compile the kernels (Triton's and the
        # SPIR-V) fills the caches on disk, so each timed process spends its share on timing. The
        # float64 check runs after them, in a process of its own.
        # Triton's autotuning results are kept on disk too (TRITON_CACHE_AUTOTUNING): each timed
        # process then runs the configuration the warm process chose instead of benchmarking every
        # configuration again inside its share of the budget.
        os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
        # (killed at twice its share at most: Triton's first autotuning may outlast the share, and
        # what it finishes is kept on disk for the timed processes)
        children(__file__, child, 1, first_extra=["--warm-only"], budget_s=0.4 * args.budget_s,
                 grace_s=0.4 * args.budget_s)
        left = args.budget_s - (time.monotonic() - t0)
        share = left if args.no_accuracy else 0.75 * left
        reports = children(__file__, child, args.processes, first_extra=["--no-accuracy"],
                           rest_extra=["--no-accuracy"], budget_s=share)
        if not args.no_accuracy:
            reports += children(__file__, child, 1, first_extra=["--accuracy-only"],
                                budget_s=args.budget_s - (time.monotonic() - t0))
    rows = summarise(reports)
    md = spread_report(reports, rows, argv)
    print("\n" + md, flush=True)
    if args.md:
        Path(args.md).write_text(md)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(argv=argv, processes=reports, rows=rows), fh, indent=1,
                      default=lambda o: o.as_dict() if isinstance(o, Spread) else str(o))
    return 0 if rows and all(r["processes"] for r in rows) else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mamba-src", type=Path, default=None, help="a state-spaces/mamba source tree")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warm-s", type=float, default=0.5, help="back-to-back calls before each side's timed calls")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    ap.add_argument("--build-dir", type=Path, default=Path(tempfile.gettempdir()) / "vs_mamba_ssm_build")
    ap.add_argument("--build-only", action="store_true", help="build selective_scan_cuda, then stop")
    ap.add_argument("--budget-s", type=float, default=480.0, help="skip what is left after this many seconds")
    ap.add_argument("--check-updates", type=float, default=1.3e8,
                    help="largest S*T*H*P*N checked whole against the float64 oracle")
    ap.add_argument("--clocks", default=None, help="nvidia-smi log of gpu_env.sh (default $OUT/clocks.csv if present)")
    ap.add_argument("--no-peer", action="store_true", help="ssm_vk alone (no torch, no mamba_ssm)")
    ap.add_argument("--small", action="store_true", help="T and H / 8: a quick run on a CPU Vulkan device")
    ap.add_argument("--invariant", action="store_true",
                    help="time ssm_vk's invariant mode (invariant=True) beside the default, in the same rounds")
    ap.add_argument("--processes", type=int, default=3,
                    help="fresh processes, one after another, each running the whole measurement (default 3)")
    ap.add_argument("--no-accuracy", action="store_true", help="skip the float64 check (timing only)")
    ap.add_argument("--accuracy-only", action="store_true", help="the float64 check alone (no timing)")
    ap.add_argument("--warm-only", action="store_true",
                    help="each side's first calls alone, untimed (they fill the compile caches on disk)")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="summarise the JSON reports of earlier runs (one or several processes each)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    if args.processes < 1:
        ap.error("--processes: expected at least 1")
    if args.merge or (args.processes > 1 and not args.build_only):
        return several(args, argv)
    t_start = time.monotonic()

    def out_of_time():
        return time.monotonic() - t_start > args.budget_s

    names = [n for n in args.workloads.split(",") if n]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        ap.error(f"--workloads: unknown {unknown}; known: {', '.join(WORKLOADS)}")
    if not args.no_peer and args.mamba_src is None:
        ap.error("--mamba-src is needed (or --no-peer)")
    src = args.mamba_src.resolve() if args.mamba_src else None
    if src is not None and not (src / "mamba_ssm").is_dir():
        ap.error(f"--mamba-src: {src} has no mamba_ssm/ folder")

    ops: dict = {"why": {}}
    build = None
    if not args.no_peer:
        try:
            import torch

            if not torch.cuda.is_available():
                raise RuntimeError("torch sees no CUDA device")
        except Exception as e:
            why = f"not run: {type(e).__name__}: {e}"
            ops["why"] = {"mamba2": why, "mamba1": why, "decode": why, "mamba3": why, "m3decode": why}
        if args.build_only and ops["why"]:
            print(f"selective_scan_cuda: {ops['why']['mamba1']}")
            return 1
        if args.build_only:
            build = build_selective_scan(src, args.build_dir, args.budget_s)
            print(f"selective_scan_cuda: {build['message']} in {build['seconds']:.0f} s (log {build['log']})")
            return 0 if build["module"] is not None else 1
        if not ops["why"]:
            try:
                peer_package(src)
                ops["combined"], ops["update"] = triton_ops()
            except Exception as e:
                traceback.print_exc()
                ops["why"]["mamba2"] = ops["why"]["decode"] = f"not loaded: {type(e).__name__}: {e}"
            if any(WORKLOADS[n][0] in M3 for n in names) and "mamba2" not in ops["why"]:
                try:
                    ops.update(m3.load_peer())
                except Exception as e:
                    traceback.print_exc()
                    ops["why"]["mamba3"] = ops["why"]["m3decode"] = f"not loaded: {type(e).__name__}: {e}"
    else:
        ops["why"] = {f: "not run (--no-peer)" for f in ("mamba2", "mamba1", "decode", *M3)}

    h = header(args, argv, src)
    for k, v in h.items():
        print(f"{k}: {v}", flush=True)

    rows, notes = [], []
    # mamba's Mamba-1 kernel is built (or loaded, when --build-only made it) before any timing:
    # a build beside the timed calls would load the CPUs, and one left for the first Mamba-1
    # workload could find the budget spent by the workloads before it
    if any(WORKLOADS[n][0] == "mamba1" for n in names) and "mamba1" not in ops["why"]:
        try:
            build = build_selective_scan(src, args.build_dir, args.budget_s - (time.monotonic() - t_start) - 30)
            print(f"selective_scan_cuda: {build['message']} in {build['seconds']:.0f} s (log {build['log']})",
                  flush=True)
            if build["module"] is None:
                ops["why"]["mamba1"] = f"not built: {build['message'].splitlines()[0]}"
            else:
                ops["m1"] = mamba1_ops(build["module"])
        except Exception as e:
            traceback.print_exc()
            ops["why"]["mamba1"] = f"not built: {type(e).__name__}: {e}"
    for name in names:
        if out_of_time():
            notes.append(f"{name}: skipped, over the {args.budget_s:.0f} s budget")
            print(notes[-1], flush=True)
            continue
        print(f"{name}:", flush=True)
        try:
            rows += run_workload(name, args, ops, notes, out_of_time)
        except Exception as e:
            traceback.print_exc()
            rows.append(dict(workload=name, family=WORKLOADS[name][0], error=f"{type(e).__name__}: {e}"))

    from clocks import log_samples

    clk, why = log_samples(args.clocks)
    if why:
        notes.append(why)
    for r in rows:
        if r.get("ours"):
            r["sm_mhz_ours"] = sm_clocks(clk, r["ours"]["spans"])
            r["sm_mhz_peer"] = sm_clocks(clk, r["peer"]["spans"]) if r.get("peer") else "-"
    md = report(h, build, rows, notes, clk)
    print("\n" + md, flush=True)
    if args.md:
        Path(args.md).write_text(md)
    if args.json:
        b = {k: v for k, v in (build or {}).items() if k != "module"} or None
        with open(args.json, "w") as fh:
            json.dump(dict(header=h, build=b, rows=rows, notes=notes, total_s=time.monotonic() - t_start), fh,
                      indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
