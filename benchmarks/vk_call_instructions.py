"""CPU instructions of ssm_vk's Python per steady-state call (device-resident by default), counted
by valgrind's callgrind: the figure of docs/BENCHMARKS.md, "Python per call".

    python benchmarks/vk_call_instructions.py [--calls 2000] [--modes fwd,bwd] [--tree DIR]

Needs valgrind (Debian: ``apt-get install valgrind``, which brings ``valgrind/callgrind.h``), a C
compiler and a Vulkan device (lavapipe will do: the submit is stubbed out, so the device does no
work in the counted loop). For each mode it runs, under callgrind with instrumentation off, a child
that makes the call a few times (planning, recording, the kept replay), stubs out ``Sequence.submit``,
runs 50 more, then counts exactly ``--calls`` calls between two client requests (a small C library
built here into a temporary folder) and prints instructions per call. ``--tree`` counts another
checkout (e.g. an older commit's ``git worktree``), imported through PYTHONPATH, so two versions can
be counted one after the other on one machine. Modes: ``fwd`` / ``bwd`` (device inputs, the kept
replay's path), ``fwd-miss`` / ``bwd-miss`` (the kept replays cleared before each call: the full path), ``fwd-host``
/ ``bwd-host`` / ``step-host`` (host arrays and host results; ``step`` is a forward and its backward
on the same arrays, counted as one call), each also with ``-staged`` (the ``force_staging`` seam: a
discrete GPU's path, its staging slots written and compared, the copies recorded);
``fwd-prepared`` / ``bwd-prepared`` (``run()`` of a prepared call of the device inputs); each with
the prefix ``m3-`` (``m3-fwd``, ``m3-bwd``, ...): Mamba-3's calls instead (SISO, start states), and
``m3-dec``: a Mamba-3 decode step (one token, ``update_cache=True`` on DeviceArray caches).
The shape is tiny, (S, T, H, P, N, G) = (1, 4, 2, 4, 8, 1): the count is Python's, not the scan's.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_C = """#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT("loop"); }
"""

_CHILD = """
import ctypes, sys
import numpy as np
import ssm_vk
from ssm_vk import engine as vk_engine
from ssm_vk import runtime as rt

lib, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
S, T, H, P, N, G = 1, 4, 2, 4, 8, 1
rng = np.random.default_rng(0)
f = np.float32
a = dict(s=rng.uniform(-0.5, 0.5, (S, H, P, N)).astype(f), x=rng.uniform(-1, 1, (S, T, H, P)).astype(f),
         dt=rng.uniform(-1, 1, (S, T, H)).astype(f), A=-rng.uniform(0.2, 1, H).astype(f),
         B=rng.uniform(-0.5, 0.5, (S, T, G, N)).astype(f), C=rng.uniform(-0.5, 0.5, (S, T, G, N)).astype(f),
         ids=np.arange(S), g_y=rng.uniform(-1, 1, (S, T, H, P)).astype(f),
         g_states=rng.uniform(-1, 1, (S, H, P, N)).astype(f))
m3 = mode.startswith("m3-")
mode = mode.removeprefix("m3-")
back = mode.startswith(("bwd", "step"))
host = "-host" in mode
rt.get_context().seams.force_staging = mode.endswith("-staged")
names = ("s", "x", "dt", "A", "B", "C", "ids") + (("g_y", "g_states") if back else ())
if m3:   # Mamba-3 (SISO, start states, F = 2): its inputs, and the backward's g_y and g_h
    from ssm_ref.testing import mamba3_cases
    dec = mode == "dec"   # a decode step: one token, the four caches (DeviceArrays) written by ids
    case = mamba3_cases.make_case(0, S=S, T=1 if dec else T, H=H, P=P, N=N, G=G, F=2, R=S, ids="identity")
    a = {**case.args(), "g_y": case.cotangents["g_y"], "g_h": case.cotangents["g_h"]}
    names = (*case.args(), *(("g_y", "g_h") if back else ()))
args = {k: (v if k == "ids" or host or v is None else ssm_vk.to_device(v)) for k, v in a.items() if k in names}
entry = ssm_vk.ssm_scan_back if back else ssm_vk.ssm_scan
if m3:
    entry = ssm_vk.mamba3_scan_back if back else ssm_vk.mamba3_scan
    if dec:
        def entry(**kw):
            return ssm_vk.mamba3_scan(**kw, update_cache=True)
if mode.startswith("step"):
    fwd_args = {k: v for k, v in args.items() if k not in ("g_y", "g_states")}

    def entry(**kw):
        ssm_vk.ssm_scan(**fwd_args)
        return ssm_vk.ssm_scan_back(**kw)
elif mode.endswith("-prepared"):
    prepared = ((ssm_vk.prepare_mamba3_scan_back if back else ssm_vk.prepare_mamba3_scan) if m3 else
                (ssm_vk.prepare_scan_back if back else ssm_vk.prepare_scan))(**args)

    def entry(**kw):
        return prepared.run()
for _ in range(5):
    entry(**args)
rt.Sequence.submit = lambda self, wait=True, timeout_s=None: None
eng = vk_engine.current()
replays = getattr(eng, "replays", None)   # the kept replays (``lanes`` in a tree before their rename: --tree)
if replays is None:
    replays = eng.lanes
miss = mode.endswith("miss")
for _ in range(50):
    if miss:
        replays.clear()
    r = entry(**args)
    del r
cg = ctypes.CDLL(lib)
cg.cg_start()
for _ in range(n):
    if miss:
        replays.clear()
    r = entry(**args)
    del r
cg.cg_stop()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--modes", default="fwd,bwd")
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1],
                    help="the checkout whose ssm_vk is counted (default: this one)")
    args = ap.parse_args()
    for tool in ("valgrind", "cc"):
        if shutil.which(tool) is None:
            print(f"{tool} is not on PATH (Debian: apt-get install valgrind gcc)", file=sys.stderr)
            return 2
    tree = args.tree.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp) / "libcgctl.so"
        (Path(tmp) / "cgctl.c").write_text(_C)
        subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(Path(tmp) / "cgctl.c")], check=True)
        child = Path(tmp) / "calls.py"
        child.write_text(_CHILD)
        env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=str(tree))
        print(f"ssm_vk of {tree}; {args.calls} calls per mode; CPython {sys.version.split()[0]}")
        for mode in args.modes.split(","):
            out = Path(tmp) / f"{mode}.cg"
            run = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                                  f"--callgrind-out-file={out}", sys.executable, str(child), str(lib), mode,
                                  str(args.calls)], cwd=tmp, env=env, capture_output=True, text=True, check=False)
            if run.returncode:
                print(run.stderr[-3000:], file=sys.stderr)
                return 1
            total = None
            for path in glob.glob(f"{out}*"):
                text = Path(path).read_text(errors="replace")
                if "Trigger: Client Request: loop" in text:
                    m = re.search(r"^totals: (\d+)", text, re.MULTILINE)
                    total = int(m.group(1)) if m else None
            if total is None:
                print(f"{mode}: no counted loop in callgrind's output", file=sys.stderr)
                return 1
            print(f"{mode:10s} {total / args.calls / 1e3:8.1f} k instructions per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
