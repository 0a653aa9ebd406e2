"""The optional parts stay optional: importing ssm_ref, ssm_fast, ssm_vk or the CLI never imports
PyTorch, JAX, ssm_torch, ssm_jax or ssm_ggml (nor ggml), and ssm_ggml imports ssm_ref only among
this package's backends."""

from __future__ import annotations

import subprocess
import sys

from children import REPO, child_env

OPTIONAL = {"torch", "jax", "ssm_torch", "ssm_jax", "ssm_ggml"}


def _modules_after(code: str) -> set:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, env=child_env(), cwd=REPO, timeout=120, check=True)
    return set(out.stdout.split())


def test_the_backends_and_the_cli_import_none_of_the_optional_parts():
    mods = _modules_after("import ssm_ref, ssm_fast, ssm_vk, ssm_cli.main, ssm_ref.testing.fuzzing")
    assert "ssm_fast" in mods and "ssm_cli.main" in mods
    assert not OPTIONAL & mods, sorted(OPTIONAL & mods)


def test_ssm_ggml_imports_ssm_ref_only():
    mods = _modules_after("import ssm_ggml")
    assert "ssm_ref" in mods and not {"ssm_fast", "ssm_vk", "ssm_cli"} & mods
