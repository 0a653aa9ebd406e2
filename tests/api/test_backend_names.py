"""The backends' names: ssm_torch (the operator and the mamba drop-ins), ssm_jax and the command
line's --backend take the same names -- the module names and the short names ref, fast, vk -- and
refuse the others with the same message, both from ssm_ref.backend_names."""

from __future__ import annotations

import numpy as np
import pytest
from optional import need
from problems import make_problem

from ssm_ref.backend_names import ALIASES, BACKENDS, lookup, refusal, resolve_backend

NAMES = [*BACKENDS, *ALIASES]
# Names none of them takes; none is an importable module (the command line would try one as a port).
REFUSED = ["cuda", "Vk", "VK", "ssm_vulkan", "fast2", "ssm-vk"]
CASE = make_problem(np.random.default_rng(3), S=2, T=3, H=2, P=2, N=3, G=1, R=2, ids="identity")


def test_the_resolver():
    assert BACKENDS == ("ssm_fast", "ssm_vk", "ssm_ref")
    assert {resolve_backend(n) for n in NAMES} == set(BACKENDS)
    assert [resolve_backend(a) for a in ("fast", "vk", "ref")] == list(BACKENDS)
    for bad in [*REFUSED, "", None, 1, b"ssm_vk", "numpy", "numba", "vulkan"]:
        assert lookup(bad) is None
        with pytest.raises(ValueError) as info:
            resolve_backend(bad)
        assert str(info.value) == f"backend: {refusal(bad)}"
    assert refusal("cuda") == "expected one of 'ssm_fast', 'ssm_vk', 'ssm_ref' (or 'fast', 'vk', 'ref'), got 'cuda'"
    with pytest.raises(ValueError, match=r"^model_backend: expected"):
        resolve_backend("x", "model_backend")


def _torch_call(name):
    torch = need("torch")
    import ssm_torch

    a = CASE.args()
    t = [torch.from_numpy(a[k]) for k in ("s", "x", "dt", "A", "B", "C")]
    ssm_torch.ssm_scan(*t, backend=name)
    return ssm_torch.last_where().backend


def _torch_drop_in(name):
    torch = need("torch")
    from ssm_torch.mamba import mamba_chunk_scan_combined

    a = CASE.args()
    x, dt, A = torch.from_numpy(a["x"]), torch.from_numpy(a["dt"]).abs(), torch.from_numpy(a["A"])
    B, C = torch.from_numpy(a["B"]), torch.from_numpy(a["C"])
    mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=4, backend=name)
    import ssm_torch

    return ssm_torch.last_where().backend


def _jax_call(name):
    jax = need("jax")
    import ssm_jax

    a = CASE.args()
    ssm_jax.ssm_scan(*(jax.numpy.asarray(a[k]) for k in ("s", "x", "dt", "A", "B", "C")), backend=name)
    return ssm_jax.last_where().backend


def _cli(name):
    from ssm_cli import backends as bk

    b = bk.load(name)
    assert b.available, b.reason
    return b.name


FRONT_ENDS = {"ssm_torch.ssm_scan": _torch_call, "ssm_torch.mamba": _torch_drop_in, "ssm_jax.ssm_scan": _jax_call,
              "ssm-scan --backend": _cli}


@pytest.mark.vulkan
@pytest.mark.parametrize("front", FRONT_ENDS)
@pytest.mark.parametrize("name", NAMES)
def test_every_front_end_takes_the_names_and_short_names(front, name):
    # the backend that ran (last_where's, after a fallback the one that computed: none here)
    assert FRONT_ENDS[front](name) == resolve_backend(name)


@pytest.mark.parametrize("front", FRONT_ENDS)
@pytest.mark.parametrize("name", REFUSED)
def test_every_front_end_refuses_the_other_names_with_the_same_message(front, name):
    if front == "ssm-scan --backend":
        from ssm_cli.common import UsageError

        with pytest.raises(UsageError) as info:
            _cli(name)
        assert str(info.value).startswith(f"--backend {name}: ") and refusal(name) in str(info.value)
    else:
        with pytest.raises(ValueError) as info:
            FRONT_ENDS[front](name)
        assert str(info.value) == f"backend: {refusal(name)}"
