"""Fixtures of the PyTorch tests: mamba_ssm's reference functions (tests/pytorch/mamba_reference.py),
skipped when they cannot be had -- failed instead under SSM_REQUIRE_TORCH=1, as in CI. (Each
test module skips itself when torch is not installed: tests/pytorch/torchreq.py.)"""

import os

import pytest
from torchreq import missing


@pytest.fixture(scope="session")
def mamba_ref(request, tmp_path_factory):
    import mamba_reference as mr

    cache = getattr(request.config, "cache", None)   # None under -p no:cacheprovider: this session's folder
    try:
        if cache is None and not os.environ.get("SSM_TEST_CACHE"):
            root = mr.fetch(tmp_path_factory.mktemp("mamba_ssm"))
        else:
            root = mr.fetch(mr.cache_dir(cache))
        return mr.load(root)
    except mr.Unavailable as e:
        missing(f"mamba_ssm's reference functions are not available: {e}")


@pytest.fixture
def ctx_mapped():
    """The Vulkan context, where the host stand-in of CUDA's side can read its exported memory
    (lavapipe's, host visible); skipped elsewhere (the GPU's side is tests/pytorch/test_cuda_tensors.py)."""
    from ssm_vk import runtime as rt
    from ssm_vk.runtime import external

    ctx = rt.get_context()
    ok, why = external.export_support(ctx)
    if not ok:
        pytest.skip(f"no exportable memory here: {why}")
    if ctx.info.type != "cpu":
        pytest.skip("the host stand-in reads the exported memory through its host mapping (lavapipe's)")
    return ctx


@pytest.fixture
def side(ctx_mapped):
    """A host stand-in for CUDA's side of the arena (bridgecheck.HostSide), its arena closed after."""
    from bridgecheck import HostSide

    s = HostSide()
    yield s
    arena = ctx_mapped.owned.extension(f"torch-arena:{s.key}")
    if arena is not None:
        arena.close()
