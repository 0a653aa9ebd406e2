"""ids changed by another thread during a call: every backend reads them once, into a copy.

The kernels index ``s[ids[i]]`` without a bounds check, so ids that reach them must be the ones
that passed the range check. A writer thread flips the caller's ids between valid rows and out of
range values while the main thread calls the backend; in a subprocess, so that a crash is a test
failure and not the end of the test run. Every call must either raise the range check's
ValueError or return, for each sequence i, exactly the result of a call with one of the two valid
values that ids[i] took -- never a crash, never a mix of rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from children import child_env
from registry import BACKENDS

CHILD = textwrap.dedent(r"""
    import json, sys, threading, time
    import numpy as np
    import {module} as m

    device = {device}
    rng = np.random.default_rng(5)
    S, R, T, H, P, N, G = 4, 4, 24, 4, 8, 32, 1
    f = np.float32
    s = rng.uniform(-0.5, 0.5, (R, H, P, N)).astype(f)
    x, dt = rng.uniform(-1, 1, (S, T, H, P)).astype(f), rng.uniform(-0.5, 0.5, (S, T, H)).astype(f)
    A = (-rng.uniform(0.2, 1, (H,))).astype(f)
    B, C = rng.uniform(-0.5, 0.5, (S, T, G, N)).astype(f), rng.uniform(-0.5, 0.5, (S, T, G, N)).astype(f)
    gy, gs = rng.uniform(-1, 1, (S, T, H, P)).astype(f), rng.uniform(-1, 1, (S, H, P, N)).astype(f)
    floats = dict(s=s, x=x, dt=dt, A=A, B=B, C=C)
    if device:
        floats = {{k: m.to_device(v) for k, v in floats.items()}}

    def host(a):
        return a.numpy() if hasattr(a, "numpy") and not isinstance(a, np.ndarray) else a

    # sequence i reads row i or row (i + 1) % R: the result of each, sequence by sequence
    valid = [(i, (i + 1) % R) for i in range(S)]
    want = {{}}
    for k in range(2):
        ids = np.array([v[k] for v in valid], dtype=np.int64)
        r = m.ssm_scan(**floats, ids=ids)
        y, st = host(r.y), host(r.states)
        for i in range(S):
            want[(i, int(ids[i]))] = (y[i].copy(), st[i].copy())

    ids = np.array([v[0] for v in valid], dtype=np.int64)  # C-contiguous int64: the fast path
    stop = threading.Event()

    def writer():
        pick = np.random.default_rng(6)
        while not stop.is_set():
            i = int(pick.integers(S))
            if pick.integers(4) == 0:  # now and then out of range, for one switch to the caller
                ids[i] = (10**12, -3)[int(pick.integers(2))]
                time.sleep(0)
            ids[i] = valid[i][int(pick.integers(2))]
            time.sleep(0)  # let the caller run between writes (and write while it is in numpy or a kernel)

    t = threading.Thread(target=writer)
    t.start()
    ok = raised = mixed = n = 0
    deadline = time.monotonic() + 60
    try:
        # at least {calls} calls, and on until both outcomes were seen (a call that raises is quick:
        # many fit in one switch interval during which the ids hold an out-of-range value)
        while n < {calls} or (min(ok, raised) < 5 and time.monotonic() < deadline):
            n += 1
            try:
                r = m.ssm_scan(**floats, ids=ids)
                if n % 8 == 0:
                    m.ssm_scan_back(**floats, ids=ids, g_y=gy, g_states=gs)
            except ValueError as e:
                assert str(e).startswith("ids:"), e
                raised += 1
                continue
            y, st = host(r.y), host(r.states)
            good = all(any(np.array_equal(y[i], want[(i, v)][0]) and np.array_equal(st[i], want[(i, v)][1])
                           for v in valid[i]) for i in range(S))
            ok += good
            mixed += not good
    finally:
        stop.set()
        t.join()
    print(json.dumps(dict(ok=ok, raised=raised, mixed=mixed)))
""")

CASES = [(b.name, False) for b in BACKENDS] + [(b.name, True) for b in BACKENDS if b.name == "ssm_vk"]


@pytest.mark.parametrize(("module", "device"), CASES, ids=[f"{m}{'-device' if d else ''}" for m, d in CASES])
def test_ids_written_by_another_thread_during_calls(module, device):
    code = CHILD.format(module=module, device=device, calls=300 if module != "ssm_vk" else 100)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(),
                         timeout=900, check=False)
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])  # a segfault is -11
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["mixed"] == 0, out
    assert out["ok"] > 0 and out["raised"] > 0, out  # the writer did race the calls both ways
