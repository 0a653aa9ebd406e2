"""Forward scan kernels (private: they trust their inputs and only do arithmetic).

Two layouts, one per variant, chosen for what each variant's decay shares:

* Mamba-2 (:func:`forward_mamba2`, "rows"): the decay is one scalar per (i, t, h), shared by the
  P channels of the head. A task owns (sequence i, head h, a block of ``rows`` channels); its state
  rows (rows x N float32) stay in L1 while it walks the tokens. Per token it updates four rows at a
  time over n, so B[t] and C[t] are loaded once per four rows and four dot products with C run side
  by side. The loops over n are contiguous and vectorised; the sum over n is grouped by LLVM at
  compile time (``reassoc``, see config).
* Mamba-1 (:func:`forward_mamba1`, "lanes"): the decay exp(d * A[h, n]) is different for every
  state, and N is typically 16, too short for a vector loop with a reduction. A task owns
  (sequence i, group g, a block of ``lanes`` rows (h, p) of that group) and keeps the state
  transposed, (N, lanes), so the inner loop runs over rows: the exp, the update and y accumulate
  lane-wise with no horizontal sum (y's sum over n runs in plain order n = 0..N-1).

State snapshots (``snapshots=K``, docs/SPEC.md section 3.1): both kernels take ``snaps``
(Kw, S, H, P, N). A task writes its rows of slot T - 1 - t right after token t for the last Kw
tokens, and of slot T (the start state) when T < Kw, from the state rows it holds; the slots
beyond T are the caller's. Kw = 0 (K = 1: the one slot is ``states``) writes nothing and runs the
same arithmetic as without snapshots.

Tasks share nothing but read-only inputs and write disjoint slices of y, states and snaps, so
results do not depend on the thread count or on which thread runs which task.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .config import DRIVER
from .mathf import exp_f32, softplus_f32
from .pool import fetch_add
from .simd import prefer_vector_width, restrict_arrays

ZERO = np.float32(0.0)


def tasks_mamba2(x, rows):
    """Tasks of :func:`forward_mamba2`: (sequence, head, block of ``rows`` channels)."""
    S, H, P = x.shape[0], x.shape[2], x.shape[3]
    return S * H * ((P + rows - 1) // rows)


def tasks_mamba1(x, G, lanes):
    """Tasks of :func:`forward_mamba1`: (sequence, group, block of ``lanes`` rows)."""
    S, H, P = x.shape[0], x.shape[2], x.shape[3]
    return S * G * ((H // G * P + lanes - 1) // lanes)


# Each kernel is a driver (pool.py): every thread that runs it takes task numbers from ``counter``
# until none are left, so one compiled function serves one thread and many alike.


@njit(**DRIVER)
def forward_mamba2(counter, s, x, dt, identity, A, B, C, ids, rows, n_tasks, direct, y, states, snaps):
    """Mamba-2 forward. s (R,H,P,N), x (S,T,H,P), dt (S,T,H), A (H,1), B/C (S,T,G,N),
    ids (S,) in [0, R); fills y (S,T,H,P), states (S,H,P,N) and the slots k <= T of snaps
    (Kw,S,H,P,N) (slot k: the state after T - k tokens; Kw = 0 for none). ``rows``: channels per task;
    ``n_tasks``: :func:`tasks_mamba2`; ``counter``: (1,) int64, the next task (0 on entry);
    ``direct``: with T = 1, update s into states directly (no scratch rows), a function of the
    shape only (config.DECODE_DIRECT_BYTES)."""
    prefer_vector_width()
    restrict_arrays()
    T, H, P = x.shape[1], x.shape[2], x.shape[3]
    N = s.shape[3]
    G = B.shape[2]
    Kw = snaps.shape[0]
    hpg = H // G
    blocks = (P + rows - 1) // rows
    while True:
        task = fetch_add(counter, 1)
        if task >= n_tasks:
            break
        i = task // (H * blocks)
        h = (task // blocks) % H
        p0 = (task % blocks) * rows
        nr = min(rows, P - p0)
        g = h // hpg
        j = ids[i]
        if T == 1 and direct:
            # A decode step: each state is read once from s and written once to states, without
            # the scratch rows and their allocations (the same arithmetic as the loop below).
            d = dt[i, 0, h] if identity else softplus_f32(dt[i, 0, h])
            a = exp_f32(d * A[h, 0])
            q = 0
            while q + 4 <= nr:
                p = p0 + q
                u0 = x[i, 0, h, p] * d
                u1 = x[i, 0, h, p + 1] * d
                u2 = x[i, 0, h, p + 2] * d
                u3 = x[i, 0, h, p + 3] * d
                y0 = ZERO
                y1 = ZERO
                y2 = ZERO
                y3 = ZERO
                for n in range(N):
                    b = B[i, 0, g, n]
                    c = C[i, 0, g, n]
                    v0 = s[j, h, p, n] * a + b * u0
                    v1 = s[j, h, p + 1, n] * a + b * u1
                    v2 = s[j, h, p + 2, n] * a + b * u2
                    v3 = s[j, h, p + 3, n] * a + b * u3
                    states[i, h, p, n] = v0
                    states[i, h, p + 1, n] = v1
                    states[i, h, p + 2, n] = v2
                    states[i, h, p + 3, n] = v3
                    y0 += v0 * c
                    y1 += v1 * c
                    y2 += v2 * c
                    y3 += v3 * c
                y[i, 0, h, p] = y0
                y[i, 0, h, p + 1] = y1
                y[i, 0, h, p + 2] = y2
                y[i, 0, h, p + 3] = y3
                q += 4
            while q < nr:
                p = p0 + q
                u0 = x[i, 0, h, p] * d
                y0 = ZERO
                for n in range(N):
                    v0 = s[j, h, p, n] * a + B[i, 0, g, n] * u0
                    states[i, h, p, n] = v0
                    y0 += v0 * C[i, 0, g, n]
                y[i, 0, h, p] = y0
                q += 1
            if Kw > 0:                                       # slot 0, and slot 1 = s[ids[i]]
                for q in range(nr):
                    for n in range(N):
                        snaps[0, i, h, p0 + q, n] = states[i, h, p0 + q, n]
                if Kw > 1:
                    for q in range(nr):
                        for n in range(N):
                            snaps[1, i, h, p0 + q, n] = s[j, h, p0 + q, n]
            continue
        st = np.empty((nr, N), dtype=np.float32)            # state rows p0 .. p0+nr-1
        for q in range(nr):
            for n in range(N):
                st[q, n] = s[j, h, p0 + q, n]
        if T < Kw:                                           # slot T: the start state
            for q in range(nr):
                for n in range(N):
                    snaps[T, i, h, p0 + q, n] = st[q, n]
        d_t = np.empty(T, dtype=np.float32)                  # softplus(dt[i, :, h])
        a_t = np.empty(T, dtype=np.float32)                  # exp(d * A[h]): one exp per (i, t, h)
        for t in range(T):
            d = dt[i, t, h] if identity else softplus_f32(dt[i, t, h])
            d_t[t] = d
            a_t[t] = exp_f32(d * A[h, 0])
        for t in range(T):
            d = d_t[t]
            a = a_t[t]
            q = 0
            while q + 4 <= nr:
                p = p0 + q
                u0 = x[i, t, h, p] * d
                u1 = x[i, t, h, p + 1] * d
                u2 = x[i, t, h, p + 2] * d
                u3 = x[i, t, h, p + 3] * d
                y0 = ZERO
                y1 = ZERO
                y2 = ZERO
                y3 = ZERO
                for n in range(N):
                    b = B[i, t, g, n]
                    c = C[i, t, g, n]
                    v0 = st[q, n] * a + b * u0
                    v1 = st[q + 1, n] * a + b * u1
                    v2 = st[q + 2, n] * a + b * u2
                    v3 = st[q + 3, n] * a + b * u3
                    st[q, n] = v0
                    st[q + 1, n] = v1
                    st[q + 2, n] = v2
                    st[q + 3, n] = v3
                    y0 += v0 * c
                    y1 += v1 * c
                    y2 += v2 * c
                    y3 += v3 * c
                y[i, t, h, p] = y0
                y[i, t, h, p + 1] = y1
                y[i, t, h, p + 2] = y2
                y[i, t, h, p + 3] = y3
                q += 4
            while q < nr:
                u0 = x[i, t, h, p0 + q] * d
                y0 = ZERO
                for n in range(N):
                    v0 = st[q, n] * a + B[i, t, g, n] * u0
                    st[q, n] = v0
                    y0 += v0 * C[i, t, g, n]
                y[i, t, h, p0 + q] = y0
                q += 1
            k = T - 1 - t
            if k < Kw:                                       # the state after t + 1 tokens
                for q in range(nr):
                    for n in range(N):
                        snaps[k, i, h, p0 + q, n] = st[q, n]
        for q in range(nr):
            for n in range(N):
                states[i, h, p0 + q, n] = st[q, n]

@njit(**DRIVER)
def forward_mamba1(counter, s, x, dt, identity, A, B, C, ids, lanes, n_tasks, y, states, snaps):
    """Mamba-1 forward. Same arguments as :func:`forward_mamba2` with A (H,N); ``lanes``: rows
    (h, p) per task; ``n_tasks``: :func:`tasks_mamba1`."""
    prefer_vector_width()
    restrict_arrays()
    S, T, H, P = x.shape
    N = s.shape[3]
    G = B.shape[2]
    Kw = snaps.shape[0]
    hpg = H // G
    RG = hpg * P                                             # rows (h, p) per group
    blocks = (RG + lanes - 1) // lanes
    x2 = x.reshape(S, T, H * P)                              # row r = h*P + p
    y2 = y.reshape(S, T, H * P)
    while True:
        task = fetch_add(counter, 1)
        if task >= n_tasks:
            break
        i = task // (G * blocks)
        g = (task // blocks) % G
        r0 = g * RG + (task % blocks) * lanes                # first row of this task
        nl = min(lanes, (g + 1) * RG - r0)
        j = ids[i]
        h_l = np.empty(nl, dtype=np.int64)                   # head of each lane
        st = np.empty((N, nl), dtype=np.float32)             # state, transposed
        A_t = np.empty((N, nl), dtype=np.float32)            # A[h_l, n], transposed
        for l in range(nl):
            h = (r0 + l) // P
            p = r0 + l - h * P
            h_l[l] = h
            for n in range(N):
                st[n, l] = s[j, h, p, n]
                A_t[n, l] = A[h, n]
                if T < Kw:                                   # slot T: the start state
                    snaps[T, i, h, p, n] = st[n, l]
        d_l = np.empty(nl, dtype=np.float32)
        u_l = np.empty(nl, dtype=np.float32)
        y_l = np.empty(nl, dtype=np.float32)
        for t in range(T):
            for l in range(nl):
                d = dt[i, t, h_l[l]] if identity else softplus_f32(dt[i, t, h_l[l]])
                d_l[l] = d
                u_l[l] = x2[i, t, r0 + l] * d
                y_l[l] = ZERO
            for n in range(N):
                b = B[i, t, g, n]
                c = C[i, t, g, n]
                for l in range(nl):
                    v = st[n, l] * exp_f32(d_l[l] * A_t[n, l]) + b * u_l[l]
                    st[n, l] = v
                    y_l[l] += v * c
            for l in range(nl):
                y2[i, t, r0 + l] = y_l[l]
            k = T - 1 - t
            if k < Kw:                                       # the state after t + 1 tokens
                for l in range(nl):
                    h = h_l[l]
                    p = r0 + l - h * P
                    for n in range(N):
                        snaps[k, i, h, p, n] = st[n, l]
        for l in range(nl):
            h = h_l[l]
            p = r0 + l - h * P
            for n in range(N):
                states[i, h, p, n] = st[n, l]
