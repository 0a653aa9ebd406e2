"""No index in a shader overflows uint32 or leaves its binding, for any problem ssm_vk accepts.

The shaders index with uint32 *relative to each window's binding* (ssm_vk/*/glsl/*.comp). This test
records the real command sequences (the families' recordings, with the real planner and bindings) for a grid
of huge problems under H200 and lavapipe limits -- without a device: a fake sequence collects every
dispatch -- and evaluates, for every dispatch and every binding, the largest index a live
invocation computes. The formulas below are the shaders' index expressions, transcribed; each is
a sum of products of non-negative terms (Horner form), so its largest value is reached at the
largest coordinates and bounds every intermediate value too. The chunked Mamba-2 kernels
(ssm_vk/chunked/glsl/chunk_*.comp, ssm_vk/chunked/chunked_recording.py), which the default knobs
pick for Mamba-2 from 256 tokens, are checked the same way. Asserted for every binding:

    largest index + 1  <=  elements bound  <=  maxStorageBufferRange / 4  <  2^32

and for every dispatch: workgroups within maxComputeWorkGroupCount, threads (gx * gy * WG) within
2^32 (the element-wise kernels compute a flat thread index). Problems beyond the device are shown
to fall back instead (ssm_vk/sizing/), so no kernel ever sees them.
"""

from __future__ import annotations

import itertools
import struct

import numpy as np
import plans
import pytest

from ssm_ref import Dims, Problem
from ssm_vk import budget, recording, workspace
from ssm_vk import kernel_specs as specs
from ssm_vk.chunked import chunked_recording as chunked_record
from ssm_vk.chunked import chunked_specs as chunked_specs
from ssm_vk.m1 import m1_recording as m1_record
from ssm_vk.m1 import m1_specs as m1_specs
from ssm_vk.registry import plan
from ssm_vk.runtime.pieces import Pieces
from ssm_vk.sequential import sequential_recording as sequential_record
from ssm_vk.sequential import sequential_specs as sequential_specs
from ssm_vk.sequential import time_chunks
from ssm_vk.sizing import Limits, TooLarge, output_shapes, piece_sizes

U32 = 2**32
ALL_OPS = frozenset({"basic", "vote", "arithmetic", "ballot", "shuffle", "shuffle_relative", "clustered", "quad"})

# NVIDIA H200 (driver 580, docs/VULKAN.md "Devices measured") and lavapipe (llvmpipe 15) limits.
H200 = Limits(subgroup_size=32, subgroup_ops=ALL_OPS, max_workgroup_invocations=1024, max_shared_memory=48 << 10,
              max_workgroup_count=(2**31 - 1, 65535, 65535), max_storage_buffer_range=2**32 - 1,
              max_memory_allocation_size=2**32, min_storage_buffer_offset_alignment=16,
              max_workgroup_size=(1024, 1024, 64), max_push_constants_size=256, max_storage_buffers_per_stage=2**20,
              max_memory_allocation_count=2**32)
H200_HEAP = 140 * 10**9
LAVAPIPE = Limits(subgroup_size=8, subgroup_ops=ALL_OPS, max_workgroup_invocations=1024, max_shared_memory=32 << 10,
                  max_workgroup_count=(65535, 65535, 65535), max_storage_buffer_range=2**27,
                  max_memory_allocation_size=2**31, min_storage_buffer_offset_alignment=16,
                  max_workgroup_size=(1024, 1024, 1024), max_push_constants_size=128, max_storage_buffers_per_stage=32,
                  max_memory_allocation_count=2**32 - 1)
LAVAPIPE_HEAP = 2**31
DEVICES = {"h200": (H200, H200_HEAP), "lavapipe": (LAVAPIPE, LAVAPIPE_HEAP)}


class FakeBuffer:
    ctx = None

    def __init__(self, nbytes: int, content=None):
        self.size = nbytes
        self.content = content          # constants: the pairs the rows kernel reads
        self.serial = id(self)


class FakeInfo:
    def __init__(self, lim: Limits, heap: int):
        self.max_memory_allocation_size = lim.max_memory_allocation_size
        self.min_storage_buffer_offset_alignment = lim.min_storage_buffer_offset_alignment
        self.device_local_bytes = heap
        self.max_memory_allocation_count = 2**32
        self.name = "fake"


class FakeWorkspace:
    """What the recordings ask of a workspace.Workspace: limits, family and plan, scratch, constants,
    bindings."""

    bind = workspace.Workspace.bind

    def __init__(self, d: Dims, lim: Limits, fp, backward: bool):
        self.ctx = None
        self.limits, self.family, self.plan = lim, fp.family, fp.plan
        self.align = lim.min_storage_buffer_offset_alignment
        self.sizes = {k: int(np.prod(v, dtype=np.int64)) for k, v in output_shapes(d, backward).items()}
        self.profile = False
        self._dummy = FakeBuffer(16)

    def scratch(self, n_elems: int):
        return FakeBuffer(n_elems * 4) if n_elems > 0 else None

    def constant(self, arr):
        return FakeBuffer(arr.nbytes, arr.copy())

    def dummy(self):
        return self._dummy

    def flag_host(self):
        return FakeBuffer(16)


class FakeSequence:
    """Collects dispatches; checks copies and fills stay inside their buffers."""

    def __init__(self):
        self.dispatches = []

    def dispatch(self, spec, bindings, push, groups):
        self.dispatches.append((spec, bindings, push, groups))

    def copy(self, src, dst, nbytes, src_offset=0, dst_offset=0):
        assert src_offset + nbytes <= src.size and dst_offset + nbytes <= dst.size

    def fill(self, buf, value, offset=0, nbytes=None):
        assert offset + (nbytes or 0) <= buf.size

    def barrier(self):
        pass

    def timestamp(self, label):
        pass


def _record(d: Dims, ids: np.ndarray, lim: Limits, backward: bool, monkeypatch, cuts: dict | None = None) -> list:
    """The dispatches of the call's recording; the arrays of ``cuts`` (budget.pieces: name -> byte
    offsets) held in pieces of fake buffers, so each binding of them resolves to one piece (or
    raises: Pieces.at)."""
    for module in (recording, sequential_record, chunked_record, time_chunks, m1_record):
        monkeypatch.setattr(module, "kernel", lambda ctx, spec: spec)
    pl = plan(d, lim, backward=backward)
    ws = FakeWorkspace(d, lim, pl, backward)
    p = Problem(dims=d, s=None, x=None, dt=None, A=None, B=None, C=None, ids=ids)
    names = {"s": d.R * d.H * d.P * d.N, "x": d.S * d.T * d.H * d.P, "dt": d.S * d.T * d.H,
             "A": d.H * (d.N if d.mamba1 else 1), "B": d.S * d.T * d.G * d.N, "C": d.S * d.T * d.G * d.N,
             "g_y": d.S * d.T * d.H * d.P, "g_states": d.S * d.H * d.P * d.N, **ws.sizes}
    bufs = {k: ((FakeBuffer(4 * n), 0) if n else (None, 0)) for k, n in names.items()}
    for k, starts in (cuts or {}).items():
        bufs[k] = (Pieces([FakeBuffer(n) for n in piece_sizes(4 * names[k], starts)], starts, 4 * names[k]), 0)
    seq = FakeSequence()
    (ws.family.record_backward if backward else ws.family.record_forward)(seq, ws, p, bufs)
    return seq.dispatches


def _push(spec, push: bytes) -> dict:
    fields = {"ssm_scan": sequential_specs.FWD_PUSH, "ssm_decode": sequential_specs.FWD_PUSH,
              "ssm_scan_back": sequential_specs.BWD_PUSH,
              "ssm_scan_reduce": specs.RED_PUSH,
              "rows": specs.ROWS_PUSH, "ssm_scan_carry": specs.CARRY_PUSH, "m1_scan": m1_specs.M1_PUSH,
              "m1_scan_back": m1_specs.M1_BACK_PUSH}.get(
                  spec.name, chunked_specs.CHUNK_PUSH if spec.name.startswith("chunk_") else None)
    return dict(zip(fields, struct.unpack(f"<{len(fields)}I", push), strict=True))


# ssm_vk/chunked/glsl/chunk_common.glsl: the binding table of every chunked kernel, and the slots of sm.
CB = {name: k for k, name in enumerate(chunked_specs.CHUNK_BINDINGS)}
NSM, SM_W, SM_GX, SM_BETA, SM_ALPHA, SM_GH = 12, 0, 1, 3, 5, 9


def _chunk_bounds(spec, v: dict, D: dict) -> dict[int, int]:
    """The chunked kernels' bindings -> largest index + 1 (ssm_vk/chunked/glsl/chunk_*.comp). Token indices are
    tok(i, c, t) = i*T + c*CL + t < S*T (loads clamp t to the chunk's last token), head matrices
    head_mat(i, c, h) < S*NCH*H, group matrices < S*NCH*G."""
    S, T, H, G, NCH = v["S"], v["T"], v["H"], v["G"], v["NCH"]
    CL, PD, ND = D["CL"], D["PD"], D["ND"]
    DEC = 2 * CL + 1
    ST, heads = S * T, S * NCH * H
    tokP, tokG = ST * H * PD, ST * G * ND                      # (it*H + h)*P + p, (it*G + g)*N + n
    if not D.get("HEADLOOP", 0):
        tokG = ST * (H // D.get("HPART", 1)) * ND              # parts: (it*(H/HPART) + h/HPART)*N + n
    dt = v["o_dt"] + ST * H                                    # dt[o_dt + it*H + h]
    dec = heads * DEC                                          # dec[hm*DEC + 2CL]
    hsz = heads * PD * ND                                      # hs[hm*P*N + p*N + n], gs the same
    mat = heads * CL * CL                                      # mcb, gu, mgu[hm*CL*CL + t*CL + s]
    sm = lambda top: (ST * H - 1) * NSM + top                  # sm[(it*H + h)*NSM + slot + block] # noqa: E731
    if spec.name == "chunk_pass":                              # e < S*H*P*N; (i*NCH + c)*row + rem
        return {CB["st"]: v["o_st"] + S * H * PD * ND, CB["hs" if D["MODE"] == 0 else "gs"]: S * NCH * H * PD * ND,
                CB["dec"]: dec}
    if spec.name == "chunk_decay":
        out = {CB["dt"]: dt, CB["A"]: v["o_A"] + H, CB["dec"]: dec}
        if D["MODE"] == 1 or not D.get("KEPT", 0):
            out[CB["cb"]] = S * NCH * G * CL * CL
        if not D.get("KEPT", 0):
            out[CB["mcb"]] = mat
        if D["MODE"] == 1:
            out.update({CB["gu"]: mat, CB["mgu"]: mat, CB["sm"]: sm(SM_W + 1)})
        return out
    if spec.name == "chunk_finish":
        return {CB["dec"]: dec, CB["A"]: v["o_A"] + H, CB["dt"]: dt,
                CB["ddtp"]: v["o_st"] + ST * H,               # d_dt[o_st + it*H + h]
                CB["sm"]: sm(max(SM_ALPHA + D["NBN"], SM_BETA + D["NBP"], SM_GX + D["NBP"], SM_GH + D["NBP"])),
                CB["dAp"]: v["o_out"] + (S * H - 1) * v["NCHA"] + NCH}   # dAp[o_out + (i*H + h)*NCHA + c]
    assert spec.name.startswith("chunk_gemm_"), spec.name
    mode = spec.name.removeprefix("chunk_gemm_")                # the product: glsl/chunk_gemm_<mode>.comp
    cols = {"cb": CL, "gu": CL, "zf": ND, "zb": ND, "y": PD, "gam": PD, "db": ND, "dc": ND}[mode]
    ncbk = -(-cols // D["CBLK"])
    x, gy = CB["x"], CB["gy"]
    Bn, Cn = v["o_B"] + ST * G * ND, v["o_C"] + ST * G * ND    # B[o_B + (it*G + g)*N + n]
    reads = {  # product -> {binding: bound} of what its operands, staging and epilogue touch
        "cb": {CB["B"]: Bn, CB["C"]: Cn, CB["cb"]: S * NCH * G * CL * CL},
        "gu": {gy: v["o_gy"] + tokP, x: v["o_x"] + tokP, CB["gu"]: mat},
        "zf": {x: v["o_x"] + tokP, CB["B"]: Bn, CB["hs"]: hsz},
        "zb": {gy: v["o_gy"] + tokP, CB["C"]: Cn, CB["gs"]: hsz},
        "y": {CB["mcb"]: mat, x: v["o_x"] + tokP, CB["C"]: Cn, CB["hs"]: hsz, CB["out"]: v["o_out"] + tokP},
        "gam": {CB["mcb"]: mat, gy: v["o_gy"] + tokP, CB["B"]: Bn, CB["gs"]: hsz, CB["out"]: v["o_out"] + tokP,
               x: v["o_x"] + tokP, CB["hs"]: hsz, CB["sm"]: sm(SM_GH + ncbk)},
        "db": {CB["mgu"]: mat, CB["C"]: Cn, x: v["o_x"] + tokP, CB["gs"]: hsz, CB["out"]: v["o_out"] + tokG},
        "dc": {CB["mgu"]: mat, CB["B"]: Bn, gy: v["o_gy"] + tokP, CB["hs"]: hsz, CB["out"]: v["o_out"] + tokG,
              CB["C"]: Cn, CB["sm"]: sm(SM_ALPHA + ncbk)},
    }[mode]
    if mode != "cb":                                            # d_t = softplus(dt), din, dout
        reads.update({CB["dt"]: dt, CB["dec"]: dec})
    if mode == "gam":
        assert SM_GX + ncbk <= SM_BETA and SM_BETA + ncbk <= SM_ALPHA and SM_GH + ncbk <= NSM, \
            "GAM's column blocks overrun their sm slots"
        assert SM_ALPHA + 4 <= SM_GH
    if mode == "dc":
        assert SM_ALPHA + ncbk <= NSM, "DC's column blocks overrun their sm slots"
    return reads


def _m1_bounds(spec, v: dict, D: dict, bindings) -> dict[int, int]:
    """The Mamba-1 kernels with time in threads (ssm_vk/m1/glsl/m1_scan.comp, m1_scan_back.comp): token
    arrays [o + (it*H + h)] and [o + (it*G + g)*N + n] for tokens it < S*T (a slice past T reads
    nothing), per-chunk tables [((i*NCH + c)*H + h)*N + n], the slices' table
    [((wg*NW + slice)*(N + 1) + n)*RW + lane] for the S*NCH*NRB workgroups (MODE 0 and 1; the one
    pass, MODE 2, keeps it in shared memory)."""
    S, T, H, G, NCH, NRB = v["S"], v["T"], v["H"], v["G"], v["NCH"], v["NRB"]
    N, RW, NW = D["ND"], D["RW"], D["NW"]
    tokH, tokG = S * T * H, S * T * G * N
    chunks = S * NCH * H * N
    init = chunks if NCH > 1 else S * H * N
    out = {0: v["o_x"] + tokH, 1: v["o_dt"] + tokH, 2: v["o_A"] + H * N, 3: v["o_B"] + tokG}
    gather = v["gather"] and NCH == 1
    if gather:                                                 # s_in[o_s + (ids[o_ids + i]*H + h)*N + n]
        ids = bindings[13 if spec.name == "m1_scan" else 9][0].content
        s_rows = v["o_s"] + (int(ids[v["o_ids"]:v["o_ids"] + S].max()) + 1) * H * N
    if spec.name == "m1_scan":
        mode, adj = D["MODE"], D.get("ADJ", 0)                # MODE 2: 0 then 1 in one pass, no agg
        if mode or adj:
            out[4] = v["o_C"] + tokG
        if adj:
            out[5] = v["o_gy"] + tokH                          # gy[o_gy + it*H + h]
        elif v["keep_step"]:
            out[5] = tokH                                      # dstep[it*H + h]
        if not adj and mode != 2:
            out[8] = S * NCH * NRB * NW * (N + 1) * RW         # agg
        if mode == 0 and NCH > 1:
            out.update({9: chunks, 10: chunks})                # cb, cdec
            if adj:
                out[11] = chunks                               # cbl
        if mode:
            out.update({6: v["o_y"] + tokH, 7: v["o_init"] + (0 if gather else init)})
            if gather:
                out.update({12: s_rows, 13: v["o_ids"] + S})
        return out
    out.update({4: v["o_C"] + tokG, 5: v["o_gy"] + tokH, 7: v["o_adj"] + init,
                10: v["o_dx"] + tokH, 11: v["o_ddt"] + tokH,
                12: S * T * NRB * N, 13: S * T * NRB * N,      # dBp, dCp[((it*NRB + rb)*N + n]
                14: S * H * NCH * N})                          # dAp[((i*H + h)*NCH + c)*N + n]
    if gather:
        out.update({8: s_rows, 9: v["o_ids"] + S})
    else:
        out[6] = v["o_init"] + init
    return out


def _bounds(spec, v: dict, D: dict, bindings) -> dict[int, int]:
    """Binding -> (largest index a live invocation computes) + 1; the shaders' expressions."""
    if spec.name.startswith("chunk_"):
        return _chunk_bounds(spec, v, D)
    if spec.name.startswith("m1_"):
        return _m1_bounds(spec, v, D, bindings)
    S, T, H, P, N = v.get("S", 0), v.get("T", 0), v.get("H", 0), v.get("P", 0), v.get("N", 0)
    G = v.get("G", 1)
    if spec.name == "ssm_scan_carry":
        # e < S*H*P*N; dec[(v*H + h)*N + n] or [v*H + h], b[v*row + r] for the chunks v < S*NCH
        row, KA = H * P * N, N if D["MAMBA1"] else 1
        out = {0: S * v["NCH"] * H * KA, 1: S * v["NCH"] * row, 2: v["o_st"] + S * row, 5: 1}
        if v["gather"]:
            ids = bindings[4][0].content                       # s_in[o_s + ids[o_ids + i]*row + r]
            out.update({3: v["o_s"] + (int(ids[v["o_ids"]:v["o_ids"] + S].max()) + 1) * row, 4: v["o_ids"] + S})
        return out
    if spec.name in ("ssm_scan", "ssm_scan_back", "ssm_decode"):
        rows = S * H * P
        KA = N if D["MAMBA1"] else 1
        if rows == 0 or S * T == 0:
            return {}
        out = {0: v["o_x"] + S * T * H * P,                    # x[o_x + (it*H + h)*P + p]
               1: v["o_dt"] + S * T * H,                       # dt[o_dt + it*H + h]
               2: v["o_A"] + H * KA,                           # A[o_A + h*N + n] or A[o_A + h]
               3: v["o_B"] + S * T * G * N,                    # B[o_B + (it*G + g)*N + n]
               4: v["o_C"] + S * T * G * N}
        if N == 0:
            out.update({2: v["o_A"] + H * KA if KA else 0, 3: 0, 4: 0})
        last_c = v["c0"] + -(-T // D.get("K", 1)) - 1        # the last checkpoint chunk read/written
        ck = v["o_ck"] + ((rows - 1) * v["NC"] + last_c) * N + N if N else 0
        if spec.name in ("ssm_scan", "ssm_decode"):            # (ssm_decode: the same elements, 4 at a time)
            out[6] = v["o_st"] + rows * N                      # st_buf[o_st + row*N + n]
            if D.get("CKPT"):
                out[7] = ck                                    # ck[o_ck + (row*NC + c)*N + n]
            elif D.get("SUMMARY"):
                out[7] = v["o_ck"] + S * H * KA                # dec[o_ck + (i*H + h)*N + n] or [o_ck + i*H + h]
            else:
                out[5] = v["o_y"] + S * T * H * P              # y[o_y + (it*H + h)*P + p]
            if v["gather"] and N:                              # s_in[o_s + (ids[o_ids + i]*H + h)*P*N + p*N + n]
                ids = bindings[9][0].content
                out[8] = v["o_s"] + (int(ids[v["o_ids"]:v["o_ids"] + S].max()) + 1) * H * P * N
                out[9] = v["o_ids"] + S
        elif D.get("BSUM"):                                    # the adjoint summary: dt, A, C, gy; lam
            out.update({5: v["o_gy"] + S * T * H * P, 6: v["o_lam"] + rows * N})
            del out[0], out[3]                                 # (x and B not read)
        else:
            hp = H // v["HB"] if D.get("HSUM") else H          # heads of the d_B / d_C partials
            out.update({5: v["o_gy"] + S * T * H * P,          # gy[o_gy + (it*H + h)*P + p]
                        6: v["o_lam"] + rows * N,              # lam_buf[o_lam + row*N + n]
                        7: ck,                                 # ck[o_ck + (row*NC + c0 + c)*N + n]
                        8: v["o_dx"] + S * T * H * P,          # dx[o_dx + (it*H + h)*P + p]
                        9: S * T * hp * v["NPB"] * N,          # dBp[((it*H + h2)*NPB + pbk)*N + n], HSUM:
                        10: S * T * hp * v["NPB"] * N,         #   dBp[((it*NHB + hbk)*NPB + pbk)*N + n]
                        11: S * T * H * v["NPB"],              # ddtp[(it*H + h2)*NPB + pbk]
                        12: v["o_dA"] + rows * (N if D["MAMBA1"] else 1)})  # dAp[o_dA + row*N + n] / [o_dA + row]
        return out
    if spec.name == "ssm_scan_reduce":
        if D["MODE"] == 0:
            n_bc, n_dt = S * T * G * N, S * T * H
            # dBp[o_0 + ((it*(H/HS) + q)*NPB + b)*N + n], dCp the same with HSC
            part = v["o_0"] + S * T * (H // v["HS"]) * v["NPB"] * N if n_bc else 0
            part_c = v["o_0"] + S * T * (H // v["HSC"]) * v["NPB"] * N if n_bc else 0
            if D.get("NODT"):                                          # d_dt left alone
                return {0: part, 1: part_c, 3: v["o_3"] + n_bc, 4: v["o_4"] + n_bc}
            return {0: part, 1: part_c, 2: n_dt * v["NPB"],           # ddtp[e*NPB + b]
                    3: v["o_3"] + n_bc, 4: v["o_4"] + n_bc, 5: v["o_5"] + n_dt}
        if D["MODE"] == 2:                                             # in place, T chunks, N = CL * CL
            # mgu[o_0 + ((it*H + g*hpg + k)*N + n], k < hpg = H / G
            return {0: v["o_0"] + S * T * H * N if S * T * G * N else 0}
        n_a = H * v["KA"]
        return {0: v["o_0"] + S * H * P * v["KA"] if n_a else 0,       # dAp[o_0 + ((i*H + h)*P + p)*KA + k]
                3: v["o_3"] + n_a}                                     # dA[o_3 + e]
    # rows.comp: dst[o_dst + d*L + j] += src[o_src + s*L + j], (d, s) from the pairs buffer
    pairs = bindings[2][0].content.reshape(-1, 2)[: v["n_pairs"]]
    L = v["L"]
    return {0: v["o_src"] + (int(pairs[:, 1].max()) + 1) * L, 1: v["o_dst"] + (int(pairs[:, 0].max()) + 1) * L,
            2: 2 * v["n_pairs"]}


def _check_dispatches(dispatches, lim: Limits, label: str) -> int:
    for spec, bindings, push, (gx, gy, gz) in dispatches:
        v, D = _push(spec, push), dict(spec.defines)
        mx = lim.max_workgroup_count
        assert 1 <= gx <= mx[0] and 1 <= gy <= mx[1] and gz == 1, (label, spec.name, gx, gy)
        assert gx * gy * spec.wg <= U32, (label, spec.name, "flat thread index overflows")
        assert v.get("gx", gx) == gx
        for b, bound in _bounds(spec, v, D, bindings).items():
            buf, offset, nbytes = bindings[b]
            assert offset % lim.min_storage_buffer_offset_alignment == 0
            assert offset + nbytes <= buf.size, (label, spec.name, b)
            assert nbytes <= lim.max_storage_buffer_range, (label, spec.name, b, nbytes)
            assert bound * 4 <= nbytes, (label, spec.name, b, bound, nbytes // 4)
            assert bound < U32
    return len(dispatches)


def _dims(S, T, H, P, N, G, mamba1, R=None) -> Dims:
    R = S if R is None else R
    return Dims(S=S, T=T, H=H, P=P, N=N, G=G, R=R, mamba1=mamba1, a_shape=(H, N) if mamba1 else (H,))


# (S, T, H, P, N, G): the H200 benchmark shapes, then long, wide and tall ones far beyond int32.
SHAPES = [
    (1, 64, 16, 64, 128, 1), (1, 512, 48, 64, 128, 1), (8, 2048, 24, 64, 128, 1), (1, 16384, 24, 64, 128, 1),
    (1, 65536, 24, 64, 128, 1),        # x: 400 MiB, beyond lavapipe's 128 MiB binding range: windows
    (1, 2**20, 24, 64, 128, 1),        # x: 6 GiB: beyond one allocation anywhere, in pieces on the H200
    (1, 2**24, 24, 64, 128, 1),        # x: 96 GiB: in pieces, beyond the H200's heap with y: refused
    (2048, 1, 64, 64, 256, 1),         # states: 8 GiB, bound whole by some kernel: refused
    (1, 2**22, 1536, 1, 16, 1),        # x: 24 GiB; Mamba-1's forward over time chunks, in pieces
    (64, 4096, 32, 64, 256, 8),        # B: 2^31 elements
    (1024, 1, 128, 64, 16, 4),         # many sequences, one token
    (128, 1, 80, 64, 128, 1),          # decode steps: 335 MB of states (lavapipe: windows of sequences)
    (2, 1000, 1, 1, 1 << 16, 1),       # long rows (d_state 65536)
    (3, 17, 5, 3, 7, 1),               # odd sizes
    (8, 2048, 1536, 1, 16, 1),         # Mamba-1's shapes: the time-in-threads kernels on a GPU
    (1, 131072, 4096, 1, 16, 1),       # x: 2^29 elements
    (2, 100, 64, 1, 32, 2),
    (4, 16, 64, 1, 16, 1),             # one chunk: the cache rows read in place by the kernels themselves
]


def _accepted(d: Dims, lim: Limits, heap: int, backward: bool) -> dict | None:
    """The arrays a call of ``d`` holds in pieces ({name: byte offsets}, budget.pieces) when the
    device accepts it, else None."""
    try:
        pl = plan(d, lim, backward=backward)
    except TooLarge:
        return None
    sizes = budget.buffers(d, pl, lim, backward)
    cut, why = budget.pieces(d, pl, lim, backward, sizes)
    if why or budget.check(FakeInfo(lim, heap), sizes, 0, cut):
        return None
    return cut.get(False, {})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_every_index_stays_in_its_binding_and_in_uint32(device, backward, monkeypatch):
    lim, heap = DEVICES[device]
    checked = refused = chunked = over_time = in_threads = decode = pieced = pieced_over_time = 0
    for (S, T, H, P, N, G), mamba1 in itertools.product(SHAPES, (False, True)):
        d = _dims(S, T, H, P, N, G, mamba1)
        cuts = _accepted(d, lim, heap, backward)
        if cuts is None:
            refused += 1   # supports() says no: the CPU computes it, no kernel sees it
            continue
        ids = np.arange(S)
        if backward and S > 1:
            ids = ids // 2  # duplicates: the rows kernel runs too
            d = _dims(S, T, H, P, N, G, mamba1, R=int(ids.max()) + 1)
            cuts = _accepted(d, lim, heap, backward)
            assert cuts is not None
        label = f"{device} {'backward' if backward else 'forward'} {d}"
        dispatches = _record(d, ids, lim, backward, monkeypatch, cuts)
        pieced += bool(cuts)
        pieced_over_time += bool(cuts) and any(spec.name == "ssm_scan_carry" for spec, *_ in dispatches)
        assert _check_dispatches(dispatches, lim, label) > 0
        checked += 1
        chunked += any(spec.name.startswith("chunk_") for spec, *_ in dispatches)
        over_time += any(spec.name == "ssm_scan_carry" for spec, *_ in dispatches)
        in_threads += any(spec.name.startswith("m1_") for spec, *_ in dispatches)
        decode += any(spec.name == "ssm_decode" for spec, *_ in dispatches)
    assert checked >= 6 and refused >= 2   # both kinds of outcome occur on every device
    assert pieced >= ((1 if backward else 2) if device == "h200" else 0)   # arrays beyond one allocation, in pieces
    assert pieced_over_time >= (0 if backward or device != "h200" else 1)   # (and their time chunks)
    assert chunked >= 2                    # the default knobs give shapes to the chunked kernels
    assert over_time >= 1                  # and Mamba-1 forwards and backwards to the time chunks
    assert decode >= (0 if backward else 2)  # and one-token Mamba-2 forwards to the decode kernel
    if device == "h200":                   # (or, with one channel per head, to the time-in-threads kernels)
        assert in_threads >= 2


@pytest.mark.parametrize("device", DEVICES)
def test_what_decides_the_largest_problem(device):
    # Every buffer of an accepted problem is at most maxMemoryAllocationSize: an array of tokens
    # beyond it is held in pieces, cut at the windows (each piece at most 2^30 floats on the H200,
    # 2^29 on lavapipe, far below 2^32); bindings bigger than the storage range are cut into
    # windows. One sequence of 2^20 tokens (x: 6 GiB) runs on the H200, x, g_y and d_x in two
    # pieces each, and is refused by lavapipe's 2 GiB heap (the reason says so); 65536 tokens run,
    # on lavapipe in token windows.
    lim, heap = DEVICES[device]
    big = _dims(1, 2**20, 24, 64, 128, 1, False)
    pl = plan(big, lim, backward=True)
    sizes = budget.buffers(big, pl, lim, True)
    assert budget.check(FakeInfo(lim, heap), sizes).startswith(
        "x needs a buffer of 6442450944 bytes, above maxMemoryAllocationSize")   # as one buffer
    cut, why = budget.pieces(big, pl, lim, True, sizes)
    assert not why and set(cut[False]) == {"x", "g_y", "d_x"}
    for starts in cut[False].values():
        assert max(piece_sizes(6442450944, starts)) <= lim.max_memory_allocation_size
    why = budget.check(FakeInfo(lim, heap), sizes, 0, cut)
    if device == "h200":
        assert why == "" and _accepted(big, lim, heap, True) == cut[False]
    else:
        assert "largest device-local heap" in why and _accepted(big, lim, heap, True) is None
    ok = _dims(1, 65536, 24, 64, 128, 1, False)
    assert _accepted(ok, lim, heap, backward=False) is not None
    pl = plan(ok, lim, backward=False)
    seq = plans.sequential(pl)   # the token-sequential plan: the call's, or its recompute's
    assert max(w.S * w.T for w in seq.windows) * ok.H * ok.P * 4 <= lim.max_storage_buffer_range
    assert seq.time_split == (lim.max_storage_buffer_range < ok.T * ok.H * ok.P * 4)
