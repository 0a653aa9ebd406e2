"""The support decision of one call on the current context: the context (opened on first use, or
why it cannot be), the Engine's cached decision for everything it depends on, and the step's form
as the kernels' code (and back). api.py and prepared.py both take their decisions here;
ssm_vk.decision decides, this module finds the context and caches."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from ssm_ref import Support, check_dt_softplus
from ssm_ref.ops import SCAN
from ssm_ref.results import PRECISION

from . import runtime as rt
from .decision import decide
from .engine import engine_of
from .kernel_specs import SOFTPLUS

if TYPE_CHECKING:
    from . import config

__all__ = ["NAME", "INPUTS", "FORMS", "PRECISION", "Decided", "context_or_reason", "decision", "form_code", "log_once",
           "with_precision"]

NAME = "ssm_vk"
log = logging.getLogger("ssm_vk")
_logged: set[str] = set()
_unopenable: dict[int, str] = {}   # pid -> why the driver would not open the device in it


def log_once(message: str) -> None:
    """A warning on the ``ssm_vk`` logger, the first time this message comes up in the process
    (two threads may both log it once: no lock, so nothing to renew after a fork)."""
    if message in _logged:
        return
    _logged.add(message)
    log.warning("%s", message)


def context_or_reason():
    """(the open context, "") or (None, why no device can be used in this process): opened on
    first use; a device that would not open here is not tried again by this process."""
    ctx = rt.current_context()
    if ctx is not None and not ctx.closed and not ctx.lost:
        return ctx, ""  # the per-call fast path
    if os.getpid() in _unopenable:
        return None, _unopenable[os.getpid()]
    ok, reason = rt.available()
    if not ok:
        return None, f"no Vulkan device: {reason}"
    try:
        return rt.get_context(), ""
    except rt.VulkanUnavailable as e:
        return None, f"no Vulkan device: {e}"
    except rt.VulkanError as e:
        # The driver lists a device but will not open it here. Seen on an H200: in a process
        # forked from one that had used Vulkan, vkCreateDevice fails with
        # VK_ERROR_INITIALIZATION_FAILED. The GPU truly cannot run this process's calls; the
        # answer is kept for this process, so each later call does not try again.
        _unopenable[os.getpid()] = f"the Vulkan device could not be opened in this process: {e}"
        return None, _unopenable[os.getpid()]


INPUTS = (*SCAN.float_inputs, *SCAN.cotangent_names)   # s, x, dt, A, B, C, g_y, g_states


class Decided:
    """A support decision and what the call needs from it: the engine, the context's ``info``
    it was taken with, the plans (family.Planned, None when refused), whether the results are
    DeviceArrays."""

    __slots__ = ("device_out", "engine", "info", "planned", "sup")

    def __init__(self, sup, engine=None, info=None, planned=None, device_out=False):
        self.sup, self.engine, self.info = sup, engine, info
        self.planned, self.device_out = planned, device_out


FORMS = {code: form for form, code in SOFTPLUS.items()}   # the kernels' code -> the checked form


def with_precision(sup: Support, precision: str) -> Support:
    """``sup`` with what a call asking for ``precision`` (checked by the caller, before any work)
    computes: "high" and "medium" ask for the matrix units, which no ssm_vk kernel runs on yet, so
    such a call computes at "highest" -- said here, as its result's ``precision`` says it."""
    if precision == PRECISION:
        return sup
    return Support(sup.ok, f"{sup.reason}; precision {precision!r} computes as {PRECISION!r} (float32 products): "
                           "no ssm_vk kernel runs on the matrix units yet")


def form_code(dt_softplus) -> int:
    """The kernels' code of the ``dt_softplus`` form (kernel_specs.SOFTPLUS), mamba_ssm's booleans
    included; ValueError for another value (ssm_ref.check_dt_softplus)."""
    try:   # the forms' own spellings: one look-up (True, False and the rest have no key)
        return SOFTPLUS[dt_softplus]
    except (KeyError, TypeError):   # (TypeError: an unhashable value)
        return SOFTPLUS[check_dt_softplus(dt_softplus)]


def decision(op: str, p, knobs: config.Settings, softplus: int = 0) -> Decided:
    """Whether ``p`` runs on the device (ssm_vk.decision), decided before any allocation, cached
    in the context's Engine by everything it depends on: the context's limits (``ctx.info``,
    which override_limits swaps), op, dims, which inputs are device-resident, the knobs and the
    step's form."""
    ctx = rt.current_context()
    if ctx is None or ctx.lost:  # (current_context() is open or None)
        ctx, reason = context_or_reason()
        if ctx is None:
            return Decided(Support(False, reason))
    engine = engine_of(ctx)
    info = ctx.info
    # Which inputs are device-resident is a matter of their types (DeviceArray's class attribute
    # ``_ssm_device_array``): the key holds the types, the set is worked out on a miss.
    types = (type(p.s), type(p.x), type(p.dt), type(p.A), type(p.B), type(p.C), type(p.g_y), type(p.g_states))
    key = (id(info), op, p.dims, types, knobs.key, softplus)
    if p.g_snapshots is not None:   # (a forward's K is in dims; a backward's g_snapshots of one slot is not)
        key += (type(p.g_snapshots),)
    hit = engine.decision(key)
    if hit is not None and hit.info is info:   # the entry keeps ``info`` alive: its id is not reused
        return hit
    resident = frozenset([k for k in INPUTS if getattr(getattr(p, k), "_ssm_device_array", False) is True])
    lim = engine.limits(info, knobs)
    sup, cache, planned = decide(ctx, lim, knobs, op, p, resident, softplus)
    if planned is not None and planned.dropped:   # a family's kernels could not be had: said once
        log_once(f"ssm_vk: {sup.reason}")
    out = Decided(sup, engine, info, planned, bool(resident))
    if cache:
        engine.remember(key, out)
    return out
