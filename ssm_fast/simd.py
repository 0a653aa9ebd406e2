"""Ask LLVM for wider vectors in one kernel, without touching numba's process-wide settings.

On Intel server CPUs from Skylake-SP on (Emerald Rapids among them), LLVM's tuning prefers 256-bit
vectors ("prefer-256-bit") even though AVX-512 is available, so numba's loops run 8 float32 lanes
wide. The fix numba offers is process-wide (``NUMBA_CPU_FEATURES`` with ``-prefer-256-bit``),
which would change every other numba function in the user's process. Instead, a kernel calls
:func:`prefer_vector_width` at its top; that tags the LLVM function holding the loops with
``"prefer-vector-width"="<config.VECTOR_BITS>"``, which LLVM's vectoriser reads per function.
On a CPU without AVX-512 LLVM keeps the widest legal width, so the tag is harmless there.

512-bit vectors pay most in the Mamba-1 kernels (a vectorised exp per state): docs/FAST.md,
"Vector width".
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import config

__all__ = ["prefer_vector_width", "restrict_arrays"]


@intrinsic
def prefer_vector_width(typingctx):
    """Tag the calling LLVM function with config.VECTOR_BITS as its preferred vector width
    (no-op when VECTOR_BITS is None). Call it in the function whose loops should use it (inside a
    ``prange`` body: numba outlines that body into its own function, whose loops get vectorised)."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        if config.VECTOR_BITS:
            # llvmlite's FunctionAttributes accepts only keyword attributes in add(); a string
            # attribute is printed as given, so add it to the underlying set.
            set.add(builder.function.attributes, f'"prefer-vector-width"="{int(config.VECTOR_BITS)}"')
        return context.get_dummy_value()

    return sig, codegen



@intrinsic
def restrict_arrays(typingctx):
    """Tell LLVM that the data of the calling function's array arguments do not overlap (``noalias``
    on each array's data pointer, as numba itself does for the body of a ``prange`` loop when it
    finds no aliases), except the task counter's (argument ``counter``, written by several threads).

    Without it LLVM must assume that a store to an output may change any input, so it reloads
    inputs in the inner loops and vectorises them behind run-time overlap checks (what that costs:
    docs/FAST.md, "Things that cost a factor"). The caller guarantees it: every array a kernel writes is
    allocated by the public wrapper for that call, and arrays that may share memory (inputs that are
    views of one buffer) are only read."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        for arg in builder.function.args:
            name = arg.name
            # numba names an array argument's fields arg.<name>.<k>; k = 4 is the data pointer
            if name.startswith("arg.") and name.endswith(".4") and name != "arg.counter.4" and name.count(".") == 2:
                if isinstance(arg.type, ir.PointerType):
                    arg.add_attribute("noalias")
        return context.get_dummy_value()

    return sig, codegen
