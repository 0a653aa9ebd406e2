"""Mamba-3 as mamba_ssm has it, on ssm-scan's backends (docs/TORCH.md, "Mamba-3"):

- :func:`mamba3_siso_combined` -- the SISO scan (``mamba_ssm.ops.triton.mamba3.mamba3_siso_combined``);
- :func:`mamba3_mimo` -- the MIMO scan (``mamba_ssm.ops.tilelang.mamba3.mamba3_mimo``);
- :func:`mamba3_siso_step` -- one SISO decoding step (``mamba_ssm.ops.triton.mamba3.mamba3_siso_step``);
- :class:`Mamba3` -- the layer (``mamba_ssm.modules.mamba3.Mamba3``), and :class:`RMSNormGated`.

The drop-in functions are written in ssm_torch/_mamba3_dropins.py, the layer (which calls them) in
ssm_torch/mamba3_layer.py; this module presents both, so that neither imports the other's importer.
"""

from __future__ import annotations

from ._mamba3_dropins import mamba3_mimo, mamba3_siso_combined, mamba3_siso_step
from .mamba3_layer import Mamba3, RMSNormGated

__all__ = ["Mamba3", "RMSNormGated", "mamba3_mimo", "mamba3_siso_combined", "mamba3_siso_step"]
