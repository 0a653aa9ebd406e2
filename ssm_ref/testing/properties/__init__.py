"""The properties every implementation of the scan must have, as plain functions a test, the
fuzzer (``ssm-scan fuzz``) or a user can run on any port (docs/PORTING.md, "The port interface").

    from ssm_ref.testing.properties import PROPERTIES, PropertyFailed
    for prop in PROPERTIES.values():
        if case.regime in prop.regimes:
            prop.check(my_module, case, ssm_ref.tolerance.F32_TOL)   # raises PropertyFailed

``check(module, case, tol)`` returns True when it checked something, False when the property does
not apply to the case (``group_broadcast`` with H/G == 1, ``mamba2_as_mamba1`` with N == 1),
and raises :class:`PropertyFailed` (an AssertionError) with a message naming the outputs and the
case when the property does not hold. ``tol`` is an output -> Tol table (ssm_ref.tolerance).
numpy only: no hypothesis needed.

:data:`INVARIANCES` holds two more, ``batch_invariant`` and ``split_invariant``: bit-for-bit
equalities that a backend may promise beyond the tolerance (docs/SPEC.md section 3.2). They are
not part of the contract every port must meet, so they are kept apart from PROPERTIES: the fuzzer
runs them when named (``ssm-scan fuzz --property batch_invariant``), ``ssm-scan check`` reports
them as information. Their ``tol`` is not used.
"""

from __future__ import annotations

from ..cases import ORACLE_REGIMES, REGIMES
from ._common import Property, PropertyFailed
from .backward import deterministic, linear_backward, nonfinite_pattern
from .invariance import batch_invariant, split_invariant
from .oracle import adjoint, oracle_backward, oracle_forward
from .structure import group_broadcast, mamba2_as_mamba1, permute_sequences, scatter_of_d_s0, split_tokens

__all__ = ["BACKWARD_ONLY", "INVARIANCES", "PROPERTIES", "Property", "PropertyFailed", "known"]

# Regimes whose values stay finite: the adjoint and linearity bounds are norms of finite arrays.
FINITE = ("typical", "wide_dt", "small_A", "long_decay")

PROPERTIES: dict[str, Property] = {p.name: p for p in (
    Property("oracle_forward", oracle_forward, ORACLE_REGIMES,
             "y and states within the tolerance of the float64 oracle"),
    Property("oracle_backward", oracle_backward, ORACLE_REGIMES,
             "every gradient within the tolerance of the float64 oracle"),
    Property("adjoint", adjoint, FINITE,
             "<J v, w> (reference forward mode, float64) == <v, J^T w> (the backward)"),
    Property("split_tokens", split_tokens, ORACLE_REGIMES,
             "tokens [0, t) then [t, T) equal one scan, forward and chained backward"),
    Property("group_broadcast", group_broadcast, ORACLE_REGIMES,
             "G groups equal G*k groups with B, C repeated; d_B, d_C summed back"),
    Property("mamba2_as_mamba1", mamba2_as_mamba1, ORACLE_REGIMES,
             "Mamba-2 equals Mamba-1 with A repeated over N; d_A summed over N"),
    Property("permute_sequences", permute_sequences, ORACLE_REGIMES,
             "permuting sequences with their ids permutes the outputs"),
    Property("scatter_of_d_s0", scatter_of_d_s0, REGIMES,
             "d_s is the scatter-add of d_s0 by ids; unread rows are 0"),
    Property("linear_backward", linear_backward, FINITE,
             "the backward is linear in (g_y, g_states); zero in, zero out"),
    Property("deterministic", deterministic, REGIMES,
             "two runs give bit-identical outputs"),
    Property("nonfinite_pattern", nonfinite_pattern, REGIMES,
             "nan/+inf/-inf where the float32 reference has them; no crash, no RuntimeWarning"),
)}

# Properties of the backward alone: not applicable to a port without one (its ssm_scan_back raises
# NotImplementedError); the others then check the forward's half.
BACKWARD_ONLY = ("oracle_backward", "adjoint", "scatter_of_d_s0", "linear_backward")

# Bit-for-bit invariances (docs/SPEC.md section 3.2): claimed only by the backends that promise them,
# checked in every regime (bits either match or they do not). Not in PROPERTIES.
INVARIANCES: dict[str, Property] = {p.name: p for p in (
    Property("batch_invariant", batch_invariant, REGIMES,
             "a sequence's outputs and own gradients are the same bits alone and anywhere in any batch"),
    Property("split_invariant", split_invariant, REGIMES,
             "one call over [0, T) is the same bits as consecutive calls carrying the state"),
)}


def known() -> dict[str, Property]:
    """Every property by name: PROPERTIES, then INVARIANCES (what the fuzzer accepts by name)."""
    return {**PROPERTIES, **INVARIANCES}
