"""The names of ssm-scan's backends, as every front end takes them: ``backend=`` of ssm_torch (its
operator and the mamba drop-ins) and ssm_jax, and the command line's ``--backend`` -- the module
names and their short names, resolved here, in the bottom layer all of them import, so that they
take and refuse the same names with the same message.

    resolve_backend("vk")        # "ssm_vk"
    resolve_backend("cuda")      # ValueError: backend: expected one of 'ssm_fast', 'ssm_vk', 'ssm_ref' (or ...
"""

from __future__ import annotations

__all__ = ["ALIASES", "BACKENDS", "lookup", "refusal", "resolve_backend"]

# The backend modules, the bridges' default first.
BACKENDS = ("ssm_fast", "ssm_vk", "ssm_ref")
# Their short names.
ALIASES = {"fast": "ssm_fast", "vk": "ssm_vk", "ref": "ssm_ref"}

_EXPECTED = (f"one of {', '.join(repr(b) for b in BACKENDS)} "
             f"(or {', '.join(repr(a) for a in ALIASES)})")


def lookup(name) -> str | None:
    """The module name ``name`` stands for (a module name of BACKENDS or a short name of ALIASES),
    else None (any other value, a non-string included)."""
    if not isinstance(name, str):
        return None
    name = ALIASES.get(name, name)
    return name if name in BACKENDS else None


def refusal(backend) -> str:
    """What a front end says of a name it does not take, after the argument's name: "expected one
    of 'ssm_fast', 'ssm_vk', 'ssm_ref' (or 'fast', 'vk', 'ref'), got 'cuda'"."""
    return f"expected {_EXPECTED}, got {backend!r}"


def resolve_backend(backend, argument: str = "backend") -> str:
    """The module name of ``backend`` (a module name or a short name); ValueError naming
    ``argument`` for anything else."""
    name = lookup(backend)
    if name is None:
        raise ValueError(f"{argument}: {refusal(backend)}")
    return name
