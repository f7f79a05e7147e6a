"""bench store: every queued episode reaches the finalized dataset under each commit_batch."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from robot_rl.bench.store import StoreBenchConfig, parse_overrides, run_store_bench


def test_each_setting_stores_every_queued_episode_and_reports_ratios():
    cfg = StoreBenchConfig(episodes=3, batches=(1, 3), writers=("thread", "process"), episode_steps=20)
    report = run_store_bench(cfg, progress=lambda msg: None)
    assert [(row["writer"], row["commit_batch"]) for row in report["rows"]] == [
        ("thread", 1), ("thread", 3), ("process", 1), ("process", 3)]
    for row in report["rows"]:
        assert row["episodes"] == 3 and row["total_s"] >= row["ingest_s"] > 0
        assert 0 < row["trainer_speed"] < 2
    assert report["rows"][0]["speedup_vs_first"] == 1.0


def test_overrides_are_checked():
    parsed = parse_overrides(["bench.batches=[2,4]", "bench.episodes=5", "bench.writers=[process]"], StoreBenchConfig())
    assert parsed.batches == (2, 4) and parsed.writers == ("process",)
    with pytest.raises(ValueError, match="thread and/or process"):
        parse_overrides(["bench.writers=[fork]"], StoreBenchConfig())
    with pytest.raises(SystemExit, match="unknown override"):
        parse_overrides(["bench.speed=3"], StoreBenchConfig())
    with pytest.raises(SystemExit, match="whole numbers"):
        parse_overrides(["bench.batches=[1,x]"], StoreBenchConfig())
    with pytest.raises(ValueError, match=">= 1"):
        StoreBenchConfig(batches=(0,))
