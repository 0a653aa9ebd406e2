"""ssm_vk plans a problem shape once: the support decision makes the plan (ssm_vk.registry.plan) and
checks its kernels, and the workspace and the recording run that very plan -- no call plans
again, and a repeated call of the same shape plans nothing.

The count of registry.plan calls a call makes, counted where ssm_vk.decision calls it:
- the first call of a new shape: 1 (the decision's plan; where its results are flagged when
  non-finite, the plan that recomputes them is made with it, registry.plan's rerun);
- a repeat of it (host arrays: the cached decision; DeviceArrays: also the kept replay): 0;
- the first result of a shape that the chunked kernels flag as non-finite: 0 more -- the
  recompute runs the plan the decision made; its repeats: 0.
(Where a family's kernels cannot be had -- no SPIR-V, or the device does not take them -- the
decision plans twice: the plan without them. Not reached here: lavapipe and glslc take them.)
"""

from __future__ import annotations

import pytest
from problems import make_problem

import ssm_ref
import ssm_vk
import ssm_vk.support
from ssm_vk import config
from ssm_vk import decision as vk_decision
from ssm_vk import engine as vk_engine
from ssm_vk import runtime as rt
from ssm_vk.sizing import Limits

pytestmark = pytest.mark.vulkan

# name -> (knobs, problem sizes, variant, the family that must run it, over time chunks)
KINDS = {
    "chunked": ({"CHUNK": 16, "CHUNK_MIN_T": 1}, dict(S=2, T=40, H=4, P=3, N=5, G=2), "mamba2", ("chunked", False)),
    "sequential": ({"CHUNK": 0, "TCHUNK": 0, "M1": 0}, dict(S=2, T=12, H=4, P=3, N=5, G=2), "mamba2",
                   ("sequential", False)),
    "time-chunks": ({"CHUNK": 0, "M1": 0, "TCHUNK": 16}, dict(S=1, T=64, H=2, P=3, N=5, G=1), "mamba2",
                    ("sequential", True)),
    "mamba1": ({"M1": 1}, dict(S=2, T=24, P=1, N=4, G=1), "mamba1", ("m1", False)),
}


@pytest.fixture
def plans(monkeypatch):
    """The number of ssm_vk.registry.plan calls the decision made since the last reset (``plans.n``;
    ``plans.reset()``)."""
    real = vk_decision.plan

    class Count:
        n = 0

        def reset(self) -> None:
            self.n = 0

    count = Count()

    def counted(*args, **kwargs):
        count.n += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(vk_decision, "plan", counted)
    vk_engine.clear()
    yield count
    vk_engine.clear()


def _case(kind: str, seed: int, regime: str = "typical"):
    _, sizes, variant, _ = KINDS[kind]
    if variant == "mamba1":   # whole subgroups of channels: the Mamba-1 kernels with time in threads
        sizes = {**sizes, "H": 2 * Limits.of(rt.get_context().info).subgroup_size}
    return make_problem(seed, **sizes, variant=variant, regime=regime)


def _inputs(case, resident: bool):
    args = dict(case.args())
    grads = {"g_y": case.g_y, "g_states": case.g_states}
    if resident:
        args = {k: (v if k == "ids" else ssm_vk.to_device(v)) for k, v in args.items()}
        grads = {k: ssm_vk.to_device(v) for k, v in grads.items()}
    return args, grads


def _call(backward: bool, args: dict, grads: dict):
    r = ssm_vk.ssm_scan_back(**args, **grads) if backward else ssm_vk.ssm_scan(**args)
    assert r.where.startswith("Vulkan"), r.where
    return r


@pytest.mark.parametrize("resident", [False, True], ids=["host", "device"])
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_new_shape_plans_once_and_its_repeats_never(plans, kind, backward, resident):
    tune, _, _, (family, over_time) = KINDS[kind]
    case = _case(kind, 11)
    args, grads = _inputs(case, resident)
    with config.configure(tune=tune):
        plans.reset()
        _call(backward, args, grads)
        assert plans.n == 1, f"the first call of a new shape planned {plans.n} times"
        for _ in range(3):
            _call(backward, args, grads)
        assert plans.n == 1, f"repeated calls planned {plans.n - 1} more times"
        # the workspace that ran the calls runs the decision's own plan object
        if backward:   # (the very problem of the calls: the decision's key holds the inputs' types)
            p, op = ssm_ref.check_backward(**args, **grads, keep_device=True), "ssm_scan_back"
        else:
            p, op = ssm_ref.check_forward(**args, keep_device=True), "ssm_scan"
        planned = ssm_vk.support.decision(op, p, config.settings()).planned
        ctx = rt.get_context()
        ws = vk_engine.engine_of(ctx).find_workspace(planned.dims, backward, Limits.of(ctx.info), config.settings())
        assert ws is not None and ws.plan is planned.first.plan and ws.family is planned.first.family
        assert plans.n == 1
    first = planned.first
    assert first.family.name == family, f"{kind}: {family} does not run it: {first}"
    assert bool(getattr(first.plan, "tchunk", 0)) == over_time
    # a plan that flags its inf and nan comes with its recompute's (made once, with it)
    assert (first.rerun is not None) == (family != "sequential" or over_time)
    assert first.rerun is None or ws.flags_nonfinite


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
def test_the_recompute_of_a_nonfinite_result_plans_once(plans, backward):
    case = _case("chunked", 5, regime="nonfinite")
    args, grads = _inputs(case, resident=False)
    engine = vk_engine.engine_of(rt.get_context())
    with config.configure(tune=KINDS["chunked"][0]):
        plans.reset()
        reruns = engine.reruns
        _call(backward, args, grads)
        assert engine.reruns == reruns + 1, "the chunked kernels did not flag the non-finite result"
        assert plans.n == 1, f"a first non-finite call planned {plans.n} times (the decision's plans: once)"
        _call(backward, args, grads)
        assert engine.reruns == reruns + 2
        assert plans.n == 1, f"a repeated non-finite call planned {plans.n - 1} more times"
