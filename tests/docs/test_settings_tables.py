"""The docs' tables of ssm_vk's settings are the ones ssm_vk/config.py declares: the knobs in
docs/KERNELS.md and the environment variables in docs/API.md, as tools/settings_tables.py writes
them; every environment variable config.py reads is declared, with its default and doc."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ssm_vk import config

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import settings_tables  # noqa: E402


@pytest.mark.parametrize("path, name, make", settings_tables.TABLES)
def test_the_docs_table_is_the_one_config_declares(path, name, make):
    _, table, _ = settings_tables.split((REPO / path).read_text(), name, path)
    assert table == make(), f"{path}: the {name} table is out of date; run: python tools/settings_tables.py"


def test_the_check_command_passes():
    run = subprocess.run([sys.executable, str(REPO / "tools" / "settings_tables.py"), "--check"],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr


def test_every_environment_variable_config_reads_is_declared():
    read = set(re.findall(r'EnvVar\("([A-Z_0-9]+)"\)', (REPO / "ssm_vk" / "config.py").read_text()))
    assert read == set(config.ENV)
    assert all(e.default and e.doc for e in config.ENV.values())


def test_every_knob_has_a_legal_default_or_none_and_a_doc():
    for name, k in config.KNOBS.items():
        assert k.doc and k.rule.text, name
        assert k.default is None or k.rule(k.default) == "", (name, k.default)
        assert config.DEFAULTS.knob(name) == k.default
    assert config.DEFAULTS.with_knobs(K=16).knob("K") == 16
