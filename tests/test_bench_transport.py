"""`robot-rl bench transport`'s weight fan-out, shortened: every robot loads every version, and the
report says how much CPU the edges and the learner spent on each (the numbers are BENCHMARKS.md's)."""

from __future__ import annotations

import pytest

from robot_rl.bench.config import TransportBenchConfig
from robot_rl.bench.transport import zmq_fanout

pytestmark = pytest.mark.slow


def test_a_short_fan_out_reaches_every_robot_and_reports_the_cpu_each_version_took(tmp_path):
    cfg = TransportBenchConfig(fanout_mb=2.0, swaps=2, swap_gap_s=0.2, swap_timeout_s=60.0)
    row = zmq_fanout(2, cfg, tmp_path)
    assert row["swaps"] == 2 and 0.0 < row["loaded_p50_s"] <= row["loaded_p95_s"] < 60.0
    # Two robots fetched, hashed and loaded 2 MB twice; the learner serialised and served it.
    assert row["edge_cpu_s_per_version"] > 0.0 and row["learner_cpu_s_per_version"] > 0.0
    spent = row["edge_cpu_s_per_version"] + row["learner_cpu_s_per_version"]
    assert row["cpu_floor_s"] == pytest.approx(spent / row["cores"])
