"""Sample problems for the tests: re-exported from the public modules, so the tests and users
fuzzing their own port draw from ONE implementation.

``make_problem`` / ``Case`` / ``IDS_PATTERNS`` / ``INPUT_NAMES``: :mod:`ssm_ref.testing.cases`;
``problems`` (the hypothesis strategy): :mod:`ssm_ref.testing.strategies`.
"""

from ssm_ref.testing.cases import IDS_PATTERNS, INPUT_NAMES, REGIMES, Case, make_problem
from ssm_ref.testing.strategies import problems

__all__ = ["IDS_PATTERNS", "INPUT_NAMES", "REGIMES", "Case", "make_problem", "problems"]
