"""The optional parts stay optional: importing ssm_ref, ssm_fast, ssm_vk or the CLI never imports
PyTorch, JAX, ssm_torch, ssm_jax or ssm_ggml (nor ggml), and ssm_ggml imports ssm_ref only among
this package's backends. Where an optional package is missing, the message says how to install it
in one wording (ssm_ref.extras.install_hint): the third-party package, then ssm-scan's extra from
its checkout or wheel -- never from a package index, which has no ssm-scan."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from children import REPO, child_env

from ssm_ref._version import __version__
from ssm_ref.extras import install_hint

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


def test_the_install_hint_names_the_package_then_the_extra_from_the_checkout_or_the_wheel():
    assert install_hint("vulkan", "vulkan") == (
        "pip install vulkan (or ssm-scan's extra: pip install '.[vulkan]' in its checkout, "
        f"or pip install 'ssm_scan-{__version__}-py3-none-any.whl[vulkan]')")
    assert install_hint("jax", ["jax", "jaxlib"]).startswith("pip install jax jaxlib (or ")
    for bad in (("", "x"), ("x", []), ("x", ""), (None, "x")):
        with pytest.raises(ValueError, match="install_hint"):
            install_hint(*bad)


@pytest.mark.parametrize("bridge,framework,extra", [("ssm_torch", "torch", "torch"), ("ssm_jax", "jax", "jax"),
                                                    ("ssm_torch.mamba", "torch", "torch")])
def test_a_bridge_without_its_framework_says_what_to_install(bridge, framework, extra):
    # sys.modules[name] = None: any import of it fails as if it were not installed
    code = (f"import sys; sys.modules[{framework!r}] = None\ntry:\n    import {bridge}\n"
            "except ModuleNotFoundError as e:\n    print(e.name); print(e)\nelse:\n    raise SystemExit('imported')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), cwd=REPO,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    name, message = r.stdout.strip().split("\n", 1)
    assert name == framework
    needs = message.split(", which is not installed: ")[0]
    assert needs.startswith(f"{bridge.split('.')[0]} needs ") and framework in needs, message
    assert message.endswith(f"which is not installed: {install_hint(extra, framework)}"), message


def test_no_message_installs_ssm_scan_from_a_package_index():
    # 'pip install ssm-scan[...]' / "'ssm-scan[vulkan]'" would ask an index that has no ssm-scan
    asks = re.compile(r"pip install\s+['\"]?ssm-scan\b")
    found = [f"{p.relative_to(REPO)}:{n}" for p in sorted(REPO.glob("ssm_*/**/*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if asks.search(line)]
    assert not found, found
