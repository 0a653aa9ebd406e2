"""The ``ssm-scan`` command: the front door to the three backends."""

from ssm_ref._version import __version__

__all__ = ["__version__"]
