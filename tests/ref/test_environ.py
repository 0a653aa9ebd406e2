"""ssm_ref.environ.EnvVar reads what ``os.environ.get`` reads, however the variable was set."""

import os

import pytest

from ssm_ref.environ import EnvVar

NAME = "SSM_TEST_ENVVAR_READ"


@pytest.mark.parametrize("value", ["", "1", "LN=8,WG=128", " spaced ", "\u00e9t\u00e9"])
def test_get_follows_os_environ(monkeypatch, value):
    var = EnvVar(NAME)
    monkeypatch.delenv(NAME, raising=False)
    assert var.get() == "" and var.get("dflt") == "dflt"
    monkeypatch.setenv(NAME, value)
    assert var.get() == os.environ.get(NAME, "") == value
    assert var.get("dflt") == os.environ.get(NAME, "dflt")
    os.environ[NAME] = value + "x"
    assert var.get() == value + "x"
    del os.environ[NAME]
    assert var.get() == "" and var.get("dflt") == "dflt"


def test_a_replaced_environ_is_read_through_its_get(monkeypatch):
    var = EnvVar(NAME)
    monkeypatch.setattr(os, "environ", {NAME: "from a dict"})
    assert var.get() == "from a dict"
    monkeypatch.setattr(os, "environ", {})
    assert var.get("dflt") == "dflt"
