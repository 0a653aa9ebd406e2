"""What every planner, the budget and the recordings size a call by, in pure Python before any
Vulkan call: the device's limits and what fits them (:mod:`.limits`: ``Limits.of(info)``, grids,
binding ranges, windows), the arrays a call binds (:mod:`.shapes`) and where an array beyond one
allocation is cut into pieces (:mod:`.pieces`). Each family sizes its own
plan and scratch in its planner (``ssm_vk/<family>/<family>_planner.py``)."""

from __future__ import annotations

from .limits import (
    DEFAULT_K,
    F32,
    SPEC_MINIMUMS,
    Limits,
    TooLarge,
    Window,
    alloc_cap,
    binding_cap,
    grid,
    most_that_fit,
    rows_in_place,
)
from .pieces import (
    cuts,
    device_cuts,
    device_piece_bytes,
    device_piece_tokens,
    even_cuts,
    piece_cap,
    piece_sizes,
    token_arrays,
    token_windows,
    window_cuts,
    window_ranges,
)
from .shapes import DUMMY_BYTES, FLAG_ELEMS, input_shapes, output_shapes

__all__ = ["DEFAULT_K", "F32", "SPEC_MINIMUMS", "Limits", "TooLarge", "Window", "alloc_cap", "binding_cap",
           "most_that_fit", "device_cuts", "device_piece_bytes", "device_piece_tokens", "token_windows", "grid",
           "rows_in_place",
           "DUMMY_BYTES", "FLAG_ELEMS", "input_shapes", "output_shapes", "cuts", "even_cuts", "piece_cap",
           "piece_sizes", "token_arrays", "window_cuts", "window_ranges"]
