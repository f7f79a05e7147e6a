"""bench store: every queued episode reaches the finalized dataset under each commit_batch."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from robot_rl.bench.config import StoreBenchConfig
from robot_rl.bench.store import run_store_bench
from robot_rl.config import ConfigError, load_config

pytestmark = pytest.mark.slow  # processes end to end: started first when the suite runs in parallel


def test_each_setting_stores_every_queued_episode_and_reports_ratios():
    cfg = StoreBenchConfig(episodes=2, batches=[1, 2], writers=["thread", "process"], episode_steps=10)
    report = run_store_bench(cfg, progress=lambda msg: None)
    assert [(row["writer"], row["commit_batch"]) for row in report["rows"]] == [
        ("thread", 1), ("thread", 2), ("process", 1), ("process", 2)]
    for row in report["rows"]:
        assert row["episodes"] == 2 and row["total_s"] >= row["ingest_s"] > 0
        assert 0 < row["trainer_speed"] < 2
    assert report["rows"][0]["speedup_vs_first"] == 1.0


def test_settings_are_checked():
    parsed = load_config(["+bench=store", "bench.batches=[2,4]", "bench.episodes=5", "bench.writers=[process]"]).bench
    assert parsed.batches == [2, 4] and parsed.writers == ["process"]
    with pytest.raises(ConfigError, match="thread and/or process"):
        load_config(["+bench=store", "bench.writers=[fork]"])
    with pytest.raises(ConfigError, match="bench.speed is not a setting"):
        load_config(["+bench=store", "bench.speed=3"])
    with pytest.raises(ConfigError, match="bench.batches"):
        load_config(["+bench=store", "bench.batches=[1,x]"])
    with pytest.raises(ValueError, match=">= 1"):
        StoreBenchConfig(batches=[0])
