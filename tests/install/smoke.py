"""The installed package as a user meets it: run from outside the checkout, in a virtual
environment that holds only a built wheel or sdist (``tests/install/run.sh`` makes them).

    python smoke.py --mode glslc|no-glslc|no-binding [--readme README.md]

Every backend runs the forward and backward of a handful of shapes (d_state 5, 16, 24, 128;
Mamba-1 and Mamba-2; one that the chunked Mamba-2 kernels take, one whose chunked variant no wheel
packages), ``ssm_vk`` also with state snapshots (K = 3) and in the invariant mode; each result is
held to the tolerance table against the float64 oracle, and for ``ssm_vk``:

- ``supports()`` is the call's own answer: ok means the result says it ran on the device, a
  refusal means it ran on the CPU, and the refusal's reason was logged;
- with device-resident inputs the results are DeviceArrays, whether the call ran on the device or
  fell back;
- what the mode implies: with glslc every shape runs on the device; without glslc the packaged
  shapes do and the others fall back; without the ``vulkan`` binding everything falls back and the
  reason says how to install it.

Then ``ssm-scan check --quick``, ``ssm-scan info`` and (mode glslc) ``ssm-scan check --quick --op
mamba3`` must succeed, and (with a README path, and
the binding there: the README's device examples upload with ``ssm_vk.to_device``) every Python
block of the README runs. Exit status 0 when everything holds; each failure is printed.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/snippets.py (stdlib only)
from snippets import python_blocks, run_block

import ssm_fast
import ssm_ref
import ssm_vk
from ssm_ref.extras import install_hint
from ssm_ref.tolerance import F32_TOL, compare, scaled
from ssm_vk.registry import MODES_N

# (label, S, T, H, P, N, G, mamba1, packaged): packaged = the wheel's SPIR-V covers it on every
# device profile it is built for (ssm-scan build-shaders' defaults: the token-sequential kernels
# for every d_state up to 256, the chunked ones for head_dim 32/64/128 x d_state 64/128/256).
SHAPES = (
    ("mamba2 N=5", 2, 9, 4, 3, 5, 2, False, True),
    ("mamba2 N=16", 2, 12, 4, 8, 16, 1, False, True),
    ("mamba1 N=16", 1, 20, 8, 1, 16, 1, True, True),
    ("mamba2 N=24", 1, 7, 2, 4, 24, 1, False, True),
    ("mamba2 N=128", 1, 8, 2, 16, 128, 1, False, True),
    ("mamba2 N=300", 1, 3, 2, 2, 300, 1, False, False),                  # beyond the packaged d_state
    ("mamba2 chunked P=64 N=128", 1, 256, 2, 64, 128, 1, False, True),
    ("mamba2 chunked P=48 N=128", 1, 256, 2, 48, 128, 1, False, True),  # token-sequential without glslc
)

failures: list[str] = []


def fail(msg: str) -> None:
    failures.append(msg)
    print(f"FAIL {msg}", flush=True)


def problem(S, T, H, P, N, G, mamba1, seed):
    rng = np.random.default_rng(seed)
    f = np.float32
    a = dict(s=rng.uniform(-0.5, 0.5, (S, H, P, N)).astype(f), x=rng.uniform(-1, 1, (S, T, H, P)).astype(f),
             dt=rng.uniform(-0.5, 0.5, (S, T, H)).astype(f),
             A=(-rng.uniform(0.2, 1.0, (H, N) if mamba1 else (H,))).astype(f),
             B=rng.uniform(-0.5, 0.5, (S, T, G, N)).astype(f), C=rng.uniform(-0.5, 0.5, (S, T, G, N)).astype(f))
    grads = dict(g_y=rng.uniform(-1, 1, (S, T, H, P)).astype(f), g_states=rng.uniform(-1, 1, (S, H, P, N)).astype(f))
    return a, grads


def host(v):
    return v.numpy() if isinstance(v, ssm_vk.DeviceArray) else np.asarray(v)


def judge(label, backend, res, want, names, T) -> None:
    table = scaled(F32_TOL, T)
    for k in names:
        c = compare(k, host(getattr(res, k)), getattr(want, k), table[k])
        if not c.ok:
            fail(f"{label}: {backend} {k}: {c}")


class Logged(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def check_vk(label, sup, res, logged: Logged, mode: str, packaged: bool) -> None:
    on_device = res.where.startswith("Vulkan")
    if bool(sup) != on_device or (res.backend == "ssm_vk") != on_device:
        fail(f"{label}: supports() said {sup} but the call ran on {res.where} ({res.backend})")
    if not sup and not any(sup.reason in m for m in logged.messages):
        fail(f"{label}: the fallback's reason was not logged: {sup.reason!r}")
    expect = {"glslc": True, "no-glslc": packaged, "no-binding": False}[mode]
    if on_device != expect:
        fail(f"{label}: mode {mode}: expected {'the device' if expect else 'a fallback'}, got {res.where}: "
             f"{sup.reason}")
    if mode == "no-binding" and install_hint("vulkan", "vulkan") not in sup.reason:
        fail(f"{label}: without the binding the reason should say how to install it: {sup.reason!r}")


def run_shapes(mode: str) -> None:
    logged = Logged()
    logging.getLogger("ssm_vk").addHandler(logged)
    have_device = bool(ssm_vk.devices())
    if mode != "no-binding" and not have_device:
        fail("no Vulkan device: the smoke suite needs one (lavapipe on CI)")
    for i, (label, S, T, H, P, N, G, mamba1, packaged) in enumerate(SHAPES):
        a, gr = problem(S, T, H, P, N, G, mamba1, seed=i)
        want = ssm_ref.ssm_scan(**a, dtype=np.float64)
        want_g = ssm_ref.ssm_scan_back(**a, ids=None, **gr, dtype=np.float64)
        for mod in (ssm_ref, ssm_fast, ssm_vk):
            try:
                r = mod.ssm_scan(**a)
                g = mod.ssm_scan_back(**a, ids=None, **gr)
            except Exception as exc:  # what the smoke suite is for
                fail(f"{label}: {mod.NAME} raised {type(exc).__name__}: {exc}")
                continue
            judge(label, mod.NAME, r, want, ("y", "states"), T)
            judge(label, mod.NAME, g, want_g, ssm_ref.GRAD_NAMES, T)
            if mod is ssm_vk:
                sup = ssm_vk.supports("ssm_scan", **a)
                check_vk(f"{label} forward", sup, r, logged, mode, packaged)
                check_vk(f"{label} backward", ssm_vk.supports("ssm_scan_back", **a), g, logged, mode, packaged)
                if mode == "no-glslc" and "P=48" in label and "token-sequential" not in sup.reason:
                    fail(f"{label}: the chunked kernels are not packaged; supports() should say the "
                         f"token-sequential kernels run it: {sup.reason!r}")
        # the modes' variants are packaged for the d_state of Mamba models only (registry.MODES_N):
        # at another N a wheel without glslc falls back, and says so
        run_modes(label, a, gr, T, logged, mode, packaged and N in MODES_N, seed=i)
        if have_device:  # device-resident inputs: DeviceArrays out, on the device or not
            dev = {k: ssm_vk.to_device(v) for k, v in a.items()}
            dgr = {k: ssm_vk.to_device(v) for k, v in gr.items()}
            try:
                r = ssm_vk.ssm_scan(**dev)
                g = ssm_vk.ssm_scan_back(**dev, ids=None, **dgr)
            except Exception as exc:
                fail(f"{label}: ssm_vk with device arrays raised {type(exc).__name__}: {exc}")
                continue
            for res, names in ((r, ("y", "states")), (g, ssm_ref.GRAD_NAMES)):
                wrong = [k for k in names if not isinstance(getattr(res, k), ssm_vk.DeviceArray)]
                if wrong:
                    fail(f"{label}: device-resident inputs, {res.where}: {wrong} are not DeviceArrays")
            judge(label, "ssm_vk (device arrays)", r, want, ("y", "states"), T)
            judge(label, "ssm_vk (device arrays)", g, want_g, ssm_ref.GRAD_NAMES, T)
        print(f"ok   {label}: ssm_vk {r.where}", flush=True)


def run_modes(label, a, gr, T, logged: Logged, mode: str, packaged: bool, seed: int, K: int = 3) -> None:
    """ssm_vk with K state snapshots (forward, and the backward given g_snapshots) and in the
    invariant mode: the packaged matrix holds their variants for the d_state of Mamba models
    (``packaged`` says whether this shape's are), so the mode implies the device-or-fallback
    answer for them (every shape has T >= K: all K slots are states)."""
    S, H, P, N = a["s"].shape
    gsn = np.random.default_rng(seed).uniform(-1, 1, (K, S, H, P, N)).astype(np.float32)
    want = ssm_ref.ssm_scan(**a, snapshots=K, dtype=np.float64)
    want_g = ssm_ref.ssm_scan_back(**a, ids=None, **gr, g_snapshots=gsn, dtype=np.float64)
    plain = ssm_ref.ssm_scan_back(**a, ids=None, **gr, dtype=np.float64)
    for name, fwd_kw, bwd_kw, wg in ((f"snapshots={K}", {"snapshots": K}, {"g_snapshots": gsn}, want_g),
                                     ("invariant", {"invariant": True}, {"invariant": True}, plain)):
        try:
            r = ssm_vk.ssm_scan(**a, **fwd_kw)
            g = ssm_vk.ssm_scan_back(**a, ids=None, **gr, **bwd_kw)
        except Exception as exc:  # what the smoke suite is for
            fail(f"{label} {name}: ssm_vk raised {type(exc).__name__}: {exc}")
            continue
        judge(f"{label} {name}", "ssm_vk", r, want, ("y", "states"), T)
        judge(f"{label} {name}", "ssm_vk", g, wg, ssm_ref.GRAD_NAMES, T)
        if "snapshots" in fwd_kw:
            c = compare("states", host(r.snapshots), want.snapshots, scaled(F32_TOL, T)["states"])
            if not c.ok:
                fail(f"{label} {name}: ssm_vk snapshots: {c}")
        back_kw = {"snapshots": K} if "snapshots" in fwd_kw else bwd_kw
        check_vk(f"{label} forward {name}", ssm_vk.supports("ssm_scan", **a, **fwd_kw), r, logged, mode, packaged)
        check_vk(f"{label} backward {name}", ssm_vk.supports("ssm_scan_back", **a, **back_kw), g, logged, mode,
                 packaged)


# The installed command's exit codes as its help documents them (0 success, 2 a usage error, 3 an
# output that cannot be written), and --version naming the installed version.
_CLI_CODES = ((["--version"], 0), (["fuzz", "--minutes", "0.01", "--property", "nope"], 2),
              (["vectors", "--out", "/proc/ssm-scan-cannot-write-here"], 3))


def run_cli(mode: str) -> None:
    exe = Path(sys.executable).with_name("ssm-scan")
    # Mamba-3's check once, in the first mode: its kernels are ssm_ref's and ssm_fast's (numba compiles
    # them on first use, ~12 s, in every fresh environment), which no mode changes.
    m3 = [[str(exe), "check", "--quick", "--op", "mamba3"]] if mode == "glslc" else []
    for cmd in ([str(exe), "info"], [str(exe), "check", "--quick"], *m3):
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, check=False)
        if run.returncode != 0:
            fail(f"{' '.join(cmd[1:])} exited {run.returncode}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
        else:
            print(f"ok   ssm-scan {' '.join(cmd[1:])}", flush=True)
    for args, code in _CLI_CODES:
        run = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300, check=False)
        if run.returncode != code or (code == 0 and ssm_vk.__version__ not in run.stdout):
            fail(f"ssm-scan {' '.join(args)} exited {run.returncode} (expected {code}):\n{run.stdout[-2000:]}"
                 f"\n{run.stderr[-2000:]}")
        elif code == 2 and run.stdout.strip():
            fail(f"ssm-scan {' '.join(args)} printed before failing:\n{run.stdout[-2000:]}")
        else:
            print(f"ok   ssm-scan {' '.join(args)}: exit {code}", flush=True)


def run_readme(readme: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for line, code in python_blocks(readme):
            failed, out = run_block(code, sys.executable, Path(tmp), None, 1200)
            if failed:
                fail(f"{readme.name}:{line}: {failed}:\n{out[-4000:]}")
            else:
                print(f"ok   {readme.name}:{line}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", required=True, choices=("glslc", "no-glslc", "no-binding"))
    ap.add_argument("--readme", type=Path, help="run every Python block of this README too")
    args = ap.parse_args()
    here = Path(ssm_vk.__file__).resolve()
    print(f"ssm-scan {ssm_vk.__version__} from {here.parent}; mode {args.mode}; cwd {os.getcwd()}", flush=True)
    if "site-packages" not in here.parts:
        fail(f"ssm_vk was imported from {here}, not from an installed package")
    have_glslc = any((Path(d) / "glslc").is_file() for d in os.environ.get("PATH", "").split(os.pathsep) if d)
    if args.mode != "no-binding" and have_glslc != (args.mode == "glslc"):
        fail(f"mode {args.mode} but glslc {'is' if have_glslc else 'is not'} on PATH")
    run_shapes(args.mode)
    run_cli(args.mode)
    if args.readme is not None and args.mode != "no-binding":
        run_readme(args.readme)
    print(f"{len(failures)} failure(s)" if failures else "smoke: all passed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
