"""One SSM_SCAN graph on one ggml backend device, built the way llama.cpp's Mamba graphs build it.

Our shapes (numpy C order) and ggml's (``ne``, fastest axis first) are the same bytes:

    s    (R, H, P, N)   ne (N, P, H, R)   F32   the state cache; sequence i starts from row ids[i]
    x    (S, T, H, P)   ne (P, H, T, S)   F32
    dt   (S, T, H)      ne (H, T, S)      F32
    A    (H,) | (H, 1)  ne (1, H)         F32   Mamba-2: one decay rate per head
         (H, N)         ne (N, H)         F32   Mamba-1
    B, C (S, T, G, N)   ne (N, G, T, S)   F32
    ids  (S,)           ne (S,)           I32
    out  1-D, S*T*H*P + K*S*H*P*N floats: y (ne (P, H, T, S)) then K state slots (ne (N, P, H, S)
         each, slot-major), slot 0 the final states; K = 1 on a build without K (lib.GgmlLibrary.has_k)

The K snapshot slots (ggml_ssm_scan's trailing K, docs/SPEC.md section 3.1): ggml writes slot k
(the state after T - k tokens) for k < T only; the others keep the output's fill below.

The output tensor is filled with a NaN of a payload of its own (UNWRITTEN_BITS) before every
compute, so an entry ggml leaves unwritten reads as NaN (not as whatever the buffer held) and is
told apart from a NaN that ggml computed, and it is followed by a guard tensor of known bytes:
a kernel that writes past the end of its output changes the guard, which :meth:`ScanGraph.run`
reports. The caller's arrays are copied into ggml's buffers; nothing is written back to them.
"""

from __future__ import annotations

import time

import numpy as np

from ssm_ref.ops import SCAN

from .lib import GGML_STATUS_SUCCESS, GGML_TYPE_F32, GGML_TYPE_I32, GgmlLibrary, missing_device

__all__ = ["GUARD_FLOATS", "UNWRITTEN_BITS", "Device", "GgmlError", "OutputOverrun", "ScanGraph", "unwritten"]

GUARD_FLOATS = 4096               # floats of the guard after the output
_GUARD_BITS = np.uint32(0x7FC0_5EED)  # NaN payloads no kernel computes: the guard's,
UNWRITTEN_BITS = np.uint32(0x7FC0_0DEF)  # and the output's fill (an entry still holding it was never written)
_F32 = np.float32


class GgmlError(RuntimeError):
    """ggml refused or failed a step (graph compute status, allocation) or wrote past an output."""


class Device:
    """A ggml backend device by its ggml name ("CPU", "Vulkan0", ...), with its backend started
    on first use. ``threads`` sets the CPU backend's thread count (ignored elsewhere)."""

    def __init__(self, lib: GgmlLibrary, name: str, threads: int | None = None):
        self.lib, self.name, self.threads = lib, name, threads
        self.dev = lib.fn["ggml_backend_dev_by_name"](name.encode())
        if not self.dev:
            raise ValueError(missing_device(name, lib.folder, [n for n, _ in lib.devices()]))
        self.description = lib.fn["ggml_backend_dev_description"](self.dev).decode(errors="replace")
        self._backend = None

    @property
    def backend(self) -> int:
        if self._backend is None:
            b = self.lib.fn["ggml_backend_dev_init"](self.dev, None)
            if not b:
                raise GgmlError(f"ggml_backend_dev_init({self.name}) returned NULL")
            if self.threads and "ggml_backend_cpu_set_n_threads" in self.lib.fn and self.name == "CPU":
                self.lib.fn["ggml_backend_cpu_set_n_threads"](b, int(self.threads))
            self._backend = b
        return self._backend

    def close(self) -> None:
        if self._backend is not None:
            self.lib.fn["ggml_backend_free"](self._backend)
            self._backend = None


def unwritten(packed: np.ndarray) -> np.ndarray:
    """Mask of the output floats ggml never wrote (they still hold the fill's bits)."""
    return np.ascontiguousarray(packed, dtype=_F32).view(np.uint32) == UNWRITTEN_BITS


def _ne(shape: tuple) -> tuple:
    return tuple(int(v) for v in reversed(shape))


class ScanGraph:
    """The graph of one forward (or ggmlR backward) for one problem's shapes on one device.

    ``ScanGraph(device, shapes, backward=False)`` builds the tensors and the op (metadata only);
    :meth:`supported` asks ggml's ``ggml_backend_dev_supports_op``; :meth:`allocate` makes the
    device buffers; :meth:`set_inputs`, :meth:`compute`, :meth:`output` run it (``run`` does all
    three). ``shapes``: s, x, dt, A (2-D: (H, 1) or (H, N)), B, C numpy shapes, and S for ids.
    Close with :meth:`close` (or use it as a context manager)."""

    def __init__(self, device: Device, shapes: dict, backward: bool = False, K: int = 1):
        self.device, self.lib = device, device.lib
        self.backward = backward
        if K > 1 and (backward or not self.lib.has_k):
            # an older ggml_ssm_scan ignores the trailing K: its output would have one slot
            raise GgmlError(f"K = {K}: the build at {self.lib.folder} has no K in ggml_ssm_scan"
                            if not backward else f"K = {K}: the backward has no snapshots")
        fn = self.lib.fn
        self.ctx = self.lib.context(12, graph=True)
        self.buffer = None
        try:
            t = {k: self.lib.new_tensor(self.ctx, GGML_TYPE_F32, _ne(shapes[k]))
                 for k in SCAN.float_inputs}
            t["ids"] = self.lib.new_tensor(self.ctx, GGML_TYPE_I32, (int(shapes["S"]),))
            args = [self.ctx, t["s"], t["x"], t["dt"], t["A"], t["B"], t["C"], t["ids"]]
            if backward:
                n_fwd = int(np.prod(shapes["x"])) + int(np.prod(shapes["s"][1:])) * int(shapes["S"])
                t["g"] = self.lib.new_tensor(self.ctx, GGML_TYPE_F32, (n_fwd,))
                self.op = fn["ggml_ssm_scan_back"](*args, t["g"])
            else:
                self.op = fn["ggml_ssm_scan"](*args, K)
            if not self.op:
                raise GgmlError("ggml_ssm_scan returned NULL")
            self.n_out = int(fn["ggml_nelements"](self.op))
            # made after the op: the allocator places it right behind the output
            self.guard = self.lib.new_tensor(self.ctx, GGML_TYPE_F32, (GUARD_FLOATS,))
            self.graph = fn["ggml_new_graph"](self.ctx)
            fn["ggml_build_forward_expand"](self.graph, self.op)
        except BaseException:
            fn["ggml_free"](self.ctx)
            raise
        self.tensors = t

    def supported(self) -> bool:
        return bool(self.lib.fn["ggml_backend_dev_supports_op"](self.device.dev, self.op))

    def allocate(self) -> None:
        if self.buffer is None:
            self.buffer = self.lib.fn["ggml_backend_alloc_ctx_tensors"](self.ctx, self.device.backend)
            if not self.buffer:
                raise GgmlError(f"ggml_backend_alloc_ctx_tensors failed on {self.device.name}")

    def _set(self, tensor: int, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr)
        if arr.nbytes:
            self.lib.fn["ggml_backend_tensor_set"](tensor, arr.ctypes.data, 0, arr.nbytes)

    def set_inputs(self, arrays: dict) -> None:
        """Copy the inputs (float32 arrays of the shapes given at construction, ids int32) and the
        output's NaN fill and the guard into the device buffers."""
        self.allocate()
        for k in SCAN.float_inputs:
            self._set(self.tensors[k], np.asarray(arrays[k], dtype=_F32))
        self._set(self.tensors["ids"], np.asarray(arrays["ids"], dtype=np.int32))
        if self.backward:
            self._set(self.tensors["g"], np.asarray(arrays["g"], dtype=_F32))
        self._set(self.op, np.full(self.n_out, UNWRITTEN_BITS, dtype=np.uint32))
        self._set(self.guard, np.full(GUARD_FLOATS, _GUARD_BITS, dtype=np.uint32))

    def compute(self) -> float:
        """Run the graph; seconds it took (graph compute and synchronize)."""
        fn = self.lib.fn
        t0 = time.perf_counter()
        status = fn["ggml_backend_graph_compute"](self.device.backend, self.graph)
        fn["ggml_backend_synchronize"](self.device.backend)
        secs = time.perf_counter() - t0
        if status != GGML_STATUS_SUCCESS:
            raise GgmlError(f"ggml_backend_graph_compute on {self.device.name} returned status {status}")
        return secs

    def output(self) -> np.ndarray:
        """The op's packed output (1-D float32). Raises GgmlError when the guard changed."""
        out = np.empty(self.n_out, dtype=_F32)
        if out.nbytes:
            self.lib.fn["ggml_backend_tensor_get"](self.op, out.ctypes.data, 0, out.nbytes)
        guard = np.empty(GUARD_FLOATS, dtype=np.uint32)
        self.lib.fn["ggml_backend_tensor_get"](self.guard, guard.ctypes.data, 0, guard.nbytes)
        changed = np.flatnonzero(guard != _GUARD_BITS)
        if changed.size:
            raise OutputOverrun(self.device.name, out, int(changed.size), int(changed[0]))
        return out

    def run(self, arrays: dict) -> np.ndarray:
        self.set_inputs(arrays)
        self.compute()
        return self.output()

    def close(self) -> None:
        if self.buffer is not None:
            self.lib.fn["ggml_backend_buffer_free"](self.buffer)
            self.buffer = None
        if self.ctx:
            self.lib.fn["ggml_free"](self.ctx)
            self.ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class OutputOverrun(GgmlError):
    """SSM_SCAN changed floats behind its output tensor (the guard). ``packed`` holds the output
    it computed, so the caller can say how wrong it is as well."""

    def __init__(self, device: str, packed: np.ndarray, changed: int, first: int, note: str = ""):
        self.device, self.packed, self.changed, self.first, self.note = device, packed, changed, first, note
        super().__init__(f"ggml's {device} SSM_SCAN wrote past the end of its output: {changed} of the "
                         f"{GUARD_FLOATS} guard floats placed behind it changed (the first is guard float {first})"
                         + (f"; {note}" if note else ""))

