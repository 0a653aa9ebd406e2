"""Argument checks shared by the runtime's modules (every argument is checked before Vulkan sees it)."""

from __future__ import annotations

import numpy as np


def check_int(name: str, value, minimum: int = 0) -> int:
    """``value`` as a Python int. Raises TypeError when it is not an int (bools are not), ValueError
    when it is below ``minimum``; ``name`` starts the message."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value
