"""Mamba-3's properties on its PyTorch and JAX bridges (tests/kit/bridge_ports.py): the bridges'
forward and their frameworks' gradients against the op's float64 reference, token splits,
permuted sequences, rank and rotation identities -- as for the numpy backends. Not run on them:
decode_in_place (update_cache: the bridges write no array in place)."""

from __future__ import annotations

import pytest
from bridge_ports import jax_port, torch_port
from hypothesis import given, settings
from optional import need

from ssm_ref import ops
from ssm_ref.testing import mamba3_cases as mc
from ssm_ref.testing.properties.mamba3 import PROPERTIES

OP = ops.MAMBA3
TOL = OP.tol()
SKIP = {"decode_in_place"}
# The fixed problems of up to 16 tokens: a bridge call costs a framework's dispatch (JAX's a trace
# per new shape), and decode_steps calls once per token.
CASES = [c for c in mc.cases(quick=True) if c.dims["T"] <= 16]


def _port(framework: str):
    need(framework)
    return torch_port(OP) if framework == "torch" else jax_port(OP)


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_the_properties_hold_on_the_bridges(framework, case):
    port = _port(framework)
    applied = [name for name, prop in PROPERTIES.items() if name not in SKIP and prop.check(port, case, TOL)]
    assert {"oracle_forward", "oracle_backward", "deterministic"} <= set(applied)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_drawn_problems_on_the_bridges(framework):
    port = _port(framework)

    @settings(max_examples=3, deadline=None)
    @given(mc.strategy(max_T_long=8))
    def run(case):
        for name, prop in PROPERTIES.items():
            if name not in SKIP:
                prop.check(port, case, TOL)

    run()


def test_a_wrong_gradient_through_a_bridge_is_caught():
    """The port's backward is what the properties judge: a bridge whose d_x were off would fail."""
    port = _port("torch")
    back = getattr(port, OP.backward_name)

    def wrong(*args, **kw):
        g = back(*args, **kw)
        g["d_x"] = g["d_x"] * 1.01
        return g

    setattr(port, OP.backward_name, wrong)
    case = mc.cases(quick=True)[0]
    with pytest.raises(AssertionError, match="d_x"):
        PROPERTIES["oracle_backward"].check(port, case, TOL)
