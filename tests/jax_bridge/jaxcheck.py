"""What the JAX bridge's tests share: the inputs' names and a case's inputs as JAX arrays.
Imported by the test modules after their check that jax is installed."""

import jax.numpy as jnp
import numpy as np

NAMES = ("s", "x", "dt", "A", "B", "C")


def arrays(case, dtype):
    """``case``'s six inputs as JAX arrays of ``dtype`` (in NAMES' order), and its ids."""
    args = case.args()
    return [jnp.asarray(np.asarray(args[k], np.float64), dtype=dtype) for k in NAMES], args["ids"]
