"""Float32 products on the matrix units, error-compensated (benchmarks/glsl/bench_mma.comp): how
fast, and how close to float64, beside plain float16 products. A batch of 64 x KD by KD x 64
products, rows of A and columns of B of magnitudes spread over 10^-3 .. 10^3 or all alike; the
operands scaled per 16-row (16-column) block or per row (column).

    python benchmarks/vk_mma.py [--kd 192] [--batch 6144] [--json out.json]

Then the chunked forward's chunk states in the same form (benchmarks/glsl/bench_mma_states.comp),
to set beside chunk_gemm.comp's float32 ZF at the same shape (benchmarks/vk_speed.py, "states").

Needs a device whose DeviceInfo.matrix_f16 is true (NVIDIA's VK_NV_cooperative_matrix).
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from pathlib import Path

import numpy as np

from ssm_vk import runtime as rt

BENCH_GLSL = Path(__file__).resolve().parent / "glsl"


def run(ctx, kd: int, batch: int, terms: int, rowscale: int, spread: float, seconds: float, seed: int = 0) -> dict:
    sgs = ctx.info.subgroup_size
    wg = 4 * sgs
    k = rt.Kernel.get(ctx, "bench_mma", bindings=3, push_size=4, local_size=(wg, 1, 1),
                      defines={"WG": wg, "SGS": sgs, "KD": kd, "TERMS": terms, "ROWSCALE": rowscale},
                      search_path=BENCH_GLSL)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((batch, 64, kd)) * 10.0 ** rng.uniform(-spread, spread, (batch, 64, 1))
    b = rng.standard_normal((batch, kd, 64)) * 10.0 ** rng.uniform(-spread, spread, (batch, 1, 64))
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    bufs = [rt.Buffer(ctx, a32.nbytes), rt.Buffer(ctx, b32.nbytes), rt.Buffer(ctx, batch * 64 * 64 * 4)]
    rt.upload(bufs[0], a32)
    rt.upload(bufs[1], b32)
    seq = rt.Sequence(ctx)
    seq.timestamp("a")
    seq.dispatch(k, bufs, struct.pack("<I", batch), (batch, 1, 1))
    seq.timestamp("b")
    seq.finish()
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 5:
        seq.submit()
        times.append(seq.gpu_times()["b"] / 1e3)
    out = rt.download(bufs[2], ((batch, 64, 64), np.float32))
    ref = np.matmul(a32.astype(np.float64), b32.astype(np.float64))
    fp32 = np.matmul(a32, b32)            # numpy's float32 product, for scale
    absref = np.matmul(np.abs(a32.astype(np.float64)), np.abs(b32.astype(np.float64)))
    err = np.abs(out - ref)
    seq.close()
    for x in bufs:
        x.close()
    us = float(np.median(times))
    return dict(kd=kd, batch=batch, terms=terms, rowscale=rowscale, spread=spread, us=us,
                tflops=batch * 64 * 64 * kd * 2 / us / 1e6,
                max_rel_to_absprod=float((err / absref).max()),          # |err| / (|A| |B|), elementwise
                norm_rel=float(err.max() / np.abs(ref).max()),
                fp32_max_rel_to_absprod=float((np.abs(fp32 - ref) / absref).max()),
                tile_rel=float((err.max(axis=(1, 2)) / np.abs(ref).max(axis=(1, 2))).max()))


def states_reference(x, w, b, CL: int) -> np.ndarray:
    """float64 chunk states (S, NCH, H, P, N) of x (S, T, H, P), w (S, T, H), B (S, T, G, N)."""
    S, T, H, _ = x.shape
    G = b.shape[2]
    NCH = -(-T // CL)
    pad = NCH * CL - T
    u = np.pad(x.astype(np.float64) * w.astype(np.float64)[..., None], ((0, 0), (0, pad), (0, 0), (0, 0)))
    bb = np.pad(b.astype(np.float64), ((0, 0), (0, pad), (0, 0), (0, 0)))
    u = u.reshape(S, NCH, CL, H, -1)
    bb = bb.reshape(S, NCH, CL, G, -1)[:, :, :, np.arange(H) // (H // G)]
    return np.matmul(u.transpose(0, 1, 3, 4, 2), bb.transpose(0, 1, 3, 2, 4))


def run_states(ctx, S: int, T: int, H: int, G: int, terms: int, keep: int, seconds: float, seed: int = 0) -> dict:
    """bench_mma_states.comp at (S, T, H, P = 64, N = 128), chunks of 64: the chunk states of the
    chunked forward (chunk_gemm.comp's ZF) on the matrix units; errors against float64 per tile."""
    P, N, CL = 64, 128, 64
    NCH = -(-T // CL)
    sgs = ctx.info.subgroup_size
    k = rt.Kernel.get(ctx, "bench_mma_states", bindings=4, push_size=20, local_size=(4 * sgs, 1, 1),
                      defines={"WG": 4 * sgs, "CL": CL, "P": P, "N": N, "TERMS": terms, "KEEP": keep},
                      search_path=BENCH_GLSL)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((S, T, H, P)).astype(np.float32)
    w = rng.uniform(0.01, 1.0, (S, T, H)).astype(np.float32)
    b = rng.standard_normal((S, T, G, N)).astype(np.float32)
    groups = S * NCH * H
    bufs = [rt.Buffer(ctx, x.nbytes), rt.Buffer(ctx, w.nbytes), rt.Buffer(ctx, b.nbytes),
            rt.Buffer(ctx, groups * P * N * 4)]
    for buf, arr in zip(bufs, (x, w, b), strict=False):
        rt.upload(buf, arr)
    seq = rt.Sequence(ctx)
    seq.timestamp("a")
    seq.dispatch(k, bufs, struct.pack("<5I", S, T, H, G, NCH), (groups, 1, 1))
    seq.timestamp("b")
    seq.finish()
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 5:
        seq.submit()
        times.append(seq.gpu_times()["b"] / 1e3)
    got = rt.download(bufs[3], ((S, NCH, H, P, N), np.float32)).astype(np.float64)
    seq.close()
    for buf in bufs:
        buf.close()
    want = states_reference(x, w, b, CL)
    err = np.linalg.norm((got - want).reshape(S * NCH * H, -1), axis=1)
    ref = np.linalg.norm(want.reshape(S * NCH * H, -1), axis=1)
    us = float(np.median(times))
    return dict(kernel="states", S=S, T=T, H=H, G=G, terms=terms, keep=keep, us=us,
                tflops=S * NCH * H * P * N * CL * 2 / us / 1e6, tile_rel=float((err / ref).max()),
                bytes_per_s=(x.nbytes + w.nbytes + b.nbytes + groups * P * N * 4) / us / 1e-6)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kd", default="64,192")
    ap.add_argument("--batch", type=int, default=6144)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--states", default="8/2048/24/1,1/16384/24/1",
                    help="S/T/H/G of the chunk-state probe, ','-separated ('' for none)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    ctx = rt.get_context()
    print(f"device: {ctx.info.name}, {ctx.info.driver}; matrix_f16 {ctx.info.matrix_f16}, "
          f"subgroup {ctx.info.subgroup_size}")
    if not ctx.info.matrix_f16:
        print("no float16 matrix units on this device")
        return 1
    rows = []
    for kd in (int(v) for v in args.kd.split(",") if v):
        for terms, rowscale, spread in ((3, 0, 3.0), (3, 1, 3.0), (1, 0, 3.0), (3, 0, 0.0), (3, 1, 0.0), (1, 0, 0.0)):
            r = run(ctx, kd, args.batch, terms, rowscale, spread, args.seconds)
            rows.append(r)
            print(json.dumps(r))
    for shape in filter(None, args.states.split(",")):
        S, T, H, G = (int(v) for v in shape.split("/"))
        for terms, keep in ((3, 0), (3, 1), (1, 0)):
            r = run_states(ctx, S, T, H, G, terms, keep, args.seconds)
            rows.append(r)
            print(json.dumps(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=ctx.info.name, driver=ctx.info.driver, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
