"""benchmarks/vk_long.py, the one GPU run of arrays beyond one allocation, at lavapipe's scale with
the limits lowered: x really is held in pieces at the larger size, every call that supports()
takes runs on the device and agrees with ssm_fast and the float64 oracle, a backward over the
(lowered) heap is recorded as refused with the reason rather than run on the CPU (and runs at
the smaller N of ``--extra``), and the JSON holds the rates against the smallest size's -- so
that the GPU run, which happens once, does not find the script broken."""

from __future__ import annotations

import json
import sys

import pytest
from children import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import vk_long

pytestmark = pytest.mark.vulkan


def test_a_pieced_run_checks_out_and_a_refused_backward_is_recorded(tmp_path):
    out = tmp_path / "long.json"
    rc = vk_long.main(["--sizes", "256,2048", "--H", "4", "--P", "16", "--N", "16", "--reps", "1",
                       "--limits-mib", "0.125,0.0625,2", "--extra", "2048/4", "--threads", "2", "--warm-s", "0",
                       "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0 and not doc["failed"], doc["failed"]
    rows = {(r["T"], r["pass"], r["variant"]): r for r in doc["rows"] if r["N"] == 16}
    big = rows[(2048, "fwd", "default")]
    assert big["where"] == "Vulkan0" and big["pieces"]["x"] > 1 and big["pieces"]["y"] > 1
    assert big["copied_in"] == []   # to_device cuts x where the forward's windows cut it
    assert all(v < 1e-4 for v in big["errors"].values()) and "y_whole_vs_fast" in big["errors"]
    assert "rate_vs_base" in big and big["base_T"] == 256
    small = rows[(256, "bwd", "default")]
    assert small["where"] == "Vulkan0" and "d_x_prefix_vs_f64" in small["errors"]
    refused = rows[(2048, "bwd", "default")]
    assert refused["supports"] is False and "heap" in refused["reason"] and "where" not in refused
    extra = [r for r in doc["rows"] if r["N"] == 4]   # --extra: the backward alone, at a smaller N it takes
    assert [(r["T"], r["pass"], r["where"]) for r in extra] == [(2048, "bwd", "Vulkan0")]
    assert extra[0]["pieces"]["d_x"] > 1 and extra[0]["errors"]["d_x_whole_vs_fast"] < 1e-4


def test_the_token_windows_backward_is_rated_against_a_backward_that_recomputes_too(tmp_path):
    # at the larger size the chunked backward runs in token windows, which recompute their chunk
    # tables; at the smaller it binds its forward's: the smaller size is timed with KEEP_STATES=0
    # as well, and the larger size's rate is against that row, not the one that kept the tables
    out = tmp_path / "long.json"
    rc = vk_long.main(["--sizes", "256,2048", "--H", "4", "--P", "16", "--N", "16", "--reps", "1",
                       "--limits-mib", "0.5,0.25", "--extra", "", "--threads", "2", "--no-ref", "--warm-s", "0",
                       "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0 and not doc["failed"], doc["failed"]
    rows = {(r["T"], r["pass"], r["variant"]): r for r in doc["rows"]}
    kept, recomputed = rows[(256, "bwd", "default")], rows[(256, "bwd", "KEEP_STATES=0")]
    big = rows[(2048, "bwd", "default")]
    assert kept["kept_tables"] and not recomputed["kept_tables"] and not big.get("kept_tables")
    assert big["kept_starts"]   # (its forward, on the same DeviceArrays, kept the windows' starting states)
    assert big["kernels"] == recomputed["kernels"] == kept["kernels"]
    assert big["rate_vs_base"] == pytest.approx(big["updates_per_s"] / recomputed["updates_per_s"])
    assert (2048, "bwd", "KEEP_STATES=0") not in rows
