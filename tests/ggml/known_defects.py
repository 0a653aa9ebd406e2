"""The defects of ggml's own SSM_SCAN that the tests know, by the ggml version of the build:
there the tests require ssm_ggml, ``ssm-scan check`` and ``fuzz`` to report them; on a build of
any other version they require the spec."""

from __future__ import annotations

# The ggml versions whose CPU kernel never writes the final states of an empty scan (T = 0, where
# the spec says states = s[ids]; docs/PORTING.md, "Reading the reports"): 0.15.3 (ggml-python
# 0.0.45's sdist, CI's build), 0.21.0 (ggml-org/ggml d99724f2), 0.25.3 (llama-cpp-python 0.3.36's
# sdist). A ggml of another version that still has the defect: add its version here.
EMPTY_SCAN_UNWRITTEN = frozenset({"0.15.3", "0.21.0", "0.25.3"})


def leaves_empty_scan_unwritten(ssm_ggml) -> bool:
    """Whether the build ``ssm_ggml`` uses is one of EMPTY_SCAN_UNWRITTEN's."""
    return ssm_ggml.build_info()["build"]["version"] in EMPTY_SCAN_UNWRITTEN
