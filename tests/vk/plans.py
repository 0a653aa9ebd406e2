"""What the tests of tests/vk read of a call's plan (ssm_vk.family.FamilyPlan: the family that runs
it, that family's own plan, and the plan that recomputes its flagged results)."""

from __future__ import annotations


def of(fp, family: str):
    """The own plan of ``fp`` where family ``family`` ("sequential", "chunked", "m1") runs it, else
    None."""
    return fp.plan if fp.family.name == family else None


def sequential(fp):
    """The token-sequential plan of ``fp``: its own, or the one that recomputes its flagged results
    (what the token-sequential kernels run for the call)."""
    return fp.plan if fp.family.name == "sequential" else fp.rerun.plan


def tchunk(fp) -> int:
    """Tokens per time chunk of ``fp`` (0: not parallel over time chunks)."""
    return fp.plan.tchunk if fp.family.name == "sequential" else 0
