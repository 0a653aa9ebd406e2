"""Run transformers' Mamba and Mamba-2 models on ssm-scan: ``ssm_torch.hf.patch(model)``.

transformers' ``MambaMixer`` and ``Mamba2Mixer`` call module-level functions of their modeling
modules with mamba_ssm's signatures (``selective_scan_fn``, ``selective_state_update``,
``mamba_chunk_scan_combined``, the fused ``mamba_inner_fn`` / ``mamba_split_conv1d_scan_combined``,
and causal_conv1d's two functions). ``patch`` swaps each of those names, once per process, for a
dispatcher that calls what it called before -- unless a patched mixer is running in the current
context, where it calls ``ssm_torch.mamba``'s drop-in instead (the fused functions decline, so the
mixer takes its unfused path; the convolutions take transformers' own PyTorch code). Unpatched
models, in this thread or any other, are not affected. ``unpatch(model)`` undoes it for a model.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from dataclasses import dataclass

from . import mamba

__all__ = ["patch", "patched", "unpatch"]


@dataclass(frozen=True)
class _Settings:
    backend: str | None


_ACTIVE: contextvars.ContextVar[_Settings | None] = contextvars.ContextVar("ssm_torch_hf_active", default=None)


def _decline(*args, **kwargs):
    """The fused functions: None makes the mixer take its unfused path."""
    return None


# name in the modeling module -> what a patched mixer gets: a drop-in (takes ``backend``), the
# decline, or None for transformers' own PyTorch implementation (under the name's decorators)
_MAMBA = {
    "mamba_selective_scan": mamba.selective_scan_fn,
    "mamba_selective_state_update": mamba.selective_state_update,
    "mamba_inner_fn": _decline,
    "causal_conv1d_fn": None,
    "causal_conv1d_update": None,
}
_MAMBA2 = {
    "mamba2_chunk_scan": mamba.mamba_chunk_scan_combined,
    "mamba2_selective_state_update": mamba.selective_state_update,
    "mamba2_split_conv1d_scan_combined": _decline,
    "causal_conv1d_fn": None,
    "causal_conv1d_update": None,
}


def _dispatcher(original, ours):
    """``original`` outside patched mixers; inside, ``ours`` with the keywords it takes."""
    if ours is None:
        ours = inspect.unwrap(original)   # transformers' PyTorch function under its kernel decorators
    params = inspect.signature(ours).parameters
    takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
    drop_in = "backend" in params

    @functools.wraps(original)
    def dispatch(*args, **kwargs):
        settings = _ACTIVE.get()
        if settings is None:
            return original(*args, **kwargs)
        kw = kwargs if takes_all else {k: v for k, v in kwargs.items() if k in params}
        if drop_in:
            kw["backend"] = settings.backend
        return ours(*args, **kw)

    dispatch._ssm_torch_original = original
    return dispatch


def _install(module, table: dict) -> None:
    for name, ours in table.items():
        current = getattr(module, name)
        if getattr(current, "_ssm_torch_original", None) is None:
            setattr(module, name, _dispatcher(current, ours))


def _mixers(model):
    from transformers.models.mamba import modeling_mamba
    from transformers.models.mamba2 import modeling_mamba2

    for m in model.modules():
        if isinstance(m, modeling_mamba.MambaMixer):
            yield m, modeling_mamba, _MAMBA
        elif isinstance(m, modeling_mamba2.Mamba2Mixer):
            yield m, modeling_mamba2, _MAMBA2


def patch(model, *, backend: str | None = None):
    """Make every Mamba / Mamba-2 mixer of ``model`` (a transformers ``MambaForCausalLM``,
    ``Mamba2ForCausalLM``, their base models, or any module holding such mixers) compute its scans
    with ssm_torch.mamba on ``backend`` (None: as the drop-ins choose). Returns the model.
    ValueError when it holds no such mixer."""
    found = list(_mixers(model))
    if not found:
        raise ValueError(f"model: no transformers MambaMixer or Mamba2Mixer in {type(model).__name__}")
    settings = _Settings(backend=backend)
    for mixer, module, table in found:
        _install(module, table)
        unpatch_one(mixer)
        forward = mixer.forward

        def patched_forward(*args, _forward=forward, **kwargs):
            token = _ACTIVE.set(settings)
            try:
                return _forward(*args, **kwargs)
            finally:
                _ACTIVE.reset(token)

        mixer.forward = patched_forward
        mixer._ssm_torch_settings = settings
    return model


def unpatch_one(mixer) -> None:
    if "_ssm_torch_settings" in vars(mixer):
        del mixer.forward
        del mixer._ssm_torch_settings


def unpatch(model):
    """Undo :func:`patch` for ``model``'s mixers. Returns the model."""
    for mixer, _, _ in _mixers(model):
        unpatch_one(mixer)
    return model


def patched(model) -> bool:
    """Whether every Mamba / Mamba-2 mixer of ``model`` is patched (False when it has none)."""
    found = list(_mixers(model))
    return bool(found) and all("_ssm_torch_settings" in vars(m) for m, _, _ in found)
