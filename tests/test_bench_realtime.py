"""`robot-rl bench realtime`, shortened: an edge process whose policy runs in its own process
streams to a learner that trains and publishes, swaps the new weights in while it ticks, and
the soak reports every tick's lateness. What is checked is that the parts work together and
the report says what they did; the numbers themselves are the benchmark's (BENCHMARKS.md)."""

from __future__ import annotations

import pytest

from robot_rl.bench.config import RealtimeBenchConfig
from robot_rl.bench.realtime import soak

pytestmark = pytest.mark.slow


def test_a_short_soak_swaps_weights_from_a_training_learner_and_reports_every_tick(tmp_path):
    cfg = RealtimeBenchConfig(duration_s=6.0, robots=1, swap_every_s=1.0, runners=["process"])
    report = soak("process", cfg, tmp_path / "soak", progress=lambda _msg: None)
    assert report["runner"] == "process" and report["scheduling"] == "realtime" and report["robots"] == 1
    assert report["learner_updates"] > 0 and report["swaps"] >= 1  # trained on the stream, swapped in at the edge
    assert report["ticks"] > 0
    late = report["lateness_ms"]
    assert 0.0 <= late["p50"] <= late["p99"] <= late["max"]
    assert 0 <= report["ticks_over_period"] <= report["ticks_over_5ms"] <= report["ticks"]
    assert (tmp_path / "soak" / "learner.log").read_text().count("published weights") >= 1  # it logged beside them
