"""README's first screen: what the scan is, an example, and the legend of its shape letters before
any install detail -- the letters the same the validator's Dims has."""

from __future__ import annotations

import dataclasses
import re

from children import REPO

import ssm_ref

README = (REPO / "README.md").read_text()


def test_the_legend_names_every_shape_letter_the_validator_has():
    letters = {f.name for f in dataclasses.fields(ssm_ref.Dims) if re.fullmatch(r"[A-Z]", f.name)}
    legend = set(re.findall(r"^\| `([A-Z])` \|", README, flags=re.M))
    assert legend == letters, f"README's legend has {sorted(legend)}, ssm_ref.Dims {sorted(letters)}"


def test_the_example_and_legend_come_before_the_install_details():
    first_code = README.index("```python")
    legend = README.index("| letter |")
    assert first_code < legend < README.index("## Quick start") < README.index("## Install")
    assert "recurrence inside every Mamba layer" in README[:first_code]
