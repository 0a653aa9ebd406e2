"""The package version, shared by ssm_ref, ssm_fast, ssm_vk and ssm_cli (and pyproject.toml)."""

__version__ = "0.2.0"
