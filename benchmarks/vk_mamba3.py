"""The Mamba-3 forward on ssm_vk, device time of its kernels: the chunked forward (ssm_vk/mamba3/glsl/m3c_*.comp)
step by step beside the token-sequential kernel, from GPU timestamps around each dispatch of one recorded call
(inputs already on the device: no upload or readback counted), and the wall time of ``ssm_vk.mamba3_scan`` from
host arrays for both. SISO unless --M; the issue's shape by default: H = 32, P = 64, N = 128, F = 32, G = 1.

    python benchmarks/vk_mamba3.py --shapes 1x512,8x2048 [--M 2] [--reps 5]

Prints one block per (S, T): each plan's kernels (ms, the best of --reps submissions) and the call's wall time.
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np


class _Timed:
    """A recording Sequence that takes a GPU timestamp after each dispatch (labelled by its kernel)."""

    def __init__(self, seq):
        self.seq, self.n = seq, 0

    def dispatch(self, kernel, *args, **kw):
        self.seq.dispatch(kernel, *args, **kw)
        self.n += 1
        self.seq.timestamp(f"{self.n}:{kernel.name}")

    def __getattr__(self, name):
        return getattr(self.seq, name)


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


def _device_times(a, tune, reps):
    """(family name, {kernel: ms}) of one forward's kernels under knobs ``tune``."""
    from ssm_ref.mamba3_checks import check_mamba3_forward
    from ssm_vk import config, mamba3_api

    with config.configure(tune=tune):
        p = check_mamba3_forward(a["x"], a["dt"], a["dA"], a["lam"], a["B"], a["C"], a["B_bias"], a["C_bias"],
                                 a["dtheta"], rotation="interleaved", dtype=np.float32)
        d = p.dims
        dec = mamba3_api.decide("mamba3_scan", d)
        fam = dec.fp.family
        call = mamba3_api.M3Call(dec.ctx, dec.engine, dec.fp, config.settings())
    try:
        mamba3_api._put_inputs(call, p)
        outs = dict(y=d.S * d.T * d.M * d.H * d.P, theta=d.S * d.H * d.F, h=d.S * d.H * d.P * d.N,
                    k=d.S * d.H * d.M * d.N, v=d.S * d.H * d.M * d.P)
        for k, n in (*outs.items(), *fam.scratch(d, dec.fp.plan, False).items()):
            call.empty(k, n)

        def record(seq):
            seq.timestamp("0:start")
            fam.record_forward(_Timed(seq), call, p, call.bufs)

        best: dict = {}
        for _ in range(reps + 1):
            call.run(record)
            t = call.seq.gpu_times()
            labels = list(t)
            for a_, b_ in itertools.pairwise(labels):
                ms = (t[b_] - t[a_]) * 1e-6
                best[b_] = min(best.get(b_, ms), ms)
        return fam.name, best
    finally:
        call.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1x512,8x2048", help="SxT,... (default 1x512,8x2048)")
    ap.add_argument("--H", type=int, default=32)
    ap.add_argument("--P", type=int, default=64)
    ap.add_argument("--N", type=int, default=128)
    ap.add_argument("--F", type=int, default=32)
    ap.add_argument("--M", type=int, default=0, help="MIMO rank (0: SISO)")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    import ssm_vk
    from ssm_vk import config

    rng = np.random.default_rng(0)
    print(f"device: {ssm_vk.runtime.get_context().info.name}; H={args.H} P={args.P} N={args.N} F={args.F} "
          f"{'M=' + str(args.M) if args.M else 'SISO'}")
    for shape in args.shapes.split(","):
        S, T = (int(v) for v in shape.lower().split("x"))
        a = _problem(S, T, args.H, args.P, args.N, args.M, args.F, rng)
        print(f"(S, T) = ({S}, {T})")
        for label, tune in (("chunked", {"M3_CHUNK_MIN_T": 1}), ("token-sequential", {"M3_CHUNK": 0})):
            name, times = _device_times(a, tune, args.reps)
            with config.configure(tune=tune):
                ssm_vk.mamba3_scan(**a)
                wall = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    ssm_vk.mamba3_scan(**a)
                    wall.append(time.perf_counter() - t0)
            steps = ", ".join(f"{k.split(':', 1)[1]} {v:.3f}" for k, v in times.items())
            print(f"  {label} ({name}): kernels {sum(times.values()):.3f} ms [{steps}]; "
                  f"call from host arrays {min(wall) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
