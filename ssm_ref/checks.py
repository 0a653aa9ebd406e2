"""Argument checks shared by every backend.

Glossary (the letters of docs/SPEC.md section 1, used in every backend, shader and doc):
    N  d_state          P  head_dim         H  n_head
    G  n_group          T  tokens/sequence  S  sequences
    R  rows of the state cache s

``check_forward`` / ``check_backward`` take the caller's array-likes, check every argument
before any work is done, and return a :class:`Problem`: the dimensions plus C-contiguous,
read-only arrays in the working dtype. A backend never sees the caller's arrays writable and
never keeps them: when the caller's array already has the right dtype and layout the Problem
holds a read-only *view* of it (the caller's own flags are untouched); otherwise a converted copy.

Errors follow docs/API.md: ``TypeError`` for dtypes, ``ValueError`` for shapes, sizes, ids and
groups, with a message that names the argument, the expected shape in symbols and numbers, and
what was given.

Device-resident arrays (objects whose ``_ssm_device_array`` is True, such as ssm_vk.DeviceArray)
are one more kind of array-like: a host backend gets a host copy (``numpy()``); with
``keep_device`` they are checked by shape and dtype and kept as given. The checks keep nothing
between calls; a backend that makes its repeated calls cheaper does so itself, with the public
pieces :func:`check_ids`, :func:`arange_ids` and :func:`split_g_y`. The zeros that stand for
absent inputs (``s=None``; ``g_y``, ``g_states`` None) are zero-stride arrays until the Problem
is made; with ``keep_device`` the Problem keeps them so (:func:`zero_stand_in` tells them), for a
device backend to make the zeros on the device instead of uploading them.

One module of ~500 lines on purpose: the one validator every backend calls, which decides the order
of the checks (which error a bad call gets first); what a check needs besides -- the shapes'
agreement and messages (ssm_ref.shapes), the ids (ssm_ref.ids) -- lives beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arraylike import finish, float_array, is_device_array, zero_stand_in, zeros
from .ids import arange_ids, check_distinct_ids, check_ids
from .memory import check_host_memory, host_memory_bytes
from .shapes import MISSING, a_error, blame, check_five_arrays, expect_ndim, expect_shape

__all__ = ["DT_SOFTPLUS", "MISSING", "Dims", "Problem", "arange_ids", "check_backward", "check_dt_softplus",
           "check_dtype", "check_five_arrays", "check_forward", "check_ids", "check_invariant", "check_shapes",
           "check_snapshots", "check_update_cache", "is_device_array", "output_elems", "split_g_y", "write_cache_rows",
           "zero_stand_in"]

# Accepted working precisions of the reference; the fast backends always use float32.
_WORK_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_F32 = _WORK_DTYPES[0]


@dataclass(frozen=True)
class Dims:
    """The sizes of one problem. ``mamba1`` is True when A has shape (H, N)."""

    S: int
    T: int
    H: int
    P: int
    N: int
    G: int
    R: int
    mamba1: bool
    a_shape: tuple  # A's shape as the caller gave it: (H,), (H, 1) or (H, N)
    K: int = 1      # state slots the forward writes (snapshots=K); in a backward, g_snapshots' K

    @property
    def heads_per_group(self) -> int:
        return self.H // self.G if self.G else 0

    @property
    def variant(self) -> str:
        return "mamba1" if self.mamba1 else "mamba2"

    @property
    def forward_size(self) -> int:
        """Length of the packed forward output (ggml SSM_SCAN layout: y, then K state slots)."""
        return self.S * self.T * self.H * self.P + self.K * self.S * self.H * self.P * self.N

    @property
    def backward_size(self) -> int:
        """Length of the packed backward output (ggmlR SSM_SCAN_BACK layout)."""
        S, T, H, P, N, G = self.S, self.T, self.H, self.P, self.N, self.G
        return (S * H * P * N + S * T * H * P + S * T * H + int(np.prod(self.a_shape))
                + 2 * S * T * G * N)

    def group_of_head(self) -> np.ndarray:
        """(H,) int64: head h reads group h // (H // G)."""
        return np.arange(self.H, dtype=np.int64) // max(self.heads_per_group, 1)


@dataclass(frozen=True)
class Problem:
    """Checked inputs. Arrays are C-contiguous, read-only, in the working dtype (with
    ``keep_device``: or DeviceArrays, or zeros as a zero-stride stand-in, :func:`zero_stand_in`).

    ``A`` is always 2-D here: (H, 1) for Mamba-2, (H, N) for Mamba-1 (``dims.a_shape`` keeps the
    caller's shape for d_A). ``ids`` is int64 (S,). ``g_y`` / ``g_states`` are set only by
    ``check_backward`` and are always structured: (S, T, H, P) and (S, H, P, N). ``g_snapshots``
    is (K, S, H, P, N) with K = ``dims.K`` when the backward was given one, else None.
    """

    dims: Dims
    s: np.ndarray
    x: np.ndarray
    dt: np.ndarray
    A: np.ndarray
    B: np.ndarray
    C: np.ndarray
    ids: np.ndarray
    g_y: np.ndarray | None = None
    g_states: np.ndarray | None = None
    dtype: np.dtype = _WORK_DTYPES[0]
    g_snapshots: np.ndarray | None = None


def check_dtype(dtype) -> np.dtype:
    """The working precision: float32 (the contract) or float64 (the oracle)."""
    if dtype is None:  # np.dtype(None) is float64: a silent switch to the oracle, so refuse it
        raise TypeError("dtype: expected np.float32 or np.float64, got None")
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"dtype: expected np.float32 or np.float64, got {dtype!r}") from e
    if dt not in _WORK_DTYPES:
        raise TypeError(f"dtype: expected np.float32 or np.float64, got {dt}")
    return dt


# The forms of the softplus that turns dt into the step (docs/SPEC.md section 3): ggml's
# log(1 + exp(z)) (the default), the accurate log1p(exp(z)), or none (dt is the step itself).
DT_SOFTPLUS = ("ggml", "log1p", None)

# mamba_ssm's booleans (its ``delta_softplus`` / ``dt_softplus``): True is its softplus, PyTorch's
# F.softplus = log1p(exp(z)); False is no softplus.
_BOOL_FORMS = {True: "log1p", False: None}


def check_dt_softplus(dt_softplus):
    """``dt_softplus`` checked and returned as one of DT_SOFTPLUS: "ggml", "log1p" or None as given,
    mamba_ssm's True as "log1p" and False as None. Any other value (another string, a number) is a
    ValueError naming the argument and every accepted value."""
    if dt_softplus is None or (isinstance(dt_softplus, str) and dt_softplus in DT_SOFTPLUS):
        return dt_softplus
    if isinstance(dt_softplus, (bool, np.bool_)):
        return _BOOL_FORMS[bool(dt_softplus)]
    raise ValueError(f"dt_softplus: expected 'ggml', 'log1p', None, True (the same as 'log1p') or False (the same "
                     f"as None), got {dt_softplus!r}")


def check_snapshots(snapshots) -> int:
    """K, the number of state slots the forward writes (``snapshots=K``, docs/SPEC.md section 3):
    an integer >= 1 (TypeError for anything else, a bool included; ValueError below 1)."""
    if isinstance(snapshots, (bool, np.bool_)) or not isinstance(snapshots, (int, np.integer)):
        raise TypeError(f"snapshots: expected an integer K >= 1 (the number of state slots), got {snapshots!r}")
    if snapshots < 1:
        raise ValueError(f"snapshots: expected K >= 1 (K = 1 is the final state alone), got {snapshots}")
    return int(snapshots)


def check_invariant(invariant, backend: str) -> bool:
    """``invariant`` of a bridge's call (ssm_torch, ssm_jax) checked for the backend it names
    (docs/SPEC.md section 3.2): True is taken by ssm_vk (its invariant mode) and ssm_ref
    (invariant always); ssm_fast, which is not invariant in every case, refuses it. ValueError
    naming invariant."""
    if invariant is False:
        return False
    if invariant is not True:
        raise ValueError(f"invariant: expected True or False, got {invariant!r}")
    if backend == "ssm_fast":
        raise ValueError("invariant=True: ssm_fast is not batch and split invariant in every case (docs/SPEC.md "
                         "section 3.2); use backend='ssm_vk' or 'ssm_ref'")
    return True


def check_update_cache(update_cache, s, ids: np.ndarray, *, device_arrays: bool = False, op: str = "ssm_scan") -> bool:
    """``update_cache`` must be True or False (TypeError otherwise); returned. When True the call
    writes sequence i's final state into row ``ids[i]`` of ``s`` (the checked ids), so ``s`` must
    be writable in place -- a writeable numpy array of a float dtype, or, where
    ``device_arrays`` (ssm_vk), a DeviceArray -- and the ids distinct (two sequences would write
    one row): TypeError / ValueError naming the argument. Run after the shape checks, before any
    work. ``op``: supports()'s; only ssm_scan writes the cache (ValueError for ssm_scan_back)."""
    if update_cache is not True and update_cache is not False:
        raise TypeError(f"update_cache: expected True or False, got {update_cache!r}")
    if not update_cache:
        return False
    if s is None:
        raise ValueError("s: update_cache=True writes the new states into s, got None (zero start states, no "
                         "cache): pass the cache")
    if op != "ssm_scan":
        raise ValueError(f"update_cache: only ssm_scan writes into the cache, expected False for {op}")
    what = "a writeable numpy float array" + (" or an ssm_vk.DeviceArray" if device_arrays else "")
    if is_device_array(s):
        if not device_arrays:
            raise TypeError(f"s: update_cache=True writes the new states into s: expected {what}, got a "
                            f"DeviceArray (ssm_vk writes those)")
    elif not isinstance(s, np.ndarray) or s.dtype.kind != "f":
        got = f"{type(s).__name__} of {s.dtype}" if isinstance(s, np.ndarray) else type(s).__name__
        raise TypeError(f"s: update_cache=True writes the new states into s: expected {what}, got {got}")
    elif not s.flags.writeable:
        raise ValueError("s: update_cache=True writes the new states into s, which is read-only")
    check_distinct_ids(ids, "s")
    return True


def write_cache_rows(s: np.ndarray, ids: np.ndarray, states) -> None:
    """s[ids[i]] = states[i] (update_cache on the host: the ids checked distinct; rounded to s's
    dtype)."""
    if len(ids):
        s[ids] = np.asarray(states)


def split_g_y(g_y, dims: Dims) -> tuple:
    """The backward's packed 1-D ``g_y`` (the forward's layout, ssm_ref.packing: the gradient of y,
    then of the K state slots; its length ``dims.forward_size`` already checked) as (g_y
    (S, T, H, P), g_states (S, H, P, N), g_snapshots (K, S, H, P, N) or None): views, also of a
    device array (its ``view(start, shape)``). K = 1: the slot is g_states, g_snapshots None;
    K > 1: the K slots are g_snapshots (slot 0 the final state's) and g_states is zeros."""
    d = dims
    n_y = d.S * d.T * d.H * d.P
    y_shape, states_shape = (d.S, d.T, d.H, d.P), (d.S, d.H, d.P, d.N)
    dev = is_device_array(g_y)
    gy = g_y.view(0, y_shape) if dev else g_y[:n_y].reshape(y_shape)
    if d.K == 1:
        return gy, g_y.view(n_y, states_shape) if dev else g_y[n_y:].reshape(states_shape), None
    slots = (d.K, *states_shape)
    gsn = g_y.view(n_y, slots) if dev else g_y[n_y:].reshape(slots)
    return gy, zeros(states_shape, np.dtype(np.float32) if dev else g_y.dtype), gsn


def _zero_start(x_: np.ndarray, B, ids, work: np.dtype, keep_device: bool) -> np.ndarray:
    """The start states of ``s=None``: zeros (S, H, P, N), one row per sequence (R = S), N from B's
    last axis. ``ids`` must then be None (the rows are the sequences' own)."""
    if ids is not None:
        got = f"an array of shape {tuple(np.shape(ids))}" if hasattr(ids, "shape") else type(ids).__name__
        raise ValueError(f"ids: s is None (zero start states, one per sequence), so ids must be None, got {got}")
    S, T, H, P = (int(v) for v in x_.shape)
    B_ = float_array("B", B, work, keep_device)
    if B_.ndim != 4:
        raise ValueError(f"B: expected shape (S, T, G, N) = ({S}, {T}, G, N), got {tuple(B_.shape)}")
    return zeros((S, H, P, int(B_.shape[3])), work)


def _check_inputs(s, x, dt, A, B, C, ids, work: np.dtype, keep_device: bool, K: int = 1
                  ) -> tuple[Dims, dict, np.ndarray | None]:
    """The forward's argument checks (docs/SPEC.md shapes): (dims, the float arrays as given -- not yet
    converted --, the checked ids or None). Each array's type and number of axes first, in argument
    order; then the sizes they share, where a disagreement is blamed on the argument that disagrees
    with what the others agree on (:func:`_blame`)."""
    if C is MISSING:
        check_five_arrays(x, C)
    x_ = float_array("x", x, work, keep_device)
    expect_ndim("x", x_, "(S, T, H, P)", ("S", "T", "H", "P"))
    S, T, H, P = (int(v) for v in x_.shape)
    if S < 1:
        raise ValueError(f"x: S (the number of sequences) must be >= 1, got shape {tuple(x_.shape)}")

    if s is None:
        s_ = _zero_start(x_, B, ids, work, keep_device)
    else:
        s_ = float_array("s", s, work, keep_device)
    expect_ndim("s", s_, "(R, H, P, N)", ("R", H, P, "N"))
    R, N = int(s_.shape[0]), int(s_.shape[3])
    if R < 1:
        raise ValueError(f"s: R (rows of the state cache) must be >= 1, got shape {tuple(s_.shape)}")

    dt_ = float_array("dt", dt, work, keep_device)
    if dt_.ndim != 3:
        expect_ndim("dt", dt_, "(S, T, H)", (S, T, H))
    A_ = float_array("A", A, work, keep_device)
    a_shape = tuple(int(v) for v in A_.shape)
    if A_.ndim not in (1, 2):
        a_error(H, N, a_shape)
    B_ = float_array("B", B, work, keep_device)
    if B_.ndim != 4:
        raise ValueError(f"B: expected shape (S, T, G, N) = ({S}, {T}, G, {N}), got {tuple(B_.shape)}")
    G = int(B_.shape[2])
    C_ = float_array("C", C, work, keep_device)
    if C_.ndim != 4:
        expect_ndim("C", C_, "(S, T, G, N)", (S, T, G, N))

    mamba1 = a_shape == (H, N) and N != 1    # (H, 1) is Mamba-2's form, also where N = 1
    if (s_.shape[1:3] != (H, P) or dt_.shape != (S, T, H) or B_.shape != (S, T, G, N) or C_.shape != B_.shape
            or not (mamba1 or a_shape == (H,) or a_shape == (H, 1))):
        blame({"x": x_, "s": None if s is None else s_, "dt": dt_, "A": A_, "B": B_, "C": C_})
    if G < 1:
        raise ValueError(f"B: G (the number of groups) must be >= 1, got shape {tuple(B_.shape)}")
    if H % G:
        raise ValueError(f"B: H % G must be 0 (each group is shared by H/G heads), "
                         f"got H = {H}, G = {G}")

    ids_ = check_ids(ids, S, R)
    dims = Dims(S=S, T=T, H=H, P=P, N=N, G=G, R=R, mamba1=mamba1, a_shape=a_shape, K=K)
    A2 = A_.reshape(H, N if mamba1 else 1)
    return dims, dict(s=s_, x=x_, dt=dt_, A=A2, B=B_, C=C_), ids_


def output_elems(d: Dims, backward: bool) -> int:
    """Elements of the results of one call: y, states and (K > 1) the K snapshots, or the seven
    gradients."""
    row = d.H * d.P * d.N
    if not backward:
        return d.S * d.T * d.H * d.P + (d.K + (d.K > 1)) * d.S * row
    return (d.R * row + d.S * row + d.S * d.T * d.H * d.P + d.S * d.T * d.H + d.H * (d.N if d.mamba1 else 1)
            + 2 * d.S * d.T * d.G * d.N)


def _check_memory(dims: Dims, raw: dict, work: np.dtype, keep_device: bool, backward: bool, workspace) -> None:
    """The host memory rule (ssm_ref.memory): copies + outputs + the backend's workspace, before
    anything is converted or allocated."""
    copies = sum(a.size * work.itemsize for a in raw.values()
                 if not is_device_array(a) and not (a.dtype == work and a.flags.c_contiguous))
    copies += dims.S * 8  # ids as int64
    on_device = keep_device and any(is_device_array(a) for a in raw.values())
    parts = {"input copies": int(copies),
             "outputs": 0 if on_device else output_elems(dims, backward) * work.itemsize,
             "workspace": int(workspace(dims, work)) if workspace is not None else 0}
    if sum(parts.values()) <= host_memory_bytes()[0]:
        return  # within the limit: the message's parts are not needed
    d = dims
    check_host_memory(max(raw, key=lambda k: raw[k].size),
                      f"(S, T, H, P, N, G, R) = ({d.S}, {d.T}, {d.H}, {d.P}, {d.N}, {d.G}, {d.R})", parts)


def _problem(dims: Dims, raw: dict, ids: np.ndarray | None, work: np.dtype, keep_device: bool = False) -> Problem:
    return Problem(dims=dims, **{k: finish(v, work, keep_device) for k, v in raw.items()},
                   ids=arange_ids(dims.S) if ids is None else ids, dtype=work)


def check_forward(s, x, dt, A, B, C, ids=None, *, dtype=np.float32, keep_device: bool = False,
                  workspace=None, snapshots=1) -> Problem:
    """Check the forward's arguments (docs/SPEC.md shapes) and return a :class:`Problem`.

    x defines S, T, H, P; s defines R and N; B defines G. Every other shape is checked against
    those. ``s=None`` means zero start states, one per sequence: s = zeros (S, H, P, N) (R = S, N
    from B's last axis), and ``ids`` must be None (ValueError naming ids). Raises TypeError (dtypes)
    or ValueError (shapes, ids, groups; a problem beyond the host
    memory limit, see ssm_ref.memory) before any work or allocation. ``workspace(dims, dtype)``:
    the bytes the calling backend needs besides the converted inputs and the outputs.
    Device-resident arrays (ssm_vk.DeviceArray) are copied to the host unless ``keep_device``
    (the Vulkan backend binds them in place; the zeros of ``s=None`` then stay a zero-stride
    stand-in, :func:`zero_stand_in`). ``snapshots``: K, checked by :func:`check_snapshots`
    first and kept as ``dims.K``.
    """
    K = 1 if snapshots == 1 and type(snapshots) is int else check_snapshots(snapshots)
    work = _F32 if dtype is np.float32 else check_dtype(dtype)
    dims, raw, ids_ = _check_inputs(s, x, dt, A, B, C, ids, work, keep_device, K)
    _check_memory(dims, raw, work, keep_device, False, workspace)
    return _problem(dims, raw, ids_, work, keep_device)


def check_shapes(s, x, dt, A, B, C, ids=None, snapshots=1) -> Dims:
    """The checks of :func:`check_forward` that the arguments' shapes and dtypes settle (and the
    ids' values, when given), in its order and with its messages, without converting, copying or
    allocating the inputs; returns the :class:`Dims`. For a caller that has shapes but no data
    yet: ssm_torch checks its fake tensors under torch.compile with zero-stride stand-ins
    (``np.broadcast_to(np.zeros((), dtype), shape)``). The host memory rule is not applied."""
    K = check_snapshots(snapshots)
    dims, _raw, _ids = _check_inputs(s, x, dt, A, B, C, ids, _F32, False, K)
    return dims


def check_backward(s, x, dt, A, B, C, ids=None, g_y=None, g_states=None, *, dtype=np.float32,
                   keep_device: bool = False, workspace=None, g_snapshots=None) -> Problem:
    """Check the backward's arguments. ``g_y`` (S,T,H,P) and ``g_states`` (S,H,P,N); either may be
    None for zeros of its shape (both None: every gradient is zero); ``g_snapshots`` (K,S,H,P,N)
    or None, the gradient of the forward's K state slots (its slot 0 adds to g_states). ``g_y``
    may also be the packed 1-D forward layout (y, then K slots: K read from its length) with
    ``g_states`` and ``g_snapshots`` None. Returns a :class:`Problem` with structured g_y
    (S,T,H,P), g_states (S,H,P,N) and g_snapshots (K,S,H,P,N) or None; ``dims.K`` is that K (1
    without one). ``s=None`` as in :func:`check_forward`. Raises as :func:`check_forward`."""
    work = _F32 if dtype is np.float32 else check_dtype(dtype)
    d, raw, ids_ = _check_inputs(s, x, dt, A, B, C, ids, work, keep_device)
    y_shape, states_shape = (d.S, d.T, d.H, d.P), (d.S, d.H, d.P, d.N)
    gy = None if g_y is None else float_array("g_y", g_y, work, keep_device)
    gsn = None
    if gy is not None and g_states is None and g_snapshots is None and gy.ndim == 1:   # the packed layout
        n_y, row = d.S * d.T * d.H * d.P, d.S * d.H * d.P * d.N
        n = int(gy.shape[0])
        if n < n_y + row or (row and (n - n_y) % row) or (not row and n != n_y):
            raise ValueError(f"g_y: expected shape (S*T*H*P + K*S*H*P*N,) = ({n_y + row},) for K = 1 (and "
                             f"{row} more per further slot), got {tuple(gy.shape)}")
        d = _with_k(d, (n - n_y) // row if row else 1)
        gy_s, gs_s, gsn = split_g_y(gy, d)
    else:
        if g_snapshots is not None:
            gsn = float_array("g_snapshots", g_snapshots, work, keep_device)
            if gsn.ndim != 5 or gsn.shape[0] < 1:
                S_, H_, P_, N_ = states_shape
                raise ValueError(f"g_snapshots: expected shape (K, S, H, P, N) = (K, {S_}, {H_}, {P_}, {N_}) "
                                 f"with K >= 1, got {tuple(gsn.shape)}")
            d = _with_k(d, int(gsn.shape[0]))
            expect_shape("g_snapshots", gsn, "(K, S, H, P, N)", (d.K, *states_shape))
        if gy is None:
            gy_s = zeros(y_shape, work)
        else:
            expect_shape("g_y", gy, "(S, T, H, P)", y_shape)
            gy_s = gy
        if g_states is None:
            gs_s = zeros(states_shape, work)
        else:
            gs_s = float_array("g_states", g_states, work, keep_device)
            expect_shape("g_states", gs_s, "(S, H, P, N)", states_shape)
    raw.update(g_y=gy_s, g_states=gs_s)
    if gsn is not None:
        raw["g_snapshots"] = gsn
    _check_memory(d, raw, work, keep_device, True, workspace)
    return _problem(d, raw, ids_, work, keep_device)


def _with_k(d: Dims, K: int) -> Dims:
    return Dims(S=d.S, T=d.T, H=d.H, P=d.P, N=d.N, G=d.G, R=d.R, mamba1=d.mamba1, a_shape=d.a_shape, K=K)
