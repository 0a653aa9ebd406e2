"""Mamba-3's prepared calls (``prepare_mamba3_scan`` / ``prepare_mamba3_scan_back``): the contract
of prepare_scan (ssm_vk.prepared) for the Mamba-3 scan -- a call of DeviceArrays checked, planned
and bound once, its work recorded once in a workspace of its own with its own outputs, then
``run()`` again and again on the inputs as they are then (a decode step per token and layer:
the submit and the wait, nothing else). The same PreparedCall and replay.Replay as the scan's
(mamba3_run.MAMBA3_CALLS: what differs by op)."""

from __future__ import annotations

import numpy as np

from ssm_ref.mamba3_checks import check_mamba3_backward, check_mamba3_forward
from ssm_ref.ops import MAMBA3
from ssm_ref.precision import check_precision
from ssm_ref.results import Mamba3Grads, Mamba3Result

from . import mamba3_run
from . import runtime as rt
from .arrays import DeviceArray
from .family import OnHost
from .mamba3_api import check_update, decide, device_problem, float32_only, stand_ins
from .mamba3_workspace import M3Workspace
from .prepared import PreparedCall
from .validate import frozen_result

__all__ = ["prepare_mamba3_scan", "prepare_mamba3_scan_back"]

_F32 = np.dtype(np.float32)


def _check_resident(fn: str, named: dict) -> None:
    """Every array given a DeviceArray of the open context (None where the call takes None)."""
    ctx = rt.current_context()
    for k, a in named.items():
        if a is None:
            continue
        if type(a) is not DeviceArray:
            raise TypeError(f"{fn}: {k} must be a DeviceArray (ssm_vk.to_device) or None: a prepared call reads its "
                            f"inputs' device memory at each run; got {type(a).__name__}")
        if a.ctx is not ctx:
            raise ValueError(f"{fn}: {k} belongs to another Vulkan context than the open one")


def prepare_mamba3_scan(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi=None, s_theta=None, s_h=None, s_k=None,
                        s_v=None, ids=None, *, rotation="interleaved", dtype=np.float32,
                        update_cache=False, precision="highest") -> PreparedCall:
    """mamba3_scan's call, prepared: ``run()`` returns the Mamba3Result of the inputs as they are
    then, the same object every run, its arrays overwritten (theta, h, k, v None with
    update_cache=True: each run writes the final state into the rows ids of the four DeviceArray
    caches). Every array a float32 DeviceArray of the open context, or None where mamba3_scan takes
    None (psi, the start state: ones and zeros the call keeps on the device); ids, shapes,
    rotation and the settings are fixed now. Raises as mamba3_scan for bad input; TypeError naming
    an array that is not a DeviceArray; ValueError when the device cannot run the call (the
    reason; mamba3_scan would compute it on the CPU), or where a result holding inf or nan would be
    computed on the CPU (family.OnHost). ``precision`` as mamba3_scan (checked now; every run
    computes at "highest")."""
    check_precision(precision)
    float32_only(dtype)
    named = dict(zip(MAMBA3.float_inputs, (x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k,
                                            s_v), strict=True))
    p = check_mamba3_forward(*stand_ins(named.values()), ids, rotation=rotation, dtype=_F32)
    _check_resident("prepare_mamba3_scan", named)
    update = check_update(update_cache, (s_theta, s_h, s_k, s_v), p)
    return _M3Prepared(False, device_problem(p, named), update, tuple(a for a in named.values() if a is not None))


def prepare_mamba3_scan_back(x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi=None, s_theta=None, s_h=None,
                             s_k=None, s_v=None, ids=None, g_y=None, g_theta=None, g_h=None, g_k=None, g_v=None, *,
                             rotation="interleaved", dtype=np.float32, precision="highest") -> PreparedCall:
    """mamba3_scan_back's call, prepared: ``run()`` returns the Mamba3Grads of the inputs as they
    are then (the same object every run). Arrays and errors as :func:`prepare_mamba3_scan`; a
    cotangent None is zeros, kept on the device; ``precision`` as :func:`prepare_mamba3_scan`."""
    check_precision(precision)
    float32_only(dtype)
    names = (*MAMBA3.float_inputs, *MAMBA3.cotangent_names)
    named = dict(zip(names, (x, dt, dA, lam, B, C, B_bias, C_bias, dtheta, psi, s_theta, s_h, s_k, s_v, g_y, g_theta,
                             g_h, g_k, g_v), strict=True))
    vals = stand_ins(named.values())
    p = check_mamba3_backward(*vals[:14], ids, *vals[14:], rotation=rotation, dtype=_F32)
    _check_resident("prepare_mamba3_scan_back", named)
    return _M3Prepared(True, device_problem(p, named), False, tuple(a for a in named.values() if a is not None))


class _M3Prepared(PreparedCall):
    """A prepared mamba3_scan or mamba3_scan_back (PreparedCall's contract)."""

    def __init__(self, backward: bool, p, update: bool, inputs: tuple):
        op = MAMBA3.backward_name if backward else MAMBA3.name
        dec = decide(op, p.dims, rotation=p.rotation)
        if dec.sup and isinstance(dec.planned.first.rerun, OnHost):   # (a prepared call runs on the device, every run)
            raise ValueError(f"prepare: the Vulkan device cannot run every {op} of this shape: a result holding inf "
                             f"or nan would be computed on the CPU ({dec.planned.first.rerun.reason}); ssm_vk.{op} "
                             "runs it")
        self._setup(op, dec, p, backward, update, (), inputs, mamba3_run.MAMBA3_CALLS)
        outs = self._replay.outs
        if backward:
            self._result = Mamba3Grads(**{k: outs.get(k) for k in MAMBA3.grad_names}, where=self.where)
        else:
            fields = {k: (None if update else outs[k]) for k in ("theta", "h", "k", "v")}
            self._result = frozen_result(Mamba3Result, {"y": outs["y"], **fields, "where": self.where})

    def _workspace(self, planned):
        return M3Workspace(self._ctx, planned)

    def _outputs(self, ws, backward: bool, update: bool) -> dict:
        return mamba3_run.fresh(ws, mamba3_run.output_shapes(ws.dims, self._p, backward, update))
