"""Per-call Python overhead of ssm_vk.ssm_scan / ssm_scan_back in a training loop.

    PYTHONPATH=. python benchmarks/vk_call_overhead.py [--shape S,T,H,P,N,G] [--repeat N] [--profile]

A loop that calls with the same shapes replays one recorded command sequence per call; what it
pays beyond that replay is Python. For the forward and the backward, with device-resident inputs
(``ssm_vk.to_device``) and with host numpy inputs, this prints medians in microseconds of:

    call      the call, as a loop runs it
    drop      dropping its result (device outputs go back to the pool)
    replay    Sequence.submit() of the call's recorded sequence alone (submit + wait)
    floor     the bare cffi vkResetFences + vkQueueSubmit + vkWaitForFences of that command
              buffer: the driver and the device, which no Python change can cut
    python    call + drop - replay: our Python outside the submit, by wall clock (lavapipe's
              threads share the cores and the caches, so this one is noisy)
    in-submit replay - floor: our Python inside Sequence.submit / wait
    python*   call + drop with Sequence.submit stubbed out (no driver, no GPU work): our Python
              outside the submit alone, the steadiest figure

and python* split by stage, each stage timed alone with the same arguments (submit stubbed):

    validate  ssm_vk.validate.check_forward / check_backward (ssm_ref's validator); for a call that takes a
              kept replay (ssm_vk/replay_cache.py: device inputs, repeated: the prepared call kept for it),
              Replay.problem (ssm_vk.validate.problem: the ids and the host memory rule)
    support   ssm_vk.support.decision (the cached support decision); for a kept call, the
              look-up (ssm_vk.replay_cache.find) that stands for the support decision, the validator's
              shape checks, the workspace look-up and the input bindings
    launch    ssm_vk.run.forward / backward + drop (workspace, binding, key, outputs, and for
              host inputs upload + download; a kept call: Replay.run -- outputs, key, submit)
    glue      python* - validate - support - launch (result object, the rest of api.py)

The default shape is tiny, so that lavapipe's own execution stays small next to the Python;
``--shape 1,64,16,64,128,1`` is the issue's training step (on lavapipe the replay then dominates).
``--profile`` adds a cProfile of the device-resident loop (forward + backward).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import statistics
import time

import numpy as np

import ssm_vk
from ssm_vk import config, replay_cache, validate
from ssm_vk import run as vk_run
from ssm_vk import runtime as rt
from ssm_vk import support as vk_support


def _inputs(S, T, H, P, N, G, seed=0):
    rng = np.random.default_rng(seed)
    f = np.float32
    R = S
    return dict(s=rng.uniform(-0.5, 0.5, (R, H, P, N)).astype(f), x=rng.uniform(-1, 1, (S, T, H, P)).astype(f),
                dt=rng.uniform(-1, 1, (S, T, H)).astype(f), A=-rng.uniform(0.2, 1, H).astype(f),
                B=rng.uniform(-0.5, 0.5, (S, T, G, N)).astype(f), C=rng.uniform(-0.5, 0.5, (S, T, G, N)).astype(f),
                ids=np.arange(S), g_y=rng.uniform(-1, 1, (S, T, H, P)).astype(f),
                g_states=rng.uniform(-1, 1, (S, H, P, N)).astype(f))


FWD = ("s", "x", "dt", "A", "B", "C", "ids")
BWD = (*FWD, "g_y", "g_states")


def _floor_fn(seq):
    """The bare cffi submit + wait of ``seq``'s command buffer, as Sequence.submit issues it."""
    lib = rt.binding.vk.lib
    ctx = seq.ctx
    dev, queue, fences, fence, info = ctx.handle, ctx.queue, seq._fences, seq._fence, seq._submit_info
    timeout = int(ctx.timeout_s * 1e9)

    def floor():
        lib.vkResetFences(dev, 1, fences)
        lib.vkQueueSubmit(queue, 1, info, fence)
        lib.vkWaitForFences(dev, 1, fences, 1, timeout)
    return floor


class Case:
    def __init__(self, name: str, backward: bool, device: bool, a: dict):
        self.name, self.backward, self.device = name, backward, device
        names = BWD if backward else FWD
        args = {k: (ssm_vk.to_device(v) if device and k != "ids" else v) for k, v in a.items() if k in names}
        self.args = args
        self.entry = ssm_vk.ssm_scan_back if backward else ssm_vk.ssm_scan
        self.op = "ssm_scan_back" if backward else "ssm_scan"
        check = validate.check_backward if backward else validate.check_forward
        for _ in range(5):  # record, warm the pool and the caches
            self.entry(**args)
        self.seq = vk_run.last_sequence()
        floats = self.floats = tuple(args.get(k) for k in (BWD if backward else FWD) if k != "ids")
        self.find = lambda: replay_cache.find(backward, floats, config.settings())
        self.kept = self.find()[0]  # ssm_vk/replay_cache.py: device inputs, a repeated call
        if self.kept is not None:
            kept = self.kept
            self.validate = lambda: kept.problem(floats, args["ids"])
        else:
            self.validate = lambda: check(**args)
        self.p = self.validate()
        self.ctx = rt.current_context()
        self.samples: dict[str, list[float]] = {k: [] for k in ("call", "drop", "call*", "drop*", "replay", "floor",
                                                                "validate", "support", "launch")}

    def round(self, n: int) -> None:
        s = self.samples
        entry, args, pc = self.entry, self.args, time.perf_counter
        for stub in (False, True):
            call, drop = ("call*", "drop*") if stub else ("call", "drop")
            with _stubbed_submit(stub):
                for _ in range(n):
                    t0 = pc()
                    r = entry(**args)
                    t1 = pc()
                    del r
                    t2 = pc()
                    s[call].append(t1 - t0)
                    s[drop].append(t2 - t1)
        for key, fn in (("replay", self.seq.submit), ("floor", _floor_fn(self.seq))):
            for _ in range(n):
                t0 = pc()
                fn()
                s[key].append(pc() - t0)
        run = vk_run.backward if self.backward else vk_run.forward
        p, dev, kept, floats = self.p, self.device, self.kept, self.floats
        dec = vk_support.decision(self.op, p, config.settings())

        def launched():
            out = kept.run(p, floats) if kept is not None else run(dec.engine, p, dec.planned, dev)
            del out

        support = self.find if kept is not None else lambda: vk_support.decision(self.op, p, config.settings())
        with _stubbed_submit(True):
            for key, fn in (("validate", self.validate), ("support", support), ("launch", launched)):
                for _ in range(n):
                    t0 = pc()
                    fn()
                    s[key].append(pc() - t0)

    def medians(self) -> dict:
        m = {k: statistics.median(v) * 1e6 for k, v in self.samples.items()}
        m["python"] = m["call"] + m["drop"] - m["replay"]
        m["in-submit"] = m["replay"] - m["floor"]
        m["python*"] = m["call*"] + m["drop*"]
        m["glue"] = m["python*"] - m["validate"] - m["support"] - m["launch"]
        return m


def _reference_us() -> float:
    """Median time of a fixed pure-Python workload (dicts, tuples, attribute reads, calls)."""
    class Obj:
        def __init__(self, i):
            self.i = i

    def work():
        d = {}
        for i in range(100):
            o = Obj(i)
            d[(i, o.i)] = len(d)
        return d

    samples = []
    for _ in range(200):
        t0 = time.perf_counter()
        work()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


@contextlib.contextmanager
def _stubbed_submit(on: bool):
    """Sequence.submit replaced by a no-op while ``on``: the call's Python without the driver."""
    if not on:
        yield
        return
    real = rt.Sequence.submit
    rt.Sequence.submit = lambda self, wait=True, timeout_s=None: None
    try:
        yield
    finally:
        rt.Sequence.submit = real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1,4,2,4,8,1", help="S,T,H,P,N,G (R = S)")
    ap.add_argument("--repeat", type=int, default=2000, help="calls timed per case and measure")
    ap.add_argument("--rounds", type=int, default=10, help="the repeats are spread over this many rounds")
    ap.add_argument("--profile", action="store_true", help="also print a cProfile of the device loop")
    args = ap.parse_args()
    S, T, H, P, N, G = (int(v) for v in args.shape.split(","))
    a = _inputs(S, T, H, P, N, G)
    cases = [Case("forward, device inputs", False, True, a), Case("backward, device inputs", True, True, a),
             Case("forward, host inputs", False, False, a), Case("backward, host inputs", True, False, a)]
    ctx = rt.current_context()
    where = cases[0].entry(**cases[0].args).where
    per = max(1, args.repeat // args.rounds)
    for _ in range(args.rounds):  # interleaved, so that drift of the machine hits every case alike
        for c in cases:
            c.round(per)

    ref = _reference_us()
    cols = ("call", "drop", "replay", "floor", "python", "in-submit", "python*", "validate", "support", "launch",
            "glue")
    print(f"device: {ctx.info.name}; validation={ctx.validation}; ran on {where}; reference loop {ref:.1f} us "
          "(pure Python: this machine's speed at the time, to compare runs by)")
    print(f"shape (S, T, H, P, N, G, R) = ({S}, {T}, {H}, {P}, {N}, {G}, {S}); medians of {per * args.rounds} "
          "calls, microseconds")
    print(f"{'case':<26}" + "".join(f"{c:>10}" for c in cols))
    for c in cases:
        m = c.medians()
        print(f"{c.name:<26}" + "".join(f"{m[k]:10.1f}" for k in cols))
    kept = ", ".join(c.name for c in cases if c.kept) or "none"
    print(f"calls through a kept replay (ssm_vk/replay_cache.py): {kept}")
    step = [c.medians() for c in cases[:2]]
    tot = {k: sum(m[k] for m in step) for k in ("call", "drop", "python", "python*", "in-submit")}
    print(f"training step (forward + backward, device inputs): call+drop {tot['call'] + tot['drop']:.1f} us; "
          f"python {tot['python']:.1f} us by wall clock, python* {tot['python*']:.1f} us, "
          f"in-submit {tot['in-submit']:.1f} us")

    if args.profile:
        fwd, bwd = cases[0], cases[1]
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(per * 2):
            fwd.entry(**fwd.args)
            bwd.entry(**bwd.args)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(35)


if __name__ == "__main__":
    main()
