"""benchmarks/vk_gpu_check.warm, the warm-up every GPU benchmark times after: its load must
follow the first call, which may build pipelines for longer than the warm-up itself (an H100's
first 1 GiB forward was timed at 345-525 MHz when the warm-up's second went to the build)."""

from __future__ import annotations

import sys
import time

from children import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from vk_gpu_check import warm


def test_the_load_lasts_its_seconds_after_a_slow_first_call():
    calls = []

    def fn():
        calls.append(time.perf_counter())
        if len(calls) == 1:
            time.sleep(0.3)   # the first call: longer than the warm-up

    warm(fn, 0.2)
    assert len(calls) >= 3
    assert calls[-1] - (calls[0] + 0.3) >= 0.2 - 0.05   # calls went on for the seconds after the first


def test_a_zero_warm_up_still_makes_the_first_call():
    calls = []
    warm(lambda: calls.append(1), 0.0)
    assert calls == [1]
