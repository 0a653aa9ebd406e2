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
