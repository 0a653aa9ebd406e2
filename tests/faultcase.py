"""The problem, calls and bookkeeping the Vulkan fault tests share (tests/vk/test_vk_faults.py,
tests/vk/test_vk_environment.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from problems import make_problem
from registry import BACKENDS

import ssm_vk
from ssm_vk import runtime as rt
from ssm_vk.arrays import pool

REPO = Path(__file__).resolve().parents[1]
FALLBACK = "ssm_fast" if any(b.name == "ssm_fast" for b in BACKENDS) else "ssm_ref"
CASE = make_problem(np.random.default_rng(71), S=2, T=5, H=4, P=3, N=6, G=2, ids="duplicates")


def args(device: bool):
    a = {**CASE.args(), "g_y": CASE.g_y, "g_states": CASE.g_states}
    if device:
        a = {k: (v if k == "ids" else ssm_vk.to_device(v)) for k, v in a.items()}
    return a


def host(d: dict) -> dict:
    return {k: (v.numpy() if isinstance(v, ssm_vk.DeviceArray) else v) for k, v in d.items()}


def forward(a):
    r = ssm_vk.ssm_scan(**{k: v for k, v in a.items() if k not in ("g_y", "g_states")})
    return r, host({"y": r.y, "states": r.states})


def backward(a):
    g = ssm_vk.ssm_scan_back(**a)
    return g, host(g.as_dict())


OPS = {"ssm_scan": forward, "ssm_scan_back": backward}


def held(ctx):
    """What a context holds: device allocations and pool buffers out (the per-shape workspaces
    keep theirs between calls, so these are compared before and after, never with zero)."""
    return ctx.live_allocations, pool(ctx).in_use


def kept_by(exc: BaseException, mine: dict) -> list:
    """Device arrays the frames of ``exc``'s traceback still hold, alive and owning a buffer,
    other than the caller's own inputs ``mine``: what a caller holding the exception would keep."""
    skip = {id(v) for v in mine.values()}
    found, tb = {}, exc.__traceback__
    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            items = value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else [value]
            for v in items:
                if (isinstance(v, ssm_vk.DeviceArray) and id(v) not in skip and v._finalizer is not None
                        and v._finalizer.alive):
                    found[id(v)] = v
        tb = tb.tb_next
    return list(found.values())


def same(got: dict, want: dict):
    for k, v in want.items():
        assert np.array_equal(got[k], v), k




def fresh_context():
    """A new context: empty pool, no workspaces, no kernels."""
    rt.close()
    return rt.get_context()
