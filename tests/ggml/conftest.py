"""The ggml tests need a ggml build: the folder in SSM_GGML_LIB, else the one tools/build_ggml.sh
makes by default (build/ggml/sdist-0.0.45/lib). Without one they skip with the reason -- and fail
instead under SSM_REQUIRE_GGML=1, as in CI (`make test` builds ggml first).

The tests of state snapshots (test_ggml_snapshots.py) need a build whose ggml_ssm_scan takes K:
the folder in SSM_GGML_K_LIB, else build/ggml/sdist-llama-cpp-python-0.3.36/lib (what
`tools/build_ggml.sh --sdist llama-cpp-python==0.3.36` makes; `make ggml` builds both); skipped
without one, failed under SSM_REQUIRE_GGML=1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from known_defects import leaves_empty_scan_unwritten

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BUILD = REPO / "build" / "ggml" / "sdist-0.0.45" / "lib"
DEFAULT_K_BUILD = REPO / "build" / "ggml" / "sdist-llama-cpp-python-0.3.36" / "lib"
REQUIRE_ENV = "SSM_REQUIRE_GGML"
K_ENV = "SSM_GGML_K_LIB"
HOW = "build one with tools/build_ggml.sh and set SSM_GGML_LIB to the folder it prints"
HOW_K = ("build one with tools/build_ggml.sh --sdist llama-cpp-python==0.3.36 (or --tree DIR, a ggml checkout "
         f"of 2026-08-14 or later) and set {K_ENV} to the folder it prints")


def _lib_folder(env: str = "SSM_GGML_LIB", default: Path = DEFAULT_BUILD) -> str | None:
    value = os.environ.get(env)
    if value:
        return value
    return str(default) if any(default.glob("libggml*")) else None


def _missing(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV, "").strip() == "1":
        pytest.fail(f"{reason}; {REQUIRE_ENV}=1: these tests must run here", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def ggml_lib() -> str:
    """The folder of the ggml build the tests use (the environment's SSM_GGML_LIB is set to it)."""
    folder = _lib_folder()
    if folder is None:
        _missing(f"no ggml build ({HOW})")
    os.environ["SSM_GGML_LIB"] = folder
    return folder


@pytest.fixture(scope="session")
def ggml_k_lib() -> str:
    """The folder of a ggml build whose ggml_ssm_scan takes K (SSM_GGML_K_LIB, else the default)."""
    folder = _lib_folder(K_ENV, DEFAULT_K_BUILD)
    if folder is None:
        _missing(f"no ggml build with K ({HOW_K})")
    return folder


@pytest.fixture
def ggml_k(ggml_k_lib):
    """ssm_ggml on the K build's CPU device, calls in a worker process (this one may hold the other
    build already: one build per process, ssm_ggml.lib.load); reset afterwards."""
    import ssm_ggml

    ssm_ggml.use("CPU", lib=ggml_k_lib, isolate=True)
    yield ssm_ggml
    ssm_ggml.close()


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


@pytest.fixture
def empty_scan_unwritten(ggml_isolated) -> bool:
    """Whether the session's build (SSM_GGML_LIB) has the empty scan's defect (EMPTY_SCAN_UNWRITTEN),
    asked in a worker: the tests that run the CLI load no build in this process."""
    return leaves_empty_scan_unwritten(ggml_isolated)
