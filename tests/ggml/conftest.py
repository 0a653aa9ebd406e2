"""The ggml tests need a ggml build: the folder in SSM_GGML_LIB, else the one tools/build_ggml.sh
makes by default (build/ggml/sdist-0.0.45/lib). Without one they skip with the reason -- and fail
instead under SSM_REQUIRE_GGML=1, as in CI (`make test` builds ggml first)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BUILD = REPO / "build" / "ggml" / "sdist-0.0.45" / "lib"
REQUIRE_ENV = "SSM_REQUIRE_GGML"
HOW = "build one with tools/build_ggml.sh and set SSM_GGML_LIB to the folder it prints"


def _lib_folder() -> str | None:
    env = os.environ.get("SSM_GGML_LIB")
    if env:
        return env
    return str(DEFAULT_BUILD) if any(DEFAULT_BUILD.glob("libggml*")) else None


@pytest.fixture(scope="session")
def ggml_lib() -> str:
    """The folder of the ggml build the tests use (the environment's SSM_GGML_LIB is set to it)."""
    folder = _lib_folder()
    if folder is None:
        reason = f"no ggml build ({HOW})"
        if os.environ.get(REQUIRE_ENV, "").strip() == "1":
            pytest.fail(f"{reason}; {REQUIRE_ENV}=1: these tests must run here", pytrace=False)
        pytest.skip(reason)
    os.environ["SSM_GGML_LIB"] = folder
    return folder


@pytest.fixture
def ggml(ggml_lib):
    """ssm_ggml on ggml's CPU device, calls in this process; reset afterwards."""
    import ssm_ggml

    ssm_ggml.use("CPU", lib=ggml_lib)
    yield ssm_ggml
    ssm_ggml.close()


@pytest.fixture
def ggml_isolated(ggml_lib):
    """ssm_ggml on ggml's CPU device, every call in a worker process."""
    import ssm_ggml

    ssm_ggml.use("CPU", lib=ggml_lib, isolate=True)
    yield ssm_ggml
    ssm_ggml.close()
