"""Threads: eight Python threads calling one backend at once, each on its own problem, get the
results a single thread gets -- bit for bit (every backend is deterministic) -- and those are
within tolerance of the float64 oracle.

For ssm_vk the threads also race the creation of the Vulkan context and of every kernel (the
context is closed first), share device-resident inputs, and hammer the buffer pool directly.
What is thread-safe, and why, is written down in docs/RELIABILITY.md ("Threads").
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from children import child_env
from problems import make_problem
from registry import BACKENDS, OUTPUTS, assert_close, oracle_back, oracle_scan

import ssm_ref
import ssm_vk
from ssm_vk import config
from ssm_vk import engine as vk_engine
from ssm_vk import runtime as rt
from ssm_vk.arrays import pool
from ssm_vk.sizing import Limits

REPO = Path(__file__).resolve().parents[2]
THREADS = 8
REPEATS = 3


def _problem(k: int):
    """Problem k of eight: every thread gets other sizes, ids and variant."""
    return make_problem(np.random.default_rng(100 + k), S=1 + k % 3, T=2 + 3 * k, H=2 * (1 + k % 2), P=1 + k % 4,
                        N=3 + 5 * k, G=1 + k % 2, ids=("permutation", "duplicates", "none", "unused")[k % 4],
                        variant="mamba1" if k % 3 == 2 else "mamba2")


PROBLEMS = [_problem(k) for k in range(THREADS)]


def _run(module, case, device=False):
    a = case.args()
    gy, gs = case.g_y, case.g_states
    if device:
        a = {k: (v if k == "ids" or v is None else ssm_vk.to_device(v)) for k, v in a.items()}
        gy, gs = ssm_vk.to_device(gy), ssm_vk.to_device(gs)
    r = module.ssm_scan(**a)
    g = module.ssm_scan_back(**a, g_y=gy, g_states=gs)
    out = {"y": r.y, "states": r.states, **g.as_dict()}
    return {k: (v.numpy() if isinstance(v, ssm_vk.DeviceArray) else v) for k, v in out.items()}


def _in_threads(work, n=THREADS):
    """Run work(k) for k < n in n threads started together; re-raise the first error."""
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def body(k):
        try:
            start.wait()
            work(k)
        except BaseException as exc:  # reported below, with its traceback
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(k,), name=f"ssm-test-{k}") for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


def _assert_same(got, want, label):
    for name in OUTPUTS:
        assert np.array_equal(got[name], want[name], equal_nan=True), f"{label}: {name} differs from one thread's"


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_eight_threads_get_the_single_thread_results(backend):
    m = backend.module
    want = [_run(m, c) for c in PROBLEMS]
    for case, w in zip(PROBLEMS, want, strict=True):  # and those are right
        a = case.args()
        o, og = oracle_scan(**a), oracle_back(**a, g_y=case.g_y, g_states=case.g_states)
        for name, ref in {"y": o.y, "states": o.states, **og.as_dict()}.items():
            assert_close(backend, name, w[name], ref, label=case.label)
    if m is ssm_vk:
        rt.close()  # the threads race the context's creation and every kernel's build too

    def work(k):
        for r in range(REPEATS):
            _assert_same(_run(m, PROBLEMS[k]), want[k], f"thread {k} call {r}")

    _in_threads(work)
    if m is ssm_vk:
        # Sixteen shapes (eight problems, forward and backward) for eight cached workspaces: the
        # threads evicted each other's. Dropping the cache must give every buffer back; one that
        # stays out was taken by a workspace used after its eviction, and would never come back.
        ctx = rt.get_context()
        vk_engine.clear(ctx)
        assert pool(ctx).in_use == 0


@pytest.mark.vulkan
def test_threads_with_device_resident_and_shared_inputs():
    want = [_run(ssm_vk, c) for c in PROBLEMS]
    shared = PROBLEMS[0]
    dev = {k: (v if k == "ids" or v is None else ssm_vk.to_device(v)) for k, v in shared.args().items()}
    dev_g = (ssm_vk.to_device(shared.g_y), ssm_vk.to_device(shared.g_states))
    ctx = rt.get_context()

    def work(k):
        for r in range(REPEATS):
            if k % 2:  # odd threads: the same device arrays at once (bound by several sequences)
                g = ssm_vk.ssm_scan_back(**dev, g_y=dev_g[0], g_states=dev_g[1])
                f = ssm_vk.ssm_scan(**dev)
                got = {"y": f.y.numpy(), "states": f.states.numpy(), **{n: v.numpy() for n, v in g.as_dict().items()}}
                _assert_same(got, want[0], f"thread {k} shared call {r}")
            else:
                _assert_same(_run(ssm_vk, PROBLEMS[k], device=True), want[k], f"thread {k} device call {r}")

    _in_threads(work)
    for a in (*dev.values(), *dev_g):
        if isinstance(a, ssm_vk.DeviceArray):
            a.release()
    vk_engine.clear(ctx)  # the workspaces' own buffers
    assert pool(ctx).in_use == 0


@pytest.mark.vulkan
def test_threads_racing_forwards_and_backwards_of_one_chunked_shape(monkeypatch, knobs):
    # Eight threads, one Mamba-2 shape on the chunked kernels, each with its own device arrays:
    # forward then backward, again and again. A backward takes the chunk tables a forward left
    # only when that forward ran on its very arrays and nothing overwrote them since; taking
    # another thread's (or half-overwritten ones) would change its bits. Every result must be
    # the single-thread one, bit for bit.
    monkeypatch.delenv("SSM_VK_TUNE", raising=False)
    knobs(CHUNK=16, CHUNK_MIN_T=1)
    vk_engine.clear()
    cases = [make_problem(np.random.default_rng(300 + k), S=2, T=37, H=4, P=3, N=5, G=2, ids="permutation")
             for k in range(THREADS)]
    want = [_run(ssm_vk, c) for c in cases]      # host inputs: the backward recomputes

    def work(k):
        dev = {n: (v if n == "ids" else ssm_vk.to_device(v)) for n, v in cases[k].args().items()}
        gy, gs = ssm_vk.to_device(cases[k].g_y), ssm_vk.to_device(cases[k].g_states)
        for r in range(2 * REPEATS):
            f = ssm_vk.ssm_scan(**dev)
            g = ssm_vk.ssm_scan_back(**dev, g_y=gy, g_states=gs)
            got = {"y": f.y.numpy(), "states": f.states.numpy(), **{n: v.numpy() for n, v in g.as_dict().items()}}
            _assert_same(got, want[k], f"thread {k} call {r}")

    try:
        _in_threads(work)
        ctx = rt.get_context()
        dims = ssm_ref.check_forward(**cases[0].args()).dims
        ws = vk_engine.engine_of(ctx).find_workspace(dims, True, Limits.of(ctx.info), config.settings())
        assert ws.family.name == "chunked"
    finally:
        vk_engine.clear()


@pytest.mark.vulkan
def test_the_buffer_pool_survives_eight_threads():
    # acquire / release / trim from eight threads: trim used to iterate the free lists while
    # another thread added to them ("dictionary changed size during iteration"), and could close a
    # buffer another thread had just taken.
    ctx = rt.get_context()
    p = rt.BufferPool(ctx)
    before = ctx.live_allocations

    def work(k):
        for j in range(400):
            b = p.acquire(300 * (1 + (j + k) % 40))
            assert not b.closed
            p.release(b)
            if j % 7 == k % 7:
                p.trim()

    try:
        _in_threads(work)
        assert p.in_use == 0
        p.trim()
        assert ctx.live_allocations == before
    finally:
        p.close()
    assert ctx.live_allocations == before


@pytest.mark.vulkan
def test_threads_sharing_more_shapes_than_the_workspace_cache_holds():
    # Threads on the same shapes wait for each other's workspace while others evict it: a thread
    # that looked a workspace up before its eviction must not run in it (its buffers and
    # sequences would never be given back).
    shapes = [make_problem(np.random.default_rng(200 + j), S=1, T=2 + j, H=2, P=2, N=3, G=1)
              for j in range(vk_engine.MAX_WORKSPACES + 2)]
    want = [ssm_vk.ssm_scan(**c.args()).y for c in shapes]

    def work(k):
        for r in range(4):
            for j in range(len(shapes)):
                jj = (j * (1 + k % 3) + k + r) % len(shapes)
                assert np.array_equal(ssm_vk.ssm_scan(**shapes[jj].args()).y, want[jj]), (k, r, jj)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can: races show up
    try:
        _in_threads(work)
    finally:
        sys.setswitchinterval(interval)
    ctx = rt.get_context()
    vk_engine.clear(ctx)
    assert pool(ctx).in_use == 0


@pytest.mark.vulkan
def test_a_workspace_evicted_between_look_up_and_lock_is_not_used(monkeypatch):
    # The gap the test above races for, made certain: another thread evicts the workspace after
    # this call looked it up and before it took the workspace's lock.
    real = vk_engine.Engine.workspace
    evicted = []

    def racing(engine, dims, backward, *rest):
        ws = real(engine, dims, backward, *rest)
        if not evicted:
            evicted.append(ws)
            vk_engine.clear(engine.ctx)
        return ws

    case = make_problem(np.random.default_rng(300), S=2, T=3, H=2, P=2, N=3, G=1)
    want = ssm_vk.ssm_scan(**case.args()).y
    monkeypatch.setattr(vk_engine.Engine, "workspace", racing)
    assert np.array_equal(ssm_vk.ssm_scan(**case.args()).y, want)
    assert evicted[0].closed
    ctx = rt.get_context()
    vk_engine.clear(ctx)
    assert pool(ctx).in_use == 0


@pytest.mark.vulkan
def test_a_context_being_built_is_not_handed_out(monkeypatch):
    # While one thread builds the process's context, another must not be given it (its device
    # does not exist yet: a buffer made on it aborted the process); it waits for the build.
    rt.close()
    real = rt.Context._create
    building, go = threading.Event(), threading.Event()

    def slow(self, chosen):
        building.set()
        assert go.wait(60)
        real(self, chosen)

    monkeypatch.setattr(rt.Context, "_create", slow)
    case = PROBLEMS[0]
    results = {}
    builder = threading.Thread(target=lambda: results.setdefault("ctx", rt.get_context()))
    caller = threading.Thread(target=lambda: results.setdefault("y", ssm_vk.ssm_scan(**case.args()).y))
    builder.start()
    assert building.wait(60)
    assert rt.current_context() is None
    caller.start()
    caller.join(timeout=0.5)
    assert caller.is_alive(), "a call went ahead on a context still being built"
    go.set()
    builder.join(timeout=120)
    caller.join(timeout=120)
    assert rt.current_context() is results["ctx"]
    assert np.array_equal(results["y"], _run(ssm_vk, case)["y"])


# -- ssm_fast and numba's threading layers (subprocesses: the layer is chosen once per process) -----

FAST = [b.name for b in BACKENDS if b.name == "ssm_fast"]
LAYERS = ["default", "workqueue"]  # numba's layer for the user's own parallel code: omp or tbb here, and the unsafe one

FAST_THREADS = textwrap.dedent(r"""
    import json, sys, threading
    import numpy as np
    sys.path.insert(0, {tests!r})
    from problems import make_problem
    import numba, ssm_fast, ssm_fast.config, ssm_fast.pool
    ssm_fast.config.SERIAL_BELOW_S = 0.0  # every call of more than one task on ssm_fast's helper threads
    cases = [make_problem(np.random.default_rng(k), S=2, T=12, H=4, P=8, N=16, G=2, variant=("mamba1", "mamba2")[k % 2])
             for k in range(8)]
    want = [ssm_fast.ssm_scan_back(**c.args(), g_y=c.g_y, g_states=c.g_states).d_x for c in cases]
    bad, start = [], threading.Barrier(8)

    def work(k):
        start.wait()
        for _ in range(10):
            got = ssm_fast.ssm_scan_back(**cases[k].args(), g_y=cases[k].g_y, g_states=cases[k].g_states).d_x
            if not np.array_equal(got, want[k]):
                bad.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        layer = numba.threading_layer()
    except ValueError:  # no numba parallel region ran in this process
        layer = None
    print(json.dumps(dict(layer=layer, bad=bad, helpers=ssm_fast.pool.helper_runs())))
""")


def _layer_env(layer: str) -> dict:
    return child_env(NUMBA_NUM_THREADS="2", **({"NUMBA_THREADING_LAYER": layer} if layer != "default" else {}))


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("module", FAST)
def test_ssm_fast_from_eight_threads_under_every_threading_layer(module, layer):
    # ssm_fast runs its threads itself (ssm_fast/pool.py), never numba's threading layer: under
    # numba's workqueue layer two threads launching parallel kernels at once would abort the whole
    # process ("Concurrent access has been detected", exit 134).
    run = subprocess.run([sys.executable, "-c", FAST_THREADS.format(tests=str(REPO / "tests"))], capture_output=True,
                         text=True, env=_layer_env(layer), timeout=900, check=False)
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["bad"] == [] and out["layer"] is None, out
    assert out["helpers"] > 0, out  # the helper threads did take tasks


FAST_FORK = textwrap.dedent(r"""
    import json, os, signal, sys
    import numba
    import numpy as np
    sys.path.insert(0, {tests!r})
    from problems import make_problem
    import ssm_fast, ssm_fast.config, ssm_fast.pool, ssm_ref
    signal.alarm(300)

    @numba.njit(parallel=True)
    def users_own(n):  # the user's parallel numba code starts numba's threading layer (GNU OpenMP here)
        out = np.zeros(n)
        for k in numba.prange(n):
            out[k] = k
        return out.sum()

    users_own(64)
    ssm_fast.config.SERIAL_BELOW_S = 0.0  # helper threads run in the parent before the fork
    case = make_problem(np.random.default_rng(3), S=2, T=9, H=4, P=4, N=8, G=2)
    want = ssm_fast.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.alarm(120)
        same = True
        for _ in range(200):  # until a helper took part (a small call may be done before one wakes)
            g = ssm_fast.ssm_scan_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
            same = same and all(np.array_equal(getattr(g, k), getattr(want, k)) for k in ssm_ref.GRAD_NAMES)
            if ssm_fast.pool.helper_runs():
                break
        os.write(w, json.dumps(dict(backend=g.backend, same=bool(same), helpers=ssm_fast.pool.helper_runs())).encode())
        os._exit(0)
    os.close(w)
    child = json.loads(os.read(r, 1 << 16).decode() or "{{}}")
    _, status = os.waitpid(pid, 0)
    print(json.dumps(dict(child=child, status=status, layer=numba.threading_layer())))
""")


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("module", FAST)
def test_a_process_forked_after_ssm_fast_ran_still_computes(module, layer):
    # GNU OpenMP is not fork-safe (numba terminates a child forked after the parent's omp layer
    # started), but ssm_fast does not use numba's threading layer: its helper threads are started
    # again in the child, which computes with the kernels and gets the parent's bits.
    run = subprocess.run([sys.executable, "-c", FAST_FORK.format(tests=str(REPO / "tests"))], capture_output=True,
                         text=True, env=_layer_env(layer), timeout=900, check=False)
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])
    out = json.loads(run.stdout.strip().splitlines()[-1])
    child = out["child"]
    assert out["status"] == 0, out
    assert child["backend"] == "ssm_fast" and child["same"] and child["helpers"] > 0, out
