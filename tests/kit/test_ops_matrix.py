"""Every declared op x every backend that computes it x its sample problems, through the op's
declaration alone (ssm_ref.ops; after PyTorch's OpInfo): the op-generic properties against the
op's float64 reference. The scan and tests/kit/toy_op.py's op today; a new op joins by being
declared, a backend by having the op's two functions."""

from __future__ import annotations

import sys

import pytest
from children import REPO
from registry import BACKENDS

import ssm_ref
from ssm_ref.testing import ports
from ssm_ref.testing.properties.generic import GENERIC

sys.path.insert(0, str(REPO / "tests" / "kit"))
import toy_op  # (registers its op; it is also a port of it)

PORTS = [b.module for b in BACKENDS] + [toy_op]
MATRIX = [(op, port) for op in ssm_ref.ops.OPS.values() for port in PORTS
          if not ports.interface_problems(port, op)]


def test_the_matrix_has_every_op_and_the_scans_backends():
    names = {(op.name, ports.port_name(p)) for op, p in MATRIX}
    assert {op.name for op, _ in MATRIX} >= {"ssm_scan", "decayed_cumsum"}
    assert {("ssm_scan", b.name) for b in BACKENDS} <= names
    assert ("decayed_cumsum", "toy_fast") in names and ("ssm_scan", "toy_fast") not in names


@pytest.mark.parametrize("op,port", MATRIX, ids=lambda v: getattr(v, "name", None) or ports.port_name(v))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_backend_of_every_op_meets_its_reference(op, port, seed):
    case = ports.kit_part(op, "make_case")(seed)
    tol = op.tol()
    checked = [name for name in ("oracle_forward", "oracle_backward", "split_tokens", "permute_sequences")
               if GENERIC[name].check(port, case, tol)]
    assert "oracle_forward" in checked and "oracle_backward" in checked
