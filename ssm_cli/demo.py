"""``ssm-scan demo``: a small forward + backward with a finite-difference check."""

from __future__ import annotations

import time

import numpy as np

import ssm_ref


def make_problem(rng, S=2, T=16, H=4, P=8, N=16, G=2, R=3):
    """Inputs with the seed test's distributions; ids permuted into a cache of R rows."""
    return dict(
        s=rng.uniform(-0.5, 0.5, (R, H, P, N)),
        x=rng.uniform(-1, 1, (S, T, H, P)),
        dt=rng.uniform(-0.5, 0.5, (S, T, H)),
        A=-rng.uniform(0.2, 1.0, H),
        B=rng.uniform(-0.5, 0.5, (S, T, G, N)),
        C=rng.uniform(-0.5, 0.5, (S, T, G, N)),
        ids=rng.permutation(R)[:S],
    )


def fd_check(inp, g_y, g_states, grads, rng, samples=4, h=1e-6):
    """Max relative error of sampled gradient entries against central differences (float64)."""
    def loss(**kw):
        a = {**inp, **kw}
        r = ssm_ref.ssm_scan(**a, dtype=np.float64)
        return float(np.sum(r.y * g_y) + np.sum(r.states * g_states))

    worst = {}
    for name in ("s", "x", "dt", "A", "B", "C"):
        base = np.asarray(inp[name], dtype=np.float64)
        an = getattr(grads, "d_" + name)
        errs = []
        for flat in rng.choice(base.size, size=min(samples, base.size), replace=False):
            i = np.unravel_index(flat, base.shape)
            up, dn = base.copy(), base.copy()
            up[i] += h
            dn[i] -= h
            fd = (loss(**{name: up}) - loss(**{name: dn})) / (2 * h)
            errs.append(abs(fd - an[i]) / max(abs(fd), 1e-3))
        worst[name] = max(errs)
    return worst


def run(args) -> int:
    rng = np.random.default_rng(args.seed)
    inp = make_problem(rng)
    S, T, H, P = inp["x"].shape
    N = inp["s"].shape[3]
    print(f"problem: S={S} T={T} H={H} P={P} N={N} G={inp['B'].shape[2]} R={inp['s'].shape[0]} "
          f"ids={list(inp['ids'])} (Mamba-2)")
    t0 = time.perf_counter()
    r = ssm_ref.ssm_scan(**inp)
    t1 = time.perf_counter()
    g_y = rng.uniform(-1, 1, r.y.shape)
    g_states = rng.uniform(-1, 1, r.states.shape)
    g = ssm_ref.ssm_scan_back(**inp, g_y=g_y, g_states=g_states)
    t2 = time.perf_counter()
    print(f"ssm_ref forward  float32: y {r.y.shape} states {r.states.shape}  {1e3 * (t1 - t0):.2f} ms")
    print("ssm_ref backward float32: " + " ".join(f"{k} {getattr(g, k).shape}" for k in ssm_ref.GRAD_NAMES)
          + f"  {1e3 * (t2 - t1):.2f} ms")
    g64 = ssm_ref.ssm_scan_back(**inp, g_y=g_y, g_states=g_states, dtype=np.float64)
    worst = fd_check(inp, g_y, g_states, g64, rng)
    ok = all(v < 1e-6 for v in worst.values())
    print("finite differences vs float64 backward (max rel. error of 4 sampled entries each):")
    print("  " + "  ".join(f"d_{k} {v:.1e}" for k, v in worst.items()) + ("  PASS" if ok else "  FAIL"))
    rel = {k: float(np.linalg.norm(getattr(g, k) - getattr(g64, k)) / max(np.linalg.norm(getattr(g64, k)), 1e-30))
           for k in ssm_ref.GRAD_NAMES}
    print("float32 vs float64 backward (norm-relative): " + "  ".join(f"{k} {v:.1e}" for k, v in rel.items()))
    return 0 if ok else 1
