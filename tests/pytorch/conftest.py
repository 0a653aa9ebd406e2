"""Fixtures of the PyTorch tests: mamba_ssm's reference functions (tests/pytorch/mamba_reference.py),
skipped when they cannot be had -- failed instead under SSM_REQUIRE_TORCH=1, as in CI. (Each
test module skips itself when torch is not installed: tests/pytorch/torchreq.py.)"""

import pytest
from torchreq import missing


@pytest.fixture(scope="session")
def mamba_ref(request):
    import mamba_reference as mr

    try:
        root = mr.fetch(mr.cache_dir(request.config.cache))
        return mr.load(root)
    except mr.Unavailable as e:
        missing(f"mamba_ssm's reference functions are not available: {e}")
