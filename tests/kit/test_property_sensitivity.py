"""Each property can fail: for every property, a small mutant of the reference (one plausible
bug) and a case where the property must reject the mutant while accepting ssm_ref itself.
(The perturbed-kernel experiment on the real backends is described in docs/SPEC.md.)"""

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

import ssm_ref
from ssm_ref import ScanGrads, ScanResult
from ssm_ref.testing.cases import make_problem
from ssm_ref.testing.properties import PROPERTIES, PropertyFailed
from ssm_ref.tolerance import F32_TOL


def mutant(name, forward=None, backward=None):
    """ssm_ref with its results passed through ``forward(args, result_dict)`` /
    ``backward(args, grads_dict)``, or with its arguments rewritten (see callers)."""
    def ssm_scan(s, x, dt, A, B, C, ids=None):
        r = ssm_ref.ssm_scan(s, x, dt, A, B, C, ids)
        out = {"y": r.y, "states": r.states}
        if forward:
            out = forward(dict(s=s, x=x, dt=dt, A=A, B=B, C=C, ids=ids), out)
        return ScanResult(**out, where="CPU", backend=name)

    def ssm_scan_back(s, x, dt, A, B, C, ids, g_y, g_states):
        g = ssm_ref.ssm_scan_back(s, x, dt, A, B, C, ids, g_y, g_states).as_dict()
        if backward:
            g = backward(dict(s=s, x=x, dt=dt, A=A, B=B, C=C, ids=ids, g_y=g_y, g_states=g_states), g)
        return ScanGrads(**g, where="CPU", backend=name)

    return SimpleNamespace(NAME=name, ssm_scan=ssm_scan, ssm_scan_back=ssm_scan_back, supports=ssm_ref.supports)


def scaled(key, k):
    return lambda a, out: {**out, key: (out[key] * np.float32(k)).astype(np.float32)}


def _sorted_ids():
    def fwd(s, x, dt, A, B, C, ids=None):
        r = ssm_ref.ssm_scan(s, x, dt, A, B, C, None if ids is None else np.sort(ids))
        return ScanResult(y=r.y, states=r.states, where="CPU", backend="sorted_ids")

    def back(s, x, dt, A, B, C, ids, g_y, g_states):
        g = ssm_ref.ssm_scan_back(s, x, dt, A, B, C, None if ids is None else np.sort(ids), g_y, g_states)
        return ScanGrads(**g.as_dict(), where="CPU", backend="sorted_ids")

    return SimpleNamespace(NAME="sorted_ids", ssm_scan=fwd, ssm_scan_back=back, supports=ssm_ref.supports)


def _interleaved_groups():
    """Head h reads group h % G instead of h // (H / G) (B and C expanded per head)."""
    def expand(H, B):
        G = B.shape[2]
        return B[:, :, np.arange(H) % G]                     # (S, T, H, N)

    def fwd(s, x, dt, A, B, C, ids=None):
        H = x.shape[2]
        r = ssm_ref.ssm_scan(s, x, dt, A, expand(H, B), expand(H, C), ids)
        return ScanResult(y=r.y, states=r.states, where="CPU", backend="interleaved_groups")

    def back(s, x, dt, A, B, C, ids, g_y, g_states):
        H, G = x.shape[2], B.shape[2]
        g = ssm_ref.ssm_scan_back(s, x, dt, A, expand(H, B), expand(H, C), ids, g_y, g_states).as_dict()
        for k in ("d_B", "d_C"):
            folded = np.zeros(B.shape, np.float32)
            for h in range(H):
                folded[:, :, h % G] += g[k][:, :, h]
            g[k] = folded
        return ScanGrads(**g, where="CPU", backend="interleaved_groups")

    return SimpleNamespace(NAME="interleaved_groups", ssm_scan=fwd, ssm_scan_back=back, supports=ssm_ref.supports)


_calls = itertools.count()


def _flaky(a, out):
    y = out["y"].copy()
    if y.size and next(_calls) % 2:
        y.flat[0] = np.nextafter(y.flat[0], np.float32(np.inf))
    return {**out, "y": y}


def _unscattered(a, g):
    d_s = np.zeros_like(g["d_s"])
    d_s[: g["d_s0"].shape[0]] = g["d_s0"]                    # ggmlR's d_s0 added row for row
    return {**g, "d_s": d_s}


def _half_mamba2_dA(a, g):
    return {**g, "d_A": g["d_A"] * np.float32(0.5)} if np.ndim(a["A"]) == 1 else g


TYPICAL = dict(S=2, T=4, H=4, P=2, N=3, G=2, R=3, ids="permutation")

# property -> (mutant, case arguments): the case is one where the bug shows.
MUTANTS = {
    "oracle_forward": (mutant("y_off", forward=scaled("y", 1 + 1e-4)), TYPICAL),
    "oracle_backward": (mutant("dB_off", backward=scaled("d_B", 1 + 1e-4)), TYPICAL),
    "adjoint": (mutant("dx_off", backward=scaled("d_x", 1 + 1e-3)), TYPICAL),
    "split_tokens": (mutant("no_g_states", backward=lambda a, g: ssm_ref.ssm_scan_back(
        **{k: v for k, v in a.items() if k != "g_states"}, g_states=np.zeros_like(a["g_states"])).as_dict()),
        dict(TYPICAL, T=6)),
    "group_broadcast": (_interleaved_groups(), dict(S=1, T=3, H=8, P=1, N=2, G=2, R=1, ids="identity")),
    "mamba2_as_mamba1": (mutant("half_dA", backward=_half_mamba2_dA), TYPICAL),
    "permute_sequences": (_sorted_ids(), dict(TYPICAL, S=3, R=4)),
    "scatter_of_d_s0": (mutant("unscattered", backward=_unscattered), TYPICAL),
    "linear_backward": (mutant("affine", backward=lambda a, g: {**g, "d_x": g["d_x"] + np.float32(1e-3)}), TYPICAL),
    "deterministic": (mutant("flaky", forward=_flaky), TYPICAL),
    "nonfinite_pattern": (mutant("nan_to_num", forward=lambda a, out: {**out, "y": np.nan_to_num(out["y"])}),
                          dict(TYPICAL, regime="overflow")),
}


def test_every_property_has_a_mutant():
    assert set(MUTANTS) == set(PROPERTIES)


@pytest.mark.parametrize("name", list(MUTANTS))
def test_property_rejects_its_mutant_and_accepts_the_reference(name):
    prop = PROPERTIES[name]
    bad, kw = MUTANTS[name]
    for seed in range(3):
        case = make_problem(1000 + seed, **kw)
        assert prop.check(ssm_ref, case, F32_TOL), "the property must apply to this case"
        with pytest.raises(PropertyFailed, match=name):
            prop.check(bad, case, F32_TOL)
