"""ssm_torch.cuda's machinery on any machine: the arena of exported Vulkan memory, the order of
its steps, the dtypes, strides, snapshots and gradients it carries, the check that the CUDA
device is the Vulkan device's GPU, and the errors of CUDA tensors where they cannot be used.

The arena's other side is CUDA on a GPU (tests/pytorch/test_cuda_tensors.py). Here a host stand-in
takes its place: its "import" is the exported buffer's host mapping (lavapipe's memory is host
visible), its tensors CPU tensors over that mapping, so every step but the import and the stream
waits runs as it does on a GPU. Expected values come from ssm_ref in float64 on the same numbers.
"""

import re

import numpy as np
import pytest
from torchreq import need_torch

torch = need_torch()

from bridgecheck import NAMES, assert_close_as, leaves, oracle, rounded  # noqa: E402
from problems import make_problem  # noqa: E402

import ssm_torch  # noqa: E402
from ssm_torch import _bridge, _common, _driver, cuda  # noqa: E402
from ssm_vk import runtime as rt  # noqa: E402
from ssm_vk.runtime import external  # noqa: E402

pytestmark = pytest.mark.vulkan

GGML = _common.encode("ggml")


@pytest.mark.parametrize(("variant", "ids"), [("mamba2", "permutation"), ("mamba1", "duplicates"),
                                              ("mamba2", "none")])
def test_forward_and_backward_against_the_float64_oracle(side, variant, ids):
    case = make_problem(21, S=2, T=6, H=4, P=3, N=8, G=2, R=3, ids=ids, variant=variant)
    t, ids_t = leaves(case, requires_grad=False)
    y, states = cuda.forward(*(t[k] for k in NAMES), ids_t, GGML, None, side=side)
    gy, gs = np.asarray(case.g_y, np.float64), np.asarray(case.g_states, np.float64)
    want, gwant = oracle(t, ids_t, gy, gs)
    assert y.dtype == states.dtype == torch.float32
    assert_close_as(torch.float32, "y", y, want.y)
    assert_close_as(torch.float32, "states", states, want.states)
    w = ssm_torch.last_where()
    assert (w.op, w.backend) == ("ssm_scan", "ssm_vk") and w.where.startswith("Vulkan"), w
    grads = cuda.backward(*(t[k] for k in NAMES), ids_t, torch.tensor(gy, dtype=torch.float32),
                          torch.tensor(gs, dtype=torch.float32), None, GGML, side=side)
    for k, g in zip(NAMES, grads, strict=True):
        assert g.shape == t[k].shape and g.dtype == torch.float32
        assert_close_as(torch.float32, "d_" + k, g, getattr(gwant, "d_" + k))
    assert ssm_torch.last_where().op == "ssm_scan_back"


def test_the_steps_run_in_order(side):
    # torch writes the inputs, then the host waits for torch's stream, then Vulkan, then torch
    # reads the outputs, then the event that the next call's writes wait for
    case = make_problem(22, S=1, T=3, H=2, P=2, N=4, G=1, R=1, ids="identity")
    t, ids = leaves(case, requires_grad=False)
    cuda.forward(*(t[k] for k in NAMES), ids, GGML, None, side=side)
    log = side.log
    assert log[0] == "check" and log[1] == "before_writes"
    cut = log.index("before_vulkan")
    assert log[2:cut] == [f"view {tuple(t[k].shape)}" for k in NAMES]
    assert log[cut + 1:] == ["view (1, 3, 2, 2)", "view (1, 2, 2, 4)", "after_reads"]


def test_a_call_that_raises_still_marks_the_arena_for_the_next(side, monkeypatch):
    # torch's copies into the arena are queued when ssm_vk raises: the event after them is still
    # recorded, so the next call's writes (maybe on another stream) wait for them
    import ssm_vk

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(ssm_vk, "ssm_scan", boom)
    case = make_problem(26, S=1, T=3, H=2, P=2, N=4, G=1, R=1, ids="identity")
    t, ids = leaves(case, requires_grad=False)
    with pytest.raises(RuntimeError, match="boom"):
        cuda.forward(*(t[k] for k in NAMES), ids, GGML, None, side=side)
    assert side.log[-2:] == ["before_vulkan", "after_reads"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtypes_in_and_out(side, dtype):
    # computed in float32 from the inputs as given, returned in their dtypes (as the CPU path)
    case = make_problem(23, S=2, T=5, H=2, P=3, N=4, G=1, R=2, ids="identity")
    t, ids = leaves(case, dtype, requires_grad=False, dtypes={"s": torch.float32})
    y, states = cuda.forward(*(t[k] for k in NAMES), ids, GGML, None, side=side)
    assert y.dtype == dtype and states.dtype == torch.float32
    gy, gs = rounded(case.g_y, dtype), np.asarray(case.g_states, np.float64)
    want, gwant = oracle(t, ids, gy, gs)
    assert_close_as(dtype, "y", y, want.y)
    assert_close_as(torch.float32, "states", states, want.states)
    grads = cuda.backward(*(t[k] for k in NAMES), ids, torch.tensor(gy).to(dtype), torch.tensor(gs).float(), None,
                          GGML, side=side)
    for k, g in zip(NAMES, grads, strict=True):
        assert g.dtype == t[k].dtype, k
        assert_close_as(t[k].dtype, "d_" + k, g, getattr(gwant, "d_" + k))


def test_non_contiguous_inputs(side):
    case = make_problem(24, S=2, T=4, H=4, P=3, N=5, G=2, R=2, ids="permutation")
    t, ids = leaves(case, requires_grad=False)
    odd = {"x": t["x"].transpose(0, 1).contiguous().transpose(0, 1),           # time-major storage
           "B": torch.stack([t["B"], t["B"] * 0], dim=-1)[..., 0],              # every other element
           "C": t["C"].permute(3, 2, 1, 0).contiguous().permute(3, 2, 1, 0),
           "A": t["A"].expand(2, -1)[0]}
    args = {**t, **odd}
    assert not any(args[k].is_contiguous() for k in ("x", "B", "C"))
    y, states = cuda.forward(*(args[k] for k in NAMES), ids, GGML, None, side=side)
    want, _ = oracle(t, ids, case.g_y, case.g_states)
    assert_close_as(torch.float32, "y", y, want.y)
    assert_close_as(torch.float32, "states", states, want.states)


def test_snapshots_and_their_gradient(side):
    case = make_problem(25, S=2, T=5, H=4, P=3, N=8, G=2, R=3, ids="permutation")
    K = 7   # slot 5 the start state, slot 6 NaN
    t, ids = leaves(case, requires_grad=False)
    y, states, snaps = cuda.forward(*(t[k] for k in NAMES), ids, GGML, K, side=side)
    g_snap = np.random.default_rng(1).uniform(-1, 1, snaps.shape)
    held = g_snap.copy()
    held[6:] = 0.0
    want, gwant = oracle(t, ids, case.g_y, case.g_states, K=K, g_snapshots=held)
    assert snaps.shape == (K, 2, 4, 3, 8) and torch.isnan(snaps[6]).all() and not torch.isnan(snaps[:6]).any()
    assert_close_as(torch.float32, "y", y, want.y)
    assert_close_as(torch.float32, "states", states, want.states)
    for k in range(K):
        assert_close_as(torch.float32, "states", snaps[k], want.snapshots[k], label=f"slot {k}")
    grads = cuda.backward(*(t[k] for k in NAMES), ids, torch.tensor(case.g_y).float(),
                          torch.tensor(case.g_states).float(), torch.tensor(g_snap).float(), GGML, side=side)
    for k, g in zip(NAMES, grads, strict=True):
        assert_close_as(torch.float32, "d_" + k, g, getattr(gwant, "d_" + k))


def test_slots_grow_are_reused_and_are_freed(side, ctx_mapped):
    small = make_problem(26, S=1, T=2, H=2, P=2, N=4, G=1, R=1, ids="identity")
    big = make_problem(27, S=2, T=16, H=8, P=128, N=16, G=1, R=2, ids="identity")   # x: 128 KiB
    for case in (small, small, big, small):
        t, ids = leaves(case, requires_grad=False)
        y, _ = cuda.forward(*(t[k] for k in NAMES), ids, GGML, None, side=side)
        want, _ = oracle(t, ids, case.g_y, case.g_states)
        assert_close_as(torch.float32, "y", y, want.y)
    arena = ctx_mapped.owned.extension(f"torch-arena:{side.key}")
    assert sorted(arena.slots) == sorted([*NAMES, "out:y", "out:states"])
    assert side.attached == len(arena.slots)    # each slot imported once per size it had
    assert side.log.count("drain") > 0          # a slot grew: the other side's reads were waited for
    assert arena.slots["x"].buffer.size >= 2 * 16 * 8 * 128 * 4
    held = ctx_mapped.live_allocations.count
    with arena.lock:
        arena.trim()
    assert side.attached == 0 and not arena.slots
    assert ctx_mapped.live_allocations.count == held - 8   # the slots' memory, no more (ssm_vk's pool keeps its own)


def test_outputs_are_copies_that_later_calls_leave_alone(side):
    c1 = make_problem(28, S=1, T=3, H=2, P=2, N=4, G=1, R=1, ids="identity")
    c2 = make_problem(29, S=1, T=3, H=2, P=2, N=4, G=1, R=1, ids="identity")
    t1, _ = leaves(c1, requires_grad=False)
    t2, _ = leaves(c2, requires_grad=False)
    y1, _ = cuda.forward(*(t1[k] for k in NAMES), None, GGML, None, side=side)
    kept = y1.clone()
    cuda.forward(*(t2[k] for k in NAMES), None, GGML, None, side=side)
    assert torch.equal(y1, kept)


# ---------------------------------------------------------------------------------------------
# The GPU's identity (a fake driver answers for CUDA)

class FakeDriver:
    def __init__(self, uuid):
        self._uuid = uuid

    def uuid(self, ordinal):
        return self._uuid


@pytest.fixture
def fake_cuda(monkeypatch, ctx_mapped):
    monkeypatch.setattr(cuda, "_problem", lambda device: "")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda ordinal=None: "Fake GPU")

    def use(uuid, listed=None):
        monkeypatch.setattr(_driver, "the_driver", lambda: FakeDriver(uuid))
        if listed is not None:
            monkeypatch.setattr(external, "device_uuids", lambda: listed)
    return use


def test_a_tensor_on_another_gpu_is_refused_naming_it_and_both_devices(fake_cuda, ctx_mapped):
    ours = external.device_uuid(ctx_mapped)
    other = bytes(range(16))
    fake_cuda(other)
    x = torch.zeros(1)
    text = (rf"^x: on cuda:0 \(Fake GPU, UUID 00010203-0405-0607-0809-0a0b0c0d0e0f\), but ssm_vk computes on "
            rf"{ctx_mapped.info.where} \({re.escape(ctx_mapped.info.name)}, UUID {ours[:4].hex()}-.*\): the tensors "
            rf"must be on "
            rf"the Vulkan device's GPU; no Vulkan device of this machine has that UUID$")
    with pytest.raises(ValueError, match=text):
        cuda.CudaSide(0).check(ctx_mapped, {"x": x, "s": x})
    ok, why = cuda.shares_memory(ctx_mapped, "cuda:0")
    assert not ok and why.startswith("on cuda:0 (Fake GPU")
    fake_cuda(other, listed=[ours, other])   # the same GPU is another Vulkan device: say which
    with pytest.raises(ValueError, match=r"that GPU is Vulkan device 1: set SSM_VK_DEVICE=1 before"):
        cuda.CudaSide(0).check(ctx_mapped, {"s": x})
    fake_cuda(ours)   # the same GPU: accepted, and not asked again for this context
    side = cuda.CudaSide(0)
    side.check(ctx_mapped, {"x": x})
    assert cuda.shares_memory(ctx_mapped, "cuda:0") == (True, "")
    fake_cuda(other)
    side.check(ctx_mapped, {"x": x})


# ---------------------------------------------------------------------------------------------
# Where CUDA cannot be used

def test_available_and_require_say_why_not(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ok, why = cuda.available("cuda")
    assert not ok and why.startswith(f"torch {torch.__version__} (") and why.endswith("has no usable CUDA device here")
    with pytest.raises(RuntimeError, match=r"^CUDA tensors with backend='ssm_vk': torch .* has no usable CUDA device"):
        cuda.require("cuda:0")
    assert cuda.available("cpu") == (False, "cpu: not a CUDA device")
    with pytest.raises(RuntimeError, match=r"^CUDA tensors with backend='ssm_vk': torch .* no usable CUDA device"):
        cuda.CudaSide(0).check(rt.get_context(), {"x": torch.zeros(1)})
    monkeypatch.setattr(torch.version, "hip", "6.2")
    ok, why = cuda.available("cuda")
    assert not ok and why.startswith("this torch is a ROCm build")


class FakeCuda(torch.Tensor):
    """A tensor that says it is on a CUDA device (no data: the checks before any work read only its
    device, dtype and shape)."""

    @staticmethod
    def __new__(cls, shape, index=0):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.float32, device=f"cuda:{index}")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise AssertionError(f"{func} ran on a tensor the checks should have refused")


def fake_args(index=0):
    return [FakeCuda(shape, index) for shape in ((2, 2, 2, 4), (2, 3, 2, 2), (2, 3, 2), (2,), (2, 3, 1, 4),
                                                   (2, 3, 1, 4))]


def test_cuda_tensors_are_refused_by_the_host_backends_naming_the_tensor():
    for backend in ("ssm_fast", "ssm_ref"):
        with pytest.raises(ValueError, match=r"^s: expected a CPU tensor \(ssm-scan's backends compute from host "
                                             r"memory\) \(CUDA tensors: with backend='ssm_vk'\), got one on cuda:0"):
            ssm_torch.ssm_scan(*fake_args(), backend=backend)
    with pytest.raises(ValueError, match=r"^CUDA tensors: backend='ssm_fast' computes from host memory"):
        _bridge.cuda_module("ssm_fast")


def test_cuda_tensors_must_share_one_device_and_ids_may_be_on_the_cpu():
    a = fake_args()
    cpu_x = torch.zeros(2, 3, 2, 2)
    with pytest.raises(ValueError, match=r"^x: on cpu, the other tensors on cuda:0$"):
        ssm_torch.ssm_scan(a[0], cpu_x, *a[2:], backend="ssm_vk")
    with pytest.raises(ValueError, match=r"^C: on cuda:1, the other tensors on cuda:0$"):
        ssm_torch.ssm_scan(*a[:5], fake_args(1)[5], backend="ssm_vk")
    with pytest.raises(ValueError, match=r"^ids: on cuda:1, the other tensors on cuda:0; ids may be on the CPU"):
        ssm_torch.ssm_scan(*a, FakeCuda((2,), 1), backend="ssm_vk")
    with pytest.raises(ValueError, match=r"^ids: on meta, the other tensors on cuda:0"):
        ssm_torch.ssm_scan(*a, torch.zeros(2, dtype=torch.int64, device="meta"), backend="ssm_vk")


def test_a_backward_binds_the_inputs_its_forward_left_while_they_are_unwritten(side, monkeypatch):
    # the chunked kernels (forced): the backward of the very tensors its forward copied binds the
    # forward's arrays, so ssm_vk takes the chunk tables that forward kept; a tensor written in
    # place since (its version moved) is copied again, and the gradient is that of its new values
    from ssm_vk import engine as vk_engine

    monkeypatch.setenv("SSM_VK_TUNE", "CHUNK=16,CHUNK_MIN_T=1")
    vk_engine.clear()
    try:
        case = make_problem(24, S=2, T=40, H=4, P=3, N=5, G=2, R=2, ids="identity")
        t, ids = leaves(case, requires_grad=False)
        gy64, gs64 = np.asarray(case.g_y, np.float64), np.asarray(case.g_states, np.float64)
        gy, gs = torch.tensor(gy64, dtype=torch.float32), torch.tensor(gs64, dtype=torch.float32)

        def back():
            before = vk_engine.current().states_reused
            g = cuda.backward(*(t[k] for k in NAMES), ids, gy, gs, None, GGML, side=side)
            return g, vk_engine.current().states_reused - before

        cuda.forward(*(t[k] for k in NAMES), ids, GGML, None, side=side)
        bound, reused = back()
        assert reused == 1
        again, reused = back()                    # a second backward of the same forward binds them too
        assert reused == 1 and all(torch.equal(a, b) for a, b in zip(bound, again, strict=True))
        t["x"].add_(0.0)                          # same values, a new version: copied, tables recomputed
        copied, reused = back()
        assert reused == 0
        assert all(torch.equal(a, b) for a, b in zip(bound, copied, strict=True))
        t["x"].mul_(1.5)                          # new values: the gradient at them
        moved, reused = back()
        assert reused == 0
        _, gwant = oracle(t, ids, gy64, gs64)
        for k, g in zip(NAMES, moved, strict=True):
            assert_close_as(torch.float32, "d_" + k, g, getattr(gwant, "d_" + k))
        assert not torch.equal(moved[2], bound[2])   # d_dt reads x (d_x does not)
    finally:
        vk_engine.clear()


def test_a_forward_and_a_backward_make_one_submission_each(side, ctx_mapped):
    # ssm_vk writes its outputs straight into the arena's output slots (out=): the scan's own
    # submission is the call's one, no copy after it
    case = make_problem(30, S=2, T=6, H=4, P=3, N=8, G=2, R=3, ids="permutation")
    t, ids = leaves(case, requires_grad=False)
    gy, gs = np.asarray(case.g_y, np.float64), np.asarray(case.g_states, np.float64)
    gy_t, gs_t = torch.tensor(gy, dtype=torch.float32), torch.tensor(gs, dtype=torch.float32)
    for _ in range(2):   # the second time: recorded, slots made
        stats = ctx_mapped.stats
        n = stats.submits
        y, states = cuda.forward(*(t[k] for k in NAMES), ids, GGML, None, side=side)
        assert stats.submits == n + 1
        grads = cuda.backward(*(t[k] for k in NAMES), ids, gy_t, gs_t, None, GGML, side=side)
        assert stats.submits == n + 2
    want, gwant = oracle(t, ids, gy, gs)
    assert_close_as(torch.float32, "y", y, want.y)
    assert_close_as(torch.float32, "states", states, want.states)
    for k, g in zip(NAMES, grads, strict=True):
        assert_close_as(torch.float32, "d_" + k, g, getattr(gwant, "d_" + k))
