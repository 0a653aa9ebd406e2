"""The Mamba-3 workloads of benchmarks/vs_mamba_ssm.py: ssm_vk's ``mamba3_scan`` beside mamba_ssm's
Triton kernels (``mamba3_siso_combined``, ``mamba3_siso_step``) and, for MIMO, its TileLang kernel
``mamba3_mimo`` where TileLang imports -- the problems, both sides' timed calls and the float64
check; vs_mamba_ssm.py runs them in its rounds and processes like its other families.

- ``m3-*`` (family ``mamba3``): the SISO scan (MIMO of rank M where dims has M), forward and
  forward + backward. The peer takes mamba_ssm's raw inputs -- Q, K, V in bfloat16 (as its layer
  feeds them), ADT, DT, Trap (before its sigmoid), the biases and the raw Angles in float32 --
  with chunk 64, no D, no Z. ssm_vk takes the op's arguments formed from the same values
  (bfloat16-rounded Q, K, V; ``dtheta = pi * tanh(Angles) * DT``, ``lam = sigmoid(Trap)``, the
  (b, h, l) tensors transposed), float32, as DeviceArrays. Its fwd+bwd is ``mamba3_scan`` then
  ``mamba3_scan_back`` with the gradient of y (the peer's: autograd from the gradient of its
  output).
- ``m3dec-*`` (family ``m3decode``): one token of S sequences. The peer: ``mamba3_siso_step`` on
  S states (it returns new ones); ssm_vk: ``mamba3_scan`` with T = 1 and ``update_cache=True`` on
  S of R cache rows (DeviceArrays), in place; ``fwd prepared``: the same call prepared once
  (``ssm_vk.prepare_mamba3_scan``) and replayed with ``run()``.

The float64 check: each side's outputs against ``ssm_torch.mamba3``'s drop-in of the same
function on ssm_ref in float64 (the scan with mamba_ssm's outside ops composed: the angle
increment, the sigmoid, the layouts), the same bfloat16-rounded values upcast. Gradients: the
peer's by autograd on the GPU; ssm_vk's through the same drop-in on ``backend="ssm_vk"``
(autograd over ssm_vk's backward), both with respect to mamba_ssm's nine inputs.
"""

from __future__ import annotations

import math
import time

import numpy as np
from vk_gpu_check import vk_timed

import ssm_vk
from ssm_vk import run as vk_run

__all__ = ["WORKLOADS", "check_slice", "load_peer", "oracle", "ours_side", "peer_side", "problem", "shape_text"]

CHUNK = 64   # mamba3_siso_combined's chunk_size (its default)
PEER_INPUTS = ("Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias", "Angles")
GRADS = tuple("d_" + n for n in PEER_INPUTS)
STATES = ("theta", "h", "k", "v")
CACHES = ("s_theta", "s_h", "s_k", "s_v")
CACHES_ON_DEVICE = True   # the decode step's caches: DeviceArrays (False: host arrays, updated in place)
_SISO = dict(H=32, P=64, N=128, F=32)

WORKLOADS = {  # name: (family, dims); mamba3: S, T, H, P, N, F (M: MIMO rank); m3decode: S of R rows
    "m3-512": ("mamba3", dict(S=1, T=512, **_SISO)),
    "m3-train": ("mamba3", dict(S=8, T=2048, **_SISO)),
    "m3-long": ("mamba3", dict(S=1, T=16384, **_SISO)),
    "m3-mimo": ("mamba3", dict(S=1, T=2048, **_SISO, M=4)),
    "m3dec-1": ("m3decode", dict(S=1, R=64, **_SISO)),
    "m3dec-16": ("m3decode", dict(S=16, R=64, **_SISO)),
    "m3dec-128": ("m3decode", dict(S=128, R=256, **_SISO)),
}


def shape_text(dims: dict) -> str:
    if "R" in dims:
        return f"S={dims['S']} of R={dims['R']} H={dims['H']} P={dims['P']} N={dims['N']} F={dims['F']}"
    return " ".join(f"{k}={v}" for k, v in dims.items())


def _bf16(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to bfloat16 (to nearest even), as float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return u.view(np.float32)


def problem(family: str, dims: dict, seed: int = 0) -> dict:
    """{"family", "dims", "peer": mamba_ssm's inputs (numpy float32, Q/K/V bfloat16-rounded; decode:
    without the token axis, with "states" of S rows), "op": ssm_vk's arguments (float32), "ids",
    "g_out" (the peer's layout) and "g_y" (the op's; None for decode)}."""
    rng = np.random.default_rng(seed)
    S, H, P, N, F = (dims[k] for k in "SHPNF")
    M = dims.get("M")
    T = dims.get("T", 1)
    G = 1
    r = (M,) if M else ()

    def n(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    # The layer's scales: normed q and k (unit entries), dt softplus-sized, A in [-16, -1].
    dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), (S, H, T))).astype(np.float32)
    A = -np.exp(rng.uniform(0.0, math.log(16.0), (H,))).astype(np.float32)
    peer = dict(Q=_bf16(n(S, T, *r, G, N)), K=_bf16(n(S, T, *r, G, N)), V=_bf16(n(S, T, H, P)),
                ADT=(dt * A[None, :, None]).astype(np.float32), DT=dt, Trap=n(S, H, T),
                Q_bias=n(H, *r, N, scale=0.1) + 1, K_bias=n(H, *r, N, scale=0.1) + 1, Angles=n(S, T, H, F))
    g_out = n(S, T, H, P, scale=1.0 / math.sqrt(P))   # the peer's output (MIMO: after its sum over ranks)
    p = dict(family=family, dims=dims, peer=peer, g_out=g_out, ids=None)
    if family == "m3decode":
        R = dims["R"]
        p["ids"] = np.sort(rng.choice(R, S, replace=False)).astype(np.int64)
        p["cache"] = dict(s_theta=rng.uniform(0, 2 * math.pi, (R, H, F)).astype(np.float32),
                          s_h=n(R, H, P, N, scale=0.1), s_k=n(R, H, N), s_v=n(R, H, P))
    p["op"] = op_args(peer, p.get("cache"), p["ids"])
    p["g_y"] = None if family == "m3decode" else n(S, T, M, H, P, scale=1.0 / math.sqrt(P)) if M else g_out
    return p


def op_args(peer: dict, cache: dict | None, ids, work=np.float32) -> dict:
    """ssm_vk's (ssm_ref's) arguments of mamba_ssm's inputs ``peer``, in ``work``: the layouts
    (b, h, l) -> (b, l, h), lam = sigmoid(Trap), dtheta = pi * tanh(Angles) * dt (the drop-in's
    ssm_torch._mamba3_dropins, SPEC.md section 14); ``cache`` the start-state rows (decode)."""
    f = {k: np.asarray(v, dtype=np.float64) for k, v in peer.items()}
    dt = f["DT"].transpose(0, 2, 1)
    a = dict(x=f["V"], dt=dt, dA=f["ADT"].transpose(0, 2, 1), lam=1.0 / (1.0 + np.exp(-f["Trap"].transpose(0, 2, 1))),
             B=f["K"], C=f["Q"], B_bias=f["K_bias"], C_bias=f["Q_bias"],
             dtheta=math.pi * np.tanh(f["Angles"]) * dt[..., None])
    out = {k: np.ascontiguousarray(v, dtype=work) for k, v in a.items()}
    if cache is not None:
        out.update({k: np.asarray(v, dtype=work) for k, v in cache.items()})
    return out


def check_slice(p: dict, cap: float) -> tuple[dict, str]:
    """``p`` when it has at most ``cap`` updates (S*T*H*P*N*M), else its first sequence and
    tokens (a multiple of CHUNK), noted."""
    d = p["dims"]
    if p["family"] == "m3decode":
        return p, ""
    per_token = d["H"] * d["P"] * d["N"] * d.get("M", 1)
    if d["S"] * d["T"] * per_token <= cap:
        return p, ""
    T2 = int(min(d["T"], max(CHUNK, cap // per_token // CHUNK * CHUNK)))
    cut = {k: (v[:1, :T2] if v.ndim >= 4 and k in ("Q", "K", "V", "Angles") else v[:1, :, :T2] if k in
               ("ADT", "DT", "Trap") else v) for k, v in p["peer"].items()}
    q = dict(p, dims=dict(d, S=1, T=T2), peer=cut, g_out=p["g_out"][:1, :T2], g_y=p["g_y"][:1, :T2])
    q["op"] = op_args(cut, None, None)
    return q, f"checked on S=1, T={T2}"


def oracle(p: dict, backward: bool) -> dict:
    """The float64 drop-in (ssm_torch.mamba3 on ssm_ref) of the peer's function on ``p``'s values:
    {"y", "theta", "h", "k", "v"} and with ``backward`` the nine gradients "d_Q" ...; MIMO (whose
    peer is not wired): the op's own outputs and gradients (ssm_ref.mamba3_scan in float64)."""
    if "M" in p["dims"]:
        import ssm_ref

        return _op_level(ssm_ref, p, backward, np.float64)
    return _dropin(p, backward, "ssm_ref", np.float64)


def _op_level(mod, p: dict, backward: bool, work) -> dict:
    """``mod``'s mamba3_scan (and mamba3_scan_back with g_y) on the op's arguments in ``work``."""
    a = {k: np.asarray(v, dtype=work) for k, v in p["op"].items()}
    kw = dict(rotation="interleaved") if work == np.float32 else dict(rotation="interleaved", dtype=work)
    r = mod.mamba3_scan(**a, **kw)
    out = {k: np.asarray(_host(getattr(r, k))) for k in ("y", *STATES)}
    if backward:
        g = mod.mamba3_scan_back(**a, g_y=np.asarray(p["g_y"], dtype=work), **kw)
        out.update({k: np.asarray(_host(v)) for k, v in g.items() if v is not None})
    return out


def _dropin(p: dict, backward: bool, backend: str, work) -> dict:
    import torch

    from ssm_torch import mamba3 as m3

    t = {k: torch.tensor(np.asarray(v, dtype=work), requires_grad=backward) for k, v in p["peer"].items()}
    args = [t[k] for k in PEER_INPUTS]
    if p["family"] == "m3decode":
        states = tuple(torch.tensor(np.asarray(p["cache"][k][p["ids"]], dtype=work))
                       for k in ("s_theta", "s_h", "s_k", "s_v"))
        y, (th, h, k, _v) = m3.mamba3_siso_step(*[a[:, :, 0] if a.dim() == 3 and n in ("ADT", "DT", "Trap") else
                                                   a[:, 0] for n, a in zip(PEER_INPUTS[:3], args[:3], strict=True)],
                                                 *[a[..., 0] for a in args[3:6]], *args[6:8], args[8][:, 0],
                                                 Input_States=states, backend=backend)
        return dict(y=y.detach().numpy(), theta=th.detach().numpy(), h=h.detach().numpy(), k=k.detach().numpy())
    if "M" in p["dims"]:
        raise NotImplementedError("the float64 check of MIMO through the drop-in is not wired here")
    y, th, h, k, v = m3.mamba3_siso_combined(*args, return_final_states=True, backend=backend)
    out = dict(y=y.detach().numpy(), theta=th.detach().numpy(), h=h.detach().numpy(), k=k.detach().numpy(),
               v=v.detach().numpy())
    if backward:
        g = torch.autograd.grad(y, args, torch.tensor(np.asarray(p["g_out"], dtype=work)))
        out.update({"d_" + n: gi.numpy() for n, gi in zip(PEER_INPUTS, g, strict=True)})
    return out


# -- ssm_vk -------------------------------------------------------------------------------------------

def ours_side(p: dict) -> dict:
    """ssm_vk's timed calls on DeviceArrays: {"fwd", "fwd+bwd" (not for decode): () -> (GPU us, wall
    us), "outputs", "where", "close"}."""
    dev = {k: (v.copy() if k in CACHES and not CACHES_ON_DEVICE else ssm_vk.to_device(v)) for k, v in p["op"].items()}
    rot = dict(rotation="interleaved")
    ids = p["ids"]
    decode = p["family"] == "m3decode"
    dgy = None if decode else ssm_vk.to_device(p["g_y"])
    where = []

    def call():
        if decode:
            return ssm_vk.mamba3_scan(**dev, ids=ids, update_cache=True, **rot)
        return ssm_vk.mamba3_scan(**dev, **rot)

    fwd = vk_timed(call, where=where)
    step = vk_timed(call, lambda: ssm_vk.mamba3_scan_back(**dev, g_y=dgy, **rot))

    prepared = []

    def fwd_prepared():
        if not prepared:
            prepared.append(ssm_vk.prepare_mamba3_scan(**dev, ids=ids, update_cache=True, **rot))
        t0 = time.perf_counter()
        prepared[0].run()
        w = time.perf_counter() - t0
        return (vk_run.last_gpu_ns() or math.nan) / 1e3, w * 1e6

    def outputs():
        if decode:   # a fresh copy of the cache: the timed calls moved it on
            fresh = {k: (v.copy() if k in CACHES and not CACHES_ON_DEVICE else ssm_vk.to_device(v))
                     for k, v in p["op"].items()}
            try:
                r = ssm_vk.mamba3_scan(**fresh, ids=ids, update_cache=True, **rot)
                where.append(r.where)
                return dict(y=_host(r.y)[:, 0], theta=_host(fresh["s_theta"])[ids], h=_host(fresh["s_h"])[ids],
                            k=_host(fresh["s_k"])[ids])
            finally:
                for v in fresh.values():
                    if not isinstance(v, np.ndarray):
                        v.release()
        if "M" in p["dims"]:
            return _op_level(ssm_vk, p, True, np.float32)
        where.append("ssm_torch(ssm_vk)")
        return _dropin(p, True, "ssm_vk", np.float32)

    def close():
        for c in prepared:
            c.close()
        for v in (*dev.values(), dgy):
            if v is not None and not isinstance(v, np.ndarray):
                v.release()

    side = {"fwd": fwd, "outputs": outputs, "where": lambda: ",".join(sorted(set(where))), "close": close}
    if decode:
        side["fwd prepared"] = fwd_prepared
    else:
        side["fwd+bwd"] = step
    return side


def _host(a):
    return a.numpy() if hasattr(a, "numpy") and not isinstance(a, np.ndarray) else np.asarray(a)


# -- mamba_ssm ------------------------------------------------------------------------------------------

def load_peer() -> dict:
    """{"m3": (mamba3_siso_combined, mamba3_siso_step), "m3mimo": mamba3_mimo or None, "why_mimo"}
    from the copied package (vs_mamba_ssm.peer_package put it first on sys.path)."""
    from mamba_ssm.ops.triton.mamba3.mamba3_siso_combined import mamba3_siso_combined
    from mamba_ssm.ops.triton.mamba3.mamba3_siso_step import mamba3_siso_step

    out = {"m3": (mamba3_siso_combined, mamba3_siso_step), "m3mimo": None, "why_mimo": None}
    try:
        from mamba_ssm.ops.tilelang.mamba3.mamba3_mimo import mamba3_mimo
        out["m3mimo"] = mamba3_mimo
    except Exception as e:   # TileLang is not on every host
        out["why_mimo"] = f"mamba3_mimo did not import: {type(e).__name__}: {e}"
    return out


def peer_side(p: dict, ops: dict, device="cuda") -> dict:
    """mamba_ssm's calls for ``p``: {"fwd", "fwd+bwd" (not decode): () -> None, "outputs", "how"}."""
    import torch

    if "M" in p["dims"]:
        raise RuntimeError(ops.get("why_mimo") or "MIMO beside mamba3_mimo is not wired here")
    combined, step_fn = ops["m3"]
    bf = ("Q", "K", "V")
    t = {k: torch.tensor(v, device=device, dtype=torch.bfloat16 if k in bf else torch.float32)
         for k, v in p["peer"].items()}
    if p["family"] == "m3decode":
        ids = torch.tensor(p["ids"], device=device)
        states = [torch.tensor(p["cache"][k], device=device)[ids] for k in ("s_theta", "s_h", "s_k")]
        states.append(torch.tensor(p["cache"]["s_v"], device=device, dtype=torch.bfloat16)[ids])
        a = [t["Q"][:, 0], t["K"][:, 0], t["V"][:, 0], t["ADT"][..., 0], t["DT"][..., 0], t["Trap"][..., 0],
             t["Q_bias"], t["K_bias"], t["Angles"][:, 0]]

        def call():
            return step_fn(*a, Input_States=tuple(states))

        def outputs():
            y, st = call()
            return dict(y=y.float().cpu().numpy(), theta=st[0].float().cpu().numpy(), h=st[1].float().cpu().numpy(),
                        k=st[2].float().cpu().numpy())

        return {"fwd": call, "outputs": outputs, "how": "mamba3_siso_step (Triton)"}
    for v in t.values():
        v.requires_grad_(True)
    leaves = [t[k] for k in PEER_INPUTS]
    gy = torch.tensor(p["g_out"], device=device, dtype=torch.bfloat16)

    def fwd():
        with torch.no_grad():
            return combined(*leaves, chunk_size=CHUNK, return_final_states=True)

    def step():
        y = combined(*leaves, chunk_size=CHUNK)
        return y, torch.autograd.grad(y, leaves, gy)

    def outputs():
        y, th, h, k, v = combined(*leaves, chunk_size=CHUNK, return_final_states=True)
        g = torch.autograd.grad(y, leaves, gy)
        o = dict(y=y, theta=th, h=h, k=k, v=v)
        o = {n: x.detach().float().cpu().numpy() for n, x in o.items()}
        o.update({"d_" + n: gi.float().cpu().numpy() for n, gi in zip(PEER_INPUTS, g, strict=True)})
        return o

    return {"fwd": fwd, "fwd+bwd": step, "outputs": outputs, "how": "mamba3_siso_combined (Triton)"}
