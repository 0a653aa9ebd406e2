"""Lifetimes under pressure: what threads, faults and long runs do to contexts, buffers and
descriptor sets of ssm_vk -- each test provokes what a hostile run found:

- a device lost while eight threads call forward and backward: no crash, no hang; each call
  returns the result the device gives alone, or raises DeviceLost, and later calls recover;
- a DeviceArray released while another thread's call reads it: that call's result is still right
  (the buffer is not handed out again before the work that reads it has finished);
- device-resident calls over more shapes than the workspace cache holds, results held: the
  descriptor sets and memory stay flat after warm-up.

The crash tests run in subprocesses (a crash must fail the test, not end the session), with the
validation layer off there (it serialises too much to race) -- the suite's own contexts keep it on.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from children import REPO, child_env
from problems import make_problem

import ssm_vk
from ssm_vk import runtime as rt
from ssm_vk.runtime import pipelines

pytestmark = pytest.mark.vulkan

LOSS = textwrap.dedent("""
    import faulthandler, json, sys, threading, time, traceback
    faulthandler.enable()
    import numpy as np
    sys.path.insert(0, {tests!r})
    from problems import make_problem
    import ssm_vk
    from ssm_vk import runtime as rt

    THREADS, ROUNDS, SECONDS, EVERY = 8, {rounds}, {seconds}, 0.3
    cases = [make_problem(np.random.default_rng(300 + k), S=1 + k % 2, T=4 + k, H=2, P=2 + k % 3, N=4 + 3 * k,
                          G=1, variant="mamba1" if k % 4 == 3 else "mamba2") for k in range(THREADS)]

    def call(case):
        a = case.args()
        r = ssm_vk.ssm_scan(**a)
        g = ssm_vk.ssm_scan_back(**a, g_y=case.g_y, g_states=case.g_states)
        return r, g

    want = []
    for case in cases:
        r, g = call(case)
        assert r.where.startswith("Vulkan") and g.where.startswith("Vulkan"), (r.where, g.where)
        want.append((r.y, r.states, g.d_x, g.d_A))
    errors, counts = [], {{"ok": 0, "lost": 0, "injected": 0, "contexts": set()}}
    lock = threading.Lock()

    def worker(k, stop):
        while time.monotonic() < stop:
            try:
                r, g = call(cases[k])
            except rt.DeviceLost:
                with lock:
                    counts["lost"] += 1
                continue
            except BaseException:
                with lock:
                    errors.append(traceback.format_exc())
                return
            got = (r.y, r.states, g.d_x, g.d_A)
            same = all(np.array_equal(u, v) for u, v in zip(got, want[k]))
            with lock:
                if not (r.where.startswith("Vulkan") and same):
                    errors.append(f"thread {{k}}: {{r.where}} {{g.where}} results differ from the single-thread ones")
                counts["ok"] += 1

    def injector(stop):
        while time.monotonic() < stop - EVERY:
            time.sleep(EVERY)
            ctx = rt.current_context()
            if ctx is not None:
                with lock:
                    counts["contexts"].add(id(ctx))
                    counts["injected"] += 1
                ctx.seams.fail_next_submit(rt.DeviceLost)

    for _ in range(ROUNDS):
        stop = time.monotonic() + SECONDS
        threads = [threading.Thread(target=worker, args=(k, stop)) for k in range(THREADS)]
        threads.append(threading.Thread(target=injector, args=(stop,)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=SECONDS + 60)
            if t.is_alive():
                errors.append("a thread hung")
                faulthandler.dump_traceback(sys.stderr)
                print(json.dumps({{"errors": errors}}))
                sys.stdout.flush()
                import os
                os._exit(3)
    # after the storm: a plain call works
    r, _ = call(cases[0])
    assert np.array_equal(r.y, want[0][0])
    counts["contexts"] = len(counts["contexts"])
    print(json.dumps({{"errors": errors[:5], **counts}}))
""")


@pytest.fixture(scope="module")
def storms(request):
    """The selected runs' processes, started together (each storm is timed, not counted: two at
    once take the time of one): run -> Popen."""
    test = test_device_loss_under_eight_threads_neither_crashes_nor_hangs.__name__
    runs = [item.callspec.params["run"] for item in request.session.items
            if item.module is request.module and item.originalname == test]
    code = LOSS.format(tests=str(REPO / "tests"), rounds=5, seconds=1.5)
    started = {run: subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=child_env(SSM_VK_VALIDATION="0", SSM_VK_TIMEOUT_S="30"))
               for run in runs}
    yield started
    for p in started.values():   # (a test stopped early: no storm outlives the module)
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.parametrize("run", range(2))   # (each run a storm of its own: other interleavings)
def test_device_loss_under_eight_threads_neither_crashes_nor_hangs(run, storms):
    p = storms[run]
    try:
        stdout, stderr = p.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        p.kill()
        stdout, stderr = p.communicate()
        pytest.fail(f"the storm ran past 600 s\n{stdout[-2000:]}\n{stderr[-6000:]}")
    assert p.returncode == 0, f"exit {p.returncode}\n{stdout[-2000:]}\n{stderr[-6000:]}"
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["errors"] == [], out["errors"]
    assert out["injected"] >= 5 and out["lost"] >= 1 and out["ok"] > out["injected"], out
    assert out["contexts"] >= 2, out  # losses were replaced by new contexts, and calls went on


def test_releasing_an_input_during_a_call_never_corrupts_that_call():
    # Thread A runs forwards on a device array; thread B releases that array mid-call and grabs
    # same-sized buffers from the pool with uploads of garbage. A's result must be the right one
    # (the release waits for the work that reads the buffer), or A must raise.
    case = make_problem(np.random.default_rng(400), S=2, T=64, H=8, P=16, N=64, G=1)
    a = case.args()
    want = ssm_vk.ssm_scan(**a).y
    garbage = np.full(a["x"].shape, 1e6, np.float32)
    wrong, raised, done = [], [], 0
    for _ in range(40):
        dev = {k: (v if k == "ids" else ssm_vk.to_device(v)) for k, v in a.items()}
        started = threading.Event()

        def call(dev=dev, started=started):
            started.set()
            try:
                y = ssm_vk.ssm_scan(**dev).y.numpy()
            except RuntimeError as exc:  # released before the call took it: said, not wrong
                raised.append(exc)
                return
            if not np.array_equal(y, want):
                wrong.append(float(np.max(np.abs(y - want))))

        t = threading.Thread(target=call)
        t.start()
        started.wait()
        dev["x"].release()
        grabbed = [ssm_vk.to_device(garbage) for _ in range(4)]
        t.join()
        done += 1
        del grabbed
    assert not wrong, f"{len(wrong)} of {done} calls returned wrong results (max |diff| {max(wrong):.3g})"


def test_descriptor_sets_and_memory_stay_flat_over_many_shapes_with_results_held():
    # More shapes than the workspace cache keeps, in a mixed order, each call's results held until
    # that shape's next call (a training loop): sets must be reused, not accumulated.
    shapes = [make_problem(np.random.default_rng(500 + k), S=1, T=2 + k % 3, H=2, P=2, N=4 + k, G=1)
              for k in range(12)]
    dev = [{k: (v if k == "ids" else ssm_vk.to_device(v)) for k, v in c.args().items()} for c in shapes]
    rng = np.random.default_rng(7)
    held = {}
    ctx = rt.get_context()

    def live_sets() -> int:
        return sum(k.live_sets for k in ctx.cached_kernels())

    def run(n):
        for i in rng.integers(0, len(shapes), n):
            held[int(i)] = ssm_vk.ssm_scan(**dev[i])

    run(1000)                      # warm-up: every shape met many times, the caches filled
    sets1, allocs1 = live_sets(), ctx.live_allocations.count
    run(1500)
    sets2, allocs2 = live_sets(), ctx.live_allocations.count
    run(1500)
    sets3, allocs3 = live_sets(), ctx.live_allocations.count
    # flat: what each kernel keeps is bounded (its idle cache and the sets recorded sequences bind)
    assert sets3 <= sets2 + 8 and sets2 <= sets1 + 8 * len(shapes), (sets1, sets2, sets3)
    assert sets3 <= len(ctx._kernels) * (pipelines.IDLE_SETS + 4 * 8), (sets3, len(ctx._kernels))
    assert allocs3 <= allocs1 + 4, (allocs1, allocs2, allocs3)
    assert all(r.where.startswith("Vulkan") for r in held.values())
    want = ssm_vk.ssm_scan(**shapes[3].args()).y
    np.testing.assert_array_equal(ssm_vk.ssm_scan(**dev[3]).y.numpy(), want)


def test_a_lost_context_is_not_destroyed_under_a_call_still_inside_it(monkeypatch):
    # One thread is inside a call (between its submit and its wait) when another loses the device
    # and asks for a context: the lost one must stay alive until the call leaves it.
    ctx = rt.get_context()
    case = make_problem(np.random.default_rng(600), S=1, T=8, H=2, P=4, N=8, G=1)
    ssm_vk.ssm_scan(**case.args())
    inside, leave = threading.Event(), threading.Event()
    real_wait = rt.Sequence.wait

    def slow_wait(self, timeout_s=None):
        if threading.current_thread().name == "inside" and not inside.is_set():
            inside.set()
            leave.wait(10)
        return real_wait(self, timeout_s)

    monkeypatch.setattr(rt.Sequence, "wait", slow_wait)
    result = {}

    def call():
        try:
            result["r"] = ssm_vk.ssm_scan(**case.args())
        except rt.DeviceLost as exc:
            result["lost"] = exc

    t = threading.Thread(target=call, name="inside")
    t.start()
    assert inside.wait(10)
    ctx.mark_lost()
    new = rt.get_context()             # replaces the lost context...
    assert new is not ctx and not new.lost
    assert not ctx.closed              # ...without destroying it under the call
    leave.set()
    t.join(10)
    assert not t.is_alive()
    assert "r" in result or "lost" in result
    assert ctx.closed                  # and the last call to leave it closed it
    assert ssm_vk.ssm_scan(**case.args()).where.startswith("Vulkan")


def test_a_process_replaces_its_context_many_times():
    # An NVIDIA driver refused the 31st VkInstance of a process (VK_ERROR_INCOMPATIBLE_DRIVER) even
    # with every earlier one destroyed; contexts share the process's instance, so closing and
    # replacing the context (a lost device, close() then get_context()) never runs out.
    case = make_problem(np.random.default_rng(800), S=1, T=3, H=2, P=2, N=4, G=1)
    want = ssm_vk.ssm_scan(**case.args()).y
    for i in range(40):
        rt.close()
        ctx = rt.get_context()
        assert not ctx.lost, i
        if i % 8 == 0:
            r = ssm_vk.ssm_scan(**case.args())
            assert r.where.startswith("Vulkan") and np.array_equal(r.y, want), i
