"""Replay every saved regression case (tests/regressions/*.json, written by ``ssm-scan fuzz
--save`` or ssm_ref.testing.regressions.save_case) on every backend: the property it once failed, and
every other property claimed for its value regime."""

from pathlib import Path

import pytest
from registry import BACKENDS

from ssm_ref.testing.properties import PROPERTIES
from ssm_ref.testing.regressions import load_all

SAVED = load_all(Path(__file__).resolve().parents[1] / "regressions")


def test_there_are_saved_cases_and_each_names_a_known_property():
    assert SAVED, "tests/regressions holds no cases"
    for r in SAVED:
        assert r.property in PROPERTIES, r.path.name
        assert r.case.regime in PROPERTIES[r.property].regimes, r.path.name


@pytest.mark.parametrize("reg", SAVED, ids=[r.path.stem for r in SAVED])
@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_saved_case_holds(backend, reg):
    assert PROPERTIES[reg.property].check(backend.module, reg.case, backend.tol), \
        f"{reg.property} does not apply to its own saved case {reg.path.name}"
    for name, prop in PROPERTIES.items():
        if name != reg.property and reg.case.regime in prop.regimes:
            prop.check(backend.module, reg.case, backend.tol)
