"""What every kernel family's planner shares, decided in pure Python before any Vulkan call:

- :mod:`.limits`: the device limits (``Limits.of(info)``), grids, binding ranges, windows;
- :mod:`.sizes`: the one table of the arrays a call binds, and the sizes every family's scratch
  shares.

Each family plans in its own folder (``ssm_vk/<family>/plan.py``); ssm_vk.families combines
them into a call's plan (:func:`ssm_vk.families.plan`) and ssm_vk.budget counts its memory.
"""

from __future__ import annotations

from .limits import F32, Limits, TooLarge, Window, binding_cap, grid

__all__ = ["F32", "Limits", "TooLarge", "Window", "binding_cap", "grid"]
