"""benchmarks/vk_mamba3.py at lavapipe's scale, so that the GPU run does not find it broken: each
plan's kernels timed and summed, and under a lowered maxStorageBufferRange the chunked kernels in
windows (of sequences where a sequence's scratch fits, of tokens where it does not), or the reason
the device does not take the call."""

from __future__ import annotations

import re
import sys

import pytest
from children import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import vk_mamba3

pytestmark = pytest.mark.vulkan


def test_the_windows_are_timed_and_named(capsys, monkeypatch):
    # (the script times its dispatches by replacing ssm_vk.runtime.Sequence for the process: put
    # back after the test, for the other tests of this worker)
    from ssm_vk import runtime

    monkeypatch.setattr(runtime, "Sequence", runtime.Sequence)
    # S = 2, T = 128, H = 4, N = 128, P = 32: one sequence's queries (256 KiB) outweigh all of y
    # (128 KiB), so 0.4 MiB takes one sequence per window, 0.2 MiB windows of one sequence's tokens,
    # and 0.1 MiB not even y
    vk_mamba3.main(["--shapes", "2x128", "--H", "4", "--P", "32", "--N", "128", "--F", "4", "--pass", "fwd",
                    "--reps", "1", "--warm-s", "0", "--binding-mib", "0.4,0.2,0.1"])
    out = capsys.readouterr().out
    rows = {m.group(1): float(m.group(3)) for m in
            re.finditer(r"^  (chunked[^:(]*?|token-sequential) \(([^)]*)\): kernels ([\d.]+) ms", out, re.M)}
    assert set(rows) == {"chunked", "chunked, binding 0.4 MiB", "chunked, binding 0.2 MiB", "token-sequential"}, out
    assert all(v > 0 for v in rows.values())
    assert "(mamba3_chunked, 2 windows of sequences)" in out and "windows of tokens)" in out, out
    assert "chunked, binding 0.1 MiB: not on the device: " in out, out
