"""The Mamba-3 forward and backward on ssm_vk, device time of their kernels: the chunked forward
(ssm_vk/mamba3/glsl/m3c_*.comp) and backward (m3b_*.comp after the forward's first four) step by step beside
the token-sequential kernels, from GPU timestamps around each dispatch of one recorded call (inputs
DeviceArrays: no upload or readback counted), and the wall time of ``ssm_vk.mamba3_scan`` /
``mamba3_scan_back`` from host arrays for both. SISO unless --M; the issue's shape by default: H = 32, P = 64,
N = 128, F = 32, G = 1.

    python benchmarks/vk_mamba3.py --shapes 1x512,8x2048 [--M 2] [--reps 5] [--pass fwd|bwd|both]
        [--binding-mib 256,64]

Prints one block per (S, T) and pass: each plan's kernels (ms, the best of --reps submissions) and the call's
wall time; with --binding-mib, the chunked kernels again under each lowered maxStorageBufferRange (in windows
of sequences or of tokens: what windows cost).
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from ssm_vk.runtime.commands import MAX_TIMESTAMPS


def _timed_sequences():
    """ssm_vk.runtime.Sequence replaced by one that takes a GPU timestamp after each dispatch
    (labelled by its kernel): every sequence recorded from here on in this process."""
    from ssm_vk import runtime as rt

    base = rt.Sequence

    class Timed(base):
        def dispatch(self, kernel, *args, **kw):
            super().dispatch(kernel, *args, **kw)
            self._n = getattr(self, "_n", 0) + 1
            if self._n < MAX_TIMESTAMPS - 2:   # (room for the call's own "end"; many windows: the first kernels)
                self.timestamp(f"{self._n}:{kernel.name}")

    rt.Sequence = Timed


def _problem(S, T, H, P, N, M, F, rng):
    B = (S, T, M, 1, N) if M else (S, T, 1, N)
    bias = (H, M, N) if M else (H, N)
    f32 = np.float32
    return dict(x=rng.standard_normal((S, T, H, P)).astype(f32), dt=np.full((S, T, H), 0.05, f32),
                dA=np.full((S, T, H), -0.1, f32), lam=np.full((S, T, H), 0.5, f32),
                B=(rng.standard_normal(B) / 11).astype(f32), C=(rng.standard_normal(B) / 11).astype(f32),
                B_bias=(rng.standard_normal(bias) / 10).astype(f32),
                C_bias=(rng.standard_normal(bias) / 10).astype(f32),
                dtheta=(rng.standard_normal((S, T, H, F)) / 10).astype(f32))


def _cotangents(a, rng):
    """g_y and g_h of the forward of ``a`` (the other cotangents None: zeros)."""
    S, T, H, P = a["x"].shape
    N = a["B"].shape[-1]
    y = (S, T, a["B"].shape[2], H, P) if a["B"].ndim == 5 else (S, T, H, P)
    return {"g_y": rng.standard_normal(y).astype(np.float32),
            "g_h": rng.standard_normal((S, H, P, N)).astype(np.float32)}


def _limited(mib):
    """A context manager lowering the device's maxStorageBufferRange to ``mib`` MiB (None: as it is)."""
    import contextlib

    import ssm_vk

    if mib is None:
        return contextlib.nullcontext()
    return ssm_vk.runtime.get_context().seams.override_limits(max_storage_buffer_range=int(mib * (1 << 20)))


def _device_times(a, tune, reps, cot=None, warm_s=1.0, mib=None):
    """(family name, {kernel: ms}) of one forward's kernels (with ``cot``: one backward's) under knobs
    ``tune``, its inputs DeviceArrays (the best of ``reps`` runs of the recorded sequence, after
    ``warm_s`` seconds of the same calls back to back: a GPU idles at a low clock between
    submissions and takes up to a second of work to raise it)."""
    from vk_gpu_check import warm

    import ssm_vk
    from ssm_ref.mamba3_checks import check_mamba3_forward
    from ssm_vk import config, mamba3_api, run

    p = check_mamba3_forward(*(a[k] for k in ("x", "dt", "dA", "lam", "B", "C", "B_bias", "C_bias", "dtheta")),
                             rotation="interleaved", dtype=np.float32)
    op = "mamba3_scan_back" if cot else "mamba3_scan"
    with config.configure(tune=tune), _limited(mib):
        dec = mamba3_api.decide(op, p.dims)
    if not dec.sup:
        return f"not on the device: {dec.sup.reason}", {}
    first = dec.planned.first
    name = first.family.name
    windows = getattr(first.plan, "windows", ())
    if len(windows) > 1:
        name += f", {len(windows)} windows of {'tokens' if first.plan.Tw < p.dims.T else 'sequences'}"
    dev = {k: ssm_vk.to_device(v) for k, v in {**a, **(cot or {})}.items()}
    try:
        with config.configure(tune=tune), _limited(mib):
            best: dict = {}
            def call():
                r = ssm_vk.mamba3_scan_back(**dev) if cot else ssm_vk.mamba3_scan(**dev)
                for v in (r.values() if cot else r):
                    if v is not None:
                        v.release()

            warm(call, warm_s)
            for _ in range(reps + 1):
                r = ssm_vk.mamba3_scan_back(**dev) if cot else ssm_vk.mamba3_scan(**dev)
                t = run.last_sequence().gpu_times()
                for a_, b_ in itertools.pairwise(t):
                    if ":" in b_:
                        ms = (t[b_] - t[a_]) * 1e-6
                        best[b_] = min(best.get(b_, ms), ms)
                if len(t) >= MAX_TIMESTAMPS - 1:   # (dispatches left unstamped: from start to end instead)
                    ms = (t["end"] - t["start"]) * 1e-6
                    best["start to end"] = min(best.get("start to end", ms), ms)
                for v in (r.values() if cot else r):
                    if v is not None:
                        v.release()
        return name, best
    finally:
        for v in dev.values():
            v.release()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1x512,8x2048", help="SxT,... (default 1x512,8x2048)")
    ap.add_argument("--H", type=int, default=32)
    ap.add_argument("--P", type=int, default=64)
    ap.add_argument("--N", type=int, default=128)
    ap.add_argument("--F", type=int, default=32)
    ap.add_argument("--M", type=int, default=0, help="MIMO rank (0: SISO)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pass", dest="which", choices=("fwd", "bwd", "both"), default="both")
    ap.add_argument("--no-sequential", action="store_true", help="the chunked kernels only")
    ap.add_argument("--warm-s", type=float, default=1.0,
                    help="seconds of back-to-back calls before each timing (the GPU's clock rises under load)")
    ap.add_argument("--binding-mib", default="",
                    help="MiB,...: the chunked kernels also under each lowered maxStorageBufferRange (their windows)")
    ap.add_argument("--stats", action="store_true",
                    help="at the end, the driver's compile statistics of each kernel that ran (registers, spills, "
                         "... as the driver names them; needs SSM_VK_PIPELINE_STATS=1 and a driver offering them)")
    args = ap.parse_args(argv)

    import ssm_vk
    from ssm_vk import config

    _timed_sequences()
    rng = np.random.default_rng(0)
    print(f"device: {ssm_vk.runtime.get_context().info.name}; H={args.H} P={args.P} N={args.N} F={args.F} "
          f"{'M=' + str(args.M) if args.M else 'SISO'}")
    for shape in args.shapes.split(","):
        S, T = (int(v) for v in shape.lower().split("x"))
        a = _problem(S, T, args.H, args.P, args.N, args.M, args.F, rng)
        cot = _cotangents(a, rng)
        passes = {"fwd": (False,), "bwd": (True,), "both": (False, True)}[args.which]
        for backward in passes:
            print(f"(S, T) = ({S}, {T}) {'backward' if backward else 'forward'}")
            chunked = {"M3_CHUNK_BWD_MIN_T" if backward else "M3_CHUNK_MIN_T": 1}
            plans = (("chunked", chunked, None),)
            plans += tuple((f"chunked, binding {m} MiB", chunked, float(m)) for m in args.binding_mib.split(",") if m)
            plans += () if args.no_sequential else (("token-sequential", {"M3_CHUNK": 0}, None),)
            for label, tune, mib in plans:
                name, times = _device_times(a, tune, args.reps, cot if backward else None, args.warm_s, mib)
                if not times:
                    print(f"  {label}: {name}")
                    continue
                kw = {**a, **cot} if backward else a
                call = ssm_vk.mamba3_scan_back if backward else ssm_vk.mamba3_scan
                with config.configure(tune=tune), _limited(mib):
                    call(**kw)
                    wall = []
                    for _ in range(3):
                        t0 = time.perf_counter()
                        call(**kw)
                        wall.append(time.perf_counter() - t0)
                whole = times.pop("start to end", None)
                total = f"{sum(times.values()):.3f} ms" if whole is None else f"{whole:.3f} ms (start to end)"
                steps = ", ".join(f"{k.split(':', 1)[1]} {v:.3f}" for k, v in times.items())
                print(f"  {label} ({name}): kernels {total} [{steps}]; "
                      f"call from host arrays {min(wall) * 1e3:.2f} ms")
    if args.stats:
        _print_statistics()


def _print_statistics() -> None:
    ctx = __import__("ssm_vk").runtime.get_context()
    if not ctx.pipeline_stats:
        print(f"compile statistics: none ({ctx.pipeline_stats_missing})")
        return
    from ssm_vk.runtime import introspect

    for kernel in sorted(ctx.cached_kernels(), key=lambda k: k.name):
        if kernel.name.startswith(("m3", "mamba3")):
            stats = introspect.statistics(kernel)
            print(f"  {kernel.name}: " + ", ".join(f"{k} {v}" for k, v in stats.items()))


if __name__ == "__main__":
    main()
