"""Probe for the matrix-units issue: do float32 products on the float16 matrix units pay once the
operands are split by the kernels that produce them, not per tile? Two products of the chunked
Mamba-2 forward at ``train`` (8, 2048, 24, 64, 128), in one process:

1. ssm_vk's chunked forward at that shape, kernel by kernel (GPU timestamps after each dispatch):
   the float32 ``chunk_gemm_zf`` (the chunk states hs[s, c, h] = sum_t (w x)[t]ᵀ B[t], P x N) and
   ``chunk_gemm_y`` (y = mcb u + din (C hsᵀ), CL x P) the probe is measured against;
2. ``probe_split.comp``: each operand block (per sequence, chunk and head or group) scaled by one
   power of two and split into float16 hi and lo parts (ssm_ref/precision.py's split) -- in a
   product engine, work for the kernels that produce the operands;
3. ``probe_zf.comp``, ``probe_y.comp``: the two products on VK_NV_cooperative_matrix from those
   parts, three products each (``"high"``) and one (``"medium"``), read straight from memory.

Checks on a sample of blocks: the w x split bit for bit against ``ssm_ref.precision.split``, the
products against ``ssm_ref.precision.matmul`` (the emulation) and against float64. Needs an
NVIDIA GPU whose Vulkan driver offers VK_NV_cooperative_matrix (the device is created with it,
16-bit storage, float16 arithmetic and the Vulkan memory model enabled); anywhere else it says so
and stops. Not a product path: ssm_vk never enables these.

    python benchmarks/vk_split_probe.py [--shape 8,2048,24,64,128,1] [--reps 20]
"""

from __future__ import annotations

import argparse
import itertools
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

BENCH_GLSL = Path(__file__).resolve().parent / "glsl"
COOPMAT_NV = "VK_NV_cooperative_matrix"
COOPMAT_KHR = "VK_KHR_cooperative_matrix"
KHR = {"on": False}   # whether the device was made with COOPMAT_KHR too (it offers it)
_KEEP: list = []     # cffi objects the patched device creation must keep alive


def enable_matrix_units(coopmat: bool = True) -> None:
    """Create the process's Vulkan device with VK_NV_cooperative_matrix and the features its
    shaders need (16-bit storage, float16 arithmetic, the Vulkan memory model): wraps
    vkCreateDevice before ssm_vk makes its context."""
    from ssm_vk.runtime import binding

    vk = binding.require()
    ffi = vk.ffi
    original = vk.vkCreateDevice

    def create(physical, info, alloc):
        from ssm_vk.runtime import device

        names = [ffi.string(info.ppEnabledExtensionNames[i]).decode() for i in range(info.enabledExtensionCount)]
        if coopmat:
            names.append(COOPMAT_NV)
            KHR["on"] = COOPMAT_KHR in device.device_extensions(physical)
        if KHR["on"]:
            names.append(COOPMAT_KHR)
        arr = [ffi.new("char[]", n.encode()) for n in names]
        ptrs = ffi.new("char*[]", arr)
        coop = ffi.new("VkPhysicalDeviceCooperativeMatrixFeaturesNV*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV, "cooperativeMatrix": 1})
        v11 = ffi.new("VkPhysicalDeviceVulkan11Features*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES, "storageBuffer16BitAccess": 1})
        v12 = ffi.new("VkPhysicalDeviceVulkan12Features*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, "shaderFloat16": 1,
            "vulkanMemoryModel": 1, "vulkanMemoryModelDeviceScope": 1})
        khr = ffi.new("VkPhysicalDeviceCooperativeMatrixFeaturesKHR*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR, "cooperativeMatrix": 1})
        feats = ffi.cast("VkPhysicalDeviceFeatures2*", info.pNext)
        khr.pNext = feats.pNext
        coop.pNext = khr if KHR["on"] else feats.pNext
        v11.pNext = coop if coopmat else feats.pNext
        v12.pNext = v11
        feats.pNext = v12
        info.enabledExtensionCount = len(names)
        info.ppEnabledExtensionNames = ptrs
        _KEEP.extend([arr, ptrs, coop, khr, v11, v12])
        return original(physical, info, alloc)

    vk.vkCreateDevice = create


def baseline(shape, reps):
    """{kernel: best ms} of ssm_vk's chunked forward at ``shape`` (DeviceArrays in), and its total."""
    from vk_gpu_check import inputs, warm
    from vk_mamba3 import _timed_sequences

    import ssm_vk
    from ssm_vk import run
    from ssm_vk.runtime.commands import MAX_TIMESTAMPS

    _timed_sequences()
    S, T, H, P, N, G = shape
    args, _, _ = inputs((S, T, H, P, N, G, "mamba2"))
    dev = {k: ssm_vk.to_device(v) for k, v in args.items()}
    best: dict = {}

    def call():
        return ssm_vk.ssm_scan(**dev)

    warm(call, 1.0)
    where = call().where
    for _ in range(reps):
        r = call()
        t = run.last_sequence().gpu_times()
        for a, b in itertools.pairwise(t):
            if ":" in b:
                best[b] = min(best.get(b, 1e9), (t[b] - t[a]) * 1e-6)
        total = (max(t.values()) - min(t.values())) * 1e-6
        best["total"] = min(best.get("total", 1e9), total)
        del r
        assert len(t) < MAX_TIMESTAMPS
    print(f"ssm_vk forward, kernel by kernel (best ms of {reps}): {where}")
    for k, v in best.items():
        print(f"  {k:28s} {v:8.4f}")
    for v in dev.values():
        v.release()
    return best


class _Splitter:
    """probe_split.comp's dispatches: float16 parts and exponents of DeviceArrays, block by block."""

    def __init__(self, ctx, rt):
        self.ctx, self.rt, self.kernels = ctx, rt, {}

    def __call__(self, seq, v, w, hi, lo, e, R, W, tokens, blocks, S=0, T=0, WD=1, NCH=1):
        key = (R, W, tokens, w is not None)
        if key not in self.kernels:
            defs = {"WG": 256, "R": R, "W": W, "TOKENS": int(tokens), "WEIGHT": int(w is not None)}
            self.kernels[key] = self.rt.Kernel.get(self.ctx, "probe_split", bindings=5, push_size=16,
                                                   local_size=(256, 1, 1), defines=defs, search_path=[BENCH_GLSL])
        seq.dispatch(self.kernels[key], [a.buffer for a in (v, w if w is not None else v, hi, lo, e)],
                     struct.pack("<4I", S, T, WD, NCH), (blocks, 1, 1))


def _half(ssm_vk, n):
    """A DeviceArray of ``n`` float16 values (held as n / 2 float32s)."""
    return ssm_vk.to_device(np.zeros((n + 1) // 2, np.float32))


def _ints(ssm_vk, n):
    return ssm_vk.to_device(np.zeros(n, np.int32))


def _same16(a, b) -> bool:
    return np.array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))


def _timed(seq, reps, labels):
    """Best ms of each span between consecutive ``labels`` over ``reps`` submissions of ``seq``."""
    from vk_gpu_check import warm

    warm(seq.submit, 1.0)
    best = dict.fromkeys(labels[1:], 1e9)
    for _ in range(reps):
        seq.submit()
        t = seq.gpu_times()
        for a, b in itertools.pairwise(labels):
            best[b] = min(best[b], (t[b] - t[a]) * 1e-6)
    return best


def _khr_products(ctx, rt, reps, terms, defs, sub, push, groups, out, runs) -> None:
    """The two products again on VK_KHR_cooperative_matrix (the NV kernels' SPIR-V rewritten by
    spirv_khr.py), from the parts the NV run left: their time, and whether each result is the NV
    kernel's bit for bit (``runs``: {product: (bindings, output, the NV result)})."""
    import spirv_khr

    from ssm_vk.runtime import shaders

    for prod, (binds, dst, nv) in runs.items():
        wg = sub * (defs["P"] if prod == "zf" else defs["CL"]) // 16
        full = {"WG": wg, **defs}
        try:
            spv = spirv_khr.rewrite(shaders.compile_shader("probe_" + prod, full, search_path=[BENCH_GLSL]))
            k = rt.Kernel(ctx, f"probe_{prod}_khr", spv, len(binds), 20, (wg, 1, 1), (), full)
        except Exception as e:   # (what the driver says of the rewritten module is the finding)
            print(f"probe {prod} on {COOPMAT_KHR}: {type(e).__name__}: {e}")
            continue
        seq = rt.Sequence(ctx)
        seq.timestamp("start")
        seq.dispatch(k, [a.buffer for a in binds], push, (groups, 1, 1))
        seq.timestamp("product")
        seq.finish()
        best = _timed(seq, reps, ["start", "product"])
        seq.close()
        out[(prod + "-khr", terms)] = best
        same = dst.numpy().tobytes() == np.ascontiguousarray(nv).tobytes()
        print(f"probe {prod} on {COOPMAT_KHR} (TERMS={terms}): product {best['product']:.4f} ms; "
              f"the NV kernel's bits: {same}")
        k.close()


def probe(shape, reps, CL=64):
    """The chunk states and y on the matrix units at ``shape``: {(product, terms): {span: ms}}."""
    import ssm_vk
    from ssm_ref import precision
    from ssm_vk import runtime as rt

    S, T, H, P, N, G = shape
    assert T % CL == 0 and P % 16 == 0 and N % 16 == 0 and H % G == 0 and CL % 16 == 0
    NCH = T // CL
    ctx = rt.get_context()
    sub = ctx.info.subgroup_size
    split = _Splitter(ctx, rt)
    rng = np.random.default_rng(1)
    f32 = np.float32
    x = rng.uniform(-1, 1, (S, T, H, P)).astype(f32)
    d = rng.uniform(0.01, 1.0, (S, T, H)).astype(f32)                              # softplus(dt)
    w = (d * np.exp(-rng.uniform(0, 8, (S, T, H)))).astype(f32)                     # dout d
    B = rng.uniform(-0.5, 0.5, (S, T, G, N)).astype(f32)
    C = rng.uniform(-0.5, 0.5, (S, T, G, N)).astype(f32)
    din = np.exp(-rng.uniform(0, 4, (S, T, H))).astype(f32)
    lag = np.subtract.outer(np.arange(CL), np.arange(CL))
    mcb = (rng.uniform(-1, 1, (S * NCH * H, CL, CL)) * np.where(lag >= 0, np.exp(-0.1 * np.abs(lag)), 0)).astype(f32)
    hsv = (rng.standard_normal((S * NCH * H, P, N)) * 0.5).astype(f32)
    dx, dd, dw, dB, dC, ddin, dm, dh = (ssm_vk.to_device(v) for v in (x, d, w, B, C, din, mcb, hsv))
    xa_hi, xa_lo, u_hi, u_lo = (_half(ssm_vk, x.size) for _ in range(4))
    b_hi, b_lo, c_hi, c_lo = (_half(ssm_vk, B.size) for _ in range(4))
    m_hi, m_lo = _half(ssm_vk, mcb.size), _half(ssm_vk, mcb.size)
    h_hi, h_lo = _half(ssm_vk, hsv.size), _half(ssm_vk, hsv.size)
    e_xa, e_u, e_m, e_h = (_ints(ssm_vk, S * NCH * H) for _ in range(4))
    e_b, e_c = _ints(ssm_vk, S * NCH * G), _ints(ssm_vk, S * NCH * G)
    hs_out = ssm_vk.to_device(np.zeros(S * NCH * H * P * N, f32))
    y_out = ssm_vk.to_device(np.zeros(x.size, f32))
    push = struct.pack("<5I", S, T, H, G, NCH)
    tok = dict(S=S, T=T, NCH=NCH)
    out = {}
    samples = [(0, 0, 0), (S - 1, NCH - 1, H - 1), (S // 2, NCH // 3, H // 2), (1 % S, 5 % NCH, 7 % H)]
    for terms in (3, 1):
        prec = "high" if terms == 3 else "medium"
        defs = {"CL": CL, "P": P, "N": N, "TERMS": terms}
        kz = rt.Kernel.get(ctx, "probe_zf", bindings=7, push_size=20, local_size=(sub * P // 16, 1, 1),
                           defines={"WG": sub * P // 16, **defs}, search_path=[BENCH_GLSL])
        ky = rt.Kernel.get(ctx, "probe_y", bindings=14, push_size=20, local_size=(sub * CL // 16, 1, 1),
                           defines={"WG": sub * CL // 16, **defs}, search_path=[BENCH_GLSL])
        # the chunk states: w x and B split, then the product
        seq = rt.Sequence(ctx)
        seq.timestamp("start")
        split(seq, dx, dw, xa_hi, xa_lo, e_xa, CL, P, True, S * NCH * H, WD=H, **tok)
        split(seq, dB, None, b_hi, b_lo, e_b, CL, N, True, S * NCH * G, WD=G, **tok)
        seq.timestamp("split")
        seq.barrier()
        seq.dispatch(kz, [a.buffer for a in (xa_hi, xa_lo, b_hi, b_lo, e_xa, e_b, hs_out)], push, (S * NCH * H, 1, 1))
        seq.timestamp("product")
        seq.finish()
        out[("zf", terms)] = _timed(seq, reps, ["start", "split", "product"])
        seq.close()
        # y: mcb, u = d x, C and the chunk states split, then the product
        seq = rt.Sequence(ctx)
        seq.timestamp("start")
        split(seq, dm, None, m_hi, m_lo, e_m, CL, CL, False, S * NCH * H)
        split(seq, dx, dd, u_hi, u_lo, e_u, CL, P, True, S * NCH * H, WD=H, **tok)
        split(seq, dC, None, c_hi, c_lo, e_c, CL, N, True, S * NCH * G, WD=G, **tok)
        split(seq, dh, None, h_hi, h_lo, e_h, P, N, False, S * NCH * H)
        seq.timestamp("split")
        seq.barrier()
        seq.dispatch(ky, [a.buffer for a in (m_hi, m_lo, u_hi, u_lo, c_hi, c_lo, h_hi, h_lo, e_m, e_u, e_c, e_h,
                                             ddin, y_out)], push, (S * NCH * H, 1, 1))
        seq.timestamp("product")
        seq.finish()
        out[("y", terms)] = _timed(seq, reps, ["start", "split", "product"])
        seq.close()
        # accuracy on sampled blocks: against float64 and against ssm_ref's emulation; the split bit for bit
        got_hs = hs_out.numpy().reshape(S, NCH, H, P, N)
        got_y = y_out.numpy().reshape(S, T, H, P)
        xa_parts = [a.numpy().view(np.float16)[: x.size].reshape(S, T, H, P) for a in (xa_hi, xa_lo)]
        e_xav = e_xa.numpy().view(np.int32)
        err = {"zf": [0.0, 0.0], "y": [0.0, 0.0]}
        split_ok = True
        for s, c, h in samples:
            g = h // (H // G)
            ts = slice(c * CL, (c + 1) * CL)
            blk = (s * NCH + c) * H + h
            A = (w[s, ts, h, None] * x[s, ts, h]).T.copy()                 # (P, CL)
            Bm = B[s, ts, g].copy()
            want = A.astype(np.float64) @ Bm.astype(np.float64)
            emu = precision.matmul(A, Bm, prec)
            err["zf"][0] = max(err["zf"][0], np.linalg.norm(got_hs[s, c, h] - want) / np.linalg.norm(want))
            err["zf"][1] = max(err["zf"][1], np.abs(got_hs[s, c, h] - emu).max() / np.abs(emu).max())
            a_hi, a_lo, e_a = precision.split(A, "high")
            split_ok &= (_same16(xa_parts[0][s, ts, h].T, a_hi) and _same16(xa_parts[1][s, ts, h].T, a_lo)
                         and e_xav[blk] == e_a)
            u = (d[s, ts, h, None] * x[s, ts, h]).astype(f32)                # (CL, P)
            Cm, hsb, dn = C[s, ts, g].copy(), hsv[blk].T.copy(), din[s, ts, h]
            want = (mcb[blk].astype(np.float64) @ u + dn[:, None].astype(np.float64)
                    * (Cm.astype(np.float64) @ hsb.astype(np.float64)))
            emu = precision.matmul(mcb[blk], u, prec) + dn[:, None] * precision.matmul(Cm, hsb, prec)
            err["y"][0] = max(err["y"][0], np.linalg.norm(got_y[s, ts, h] - want) / np.linalg.norm(want))
            err["y"][1] = max(err["y"][1], np.abs(got_y[s, ts, h] - emu).max() / np.abs(emu).max())
        if KHR["on"]:
            _khr_products(ctx, rt, reps, terms, defs, sub, push, S * NCH * H, out, {
                "zf": ([xa_hi, xa_lo, b_hi, b_lo, e_xa, e_b, hs_out], hs_out, got_hs),
                "y": ([m_hi, m_lo, u_hi, u_lo, c_hi, c_lo, h_hi, h_lo, e_m, e_u, e_c, e_h, ddin, y_out], y_out, got_y)})
        for prod in ("zf", "y"):
            b = out[(prod, terms)]
            print(f"probe {prod}, {prec} ({terms} product{'s' * (terms > 1)}): split {b['split']:.4f} ms, "
                  f"product {b['product']:.4f} ms; error vs float64 {err[prod][0]:.2e}, vs the emulation "
                  f"{err[prod][1]:.2e} (max abs / max abs)"
                  + (f"; w x split bit for bit: {split_ok}" if prod == "zf" else ""))
    for v in (dx, dd, dw, dB, dC, ddin, dm, dh, xa_hi, xa_lo, u_hi, u_lo, b_hi, b_lo, c_hi, c_lo, m_hi, m_lo,
              h_hi, h_lo, e_xa, e_u, e_m, e_h, e_b, e_c, hs_out, y_out):
        v.release()
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="8,2048,24,64,128,1", help="S,T,H,P,N,G")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    shape = tuple(int(v) for v in a.shape.split(","))
    from ssm_vk.runtime import binding, device

    vk = binding.require()
    inst = device.create_instance()
    offered = any(COOPMAT_NV in device.device_extensions(pd) for pd in device.physical_devices(inst))
    vk.vkDestroyInstance(inst, None)
    if not offered:
        print(f"no device offers {COOPMAT_NV}: nothing to probe")
        return
    enable_matrix_units()
    base = baseline(shape, a.reps)
    res = probe(shape, a.reps)
    for prod in ("zf", "y"):
        f32 = next((v for k, v in base.items() if k.endswith("chunk_gemm_" + prod)), None)
        for terms in (3, 1):
            b = res[(prod, terms)]
            if f32:
                print(f"{prod}, {terms} product(s): {b['product']:.4f} ms (+ splits {b['split']:.4f}) against float32 "
                      f"chunk_gemm_{prod} {f32:.4f} ms: {f32 / b['product']:.2f}x, "
                      f"{f32 / (b['product'] + b['split']):.2f}x with the splits")


if __name__ == "__main__":
    main()
