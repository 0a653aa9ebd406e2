"""Fixtures of the JAX bridge's tests (test_jax_op.py, test_jax_snapshots.py)."""

import pytest


@pytest.fixture
def x64():
    """JAX with float64 enabled for the test, as it was after (imported here only when a test asks:
    the test modules skip without jax)."""
    import jax

    saved = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", saved)
