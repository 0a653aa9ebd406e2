"""Arrays of tokens beyond one allocation on a real GPU: ssm_vk's forward and backward at x of
1, 8 and 16 GiB (Mamba-2, S = 1, H = 64, P = 64, N = 128, G = 1; T = 2^16, 2^19, 2^20), checked
and timed in one run.

For each size T, in order, each step printed as it ends and the JSON rewritten after it (a run
cut short keeps what it did):

1. float32 inputs drawn in parallel over the host's cores (a 16 GiB x in seconds); the steps dt
   and the decays A give each head a memory of 20 to 8000 tokens (the carry across the windows
   and pieces of a long sequence reaches the compared tokens);
2. ``ssm_fast`` on the same inputs (the float32 check; ``--no-ref`` leaves it out);
3. ``to_device`` of each input, timed apart (host to device);
4. per plan variant (the default; and, where the default runs other kernels than the largest
   size does -- the chunked kernels at 1 GiB -- ``CHUNK=0``, the kernels of the largest size; and
   where the largest size's chunked backward runs in token windows, which recompute their chunk
   tables, the backward with ``KEEP_STATES=0`` too, so that the rates compare like with like;
   a backward that bound its forward's tables is compared only with such backwards):
   ``supports()``'s answer, then the forward on
   DeviceArrays: ``--warm-s`` of back-to-back calls (an idle GPU's clock ramps up only under
   load), ``--reps`` calls, median GPU time from the call's timestamps
   (``ssm_vk.run.last_gpu_ns``) and wall time, updates per second (S*T*H*P*N / GPU time),
   ``where``, the pieces of x and y and which inputs the call copied into pieces of its own
   (a DeviceArray cut otherwise than the call's windows); y downloaded (timed apart) and compared
   with ``ssm_fast``'s whole (norm-relative, and the worst block of tokens), its last tokens and
   the final states, and its first ``--prefix`` tokens with the float64 oracle (``ssm_fast.oracle64``,
   ``ssm_ref``'s equations in float64: a prefix's outputs depend on the prefix alone). Where the
   call copied x, the forward once more with x written into the pieces of a y the call returned
   (cut at its windows: bound in place), so that the copy's cost shows;
5. the backward likewise, where ``supports()`` takes it (else its reason is recorded): timing,
   every gradient against ``ssm_fast``'s where the host has the memory for ssm_fast's backward;
   then once more with g_y zero beyond the first ``--prefix`` tokens and g_states zero, whose
   gradients are exactly those of the prefix problem (checked in float64) and zero beyond it;
6. after the sizes, ``--extra T/N,...``: the backward alone at another N (none by default).

Then the rate of each (pass, kernels, N) at each size against the smallest size's with the same
kernels (the issue's "within 10%"), and a markdown table, with the SM clock during each row's timed
calls where benchmarks/gpu_env.sh keeps its clock log (``--clocks``). Exit status 1 when a check fails.

    python benchmarks/vk_long.py --json long.json            # the GPU run (the defaults)
    python benchmarks/vk_long.py --sizes 256,2048 --H 4 --P 16 --N 16 --limits-mib 0.125,0.0625 \
        --extra 2048/4 --reps 2 --json /tmp/long.json        # lavapipe: x in pieces at T = 2048

``--limits-mib A,R[,D]`` lowers maxMemoryAllocationSize to A MiB, maxStorageBufferRange to R MiB
(and the device-local heap to D MiB; ``ctx.seams.override_limits``), so that small arrays are held
in pieces on any device (and a call over the heap is refused: ``--limits-mib 0.125,0.0625,2`` at
the lavapipe sizes above refuses the backward at T = 2048, whose arrays alone exceed 2 MiB).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import statistics
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from vk_gpu_check import warm

import ssm_ref
import ssm_vk
from ssm_vk import config, registry
from ssm_vk import engine as vk_engine
from ssm_vk import run as vk_run
from ssm_vk import runtime as rt
from ssm_vk.arrays import pool
from ssm_vk.sizing import Limits

TOL = 1e-4          # norm-relative error above which a check fails (float32 against float32 / float64)
BLOCK = 8192        # tokens per block of the blockwise comparison of whole arrays


# --- inputs ---------------------------------------------------------------------------------

def uniform(shape, lo, hi, seed, threads):
    """float32 uniform in [lo, hi) of ``shape``, filled in parallel slabs of the first axes (each
    its own stream of one SeedSequence): a 16 GiB array in seconds on 16 cores."""
    a = np.empty(shape, np.float32)
    flat = a.reshape(-1)
    n = flat.size
    parts = max(1, min(threads * 4, n // (1 << 20)))
    edges = [n * i // parts for i in range(parts + 1)]
    seqs = np.random.SeedSequence(seed).spawn(parts)

    def fill(i):
        v = flat[edges[i]:edges[i + 1]]
        np.random.default_rng(seqs[i]).random(dtype=np.float32, out=v)
        v *= np.float32(hi - lo)
        v += np.float32(lo)

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(fill, range(parts)))
    return a


def make_inputs(S, T, H, P, N, G, seed, threads):
    """The forward's inputs (ssm_ref.ssm_scan's names), float32. dt raw in [-6, -3] (the ggml
    softplus gives steps of 0.0025 to 0.049) and A in [-1, -0.05]: per-token decays of 1e-4 to
    0.05, a memory of 20 to 8000 tokens."""
    return dict(s=uniform((S, H, P, N), -0.5, 0.5, seed, threads),
                x=uniform((S, T, H, P), -1, 1, seed + 1, threads),
                dt=uniform((S, T, H), -6, -3, seed + 2, threads),
                A=-uniform((H,), 0.05, 1.0, seed + 3, threads),
                B=uniform((S, T, G, N), -0.5, 0.5, seed + 4, threads),
                C=uniform((S, T, G, N), -0.5, 0.5, seed + 5, threads))


# --- measures -------------------------------------------------------------------------------

def rel(got, want) -> float:
    g = np.asarray(got, dtype=np.float64)
    w = np.asarray(want, dtype=np.float64)
    n = np.linalg.norm(w)
    return float(np.linalg.norm(g - w) / n) if n else float(np.linalg.norm(g))


def rel_blocks(got, want) -> dict:
    """Norm-relative error of two float32 (S, T, ...) arrays, block by block of BLOCK tokens (no
    whole float64 copy; the blocks' sums of squares by BLAS, added in float64), and the worst
    block's relative error and first token."""
    err = ref = 0.0
    worst, at = 0.0, 0
    T = got.shape[1]
    for t in range(0, T, BLOCK):
        w = np.ascontiguousarray(want[:, t:t + BLOCK]).reshape(-1)
        d = (got[:, t:t + BLOCK] - want[:, t:t + BLOCK]).reshape(-1)
        e, r = float(np.dot(d, d)), float(np.dot(w, w))
        err, ref = err + e, ref + r
        b = math.sqrt(e / r) if r else math.sqrt(e)
        if b > worst:
            worst, at = b, t
    return dict(rel=math.sqrt(err / ref) if ref else math.sqrt(err), worst_block_rel=worst, worst_block_t0=at)


def tail(a, L):
    """The last L tokens of every sequence of a DeviceArray (S, T, ...), read across any cut."""
    S, T = a.shape[:2]
    row = math.prod(a.shape[2:])
    return np.stack([a.view((i * T + T - L) * row, (L, *a.shape[2:])).numpy() for i in range(S)])


def head(a, L):
    S, T = a.shape[:2]
    row = math.prod(a.shape[2:])
    return np.stack([a.view(i * T * row, (L, *a.shape[2:])).numpy() for i in range(S)])


def pieces(a) -> int:
    """Buffers a DeviceArray is held in (1: one allocation)."""
    buf = getattr(a, "buffer", None)
    return len(buf.buffers) if isinstance(buf, rt.Pieces) else 1


def host_rss_gib() -> tuple:
    """(resident now, peak) of this process in GiB."""
    with open("/proc/self/statm") as f:
        now = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return now / 2**30, peak / 2**30


def in_token_windows(ctx, dims) -> bool:
    """Whether the backward of ``dims`` runs on the chunked kernels in token windows of one sequence."""
    return bool(getattr(registry.plan(dims, Limits.of(ctx.info), True).plan, "tokens", False))


def family(ctx, dims, backward, tune) -> str:
    """The kernels a call of ``dims`` runs under ``tune`` (registry.plan on the device's limits)."""
    with config.configure(tune=tune):
        return registry.plan(dims, Limits.of(ctx.info), backward).family.title


def dims_of(a, T):
    """The problem's Dims (ssm_ref), made without arrays: the planners' input."""
    return ssm_ref.Dims(S=a.S, T=T, H=a.H, P=a.P, N=a.N, G=a.G, R=a.S, mamba1=False, a_shape=(a.H,))


def copied(ctx, T, backward) -> list:
    """The inputs the workspaces of length-T calls copy into pieces of their own (a DeviceArray in
    pieces cut otherwise than the call's windows: HostData.rebind_pieces): a device copy per call."""
    out = set()
    for ws in vk_engine.engine_of(ctx).workspaces.values():
        if ws.dims.T == T and ws.backward == backward:
            out.update(k for k, b in ws.host.uploads.items() if isinstance(b, rt.Pieces))
    return sorted(out)


# --- the run --------------------------------------------------------------------------------

class Run:
    def __init__(self, args, ctx):
        self.args, self.ctx = args, ctx
        self.t0 = time.perf_counter()
        self.rows, self.events, self.failed = [], [], []
        i = ctx.info
        self.doc = dict(device=i.name, driver=i.driver, max_memory_allocation_size=i.max_memory_allocation_size,
                        max_storage_buffer_range=i.max_storage_buffer_range, device_local_bytes=i.device_local_bytes,
                        args=vars(args), rows=self.rows, events=self.events, failed=self.failed)

    def say(self, msg):
        now, peak = host_rss_gib()
        dev = self.ctx.live_allocations.nbytes / 2**30
        line = f"[{time.perf_counter() - self.t0:7.1f}s host {now:5.1f}/{peak:5.1f} GiB dev {dev:5.1f} GiB] {msg}"
        print(line, flush=True)
        self.events.append(line)

    def over(self) -> bool:
        return time.perf_counter() - self.t0 > self.args.budget_s

    def save(self):
        if self.args.json:
            tmp = self.args.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.doc, f, indent=1, default=str)
            os.replace(tmp, self.args.json)

    def fail(self, what):
        self.failed.append(what)
        self.say(f"FAIL {what}")

    def check(self, row, name, value, tol=TOL):
        row.setdefault("errors", {})[name] = value
        if not value <= tol:
            self.fail(f"T={row['T']} {row['pass']} {row['variant']}: {name} {value:.2e} > {tol:.0e}")

    def step(self, what, fn):
        """Run one step; an exception is recorded (with its traceback's end) and the run goes on."""
        try:
            return fn()
        except Exception as e:  # recorded and reported; the next step still runs
            self.fail(f"{what}: {type(e).__name__}: {e}")
            self.events.append(traceback.format_exc()[-3000:])
            self.save()
            return None


def timed_calls(fn, reps, warm_s):
    """(last result, median GPU ms, min GPU ms, median wall ms, (start, end) of the timed calls in
    host time) of ``reps`` calls after vk_gpu_check.warm's ``warm_s`` seconds of calls (on an H100
    left idle while the host ran ssm_fast, the 1 GiB forward took 30-44 ms at 345-525 MHz, 9.2 ms
    at 1980)."""
    warm(fn, warm_s)   # (each result dropped at once: its buffers back to the pool before the next call)
    gpus, walls = [], []
    r = None
    span = [time.time(), None]
    for _ in range(reps):
        r = None  # the previous result's buffers back to the pool before the next call
        gc.collect()
        t0 = time.perf_counter()
        r = fn()
        walls.append(time.perf_counter() - t0)
        gpus.append((vk_run.last_gpu_ns() or math.nan) / 1e6)
    span[1] = time.time()
    return r, statistics.median(gpus), min(gpus), statistics.median(walls) * 1e3, span


def release(*objs):
    for o in objs:
        if isinstance(o, ssm_vk.DeviceArray):
            o.release()
        elif o is not None and hasattr(o, "__dict__"):
            for v in vars(o).values():
                if isinstance(v, ssm_vk.DeviceArray):
                    v.release()


def new_row(run, T, backward, variant, tune, dims) -> dict:
    """The row of one (size, pass, variant), appended to the run's rows."""
    a = run.args
    row = {"T": T, "N": a.N, "x_gib": a.S * T * a.H * a.P * 4 / 2**30, "pass": "bwd" if backward else "fwd",
           "variant": variant, "kernels": family(run.ctx, dims, backward, tune)}
    run.rows.append(row)
    return row


def supported(run, row, op, args) -> bool:
    """``supports()``'s answer for ``op`` on ``args``, into ``row``; a refusal said."""
    sup = ssm_vk.supports(op, **args)
    row.update(supports=bool(sup.ok), reason=sup.reason)
    if not sup.ok:
        run.say(f"T={row['T']} {row['pass']} {row['variant']}: refused: {sup.reason}")
    return bool(sup.ok)


def forward(run, T, dev, host, ref, variant, tune, dims):
    a, ctx = run.args, run.ctx
    S, H, P, N = a.S, a.H, a.P, a.N
    row = new_row(run, T, False, variant, tune, dims)
    with config.configure(tune=tune):
        if not supported(run, row, "ssm_scan", dev):
            return
        r, g_ms, g_min, w_ms, span = timed_calls(lambda: ssm_vk.ssm_scan(**dev), a.reps, a.warm_s)
    upd = S * T * H * P * N
    row.update(where=r.where, gpu_ms=g_ms, gpu_min_ms=g_min, wall_ms=w_ms, updates_per_s=upd / (g_ms / 1e3),
               span=span, pieces={"x": pieces(dev["x"]), "y": pieces(r.y)}, copied_in=copied(ctx, T, False))
    if r.where != ctx.info.where:
        run.fail(f"T={T} fwd {variant}: ran on {r.where}, not {ctx.info.where}")
    run.say(f"T={T} fwd {variant} [{row['kernels']}]: GPU {g_ms:.2f} ms (min {g_min:.2f}), wall {w_ms:.2f} ms, "
            f"{row['updates_per_s'] / 1e9:.1f} G upd/s, where {r.where}, pieces {row['pieces']}, "
            f"copied in {row['copied_in'] or 'none'}")
    L, Tp = min(a.last, T), min(a.prefix, T)
    if ref is not None and "y" in ref:
        run.check(row, "y_last_vs_fast", rel(tail(r.y, L), ref["y"][:, T - L:]))
        run.check(row, "states_vs_fast", rel(r.states.numpy(), ref["states"]))
    y0 = head(r.y, Tp)
    o64 = ref["o64"] if ref is not None and "o64" in ref else None
    if o64 is not None:
        run.check(row, "y_prefix_vs_f64", rel(y0, o64.y))
    if a.download:
        t0 = time.perf_counter()
        yh = r.y.numpy()
        row["download_y_s"] = time.perf_counter() - t0
        row["download_y_gb_s"] = yh.nbytes / row["download_y_s"] / 1e9
        if not np.array_equal(yh[:, :Tp], y0):
            run.fail(f"T={T} fwd {variant}: the downloaded y differs from its view")
        if ref is not None and "y" in ref:
            b = rel_blocks(yh, ref["y"])
            row["y_whole_vs_fast"] = b
            run.check(row, "y_whole_vs_fast", b["rel"])
        del yh
    run.say(f"T={T} fwd {variant}: download y {row.get('download_y_s', math.nan):.2f} s; errors "
            + " ".join(f"{k} {v:.1e}" for k, v in row.get("errors", {}).items())
            + (f"; worst block of y at t={row['y_whole_vs_fast']['worst_block_t0']}: "
               f"{row['y_whole_vs_fast']['worst_block_rel']:.1e}" if "y_whole_vs_fast" in row else ""))
    release(r)


def aligned_x(run, T, dev, host, ref, dims):
    """The forward once more with x held in the pieces the call cuts its own arrays of x's shape
    into (those of a y it returned): bound in place, no copy in the call -- the difference from the
    default row is the device copy of a DeviceArray cut by to_device (its own even cuts)."""
    r = ssm_vk.ssm_scan(**dev)
    xa = r.y
    t0 = time.perf_counter()
    xa.write(host["x"])
    run.say(f"T={T}: x written into a y's pieces ({pieces(xa)}) in {time.perf_counter() - t0:.2f} s")
    r.states.release()
    old = dev["x"]
    dev["x"] = xa
    old.release()
    vk_engine.clear(run.ctx)   # (the workspace's own copy of x back to the pool)
    gc.collect()
    pool(run.ctx).trim()
    forward(run, T, dev, host, ref, "x in the call's pieces", {}, dims)


def backward(run, T, dev, host, gref, variant, tune, dims):
    a, ctx = run.args, run.ctx
    S, H, P, N = a.S, a.H, a.P, a.N
    row = new_row(run, T, True, variant, tune, dims)
    with config.configure(tune=tune):
        if not supported(run, row, "ssm_scan_back", {k: dev[k] for k in ("s", "x", "dt", "A", "B", "C")}):
            return
        reused = vk_engine.engine_of(ctx).states_reused
        g, g_ms, g_min, w_ms, span = timed_calls(lambda: ssm_vk.ssm_scan_back(**dev), a.reps, a.warm_s)
        # (whether it bound the chunk tables its forward left instead of recomputing them: rates compare
        # like with like; over token windows what the forward leaves is the windows' starting states)
        took = vk_engine.engine_of(ctx).states_reused > reused
        row["kept_starts" if in_token_windows(ctx, dims) else "kept_tables"] = took
    upd = S * T * H * P * N
    row.update(where=g.where, gpu_ms=g_ms, gpu_min_ms=g_min, wall_ms=w_ms, updates_per_s=upd / (g_ms / 1e3),
               span=span, pieces={"x": pieces(dev["x"]), "g_y": pieces(dev["g_y"]), "d_x": pieces(g.d_x)},
               copied_in=copied(ctx, T, True))
    if g.where != ctx.info.where:
        run.fail(f"T={T} bwd {variant}: ran on {g.where}, not {ctx.info.where}")
    run.say(f"T={T} bwd {variant} [{row['kernels']}]: GPU {g_ms:.2f} ms (min {g_min:.2f}), wall {w_ms:.2f} ms, "
            f"{row['updates_per_s'] / 1e9:.1f} G upd/s, where {g.where}, pieces {row['pieces']}, "
            f"copied in {row['copied_in'] or 'none'}")
    L = min(a.last, T)
    if gref is not None:
        for k in ssm_ref.GRAD_NAMES:
            if k == "d_x":
                run.check(row, "d_x_last_vs_fast", rel(tail(g.d_x, L), gref.d_x[:, T - L:]))
                if a.download:
                    t0 = time.perf_counter()
                    dx = g.d_x.numpy()
                    row["download_d_x_s"] = time.perf_counter() - t0
                    b = rel_blocks(dx, gref.d_x)
                    row["d_x_whole_vs_fast"] = b
                    run.check(row, "d_x_whole_vs_fast", b["rel"])
                    del dx
            else:
                run.check(row, f"{k}_vs_fast", rel(getattr(g, k).numpy(), getattr(gref, k)))
    release(g)
    if a.prefix and not run.over():
        run.step(f"T={T} bwd {variant} prefix", lambda: backward_prefix(run, T, dev, host, row, tune))
    run.say(f"T={T} bwd {variant}: errors " + " ".join(f"{k} {v:.1e}" for k, v in row.get("errors", {}).items()))


def backward_prefix(run, T, dev, host, row, tune):
    """g_y zero beyond the first Tp tokens, g_states zero: the gradients of the whole problem are
    those of the prefix problem on the prefix, and zero beyond it (exact in any precision)."""
    from ssm_fast.oracle64 import scan_back64

    a = run.args
    Tp = min(a.prefix, T)
    gy = np.zeros(host["x"].shape, np.float32)
    gy[:, :Tp] = host["g_y"][:, :Tp]
    gs = np.zeros_like(host["g_states"])
    dev["g_y"].write(gy)
    dev["g_states"].write(gs)
    del gy
    with config.configure(tune=tune):
        g = ssm_vk.ssm_scan_back(**dev)
    pre = {k: host[k][:, :Tp] if k in ("x", "dt", "B", "C") else host[k] for k in ("s", "x", "dt", "A", "B", "C")}
    o = scan_back64(**pre, ids=None, g_y=host["g_y"][:, :Tp], g_states=gs)
    run.check(row, "d_x_prefix_vs_f64", rel(head(g.d_x, Tp), o.d_x))
    for k in ("d_dt", "d_B", "d_C"):
        v = getattr(g, k).numpy()
        run.check(row, f"{k}_prefix_vs_f64", rel(v[:, :Tp], getattr(o, k)))
        row.setdefault("beyond_prefix_max_abs", {})[k] = float(np.abs(v[:, Tp:]).max()) if T > Tp else 0.0
    for k in ("d_A", "d_s0"):
        run.check(row, f"{k}_prefix_vs_f64", rel(getattr(g, k).numpy(), getattr(o, k)))
    L = min(a.last, T - Tp)
    if L > 0:
        row["beyond_prefix_max_abs"]["d_x_last"] = float(np.abs(tail(g.d_x, L)).max())
    nz = {k: v for k, v in row.get("beyond_prefix_max_abs", {}).items() if v != 0}
    if nz:
        run.fail(f"T={T} bwd: gradients beyond the prefix are not zero: {nz}")
    dev["g_y"].write(host["g_y"])      # (back as they were)
    dev["g_states"].write(host["g_states"])
    release(g)


def one_size(run, T, variants_of):
    a = run.args
    S, H, P, N, G = a.S, a.H, a.P, a.N, a.G
    run.say(f"T={T}: x {S * T * H * P * 4 / 2**30:.3f} GiB; drawing the inputs")
    t0 = time.perf_counter()
    host = make_inputs(S, T, H, P, N, G, a.seed, a.threads)
    run.say(f"T={T}: inputs in {time.perf_counter() - t0:.1f} s")
    dims = dims_of(a, T)
    ref = None
    passes = a.passes.split(",")
    if not a.no_ref and "fwd" in passes:
        def fast():
            import ssm_fast
            t0 = time.perf_counter()
            r = ssm_fast.ssm_scan(**host)
            out = dict(y=r.y, states=r.states, fast_s=time.perf_counter() - t0)
            run.say(f"T={T}: ssm_fast forward {out['fast_s']:.1f} s")
            return out
        ref = run.step(f"T={T} ssm_fast forward", fast)
    if a.prefix and "fwd" in passes:
        from ssm_fast.oracle64 import scan64
        Tp = min(a.prefix, T)
        pre = {k: host[k][:, :Tp] if k in ("x", "dt", "B", "C") else host[k] for k in host}
        ref = {} if ref is None else ref
        ref["o64"] = scan64(**pre)
        if "y" in ref:   # ssm_fast's own error (the scale the device's errors are read against)
            ref["y_prefix_vs_f64"] = rel(ref["y"][:, :Tp], ref["o64"].y)
            run.say(f"T={T}: ssm_fast's y prefix against float64: {ref['y_prefix_vs_f64']:.1e}")
    sizes = {}
    dev = {}
    for k in ("s", "x", "dt", "A", "B", "C"):
        t0 = time.perf_counter()
        dev[k] = ssm_vk.to_device(host[k])
        sizes[k] = (time.perf_counter() - t0, host[k].nbytes)
    up = sum(t for t, _ in sizes.values())
    nb = sum(n for _, n in sizes.values())
    run.say(f"T={T}: to_device {nb / 2**30:.2f} GiB in {up:.2f} s ({nb / up / 1e9:.2f} GB/s); x "
            f"{sizes['x'][0]:.2f} s in {pieces(dev['x'])} pieces")
    upload = {k: dict(s=t, bytes=n) for k, (t, n) in sizes.items()}
    fwd_rows = []
    if "fwd" in passes:
        for variant, tune in variants_of(dims, False):
            if run.over():
                run.say(f"T={T}: over --budget-s, fwd {variant} not started")
                break
            n0 = len(run.rows)
            run.step(f"T={T} fwd {variant}", lambda v=variant, t=tune: forward(run, T, dev, host, ref, v, t, dims))
            fwd_rows += run.rows[n0:]
            for rw in run.rows[n0:]:
                rw["upload"] = upload
            run.save()
        if any("x" in r.get("copied_in", ()) for r in fwd_rows) and not run.over():
            run.step(f"T={T} fwd, x in the call's pieces", lambda: aligned_x(run, T, dev, host, ref, dims))
    if ref is not None:
        ref.pop("y", None)   # (16 GiB at T = 2^20)
    gc.collect()
    fwd_args = {k: dev[k] for k in ("s", "x", "dt", "A", "B", "C")}
    bwd_ok = []
    for _, tune in variants_of(dims, True):
        with config.configure(tune=tune):
            bwd_ok.append(bool(ssm_vk.supports("ssm_scan_back", **fwd_args).ok))
    if "bwd" in passes and not any(bwd_ok):
        for variant, tune in variants_of(dims, True):   # the refusals recorded, before drawing g_y
            backward(run, T, dev, host, None, variant, tune, dims)
    elif "bwd" in passes and not run.over():
        host["g_y"] = uniform(host["x"].shape, -1, 1, a.seed + 6, a.threads)
        host["g_states"] = uniform(host["s"].shape, -1, 1, a.seed + 7, a.threads)
        t0 = time.perf_counter()
        dev["g_y"] = ssm_vk.to_device(host["g_y"])
        dev["g_states"] = ssm_vk.to_device(host["g_states"])
        gup = time.perf_counter() - t0
        run.say(f"T={T}: to_device g_y, g_states in {gup:.2f} s")
        gref = None
        if not a.no_ref:
            import ssm_fast
            t0 = time.perf_counter()
            try:
                gref = ssm_fast.ssm_scan_back(**{k: host[k] for k in ("s", "x", "dt", "A", "B", "C", "g_y",
                                                                        "g_states")})
                run.say(f"T={T}: ssm_fast backward {time.perf_counter() - t0:.1f} s")
            except ValueError as e:   # the host memory rule: the backward is checked on the prefix only
                run.say(f"T={T}: no ssm_fast backward ({e})")
        for variant, tune in variants_of(dims, True):
            if run.over():
                run.say(f"T={T}: over --budget-s, bwd {variant} not started")
                break
            n0 = len(run.rows)
            run.step(f"T={T} bwd {variant}", lambda v=variant, t=tune: backward(run, T, dev, host, gref, v, t, dims))
            for rw in run.rows[n0:]:
                rw["upload"] = {**upload, "g_y+g_states": dict(s=gup, bytes=host["g_y"].nbytes)}
            run.save()
        gref = None
    for v in dev.values():
        v.release()
    dev.clear()
    host.clear()   # (the closures above hold these dicts: emptied, not deleted)
    vk_engine.clear(run.ctx)
    gc.collect()
    pool(run.ctx).trim()
    run.say(f"T={T}: released")
    run.save()


def rates(rows):
    """Each row's rate against the smallest T's of the same pass, kernels and N (ratio), and for a
    backward of the same use of its forward's tables (bound, or recomputed)."""
    base = {}
    for r in sorted(rows, key=lambda r: r["T"]):
        if r.get("updates_per_s"):
            key = (r["pass"], r["kernels"], r["N"], r.get("kept_tables", False))
            base.setdefault(key, r)
            r["base_T"] = base[key]["T"]
            r["rate_vs_base"] = r["updates_per_s"] / base[key]["updates_per_s"]


def sm_clocks(run, path) -> None:
    """Each timed row's SM clock (min/median/max MHz of the log's samples during its timed calls),
    from the log benchmarks/gpu_env.sh keeps (clocks.log_samples); nothing where there is none."""
    from clocks import during, log_samples

    clk, why = log_samples(path)
    if why:
        run.say(why)
    for r in run.rows:
        if clk and r.get("span"):
            r["sm_mhz"] = during(clk, r["span"])


def table(rows) -> str:
    out = ["| T | N | x GiB | pass | variant | kernels | where | pieces | copied in | upload x s | GPU ms | "
           "G upd/s | vs smallest T | SM MHz | download s | max error |", "|" + "---|" * 16]
    for r in rows:
        up = r.get("upload", {}).get("x", {}).get("s", math.nan)
        errs = r.get("errors", {})
        worst = max(errs.items(), key=lambda kv: kv[1]) if errs else ("", math.nan)
        where = r.get("where") or ("refused: " + r.get("reason", "")[:120] if r.get("supports") is False else "-")
        ratio = (f"{r['rate_vs_base']:.3f} (T={r['base_T']})" if "rate_vs_base" in r else "-")
        dl = r.get("download_y_s", r.get("download_d_x_s", math.nan))
        kernels = r["kernels"] + (", the forward's tables" if r.get("kept_tables") else "") + (
            ", token windows from the forward's starts" if r.get("kept_starts") else "")
        out.append(f"| {r['T']} | {r['N']} | {r['x_gib']:.3g} | {r['pass']} | {r['variant']} | {kernels} | "
                   f"{where} | "
                   f"{r.get('pieces', '-')} | {','.join(r.get('copied_in', [])) or '-'} | {up:.2f} | "
                   f"{r.get('gpu_ms', math.nan):.2f} | {r.get('updates_per_s', math.nan) / 1e9:.1f} | {ratio} | "
                   f"{r.get('sm_mhz', '-')} | "
                   f"{dl:.2f} | {worst[1]:.1e} {worst[0]} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="65536,524288,1048576", help="T values (1, 8, 16 GiB of x at H=P=64)")
    ap.add_argument("--S", type=int, default=1)
    ap.add_argument("--H", type=int, default=64)
    ap.add_argument("--P", type=int, default=64)
    ap.add_argument("--N", type=int, default=128)
    ap.add_argument("--G", type=int, default=1)
    ap.add_argument("--passes", default="fwd,bwd")
    ap.add_argument("--extra", default="",
                    help="T/N,...: backward alone at these T and N after the sizes (default none)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warm-s", type=float, default=1.0,
                    help="seconds of back-to-back calls before each timing (the GPU's clock ramps under load)")
    ap.add_argument("--clocks", default=None,
                    help="the clock log of gpu_env.sh (default $OUT/clocks.csv where it exists): SM MHz per row")
    ap.add_argument("--last", type=int, default=256, help="last tokens compared with ssm_fast")
    ap.add_argument("--prefix", type=int, default=2048, help="first tokens checked in float64 (0: none)")
    ap.add_argument("--same-kernels", default="CHUNK=0",
                    help="tune that runs the largest size's kernels where the default plan runs others ('' : none)")
    ap.add_argument("--no-ref", action="store_true", help="no ssm_fast comparison (the float64 prefixes stay)")
    ap.add_argument("--no-download", dest="download", action="store_false", help="no whole download of y / d_x")
    ap.add_argument("--budget-s", type=float, default=480.0, help="no new step starts after this many seconds")
    ap.add_argument("--limits-mib", default="",
                    help="A,R[,D]: maxMemoryAllocationSize, maxStorageBufferRange[, the device-local heap] "
                         "lowered to these MiB (testing on a small device)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    sizes = [int(t) for t in args.sizes.split(",")]
    ctx = rt.get_context()
    override = None
    if args.limits_mib:
        names = ("max_memory_allocation_size", "max_storage_buffer_range", "device_local_bytes")
        lowered = {k: int(float(v) * 2**20) for k, v in zip(names, args.limits_mib.split(","), strict=False)}
        override = ctx.seams.override_limits(**lowered)
    run = Run(args, ctx)
    i = ctx.info
    run.say(f"device {i.name} ({i.type}), {i.driver}; maxMemoryAllocationSize {i.max_memory_allocation_size}, "
            f"maxStorageBufferRange {i.max_storage_buffer_range}, device-local {i.device_local_bytes / 2**30:.1f} GiB; "
            f"{args.threads} host threads")
    same = config.parse_tune(args.same_kernels, "--same-kernels") if args.same_kernels else None
    big = dims_of(args, max(sizes))

    def variants_of(dims, backward):
        out = [("default", {})]
        if same is not None:
            want = family(ctx, big, backward, {})
            if family(ctx, dims, backward, {}) != want and family(ctx, dims, backward, same) == want:
                out.append((args.same_kernels, same))
        if backward and in_token_windows(ctx, big) and not in_token_windows(ctx, dims):
            # the largest size's chunked backward recomputes its chunk tables in each token window;
            # this one binds its forward's: timed recomputing them too, the like-for-like rate
            out.append(("KEEP_STATES=0", {"KEEP_STATES": 0}))
        return out

    try:
        for T in sizes:
            if run.over():
                run.say(f"over --budget-s ({args.budget_s} s): T={T} not started")
                break
            run.step(f"T={T}", lambda T=T: one_size(run, T, variants_of))
        for T, N in (tuple(int(v) for v in e.split("/")) for e in args.extra.split(",") if e):
            if run.over():
                run.say(f"over --budget-s ({args.budget_s} s): T={T} N={N} not started")
                break
            run.args = argparse.Namespace(**{**vars(args), "N": N, "passes": "bwd"})
            run.step(f"T={T} N={N}", lambda T=T: one_size(run, T, variants_of))
            run.args = args
    finally:
        rates(run.rows)
        sm_clocks(run, args.clocks)
        run.save()
        if override is not None:
            override.restore()
    print(table(run.rows), flush=True)
    for r in run.rows:
        if "rate_vs_base" in r and r["T"] != r["base_T"] and r["rate_vs_base"] < 0.9:
            print(f"rate at T={r['T']} {r['pass']} {r['variant']}: {r['rate_vs_base']:.3f} of T={r['base_T']}'s "
                  "(below 0.9)", flush=True)
    print("ALL CHECKS PASSED" if not run.failed else f"{len(run.failed)} FAILED: " + "; ".join(run.failed), flush=True)
    return 1 if run.failed else 0


if __name__ == "__main__":
    sys.exit(main())
