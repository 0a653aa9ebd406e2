"""CUDA tensors through ``backend="ssm_vk"`` without a trip through host memory.

ssm_vk computes on a Vulkan device; torch's CUDA tensors live in CUDA's memory of a GPU. When the
two are the same GPU, this module moves the data between them on the GPU. Its arena is Vulkan
memory exported as a file descriptor (ssm_vk.runtime.external) and imported into CUDA
(``cuImportExternalMemory``, CUDA's driver API through ctypes on ``libcuda.so.1``, which every
CUDA install has: no package is needed), so that torch tensors can be views of it (through
``__cuda_array_interface__``). One call (:func:`forward`, :func:`backward`; ssm_torch's operators
call them for CUDA tensors; Mamba-3's: ssm_torch/_cuda_mamba3.py, through :func:`run`):

1. checks that the tensors' GPU is the Vulkan device: the CUDA device's UUID against the Vulkan
   device's (VkPhysicalDeviceIDProperties.deviceUUID) -- ValueError naming both otherwise;
2. has torch copy each input into its slot of the arena as float32, on torch's current stream
   (any float dtype, any strides: the copy converts), then waits for that stream, so the Vulkan
   work reads the inputs after torch's writes and everything queued before them;
3. runs ssm_vk on DeviceArrays that are the arena's slots, its outputs written straight into
   theirs (``out=``: one Vulkan submission; the call returns once the GPU is done);
4. has torch copy the outputs into new tensors of the inputs' dtypes, on the current stream, and
   records an event there: the next call's writes into the arena wait for those reads.

So the call returns tensors allocated by torch, ordered on torch's current stream; the host waits
in the call (step 2 and 3) as it does for ssm_vk's own calls. ROCm builds of torch are refused
(HIP has the matching import function, not built here); see docs/TORCH.md.
"""

from __future__ import annotations

import torch

from ssm_ref.ops import SCAN
from ssm_vk import runtime as rt
from ssm_vk.arrays import DeviceArray
from ssm_vk.runtime import external

from . import _arena, _common, _driver

__all__ = ["available", "backward", "forward", "release_memory", "require", "shares_memory"]

_F32 = 4
_FWD = SCAN.float_inputs
_N = len(SCAN.inputs)


# ---------------------------------------------------------------------------------------------
# Availability

def _problem(device: torch.device | None) -> str:
    """Why CUDA tensors on ``device`` cannot go through ssm_vk here ("" when they can)."""
    if torch.version.hip is not None:
        return ("this torch is a ROCm build: CUDA tensors through ssm_vk need CUDA's external-memory import "
                "(HIP's hipImportExternalMemory is not wired up; docs/TORCH.md)")
    if not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
        return f"torch {torch.__version__} ({built}) has no usable CUDA device here"
    if device is not None and device.index is not None and device.index >= torch.cuda.device_count():
        return f"{device}: torch sees {torch.cuda.device_count()} CUDA device(s)"
    ok, why = rt.available()
    if not ok:
        return f"ssm_vk cannot run here: {why}"
    return ""


def available(device="cuda") -> tuple[bool, str]:
    """(True, "") when CUDA tensors on ``device`` (a torch.device or its string) can be given to
    ssm_torch with backend="ssm_vk" here, else (False, the reason). Creates no Vulkan context, so
    the check of the GPU's identity (its UUID against the Vulkan device's) is left to the call.
    Never raises for a device string torch accepts."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return False, f"{dev}: not a CUDA device"
    why = _problem(dev)
    return (not why), why


def require(device="cuda") -> None:
    """Raise RuntimeError saying why when :func:`available` is False for ``device``."""
    ok, why = available(device)
    if not ok:
        raise RuntimeError(f"CUDA tensors with backend='ssm_vk': {why}")


# ---------------------------------------------------------------------------------------------
# The two sides of the arena: CUDA (the product) -- tests plug in a host stand-in

class _Span:
    """The ``__cuda_array_interface__`` of float32 memory at ``ptr`` (torch.as_tensor makes a view)."""

    def __init__(self, ptr: int, shape: tuple):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (ptr, False), "version": 3,
                                         "strides": None}


class _Import:
    def __init__(self, ext: int, ptr: int):
        self.ext, self.ptr = ext, ptr


class CudaSide:
    """How the arena meets torch on CUDA device ``ordinal``: the import, the views, the ordering
    on torch's current stream, and the check that the Vulkan device is this GPU."""

    def __init__(self, ordinal: int):
        self.ordinal = ordinal
        self.device = torch.device("cuda", ordinal)
        self.key = f"cuda:{ordinal}"
        self._checked = None   # the Vulkan context found to be this GPU

    def check(self, ctx, named: dict) -> None:
        """RuntimeError when CUDA or the memory sharing is not available; ValueError naming the
        first tensor when ``ctx``'s device is not this GPU. Checked once per context."""
        if self._checked is ctx:
            return
        why = _unusable(ctx, self.device)
        if why:
            raise RuntimeError(f"CUDA tensors with backend='ssm_vk': {why}")
        other = _other_gpu(ctx, self.ordinal)
        if other:
            raise ValueError(f"{next(iter(named))}: {other}")
        self._checked = ctx

    def attach(self, buffer: external.ExportableBuffer) -> _Import:
        return _Import(*_driver.the_driver().import_buffer(self.ordinal, buffer))

    def detach(self, imported: _Import) -> None:
        _driver.the_driver().release(self.ordinal, imported.ext, imported.ptr)

    def view(self, imported: _Import, shape: tuple) -> torch.Tensor:
        return torch.as_tensor(_Span(imported.ptr, tuple(shape)), device=self.device)

    def stream(self):
        return torch.cuda.current_stream(self.device)

    def before_writes(self, arena) -> None:
        """torch's current stream waits for the last call's reads of the arena."""
        if arena.event is not None:
            self.stream().wait_event(arena.event)

    def before_vulkan(self) -> None:
        """The host waits for torch's current stream: its writes into the arena are done."""
        self.stream().synchronize()

    def after_reads(self, arena) -> None:
        event = torch.cuda.Event()
        event.record(self.stream())
        arena.event = event

    def drain(self, arena) -> None:
        """The host waits for the last reads of the arena (before its memory is freed)."""
        if arena.event is not None:
            arena.event.synchronize()


def _unusable(ctx, device: torch.device) -> str:
    """Why CUDA and ``ctx``'s Vulkan device cannot share memory at all ("" when they can)."""
    problem = _problem(device)
    if problem:
        return problem
    ok, why = external.export_support(ctx)
    if not ok:
        return f"{ctx.info.where} ({ctx.info.name}) cannot share memory with CUDA: {why}"
    return ""


def _other_gpu(ctx, ordinal: int) -> str:
    """"" when CUDA device ``ordinal`` is ``ctx``'s Vulkan device (the same UUID), else what differs."""
    mine = _driver.the_driver().uuid(ordinal)
    theirs = external.device_uuid(ctx)
    if mine == theirs:
        return ""
    try:
        same = [i for i, u in enumerate(external.device_uuids()) if u == mine]
    except rt.VulkanUnavailable:
        same = []
    hint = (f"; that GPU is Vulkan device {same[0]}: set SSM_VK_DEVICE={same[0]} before ssm_vk's first call"
            if same else "; no Vulkan device of this machine has that UUID")
    return (f"on cuda:{ordinal} ({torch.cuda.get_device_name(ordinal)}, UUID {_driver.uuid_text(mine)}), but ssm_vk "
            f"computes on {ctx.info.where} ({ctx.info.name}, UUID {_driver.uuid_text(theirs)}): the tensors must be on "
            f"the Vulkan device's GPU{hint}")


def shares_memory(ctx, device="cuda") -> tuple[bool, str]:
    """(True, "") when CUDA tensors on ``device`` can go through ssm_vk on the Vulkan context
    ``ctx``: CUDA usable, ``ctx``'s device exports memory, and it is that GPU (their UUIDs);
    else (False, the reason)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return False, f"{dev}: not a CUDA device"
    why = _unusable(ctx, dev)
    if not why:
        why = _other_gpu(ctx, dev.index if dev.index is not None else torch.cuda.current_device())
    return (not why), why


_sides: dict[int, CudaSide] = {}


def side_for(device: torch.device) -> CudaSide:
    ordinal = device.index if device.index is not None else torch.cuda.current_device()
    side = _sides.get(ordinal)
    if side is None:
        side = _sides.setdefault(ordinal, CudaSide(ordinal))
    return side


# ---------------------------------------------------------------------------------------------
# The arena

def release_memory() -> None:
    """Free the arenas' memory (Vulkan's, and CUDA's imports of it); the next call makes it again."""
    ctx = rt.current_context()
    if ctx is None:
        return
    for side in list(_sides.values()):
        arena = ctx.owned.extension(f"torch-arena:{side.key}")
        if arena is not None:
            with arena.lock:
                arena.trim()


# ---------------------------------------------------------------------------------------------
# The calls

def _signature(tensors) -> tuple | None:
    """What a slot's copy of each tensor depends on: its memory, layout, dtype and version (torch
    counts every in-place write, through any view, as autograd does for the tensors it saves);
    None for inference tensors, which count none."""
    try:
        return tuple((t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t._version) for t in tensors)
    except RuntimeError:
        return None


def run(ctx, side, inputs: dict, outs: dict, call, forward: bool, unread: dict | None = None, keep: bool = True):
    """Inputs into the arena, ``call(arrays, out)`` (ssm_vk's, ``out`` the DeviceArrays over the
    output slots, which it writes), its outputs ``outs`` ({name: (shape, dtype)}) out of the arena
    as new tensors; ``unread`` ({name: shape}): outputs the call writes that no tensor is made of
    (the backward's d_s0). Returns (the backend's result, the tensors).

    The scan's forward inputs stay in their slots (``arena.held``); a backward given those very
    tensors, unwritten since, binds the forward's DeviceArrays of them instead of copying them
    again -- and so ssm_vk's backward finds the tables its chunked forward kept for them
    (engine.KeptForward) instead of computing them again. ``keep=False`` (Mamba-3's calls, whose
    backward keeps nothing of its forward): no slot is kept for a later call."""
    arena = _arena.arena(ctx, side)
    with arena.lock:
        side.before_writes(arena)
        sig = _signature([inputs[n] for n in _FWD]) if keep else None
        held = arena.held
        reuse = held[1] if (not forward and held is not None and sig is not None and held[0] == sig) else {}
        if not reuse:
            arena.held = None   # the slots are written now
        arrays = []
        for name, t in inputs.items():
            a = reuse.get(name)
            if a is not None:
                arrays.append(a)
                continue
            shape = tuple(t.shape)
            if t.numel() == 0:
                arrays.append(DeviceArray(ctx, None, shape, owned=False))
                continue
            slot = arena.slot(name, t.numel() * _F32)
            slot.view(side, shape).copy_(t.detach())
            arrays.append(DeviceArray(ctx, slot.buffer, shape, owned=False))
        if forward and sig is not None:
            arena.held = (sig, dict(zip(_FWD, arrays[:len(_FWD)], strict=True)))
        # the output slots, as the DeviceArrays ssm_vk writes (out=): no copy, no second submission
        shapes = {name: shape for name, (shape, _) in outs.items()}
        shapes.update(unread or {})
        targets, given = {}, {}
        for name, shape in shapes.items():
            n = _numel(shape)
            slot = targets[name] = arena.slot("out:" + name, n * _F32) if n else None
            given[name] = DeviceArray(ctx, None if slot is None else slot.buffer, shape, owned=False)
        try:
            side.before_vulkan()
            r = call(arrays, given)
            tensors = []
            for name, (shape, dtype) in outs.items():
                slot = targets[name]
                if slot is None:
                    tensors.append(torch.zeros(shape, dtype=dtype, device=side.device))
                else:
                    tensors.append(slot.view(side, shape).to(dtype, copy=True))
        finally:   # (a call that raised may have queued copies into the arena: the next call waits for them)
            side.after_reads(arena)
    return r, tuple(tensors)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def host_ids(ids):
    return None if ids is None else ids.detach().cpu().numpy()


def forward(*args, side=None) -> tuple:
    """ssm_torch's forward operators on CUDA tensors. ``args``: the scan's inputs in the declared
    order (s, x, dt, A, B, C, ids), the operators' encoded form ``dt_softplus`` and K (None: no
    snapshots). Returns (y, states) or, with K, (y, states, snapshots), in the dtypes the CPU path
    gives (y in x's, the states in s's). Raises ValueError when the tensors' GPU is not the Vulkan
    device's, RuntimeError when CUDA or the memory sharing is not available."""
    import ssm_vk

    inputs, (dt_softplus, K) = args[:_N], args[_N:]
    arg = dict(zip(SCAN.input_names, inputs, strict=True))
    x, s = arg["x"], arg["s"]
    side = side if side is not None else side_for(x.device)
    named = {n: arg[n] for n in _FWD}
    d = _common.check_shapes(inputs, snapshots=1 if K is None else K)
    ctx = rt.get_context()
    side.check(ctx, named)
    kw = _common.backend_kwargs(("ssm_vk", dt_softplus) if K is None else ("ssm_vk", dt_softplus, K))
    ids_ = host_ids(arg["ids"])
    outs = {"y": ((d.S, d.T, d.H, d.P), x.dtype), "states": ((d.S, d.H, d.P, d.N), s.dtype)}
    if K is not None:
        outs["snapshots"] = ((d.K, d.S, d.H, d.P, d.N), s.dtype)
    r, tensors = run(ctx, side, named, outs, lambda a, out: ssm_vk.ssm_scan(*a, ids_, **kw, out=out), True)
    _common.record("ssm_scan", r, torch.float32)
    return tensors


def backward(*args, side=None) -> tuple:
    """ssm_torch's backward operators on CUDA tensors. ``args``: the scan's inputs in the declared
    order, the cotangents g_y, g_states and g_snapshots (None: no ``g_snapshots`` keyword), the
    encoded form ``dt_softplus``. Returns (d_s, d_x, d_dt, d_A, d_B, d_C), each in its input's
    dtype and shape. Raises as :func:`forward`."""
    import ssm_vk

    inputs, (g_y, g_states, g_snapshots, dt_softplus) = args[:_N], args[_N:]
    arg = dict(zip(SCAN.input_names, inputs, strict=True))
    x, s = arg["x"], arg["s"]
    side = side if side is not None else side_for(x.device)
    named = {n: arg[n] for n in _FWD}
    outs = {SCAN.grad_of[n]: (tuple(t.shape), t.dtype) for n, t in named.items()}
    named["g_y"], named["g_states"] = g_y, g_states
    if g_snapshots is not None:
        named["g_snapshots"] = g_snapshots
    ctx = rt.get_context()
    side.check(ctx, named)
    kw = _common.backend_kwargs(("ssm_vk", dt_softplus))
    ids_ = host_ids(arg["ids"])
    n = len(_FWD)

    def call(a, out):
        extra = {"g_snapshots": a[n + 2]} if g_snapshots is not None else {}
        return ssm_vk.ssm_scan_back(*a[:n], ids_, a[n], a[n + 1], **kw, **extra, out=out)

    d_s0 = {"d_s0": (x.shape[0], *s.shape[1:])}   # written by the call, no tensor of it (no gradient of s0)
    g, tensors = run(ctx, side, named, outs, call, False, d_s0)
    _common.record("ssm_scan_back", g, torch.float32)
    return tensors
