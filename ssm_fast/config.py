"""Every numba option and tuning constant of ssm_fast, in one place.

Kernels import ``KERNEL`` / ``MATH`` and pass them to ``numba.njit``; nothing else in the package
names a numba option. The sizes below (ROWS_FWD, LANES, TASKS_BWD, SEGMENT_*) are read by the
public wrappers and passed to the kernels at call time. The flags and VECTOR_BITS are compile-time:
numba's on-disk cache does not notice a change to this file, so after changing them clear
``ssm_fast/__pycache__`` or point ``NUMBA_CACHE_DIR`` somewhere fresh.

Numerics of the flags:

* ``contract`` lets LLVM fuse ``a*b + c`` into one FMA (docs/SPEC.md allows fused multiply-adds).
* ``reassoc`` (kernels only) lets LLVM vectorise the sums over the state index n (the dot products
  ``sum_n st*C``, ``sum_n lam*B``, ...) with several partial sums. The grouping is fixed at compile
  time by the vector width and the trip count N, so results are the same on every run and for every
  thread count; they can differ in the last bits between CPUs with different vector widths.
* No ``nnan``/``ninf``/``nsz``/``arcp``/``afn``: inf and nan propagate as in the reference.
* The float32 math helpers (``mathf``) are compiled with ``contract`` only, so LLVM cannot
  regroup their range reduction; LLVM inlining keeps each instruction's own flags.
"""

from __future__ import annotations

# Options for the kernels (kernels_fwd, kernels_bwd). Each kernel is a task function (TASK: the
# arithmetic of one task of the fixed partition) and a driver (DRIVER) that runs tasks until none
# are left, on every thread that runs it (pool.py); the driver releases the GIL.
TASK = dict(cache=True, fastmath={"contract", "reassoc"}, error_model="numpy")
DRIVER = dict(TASK, nogil=True)

# Options for the serial helpers that the kernels call (mathf): no reassociation.
MATH = dict(cache=True, fastmath={"contract"}, error_model="numpy")
# softplus and sigmoid only combine the MATH helpers with selects and one add; they are inlined
# into the caller by numba (LLVM's inliner declines the combined body, which stops the
# vectorisation of the caller's loop), so they take the caller's flags.
MATH_INLINE = dict(MATH, inline="always")

# Preferred SIMD width of the kernels' loops in bits (see simd.py): LLVM's default on Intel server
# CPUs is 256 even with AVX-512; None keeps LLVM's choice.
VECTOR_BITS = 512

# Mamba-2 forward ("rows" layout): channels p per task. A task holds ROWS_FWD state rows of N
# floats; 32 rows of N = 128 are 16 KiB, which stay in L1 while the task walks the tokens.
ROWS_FWD = 32

# Mamba-1 forward and backward ("lanes" layout): rows (h, p) walked side by side.
LANES = 64

# Backward partition: (sequence, group, chunk); the rows (h, p) of a group are cut into chunks so
# that S*G*chunks >= TASKS_BWD. A constant, never the thread count: the grouping of every sum
# depends only on the shape, so results are bit-identical for any NUMBA_NUM_THREADS. Each chunk
# beyond the first costs a (T, G, N) slab for d_B and one for d_C, summed afterwards.
TASKS_BWD = 16

# Backward recompute: a segment of seg tokens keeps its states (and, for Mamba-1, its decays) in a
# buffer of at most SEGMENT_BYTES per task; seg >= SEGMENT_MIN. A sequence that fits in one
# segment is recomputed once, a longer one twice (checkpoints, then segment by segment).
SEGMENT_BYTES = 1024 * 1024
SEGMENT_MIN = 8

# Mamba-2 decode steps (T = 1) whose states (S*H*P*N float32) take at most DECODE_DIRECT_BYTES
# update s into the output states directly, without scratch rows: faster for small states, slower
# for large ones (docs/FAST.md, "Threads", decode steps). A function of the shape only, so the bits
# never depend on the thread count.
DECODE_DIRECT_BYTES = 8 * 1024 * 1024

# Small calls run on the calling thread (threads.count): those whose estimated single-thread time
# is below SERIAL_BELOW_S seconds. The estimate is (state updates S*T*H*P*N) * SECONDS_PER_UPDATE +
# (state elements S*H*P*N) * SECONDS_PER_STATE -- a decode step (T = 1) is bound by reading and
# writing the states. Fitted to single-thread times on a 2-core AMD EPYC (Zen 3) VM; the threshold
# is where two threads stopped losing to one with two other busy processes on the cores
# (docs/results/cpu-contention.md). The choice never changes the results.
SERIAL_BELOW_S = 1.5e-3
SECONDS_PER_UPDATE = {
    ("mamba2", "fwd"): 0.12e-9,
    ("mamba2", "bwd"): 0.55e-9,
    ("mamba1", "fwd"): 1.8e-9,
    ("mamba1", "bwd"): 3.2e-9,
}
SECONDS_PER_STATE = {
    ("mamba2", "fwd"): 1.0e-9,
    ("mamba2", "bwd"): 2.5e-9,
    ("mamba1", "fwd"): 1.0e-9,
    ("mamba1", "bwd"): 2.5e-9,
}

# Mamba-3 (kernels_m3_fwd, kernels_m3_bwd): tasks are (sequence, head). The backward recomputes
# the forward's pre-decay states segment by segment; a segment's buffers (the P x N state, the
# rotated keys and queries and the rotation's cos and sin, per token) take at most
# M3_SEGMENT_BYTES per task, half of a 2 MiB L2 cache, where they are read back.
M3_SEGMENT_BYTES = 1024 * 1024
# The single-thread cost model of threads' choice (see SERIAL_BELOW_S), per state element and
# rank per token, and per state element; measured as the Mamba-2 figures above.
M3_SECONDS_PER_UPDATE = {"fwd": 0.15e-9, "bwd": 0.8e-9}
M3_SECONDS_PER_STATE = {"fwd": 1.0e-9, "bwd": 2.5e-9}
