"""Backward scan kernels (private: they trust their inputs and only do arithmetic).

Partition and determinism
-------------------------
Every sum that crosses rows (h, p) -- d_B and d_C over the heads of a group and the channels,
d_dt over channels, d_A over sequences, channels and tokens -- must come out bit-identical for any
number of threads. So no task ever adds into memory another task writes:

* A task is (sequence i, group g, chunk c). The hpg*P rows (h, p) of group g are cut into
  ``chunks`` contiguous ranges; ``chunks`` depends only on the shape (config.TASKS_BWD), never on
  the thread count. A task walks its rows in order and adds their d_B / d_C contributions into its
  own slab ``part_B[i, c]`` / ``part_C[i, c]`` (T, G, N). With one chunk the slab *is* d_B / d_C.
* Per-row results go to per-row scratch: ``dd[i, t, h, p]`` (the row's share of dL/d softplus(dt))
  and ``dA_rows[i, h, p, :]`` (the row's share of d_A). Rows are owned by exactly one task.
* :func:`finish` then reduces in a fixed order: d_dt over p, d_A over (i, p), and the chunk slabs
  over c (c = 0, 1, ...), each in a loop that one thread runs from start to end.

Thread scheduling can change which thread runs a task, never what a task computes or the order of
a reduction, hence bit-identical results for NUMBA_NUM_THREADS = 1, 2, 4, ... and run to run.

Recompute with checkpoints
--------------------------
The forward states are not stored. Per pair of rows (Mamba-2) or block of rows (Mamba-1), a first
pass runs the recurrence and keeps the state at the start of every segment of ``seg`` tokens
(checkpoints); then, from the last segment to the first, the segment's states are recomputed into
a (seg+1)-state buffer and the tokens are walked backwards. Scratch per task: T/seg + seg + 1
states per row in flight, seg chosen so the buffer fits config.SEGMENT_BYTES (so at most O(T) per
row, never O(S*H*P*T*N) in all); with one segment (T <= seg) the first pass is skipped.

Layouts follow the forward's (kernels_fwd): Mamba-2 walks rows of N contiguous floats, two channels
at a time (sums over n vectorised with ``reassoc``); Mamba-1 keeps ``lanes`` rows side by side, transposed
(N, lanes), so the per-state exp and the per-row sums run lane-wise. Backward walks are written as
forward ``range`` loops with a computed index: numba's negative-step ``range`` kept LLVM from
vectorising the loops over n inside it.

State snapshots: ``g_snap`` (Kw, S, H, P, N) is the gradient of the forward's K state slots (Kw = 0
for none). Slot k < T is the gradient of the state after T - k tokens, so it joins the carry (the
``lam`` buffer, a_{t+1} lam_{t+1}) just before token t = T - 1 - k is walked: slot 0 with
g_states at the start, the others in the walk; slot T (T < Kw) adds to d_s0; slots k > T are
ignored. The same additions in the same order as ssm_ref.scan.backward.

One module of ~460 lines on purpose: the backward's kernels and the partition they share (below)
are read together; numba compiles them as one unit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .config import DRIVER, TASK
from .mathf import exp_f32, sigmoid_f32, softplus_f32
from .pool import fetch_add
from .simd import prefer_vector_width, restrict_arrays

ZERO = np.float32(0.0)
F32_MAX = np.float32(np.finfo(np.float32).max)


@njit(**TASK)
def _finish_token(it, dt, identity, dd, part_B, part_C, d_dt, d_B, d_C):
    """finish's work for token it = i*T + t: d_dt[i, t, :] and, with several chunks, d_B / d_C."""
    prefer_vector_width()
    T, H, P = dd.shape[1], dd.shape[2], dd.shape[3]
    chunks = part_B.shape[1]
    G = d_B.shape[2]
    N = d_B.shape[3]
    i = it // T
    t = it % T
    dd_h = np.zeros(H, dtype=np.float64)                 # sum over p, then one loop over h
    for h in range(H):                                   # that vectorises the sigmoid
        for p in range(P):
            dd_h[h] += dd[i, t, h, p]
    for h in range(H):
        d_dt[i, t, h] = np.float32(dd_h[h]) if identity else np.float32(dd_h[h]) * sigmoid_f32(dt[i, t, h])
    if chunks > 1:
        for g in range(G):
            for n in range(N):
                d_B[i, t, g, n] = part_B[i, 0, t, g, n]
                d_C[i, t, g, n] = part_C[i, 0, t, g, n]
            for c in range(1, chunks):
                for n in range(N):
                    d_B[i, t, g, n] += part_B[i, c, t, g, n]
                    d_C[i, t, g, n] += part_C[i, c, t, g, n]


@njit(**TASK)
def _finish_head(h, dA_rows, d_A):
    """finish's work for head h: d_A[h, :] = sum over (i, p) of dA_rows, in float64."""
    prefer_vector_width()
    S, P, K = dA_rows.shape[0], dA_rows.shape[2], dA_rows.shape[3]
    for n in range(K):
        acc = 0.0
        for i in range(S):
            for p in range(P):
                acc += dA_rows[i, h, p, n]
        d_A[h, n] = np.float32(acc)


@njit(**TASK)
def _finish_row(r, ids, d_s0, d_s):
    """finish's work for cache row r: 0 + the d_s0[i] with ids[i] == r, i ascending."""
    prefer_vector_width()
    S, H, P, N = d_s0.shape
    for h in range(H):
        for p in range(P):
            for n in range(N):
                d_s[r, h, p, n] = ZERO
    for i in range(S):
        if ids[i] == r:
            for h in range(H):
                for p in range(P):
                    for n in range(N):
                        d_s[r, h, p, n] += d_s0[i, h, p, n]


# Each kernel is a driver (pool.py): every thread that runs it takes task numbers from ``counter``
# (a (1,) int64 array, 0 on entry) until none are left, so one compiled function serves one thread
# and many alike. n_tasks: S * G * chunks.


@njit(**DRIVER)
def backward_mamba2(counter, s, x, dt, identity, A, B, C, ids, g_y, g_states, g_snap, seg, chunks, n_tasks,
                    d_s0, d_x, dd, dA_rows, part_B, part_C):
    """Mamba-2 backward, rows layout. Inputs as the forward plus g_y (S,T,H,P), g_states
    (S,H,P,N) and g_snap (Kw,S,H,P,N) (see the module's notes). Fills d_s0 (S,H,P,N), d_x
    (S,T,H,P), dd (S,T,H,P), dA_rows (S,H,P,1) float64, and adds into part_B / part_C
    (S, chunks, T, G, N), which must be zero on entry."""
    prefer_vector_width()
    restrict_arrays()
    T, H, P = x.shape[1], x.shape[2], x.shape[3]
    N = s.shape[3]
    G = B.shape[2]
    hpg = H // G
    RG = hpg * P
    nseg = (T + seg - 1) // seg
    Kw = g_snap.shape[0]
    while True:
        task = fetch_add(counter, 1)
        if task >= n_tasks:
            break
        i = task // (G * chunks)
        g = (task // chunks) % G
        c = task % chunks
        ra = c * RG // chunks
        rb = (c + 1) * RG // chunks
        j = ids[i]
        d_t = np.empty(T, dtype=np.float32)
        a_t = np.empty(T, dtype=np.float32)
        cps = np.empty((max(nseg, 1), 2, N), dtype=np.float32)  # states before token k*seg
        sts = np.empty((seg + 1, 2, N), dtype=np.float32)    # states of one segment
        lam = np.empty((2, N), dtype=np.float32)             # a_{t+1} lam_{t+1}, then d_s0
        h_cur = -1
        r = ra
        while r < rb:
            h = g * hpg + r // P
            p = r % P
            nr = 2 if (r + 1 < rb and p + 1 < P) else 1      # rows in this step: (p, p+1) or p
            if h != h_cur:
                for t in range(T):
                    d = dt[i, t, h] if identity else softplus_f32(dt[i, t, h])
                    d_t[t] = d
                    a_t[t] = exp_f32(d * A[h, 0])
                h_cur = h
            for q in range(nr):
                for n in range(N):
                    cps[0, q, n] = s[j, h, p + q, n]
                    lam[q, n] = g_states[i, h, p + q, n]
            if Kw > 0:                                      # slot 0: the final state too
                for q in range(nr):
                    for n in range(N):
                        lam[q, n] += g_snap[0, i, h, p + q, n]
            if nseg > 1:                                    # checkpoints
                for q in range(nr):
                    for n in range(N):
                        sts[0, q, n] = cps[0, q, n]
                for t in range((nseg - 1) * seg):
                    a = a_t[t]
                    if nr == 2:
                        u0 = x[i, t, h, p] * d_t[t]
                        u1 = x[i, t, h, p + 1] * d_t[t]
                        for n in range(N):
                            b = B[i, t, g, n]
                            sts[0, 0, n] = sts[0, 0, n] * a + b * u0
                            sts[0, 1, n] = sts[0, 1, n] * a + b * u1
                    else:
                        u0 = x[i, t, h, p] * d_t[t]
                        for n in range(N):
                            sts[0, 0, n] = sts[0, 0, n] * a + B[i, t, g, n] * u0
                    if (t + 1) % seg == 0:
                        k = (t + 1) // seg
                        for q in range(nr):
                            for n in range(N):
                                cps[k, q, n] = sts[0, q, n]
            dA0 = 0.0
            dA1 = 0.0
            for back in range(nseg):                        # segments, last first
                sg = nseg - 1 - back
                t0 = sg * seg
                t1 = min(T, t0 + seg)
                for q in range(nr):
                    for n in range(N):
                        sts[0, q, n] = cps[sg, q, n]
                for t in range(t0, t1):
                    k = t - t0
                    a = a_t[t]
                    if nr == 2:
                        u0 = x[i, t, h, p] * d_t[t]
                        u1 = x[i, t, h, p + 1] * d_t[t]
                        for n in range(N):
                            b = B[i, t, g, n]
                            sts[k + 1, 0, n] = sts[k, 0, n] * a + b * u0
                            sts[k + 1, 1, n] = sts[k, 1, n] * a + b * u1
                    else:
                        u0 = x[i, t, h, p] * d_t[t]
                        for n in range(N):
                            sts[k + 1, 0, n] = sts[k, 0, n] * a + B[i, t, g, n] * u0
                for k_back in range(t1 - t0):               # tokens, last first
                    k = t1 - t0 - 1 - k_back
                    t = t0 + k
                    ks = T - 1 - t
                    if 0 < ks < Kw:                         # the snapshot of the state after t + 1 tokens
                        for q in range(nr):
                            for n in range(N):
                                lam[q, n] += g_snap[ks, i, h, p + q, n]
                    d = d_t[t]
                    a = a_t[t]
                    if nr == 2 and a <= F32_MAX:
                        # two rows; the finite decay factored out of sum_n q_t[n]
                        x0 = x[i, t, h, p]
                        x1 = x[i, t, h, p + 1]
                        u0 = x0 * d
                        u1 = x1 * d
                        gy0 = g_y[i, t, h, p]
                        gy1 = g_y[i, t, h, p + 1]
                        gam0 = ZERO
                        gam1 = ZERO
                        w0 = ZERO
                        w1 = ZERO
                        for n in range(N):
                            cc = C[i, t, g, n]
                            b = B[i, t, g, n]
                            l0 = lam[0, n] + gy0 * cc            # lam_t of row p
                            l1 = lam[1, n] + gy1 * cc            # lam_t of row p+1
                            gam0 += l0 * b
                            gam1 += l1 * b
                            w0 += l0 * sts[k, 0, n]
                            w1 += l1 * sts[k, 1, n]
                            part_C[i, c, t, g, n] += gy0 * sts[k + 1, 0, n] + gy1 * sts[k + 1, 1, n]
                            part_B[i, c, t, g, n] += l0 * u0 + l1 * u1
                            lam[0, n] = a * l0                   # a_t lam_t, for token t-1
                            lam[1, n] = a * l1
                        w0 = a * w0                              # sum_n q_t[n] = a_t sum lam st_{t-1}
                        w1 = a * w1
                        d_x[i, t, h, p] = gam0 * d
                        d_x[i, t, h, p + 1] = gam1 * d
                        dd[i, t, h, p] = gam0 * x0 + A[h, 0] * w0
                        dd[i, t, h, p + 1] = gam1 * x1 + A[h, 0] * w1
                        dA0 += np.float64(d * w0)
                        dA1 += np.float64(d * w1)
                    else:
                        # one row, or a = inf / nan: then q_t is summed term by term, so terms
                        # of both signs give inf - inf = nan as in the reference
                        for q in range(nr):
                            xv = x[i, t, h, p + q]
                            u = xv * d
                            gy = g_y[i, t, h, p + q]
                            gam = ZERO
                            w = ZERO
                            if a <= F32_MAX:
                                for n in range(N):
                                    lm = lam[q, n] + gy * C[i, t, g, n]
                                    gam += lm * B[i, t, g, n]
                                    w += lm * sts[k, q, n]
                                    part_C[i, c, t, g, n] += gy * sts[k + 1, q, n]
                                    part_B[i, c, t, g, n] += lm * u
                                    lam[q, n] = a * lm
                                w = a * w
                            else:
                                for n in range(N):
                                    lm = lam[q, n] + gy * C[i, t, g, n]
                                    gam += lm * B[i, t, g, n]
                                    w += lm * sts[k, q, n] * a
                                    part_C[i, c, t, g, n] += gy * sts[k + 1, q, n]
                                    part_B[i, c, t, g, n] += lm * u
                                    lam[q, n] = a * lm
                            d_x[i, t, h, p + q] = gam * d
                            dd[i, t, h, p + q] = gam * xv + A[h, 0] * w
                            if q == 0:
                                dA0 += np.float64(d * w)
                            else:
                                dA1 += np.float64(d * w)
            if 0 < T < Kw:                                  # slot T: the start state
                for q in range(nr):
                    for n in range(N):
                        lam[q, n] += g_snap[T, i, h, p + q, n]
            for q in range(nr):
                for n in range(N):
                    d_s0[i, h, p + q, n] = lam[q, n]
            dA_rows[i, h, p, 0] = dA0
            if nr == 2:
                dA_rows[i, h, p + 1, 0] = dA1
            r += nr

@njit(**DRIVER)
def backward_mamba1(counter, s, x, dt, identity, A, B, C, ids, g_y, g_states, g_snap, seg, chunks, lanes,
                    n_tasks, d_s0, d_x, dd, dA_rows, part_B, part_C):
    """Mamba-1 backward, lanes layout. As :func:`backward_mamba2` with A (H,N) and dA_rows
    (S,H,P,N) float64; ``lanes``: rows walked side by side."""
    prefer_vector_width()
    restrict_arrays()
    S, T, H, P = x.shape
    N = s.shape[3]
    G = B.shape[2]
    hpg = H // G
    RG = hpg * P
    nseg = (T + seg - 1) // seg
    Kw = g_snap.shape[0]
    x2 = x.reshape(S, T, H * P)                              # row r = h*P + p
    gy2 = g_y.reshape(S, T, H * P)
    dx2 = d_x.reshape(S, T, H * P)
    dd2 = dd.reshape(S, T, H * P)
    while True:
        task = fetch_add(counter, 1)
        if task >= n_tasks:
            break
        i = task // (G * chunks)
        g = (task // chunks) % G
        c = task % chunks
        ra = g * RG + c * RG // chunks
        rb = g * RG + (c + 1) * RG // chunks
        j = ids[i]
        L = max(1, min(lanes, rb - ra))
        h_l = np.empty(L, dtype=np.int64)
        d_tl = np.empty((T, L), dtype=np.float32)            # softplus(dt[i, t, h_l])
        A_t = np.empty((N, L), dtype=np.float32)             # A[h_l, n]
        cps = np.empty((max(nseg, 1), N, L), dtype=np.float32)
        sts = np.empty((seg + 1, N, L), dtype=np.float32)
        dec = np.empty((seg, N, L), dtype=np.float32)        # exp(d * A) of the segment
        lam = np.empty((N, L), dtype=np.float32)
        dA1 = np.empty((N, L), dtype=np.float32)
        u_l = np.empty(L, dtype=np.float32)
        g_l = np.empty(L, dtype=np.float32)
        gam = np.empty(L, dtype=np.float32)
        qa = np.empty(L, dtype=np.float32)
        p_l = np.empty(L, dtype=np.int64)                    # channel of each lane
        r0 = ra
        while r0 < rb:
            nl = min(L, rb - r0)
            for l in range(nl):
                h = (r0 + l) // P
                p = r0 + l - h * P
                h_l[l] = h
                p_l[l] = p
                for n in range(N):
                    cps[0, n, l] = s[j, h, p, n]
                    lam[n, l] = g_states[i, h, p, n]
                    A_t[n, l] = A[h, n]
                    dA1[n, l] = ZERO
                if Kw > 0:                                  # slot 0: the final state too
                    for n in range(N):
                        lam[n, l] += g_snap[0, i, h, p, n]
            for t in range(T):
                for l in range(nl):
                    d_tl[t, l] = dt[i, t, h_l[l]] if identity else softplus_f32(dt[i, t, h_l[l]])
            if nseg > 1:
                for n in range(N):
                    for l in range(nl):
                        sts[0, n, l] = cps[0, n, l]
                for t in range((nseg - 1) * seg):
                    for l in range(nl):
                        u_l[l] = x2[i, t, r0 + l] * d_tl[t, l]
                    for n in range(N):
                        b = B[i, t, g, n]
                        for l in range(nl):
                            sts[0, n, l] = sts[0, n, l] * exp_f32(d_tl[t, l] * A_t[n, l]) + b * u_l[l]
                    if (t + 1) % seg == 0:
                        k = (t + 1) // seg
                        for n in range(N):
                            for l in range(nl):
                                cps[k, n, l] = sts[0, n, l]
            for back in range(nseg):                        # segments, last first
                sg = nseg - 1 - back
                t0 = sg * seg
                t1 = min(T, t0 + seg)
                for n in range(N):
                    for l in range(nl):
                        sts[0, n, l] = cps[sg, n, l]
                for t in range(t0, t1):
                    k = t - t0
                    for l in range(nl):
                        u_l[l] = x2[i, t, r0 + l] * d_tl[t, l]
                    for n in range(N):
                        b = B[i, t, g, n]
                        for l in range(nl):
                            a = exp_f32(d_tl[t, l] * A_t[n, l])
                            dec[k, n, l] = a
                            sts[k + 1, n, l] = sts[k, n, l] * a + b * u_l[l]
                for k_back in range(t1 - t0):               # tokens, last first
                    k = t1 - t0 - 1 - k_back
                    t = t0 + k
                    ks = T - 1 - t
                    if 0 < ks < Kw:                         # the snapshot of the state after t + 1 tokens
                        for l in range(nl):
                            for n in range(N):
                                lam[n, l] += g_snap[ks, i, h_l[l], p_l[l], n]
                    for l in range(nl):
                        u_l[l] = x2[i, t, r0 + l] * d_tl[t, l]
                        g_l[l] = gy2[i, t, r0 + l]
                        gam[l] = ZERO
                        qa[l] = ZERO
                    for n in range(N):
                        b = B[i, t, g, n]
                        cc = C[i, t, g, n]
                        sC = ZERO
                        sB = ZERO
                        for l in range(nl):
                            lm = lam[n, l] + g_l[l] * cc
                            sC += g_l[l] * sts[k + 1, n, l]
                            sB += lm * u_l[l]
                            gam[l] += lm * b
                            a = dec[k, n, l]
                            q = lm * sts[k, n, l] * a
                            qa[l] += q * A_t[n, l]
                            dA1[n, l] += q * d_tl[t, l]
                            lam[n, l] = a * lm
                        part_C[i, c, t, g, n] += sC
                        part_B[i, c, t, g, n] += sB
                    for l in range(nl):
                        dx2[i, t, r0 + l] = gam[l] * d_tl[t, l]
                        dd2[i, t, r0 + l] = gam[l] * x2[i, t, r0 + l] + qa[l]
            if 0 < T < Kw:                                  # slot T: the start state
                for l in range(nl):
                    for n in range(N):
                        lam[n, l] += g_snap[T, i, h_l[l], p_l[l], n]
            for l in range(nl):
                h = h_l[l]
                p = r0 + l - h * P
                for n in range(N):
                    d_s0[i, h, p, n] = lam[n, l]
                    dA_rows[i, h, p, n] = dA1[n, l]
            r0 += nl

def tasks_finish(dd, d_A, d_s) -> int:
    """Tasks of :func:`finish`: one per token (S*T), per head (H), per cache row (R)."""
    return dd.shape[0] * dd.shape[1] + d_A.shape[0] + d_s.shape[0]


@njit(**DRIVER)
def finish(counter, dt, identity, ids, dd, dA_rows, part_B, part_C, d_s0, d_dt, d_A, d_B, d_C, d_s):
    """The fixed-order reductions after the backward kernels, one task per token, head and cache
    row (every sum runs inside one task, in a fixed order):

    * d_dt[i,t,h] = (sum over p of dd, in float64) * softplus'(dt);
    * d_B / d_C = sum over chunks c = 0, 1, ... of the slabs (skipped with one chunk, where the
      slab is d_B / d_C itself);
    * d_A = sum over (i, p) of dA_rows, in float64;
    * d_s (R,H,P,N): row r = 0 + sum of d_s0[i] over the i with ids[i] == r, i ascending -- the
      same additions in the same order as ssm_ref.scatter_rows, hence the same bits.
    """
    n_tok = dd.shape[0] * dd.shape[1]
    n_head = d_A.shape[0]
    n_tasks = n_tok + n_head + d_s.shape[0]
    while True:
        task = fetch_add(counter, 1)
        if task >= n_tasks:
            break
        if task < n_tok:
            _finish_token(task, dt, identity, dd, part_B, part_C, d_dt, d_B, d_C)
        elif task < n_tok + n_head:
            _finish_head(task - n_tok, dA_rows, d_A)
        else:
            _finish_row(task - n_tok - n_head, ids, d_s0, d_s)
