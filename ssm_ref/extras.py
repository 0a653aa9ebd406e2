"""How to install what an optional part of ssm-scan needs: the one wording of the hint every
message about a missing package gives (the Vulkan binding, hypothesis for the testing kit,
matplotlib for the plots, torch and jax for the bridges).

ssm-scan is on no package index, so an extra asked of one (``ssm-scan[vulkan]``) finds nothing: the
hint names the third-party package first (``pip install vulkan`` works anywhere), then the extra as
it installs from ssm-scan's checkout or its wheel (pyproject.toml's ``[project.optional-dependencies]``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ._version import __version__

__all__ = ["install_hint"]

WHEEL = f"ssm_scan-{__version__}-py3-none-any.whl"


def install_hint(extra: str, packages: str | Sequence[str]) -> str:
    """The command that installs ``packages`` (the third-party distributions an optional part
    needs), then ssm-scan's extra ``extra`` that carries them::

        pip install vulkan (or ssm-scan's extra: pip install '.[vulkan]' in its checkout,
        or pip install 'ssm_scan-0.2.0-py3-none-any.whl[vulkan]')
    """
    names = [packages] if isinstance(packages, str) else list(packages)
    if not isinstance(extra, str) or not extra or not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"install_hint: expected an extra's name and package names, got {extra!r}, {packages!r}")
    return (f"pip install {' '.join(names)} (or ssm-scan's extra: pip install '.[{extra}]' in its checkout, "
            f"or pip install '{WHEEL}[{extra}]')")

