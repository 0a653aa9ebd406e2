"""The replay cache (ssm_vk/replay_cache.py): a device-resident call that repeats an earlier one's
signature -- the same op, input shapes, buffers and offsets, knobs -- runs the prepared call kept
for it (ssm_vk.replay.Replay), skipping the validator's shape checks, the support decision, the
workspace look-up and the input bindings. Every way a kept replay could answer
for a call it must not: a released input (its buffer handed to another array), a different array
in the same buffer, ids changed in place, other knobs, other limits, an evicted workspace, a
closed context. Results always against the float64 oracle."""

from __future__ import annotations

import numpy as np
import pytest
from problems import make_problem
from registry import F32_TOL, Backend, assert_close, oracle_back, oracle_scan

import ssm_ref
import ssm_vk
from ssm_vk import config, replay_cache, workspace
from ssm_vk import engine as vk_engine
from ssm_vk import run as vk_run
from ssm_vk import runtime as rt
from ssm_vk.replay import Replay

pytestmark = pytest.mark.vulkan

VK = Backend(name="ssm_vk", module=ssm_vk, where=r"Vulkan\d+", tol=F32_TOL)
FLOATS = ("s", "x", "dt", "A", "B", "C")


@pytest.fixture
def taken(monkeypatch):
    """For each device call made, whether it came through its kept replay (the prepared call kept for it,
    replay.Replay.run) or the full path (run._run)."""
    seen: list[bool] = []
    real_run, real_replay = vk_run._run, Replay.run

    def run(engine, p, backward, planned, device_out, update=False, **kw):
        seen.append(False)
        return real_run(engine, p, backward, planned, device_out, update, **kw)

    def replay(self, p, inputs):
        seen.append(True)
        return real_replay(self, p, inputs)

    monkeypatch.setattr(vk_run, "_run", run)
    monkeypatch.setattr(Replay, "run", replay)
    return seen


def _case(seed=5, **kw):
    return make_problem(seed, **({"S": 2, "T": 5, "H": 4, "P": 3, "N": 6, "G": 2} | kw))


def _device(case) -> dict:
    a = case.args()
    return {k: (ssm_vk.to_device(v) if k in FLOATS else v) for k, v in a.items()}


def _check(case, d: dict, packed: bool = False, label: str = ""):
    """Forward and backward of the device arrays ``d`` (the values of ``case``) against the oracle."""
    r = ssm_vk.ssm_scan(**d)
    assert r.where.startswith("Vulkan") and isinstance(r.y, ssm_vk.DeviceArray)
    o = oracle_scan(**case.args())
    assert_close(VK, "y", r.y.numpy(), o.y, label=label)
    assert_close(VK, "states", r.states.numpy(), o.states, label=label)
    if packed:
        g_y, g_states = ssm_vk.to_device(np.concatenate([case.g_y.ravel(), case.g_states.ravel()])), None
    else:
        g_y, g_states = ssm_vk.to_device(case.g_y), ssm_vk.to_device(case.g_states)
    g = ssm_vk.ssm_scan_back(**d, g_y=g_y, g_states=g_states)
    og = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    for k in ssm_ref.GRAD_NAMES:
        assert_close(VK, k, getattr(g, k).numpy(), getattr(og, k), label=label)


@pytest.mark.parametrize("packed", [False, True], ids=["structured", "packed"])
@pytest.mark.parametrize("variant", ["mamba2", "mamba1"])
def test_a_repeated_call_takes_its_lane_and_matches_the_oracle(taken, packed, variant):
    case = _case(variant=variant)
    d = _device(case)
    g = {"g_y": ssm_vk.to_device(case.g_y), "g_states": ssm_vk.to_device(case.g_states)}
    if packed:
        g = {"g_y": ssm_vk.to_device(np.concatenate([case.g_y.ravel(), case.g_states.ravel()])), "g_states": None}
    vk_engine.current().replays.clear()
    for _ in range(3):
        r = ssm_vk.ssm_scan(**d)
        b = ssm_vk.ssm_scan_back(**d, **g)
    assert taken == [False, False, True, True, True, True]
    assert r.where == b.where == rt.get_context().info.where and r.backend == b.backend == "ssm_vk"
    o = oracle_scan(**case.args())
    og = oracle_back(**case.args(), g_y=case.g_y, g_states=case.g_states)
    assert_close(VK, "y", r.y.numpy(), o.y)
    assert_close(VK, "states", r.states.numpy(), o.states)
    for k in ssm_ref.GRAD_NAMES:
        assert_close(VK, k, getattr(b, k).numpy(), getattr(og, k))


def test_new_arrays_in_the_same_buffers_take_the_lane_and_compute_their_own_values(taken):
    # What a training loop does: each step's inputs are new DeviceArrays, in the buffers the pool
    # hands back. The lane binds the buffers; the values are the new ones.
    vk_engine.current().replays.clear()
    for seed in range(11, 16):
        case = _case(seed)
        d = _device(case)
        _check(case, d, label=f"seed {seed}")
        for k in FLOATS:
            d[k].release()
        del d
    # The pool hands the buffers back last in, first out: the first steps see their assignments to
    # the inputs permuted (a lane each); from then on every call finds its lane.
    assert taken[:2] == [False, False] and all(taken[-4:]), taken


def test_a_released_input_is_refused_and_its_buffer_reused_is_not_stale(taken):
    case, other = _case(21), _case(22)
    d = _device(case)
    _check(case, d)
    ssm_vk.ssm_scan(**d)
    assert taken[-1] is True
    x, buf = d["x"], d["x"].buffer
    x.release()
    with pytest.raises(RuntimeError, match="released"):  # never a replay of the released array
        ssm_vk.ssm_scan(**d)
    with pytest.raises(RuntimeError, match="released"):
        ssm_vk.ssm_scan_back(**d, g_y=ssm_vk.to_device(case.g_y), g_states=ssm_vk.to_device(case.g_states))
    x2 = ssm_vk.to_device(other.inputs["x"])  # the pool hands the same buffer to a new array
    assert x2.buffer is buf
    d["x"] = x2
    mixed = make_problem(21, S=2, T=5, H=4, P=3, N=6, G=2)
    mixed.inputs["x"] = other.inputs["x"]
    _check(mixed, d, label="x in a reused buffer")


def test_ids_changed_in_place_are_checked_and_used(taken):
    case = _case(31, ids="permutation")
    d = _device(case)
    ids = np.array(case.inputs["ids"])
    d["ids"] = ids
    _check(case, d)
    ids[:] = ids[::-1]  # the same array object, other (valid) values
    flipped = make_problem(31, S=2, T=5, H=4, P=3, N=6, G=2, ids="permutation")
    flipped.inputs["ids"] = ids.copy()
    r = ssm_vk.ssm_scan(**d)
    assert taken[-1] is True
    o = oracle_scan(**flipped.args())
    assert_close(VK, "y", r.y.numpy(), o.y)
    assert_close(VK, "states", r.states.numpy(), o.states)
    _check(flipped, d, label="ids reversed in place")
    ids[0] = 99
    with pytest.raises(ValueError, match=r"^ids: every id must be in \[0, R\)"):
        ssm_vk.ssm_scan(**d)
    ids[0] = -1
    with pytest.raises(ValueError, match=r"^ids: every id must be in \[0, R\).*got -1$"):
        ssm_vk.ssm_scan_back(**d, g_y=ssm_vk.to_device(case.g_y), g_states=ssm_vk.to_device(case.g_states))


def test_a_lane_checks_ids_again_only_when_their_bytes_changed(taken, monkeypatch):
    # A lane keeps the checked copy of its last call's ids: the same bytes take it, other bytes
    # (another array, or the same array written in place) are checked and used.
    from ssm_vk import validate

    case = _case(32, S=3, ids="permutation")
    d = _device(case)
    ids = np.array(case.inputs["ids"])
    d["ids"] = ids
    _check(case, d)
    for _ in range(2):                 # the lane made (a fresh context: by the first), then taken
        ssm_vk.ssm_scan(**d)
    assert taken[-1] is True
    want = ssm_vk.ssm_scan(**case.args()).y
    checked = []
    real = validate.check_ids
    monkeypatch.setattr(validate, "check_ids", lambda *a: checked.append(1) or real(*a))
    for same in (ids, ids.copy()):     # equal bytes: the copy the lane kept
        d["ids"] = same
        assert ssm_vk.ssm_scan(**d).y.numpy().tobytes() == want.tobytes()
        assert taken[-1] is True and checked == [], (taken, checked)
    ids[:] = np.roll(ids, 1)           # other bytes, same object: checked, and the new values used
    d["ids"] = ids
    moved = make_problem(32, S=3, T=5, H=4, P=3, N=6, G=2, ids="permutation")
    moved.inputs["ids"] = ids.copy()
    assert ssm_vk.ssm_scan(**d).y.numpy().tobytes() == ssm_vk.ssm_scan(**moved.args()).y.tobytes()
    assert len(checked) >= 1


def test_other_knobs_never_take_a_lane_made_under_the_old_ones(taken, monkeypatch, knobs):
    case = _case(41, T=40)
    d = _device(case)
    _check(case, d)
    fwd = tuple(d[k] for k in FLOATS)
    before = replay_cache.find(False, fwd, config.settings())[0]
    assert before is not None
    for change in (lambda: monkeypatch.setenv("SSM_VK_TUNE", "CHUNK_MIN_T=1"),
                   lambda: knobs(CHUNK=32),
                   knobs.no_subgroup):
        change()
        assert replay_cache.find(False, fwd, config.settings())[0] is None
        n = len(taken)
        _check(case, d, label="knobs changed")
        assert taken[n:][:2] == [False, False]
        now = replay_cache.find(False, fwd, config.settings())[0]
        assert now is not None and now is not before and now.ws is not before.ws
        before = now


def test_other_limits_never_take_a_lane(taken):
    # A lane made under the device's limits must not run a call that those lowered refuse.
    case = _case(51)
    d = _device(case)
    _check(case, d)
    ctx = rt.get_context()
    n = len(taken)
    with ctx.seams.override_limits(device_local_bytes=512):
        r = ssm_vk.ssm_scan(**d)
        assert r.where == "CPU" and r.backend != "ssm_vk"
    assert len(taken) == n  # no device call
    np.testing.assert_allclose(r.y, ssm_vk.ssm_scan(**d).y.numpy(), rtol=1e-5, atol=1e-6)
    assert taken[-1] is True  # the limits restored (the same ctx.info again): the lane holds


def test_an_evicted_workspace_is_not_used(taken):
    case = _case(61)
    d = _device(case)
    _check(case, d)
    lane = replay_cache.find(False, tuple(d[k] for k in FLOATS), config.settings())[0]
    vk_engine.clear()
    assert lane.ws.closed and replay_cache.find(False, tuple(d[k] for k in FLOATS), config.settings())[0] is None
    _check(case, d, label="after clear_cache")
    assert replay_cache.find(False, tuple(d[k] for k in FLOATS), config.settings())[0].ws is not lane.ws


def test_a_hot_workspace_used_through_its_lane_outlives_cold_ones(taken):
    # Lanes skip _workspace's move to the recent end; eviction gives their workspaces a second chance.
    case = _case(71)
    d = _device(case)
    ssm_vk.ssm_scan(**d)
    hot = replay_cache.find(False, tuple(d[k] for k in FLOATS), config.settings())[0].ws
    for T in range(2, 2 + 2 * vk_engine.MAX_WORKSPACES):
        ssm_vk.ssm_scan(**_device(_case(72, T=T)))
        ssm_vk.ssm_scan(**d)
        assert taken[-1] is True
    assert not hot.closed


def test_a_closed_context_takes_no_lane(taken):
    case = _case(81)
    d = _device(case)
    _check(case, d)
    rt.close()
    with pytest.raises(RuntimeError, match=r"released|closed"):
        ssm_vk.ssm_scan(**d)
    d = _device(case)  # on the new context
    _check(case, d, label="new context")
    assert taken[-2:] == [False, False]
    ssm_vk.ssm_scan(**d)
    assert taken[-1] is True


def test_a_refused_case_is_never_laned(taken):
    case = _case(91)
    d = _device(case)
    ctx = rt.get_context()
    vk_engine.current().replays.clear()
    with ctx.seams.override_limits(device_local_bytes=512):
        for _ in range(2):
            assert ssm_vk.ssm_scan(**d).where == "CPU"
    assert not vk_engine.current().replays and taken == []


def test_a_workspace_keeps_its_attributes_few_enough_for_shared_keys():
    # Every call reads a dozen attributes of its workspace: past MAX_ATTRIBUTES, CPython 3.11 gives
    # each instance a dict of its own, and those reads slow every call (workspace.py says by how much).
    case = _case(variant="mamba2")
    d = _device(case)
    ssm_vk.ssm_scan(**d)
    ssm_vk.ssm_scan_back(**d, g_y=ssm_vk.to_device(case.g_y), g_states=ssm_vk.to_device(case.g_states))
    spaces = list(vk_engine.current().workspaces.values())
    assert spaces and all(len(vars(ws)) <= workspace.MAX_ATTRIBUTES for ws in spaces), [len(vars(w)) for w in spaces]
