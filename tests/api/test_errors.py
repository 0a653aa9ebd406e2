"""Bad input: one table row per mistake, the exception it must raise and a regex on the message.

docs/API.md: ValueError for shapes, sizes, ids and groups; TypeError for dtypes; raised before
any work, naming the argument and, for shapes, the expected shape in symbols and numbers
("B: expected shape (S, T, G, N) = (2, 3, 2, 5), got (2, 3, 5)").

Every row runs against every registered backend, through each entry point it concerns:
forward rows through ssm_scan, ssm_scan_back and supports (which checks like ssm_scan);
gradient rows through ssm_scan_back only.

The valid problem every row starts from: S=2 T=3 H=4 P=2 N=5 G=2 R=3, ids [2, 0], Mamba-2.

No row may write to the caller's arrays (checked for every row, and again with every array
read-only). Sizes whose element counts overflow int32 (zero-stride as_strided views, so they cost
no memory) must be refused by the host memory rule of ssm_ref.memory before anything is converted
or allocated; the limit is pinned to 64 GiB here so that the rows mean the same on every machine.
Odd inputs that are *valid* (nan, inf, other dtypes and layouts, zero-size dimensions) are in
test_odd_inputs.py.
"""

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided
from registry import BACKENDS, assert_close, oracle_back, oracle_scan

import ssm_ref

S, T, H, P, N, G, R = 2, 3, 4, 2, 5, 2, 3
N_FWD = S * T * H * P + S * H * P * N           # 48 + 80 = 128


def valid():
    rng = np.random.default_rng(51)
    f = np.float32
    return dict(s=rng.uniform(-0.5, 0.5, (R, H, P, N)).astype(f), x=rng.uniform(-1, 1, (S, T, H, P)).astype(f),
                dt=rng.uniform(-0.5, 0.5, (S, T, H)).astype(f), A=-rng.uniform(0.2, 1, H).astype(f),
                B=rng.uniform(-0.5, 0.5, (S, T, G, N)).astype(f), C=rng.uniform(-0.5, 0.5, (S, T, G, N)).astype(f),
                ids=np.array([2, 0]), g_y=rng.uniform(-1, 1, (S, T, H, P)).astype(f),
                g_states=rng.uniform(-1, 1, (S, H, P, N)).astype(f))


@dataclass(frozen=True)
class Bad:
    id: str
    change: dict          # argument -> bad value (callables are called with the valid inputs)
    exc: type
    match: str            # regex, searched in the message
    back_only: bool = False

    def args(self):
        a = valid()
        for k, v in self.change.items():
            a[k] = v(a) if callable(v) else v
        return a


def z(*shape, dtype=np.float32):
    return np.zeros(shape, dtype=dtype)


E = re.escape  # most messages carry literal parentheses

BIG = 2**31  # beyond int32: element counts and single dimensions


def huge(*shape, dtype=np.float32):
    """A zero-stride view of the given (huge) shape over one element: costs no memory."""
    return as_strided(np.zeros(1, dtype), shape=shape, strides=(0,) * len(shape), writeable=False)


NEEDS_MEMORY = r": the problem \(S, T, H, P, N, G, R\) = .* needs \d+ bytes of host memory .*nothing was allocated$"

BAD = [
    # --- shapes: wrong ndim for every array, every dimension mismatched -----------------------
    Bad("s-3d", {"s": z(R, H, P)}, ValueError, E("s: expected shape (R, H, P, N) = (R, 4, 2, N), got (3, 4, 2)")),
    Bad("s-wrong-H", {"s": z(R, 5, P, N)}, ValueError,
        E("s: expected shape (R, H, P, N) = (3, 4, 2, 5), got (3, 5, 2, 5)")),
    Bad("s-wrong-P", {"s": z(R, H, 3, N)}, ValueError,
        E("s: expected shape (R, H, P, N) = (3, 4, 2, 5), got (3, 4, 3, 5)")),
    Bad("x-3d", {"x": z(S, T, H)}, ValueError, E("x: expected shape (S, T, H, P), got (2, 3, 4)")),
    Bad("x-5d", {"x": z(S, T, H, P, 1)}, ValueError, E("x: expected shape (S, T, H, P), got (2, 3, 4, 2, 1)")),
    # x disagreeing with what dt, s, A, B and C agree on is blamed on x, not on the first that
    # disagrees with it (x channels-first used to be reported as a wrong s)
    Bad("x-channels-first", {"x": lambda a: a["x"].transpose(0, 2, 3, 1)}, ValueError,
        E("x: expected shape (S, T, H, P) = (2, 3, 4, 2), got (2, 4, 2, 3) (T = 3 in dt, B, C; H = 4 in s, dt, A; "
          "P = 2 in s) -- the same sizes in another order: the axes are (S, T, H, P)")),
    Bad("x-wrong-T", {"x": z(S, 4, H, P)}, ValueError,
        E("x: expected shape (S, T, H, P) = (2, 3, 4, 2), got (2, 4, 4, 2) (T = 3 in dt, B, C)")),
    Bad("x-wrong-H", {"x": z(S, T, 3, P)}, ValueError,
        E("x: expected shape (S, T, H, P) = (2, 3, 4, 2), got (2, 3, 3, 2) (H = 4 in s, dt, A)")),
    Bad("x-wrong-S-zero-start", {"x": z(3, T, H, P), "s": None, "ids": None}, ValueError,
        E("x: expected shape (S, T, H, P) = (2, 3, 4, 2), got (3, 3, 4, 2) (S = 2 in dt, B, C)")),
    Bad("dt-2d", {"dt": z(S, T)}, ValueError, E("dt: expected shape (S, T, H) = (2, 3, 4), got (2, 3)")),
    Bad("dt-wrong-S", {"dt": z(3, T, H)}, ValueError, E("dt: expected shape (S, T, H) = (2, 3, 4), got (3, 3, 4)")),
    Bad("dt-wrong-T", {"dt": z(S, 4, H)}, ValueError, E("dt: expected shape (S, T, H) = (2, 3, 4), got (2, 4, 4)")),
    Bad("dt-wrong-H", {"dt": z(S, T, 2)}, ValueError, E("dt: expected shape (S, T, H) = (2, 3, 4), got (2, 3, 2)")),
    Bad("A-3d", {"A": z(H, N, 1)}, ValueError,
        E("A: expected shape (H,) or (H, 1) = (4,) or (4, 1) for Mamba-2, or (H, N) = (4, 5) for Mamba-1, "
          "got (4, 5, 1)")),
    Bad("A-wrong-H", {"A": z(3)}, ValueError, r"^A: expected shape .*\(4,\).*got \(3,\)$"),
    Bad("A-wrong-N", {"A": z(H, 4)}, ValueError, r"^A: expected shape .*\(H, N\) = \(4, 5\).*got \(4, 4\)$"),
    Bad("A-scalar", {"A": np.float32(-1.0)}, ValueError, r"^A: expected shape .*got \(\)$"),
    Bad("B-3d", {"B": z(S, T, N)}, ValueError, E("B: expected shape (S, T, G, N) = (2, 3, G, 5), got (2, 3, 5)")),
    Bad("B-wrong-S", {"B": z(1, T, G, N)}, ValueError,
        E("B: expected shape (S, T, G, N) = (2, 3, 2, 5), got (1, 3, 2, 5)")),
    Bad("B-wrong-T", {"B": z(S, 2, G, N)}, ValueError,
        E("B: expected shape (S, T, G, N) = (2, 3, 2, 5), got (2, 2, 2, 5)")),
    Bad("B-wrong-N", {"B": z(S, T, G, 4)}, ValueError,
        E("B: expected shape (S, T, G, N) = (2, 3, 2, 5), got (2, 3, 2, 4)")),
    Bad("C-3d", {"C": z(S, T, N)}, ValueError, E("C: expected shape (S, T, G, N) = (2, 3, 2, 5), got (2, 3, 5)")),
    Bad("C-G-differs-from-B", {"C": z(S, T, 1, N)}, ValueError,
        E("C: expected shape (S, T, G, N) = (2, 3, 2, 5), got (2, 3, 1, 5)")),
    Bad("C-wrong-N", {"C": z(S, T, G, 6)}, ValueError,
        E("C: expected shape (S, T, G, N) = (2, 3, 2, 5), got (2, 3, 2, 6)")),
    # --- sizes and groups -------------------------------------------------------------------
    Bad("H-not-multiple-of-G", {"B": z(S, T, 3, N), "C": z(S, T, 3, N)}, ValueError,
        r"^B: H % G must be 0.*H = 4, G = 3$"),
    Bad("G-zero", {"B": z(S, T, 0, N), "C": z(S, T, 0, N)}, ValueError,
        E("B: G (the number of groups) must be >= 1, got shape (2, 3, 0, 5)")),
    Bad("S-zero", {"x": z(0, T, H, P), "dt": z(0, T, H), "B": z(0, T, G, N), "C": z(0, T, G, N), "ids": None},
        ValueError, E("x: S (the number of sequences) must be >= 1, got shape (0, 3, 4, 2)")),
    Bad("R-zero", {"s": z(0, H, P, N), "ids": None}, ValueError,
        E("s: R (rows of the state cache) must be >= 1, got shape (0, 4, 2, 5)")),
    # --- ids --------------------------------------------------------------------------------
    Bad("ids-negative", {"ids": np.array([-1, 0])}, ValueError,
        E("ids: every id must be in [0, R) = [0, 3) (R = rows of s), got -1")),
    Bad("ids-equal-R", {"ids": np.array([0, 3])}, ValueError,
        E("ids: every id must be in [0, R) = [0, 3)") + ".*got 3$"),
    Bad("ids-float", {"ids": np.array([0.0, 1.0])}, TypeError,
        E("ids: expected an integer array of shape (S,) = (2,), got dtype float64")),
    Bad("ids-bool", {"ids": np.array([True, False])}, TypeError,
        E("ids: expected an integer array of shape (S,) = (2,), got dtype bool")),
    Bad("ids-str", {"ids": ["0", "1"]}, TypeError, r"^ids: expected an integer array .*got dtype <U1$"),
    Bad("ids-too-short", {"ids": [0]}, ValueError, E("ids: expected shape (S,) = (2,), got (1,)")),
    Bad("ids-too-long", {"ids": [0, 1, 2]}, ValueError, E("ids: expected shape (S,) = (2,), got (3,)")),
    Bad("ids-2d", {"ids": np.array([[0], [1]])}, ValueError, E("ids: expected shape (S,) = (2,), got (2, 1)")),
    Bad("ids-ragged", {"ids": [0, [1]]}, TypeError, r"^ids: expected an integer array .*could not convert list"),
    # --- dtypes of the float inputs ----------------------------------------------------------
    Bad("x-int", {"x": z(S, T, H, P, dtype=np.int64)}, TypeError,
        r"^x: expected a float array .*got an integer array of dtype int64$"),
    Bad("s-uint8", {"s": z(R, H, P, N, dtype=np.uint8)}, TypeError,
        r"^s: .*got an unsigned integer array of dtype uint8$"),
    Bad("dt-bool", {"dt": z(S, T, H, dtype=bool)}, TypeError, r"^dt: .*got a bool array of dtype bool$"),
    Bad("A-complex", {"A": z(H, dtype=np.complex64)}, TypeError, r"^A: .*got a complex array of dtype complex64$"),
    Bad("B-object", {"B": lambda a: a["B"].astype(object)}, TypeError, r"^B: .*got an object array of dtype object$"),
    Bad("C-string", {"C": np.full((S, T, G, N), "0.5")}, TypeError, r"^C: .*got a string array of dtype <U3$"),
    Bad("x-datetime", {"x": z(S, T, H, P, dtype="datetime64[s]")}, TypeError, r"^x: .*non-float array"),
    Bad("s-ragged-list", {"s": [[0.0], [0.0, 1.0]]}, TypeError, r"^s: expected a float array, could not convert list"),
    Bad("x-None", {"x": None}, TypeError, E("x: expected a float array, got None")),
    # --- the gradient inputs -----------------------------------------------------------------
    Bad("g_y-wrong-shape", {"g_y": z(S, T, H, 3)}, ValueError,
        E("g_y: expected shape (S, T, H, P) = (2, 3, 4, 2), got (2, 3, 4, 3)"), back_only=True),
    Bad("g_y-3d", {"g_y": z(S, T, H)}, ValueError,
        E("g_y: expected shape (S, T, H, P) = (2, 3, 4, 2), got (2, 3, 4)"), back_only=True),
    Bad("g_y-packed-but-g_states-given", {"g_y": z(N_FWD)}, ValueError,
        E("g_y: expected shape (S, T, H, P) = (2, 3, 4, 2), got (128,)"), back_only=True),
    Bad("g_y-packed-wrong-length", {"g_y": z(N_FWD - 1), "g_states": None}, ValueError,
        E("g_y: expected shape (S*T*H*P + K*S*H*P*N,) = (128,) for K = 1 (and 80 more per further slot), "
          "got (127,)"), back_only=True),
    Bad("g_states-wrong-shape", {"g_states": z(S, H, P, 4)}, ValueError,
        E("g_states: expected shape (S, H, P, N) = (2, 4, 2, 5), got (2, 4, 2, 4)"), back_only=True),
    Bad("g_states-wrong-R-not-S", {"g_states": z(R, H, P, N)}, ValueError,
        E("g_states: expected shape (S, H, P, N) = (2, 4, 2, 5), got (3, 4, 2, 5)"), back_only=True),
    Bad("g_y-int", {"g_y": z(S, T, H, P, dtype=np.int32)}, TypeError, r"^g_y: .*integer array of dtype int32$",
        back_only=True),
    Bad("g_states-complex", {"g_states": z(S, H, P, N, dtype=complex)}, TypeError,
        r"^g_states: .*complex array", back_only=True),
    # --- more of every argument -----------------------------------------------------------------
    Bad("G-greater-than-H", {"B": z(S, T, 8, N), "C": z(S, T, 8, N)}, ValueError,
        r"^B: H % G must be 0.*H = 4, G = 8$"),
    Bad("dt-scalar", {"dt": 0.5}, ValueError, E("dt: expected shape (S, T, H) = (2, 3, 4), got ()")),
    Bad("s-1d-list", {"s": [0.0, 1.0]}, ValueError, E("s: expected shape (R, H, P, N) = (R, 4, 2, N), got (2,)")),
    Bad("x-float128", {"x": z(S, T, H, P, dtype=np.longdouble)}, TypeError,
        r"^x: expected float16, float32 or float64, got float128$"),
    Bad("A-bytes", {"A": np.full(H, b"1")}, TypeError, r"^A: .*got a bytes array of dtype \|S1$"),
    Bad("B-structured", {"B": np.zeros((S, T, G, N), dtype=[("a", "f4")])}, TypeError,
        r"^B: .*got a structured array"),
    Bad("ids-uint64-huge", {"ids": np.array([2**63, 0], np.uint64)}, ValueError,
        E("ids: every id must be in [0, R) = [0, 3) (R = rows of s), got 9223372036854775808")),
    Bad("ids-int8-negative", {"ids": np.array([0, -128], np.int8)}, ValueError, r"^ids: every id .*got -128$"),
    Bad("ids-object", {"ids": np.array([0, 1], dtype=object)}, TypeError,
        E("ids: expected an integer array of shape (S,) = (2,), got dtype object")),
    Bad("ids-scalar", {"ids": 0}, ValueError, E("ids: expected shape (S,) = (2,), got ()")),
    Bad("g_y-bool", {"g_y": z(S, T, H, P, dtype=bool)}, TypeError, r"^g_y: .*bool array", back_only=True),
    Bad("g_states-3d", {"g_states": z(S, H, P)}, ValueError,
        E("g_states: expected shape (S, H, P, N) = (2, 4, 2, 5), got (2, 4, 2)"), back_only=True),
    # --- sizes beyond int32 (no memory: zero-stride views); refused before any allocation --------
    Bad("T-2^31-tokens", {"x": huge(S, BIG, H, P), "dt": huge(S, BIG, H), "B": huge(S, BIG, G, N),
                          "C": huge(S, BIG, G, N), "g_y": huge(S, BIG, H, P)}, ValueError, "^B" + NEEDS_MEMORY),
    Bad("R-2^31-rows", {"s": huge(BIG, H, P, N)}, ValueError, "^s" + NEEDS_MEMORY),
    Bad("N-2^31-states", {"s": huge(R, H, P, BIG), "B": huge(S, T, G, BIG), "C": huge(S, T, G, BIG),
                          "g_states": huge(S, H, P, BIG)}, ValueError, "^s" + NEEDS_MEMORY),
    Bad("S-2^31-sequences", {"x": huge(BIG, T, H, P), "dt": huge(BIG, T, H), "B": huge(BIG, T, G, N),
                             "C": huge(BIG, T, G, N), "ids": None, "s": huge(BIG, H, P, N),
                             "g_y": huge(BIG, T, H, P), "g_states": huge(BIG, H, P, N)},
        ValueError, "^s" + NEEDS_MEMORY),
    Bad("P-2^31-channels-packed-g_y", {"s": huge(R, H, BIG, N), "x": huge(S, T, H, BIG), "g_states": None,
                                       "g_y": huge(S * T * H * BIG + S * H * BIG * N)},
        ValueError, "^s" + NEEDS_MEMORY, back_only=True),
]

FWD_ARGS = ("s", "x", "dt", "A", "B", "C", "ids")
ENTRY_POINTS = ("ssm_scan", "ssm_scan_back", "supports")


def call(module, entry, a, **kw):
    fwd = {k: a[k] for k in FWD_ARGS}
    if entry == "ssm_scan":
        return module.ssm_scan(**fwd, **kw)
    if entry == "ssm_scan_back":
        return module.ssm_scan_back(**fwd, g_y=a["g_y"], g_states=a["g_states"], **kw)
    return module.supports("ssm_scan", **fwd)


CASES = [pytest.param(bad, entry, id=f"{bad.id}-{entry}")
         for bad in BAD for entry in ENTRY_POINTS if entry == "ssm_scan_back" or not bad.back_only]


@pytest.fixture(autouse=True)
def _host_memory_64_gib(monkeypatch):
    monkeypatch.setenv("SSM_HOST_MEMORY_BYTES", str(64 << 30))


def _owner(a: np.ndarray) -> np.ndarray:
    """The array that owns ``a``'s memory (through views and as_strided's wrapper)."""
    while not (isinstance(a, np.ndarray) and a.flags.owndata) and getattr(a, "base", None) is not None:
        a = a.base
    return a


def _memory(a: dict) -> dict:
    """Every distinct block of memory the arguments live in, by owner."""
    out = {}
    for v in a.values():
        if isinstance(v, np.ndarray):
            own = _owner(v)
            out[id(own)] = own
    return out


def _snapshot(a: dict):
    return {k: (v.copy(), v.flags.writeable) for k, v in _memory(a).items()}


def _assert_untouched(a: dict, snap) -> None:
    for k, v in _memory(a).items():
        data, writeable = snap[k]
        assert np.array_equal(v, data, equal_nan=v.dtype.kind in "fc"), "an input was written"
        assert v.flags.writeable == writeable, "an input's flags changed"


def test_the_table_is_broad():
    assert len(BAD) >= 40
    assert len({b.id for b in BAD}) == len(BAD)
    touched = {k for b in BAD for k in b.change}
    assert touched >= {"s", "x", "dt", "A", "B", "C", "ids", "g_y", "g_states"}


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_the_valid_problem_is_valid(backend):
    # Every entry point takes it, and computes what the float64 oracle does (within the backend's
    # float32 bounds), on the backend's own device: the rows below start from a problem that works.
    a = valid()
    fwd = {k: a[k] for k in FWD_ARGS}
    sup = call(backend.module, "supports", a)
    assert sup.ok, sup.reason
    r = call(backend.module, "ssm_scan", a)
    want = oracle_scan(**fwd)
    for k in ("y", "states"):
        assert_close(backend, k, getattr(r, k), getattr(want, k), label="the valid problem")
    g = call(backend.module, "ssm_scan_back", a)
    gwant = oracle_back(**fwd, g_y=a["g_y"], g_states=a["g_states"])
    for k in ssm_ref.GRAD_NAMES:
        assert_close(backend, k, getattr(g, k), getattr(gwant, k), label="the valid problem")
    assert re.fullmatch(backend.where, r.where) and re.fullmatch(backend.where, g.where), (r.where, g.where)


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@pytest.mark.parametrize("bad,entry", CASES)
def test_bad_input_raises(backend, bad, entry):
    a = bad.args()
    snap = _snapshot(a)
    with pytest.raises(bad.exc, match=bad.match) as info:
        call(backend.module, entry, a)
    # The message names the argument first, as "<arg>: ...".
    assert re.match(r"^[A-Za-z_]+: ", str(info.value)), str(info.value)
    _assert_untouched(a, snap)


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@pytest.mark.parametrize("bad", BAD, ids=lambda b: b.id)
def test_bad_input_with_every_array_read_only(backend, bad):
    # The same mistakes with every array read-only: the same error, nothing written, no flag changed.
    a = bad.args()
    for v in _memory(a).values():
        v.flags.writeable = False
    snap = _snapshot(a)
    with pytest.raises(bad.exc, match=bad.match):
        call(backend.module, "ssm_scan_back", a)
    _assert_untouched(a, snap)


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@pytest.mark.parametrize("op", ["ssm_scan_forward", "SSM_SCAN", "", None, 0])
def test_supports_refuses_an_unknown_op(backend, op):
    fwd = {k: valid()[k] for k in FWD_ARGS}
    # (a backend that computes more ops than the scan names them too: ssm_fast's Mamba-3)
    with pytest.raises(ValueError, match=r"^op: expected (one of )?'ssm_scan'(,| or) 'ssm_scan_back'.*, got "
                       + E(repr(op)) + "$"):
        backend.module.supports(op, **fwd)


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@pytest.mark.parametrize("op", ["ssm_scan", "ssm_scan_back"])
def test_supports_answers_with_a_reason(backend, op):
    sup = backend.module.supports(op, **{k: valid()[k] for k in FWD_ARGS})
    assert isinstance(sup.ok, bool) and bool(sup) == sup.ok
    assert isinstance(sup.reason, str) and sup.reason


BAD_DTYPES: list[tuple[Any, str]] = [
    (np.float16, "float16"), (np.int32, "int32"), (np.complex128, "complex128"), ("banana", "'banana'"),
    (None, "None"), (object, "object"),
]


@pytest.mark.parametrize("entry", ["ssm_scan", "ssm_scan_back"])
@pytest.mark.parametrize("dtype,shown", BAD_DTYPES, ids=[s for _, s in BAD_DTYPES])
def test_reference_refuses_a_working_dtype_other_than_float32_or_float64(entry, dtype, shown):
    with pytest.raises(TypeError, match=r"^dtype: expected np.float32 or np.float64, got " + E(shown) + "$"):
        call(ssm_ref, entry, valid(), dtype=dtype)


FIVE = r"^s: the start states come first, \(s, x, dt, A, B, C\[, ids\]\); this call passed five arrays"


@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
def test_five_arrays_as_mamba_ssm_passes_them_name_s(backend):
    # mamba_ssm's functions take (x, dt, A, B, C): the same five arrays here lack the start states,
    # and the error says so (not Python's "missing C"), on every entry point, before any work.
    a = valid()
    five = (a["x"], a["dt"], a["A"], a["B"], a["C"])
    snap = _snapshot(a)
    m = backend.module
    for call5 in (lambda: m.ssm_scan(*five), lambda: m.ssm_scan_back(*five, g_y=a["g_y"]),
                  lambda: m.supports("ssm_scan", *five)):
        with pytest.raises(TypeError, match=FIVE):
            call5()
    with pytest.raises(TypeError, match=r"^C: missing \(expected a float array of shape \(S, T, G, N\)\)$"):
        m.ssm_scan(a["s"], a["x"], a["dt"], a["A"], a["B"])      # C itself forgotten
    assert m.ssm_scan(None, *five).y.shape == a["x"].shape       # the call the message proposes
    _assert_untouched(a, snap)
