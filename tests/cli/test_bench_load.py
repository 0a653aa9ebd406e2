"""ssm-scan bench reports the load it ran under and warns when the machine was busy."""

from __future__ import annotations

import json
import subprocess
import sys

from children import child_env

from ssm_cli import bench


def _load(avg, cores=2):
    return {"loadavg_1min": avg, "cores": cores}


def test_busy_says_why_only_when_other_work_shared_the_cores():
    assert bench.busy(_load(0.2), _load(1.4)) is None            # idle, then the benchmark's own threads
    assert "busy" in bench.busy(_load(1.0), _load(1.2))          # half the cores taken before the run
    assert "load average 0.30 before, 3.10 after" in bench.busy(_load(0.3), _load(3.1))
    assert bench.busy(_load(None), _load(None)) is None          # no load average on this OS
    assert bench.busy(_load(7.0, cores=16), _load(9.0, cores=16)) is None


def test_bench_json_records_the_load():
    run = subprocess.run([sys.executable, "-m", "ssm_cli.main", "bench", "--shape", "demo", "--backend", "ssm_ref",
                          "--pass", "fwd", "--reps", "1", "--json", "-"], capture_output=True, text=True,
                         env=child_env(), timeout=600, check=False)
    assert run.returncode == 0, run.stderr
    rep = json.loads(run.stdout)
    ld = rep["load"]
    assert ld["before"]["cores"] >= 1 and ld["before"]["loadavg_1min"] >= 0
    assert ("warning: the machine was busy" in run.stderr) == bool(ld["busy"])
