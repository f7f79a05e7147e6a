"""bench store: every queued episode reaches the finalized dataset under each commit_batch and writer."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from robot_rl.bench.config import StoreBenchConfig
from robot_rl.bench.store import run_store_bench
from robot_rl.config import ConfigError, load_config

pytestmark = pytest.mark.slow  # processes end to end: started first when the suite runs in parallel


def test_each_setting_stores_every_queued_episode_and_reports_ratios():
    cfg = StoreBenchConfig(episodes=2, batches=[1, 2], writers=["thread"], episode_steps=10)
    report = run_store_bench(cfg, progress=lambda msg: None)
    assert [(row["writer"], row["commit_batch"]) for row in report["rows"]] == [("thread", 1), ("thread", 2)]
    first = report["rows"][0]["s_per_episode"]
    for row in report["rows"]:
        assert row["episodes"] == 2 and row["s_per_episode"] == pytest.approx(row["total_s"] / 2, abs=1e-3)
        assert row["speedup_vs_first"] == pytest.approx(first / row["s_per_episode"], abs=0.01)
        assert row["probe_speed"] > 0  # the trainer's proxy kept training beside the writer


def test_the_writer_in_its_own_process_leaves_every_queued_episode_readable_in_the_dataset(tmp_path):
    from robot_rl.bench.store import writer_seconds
    from robot_rl.data.reader import load_episode_arrays

    cfg = StoreBenchConfig(episodes=2, batches=[2], writers=["process"], episode_steps=10)
    writer_seconds(2, cfg, tmp_path, "process")
    episodes = load_episode_arrays(tmp_path / "dataset", "local/robot_rl_replay")
    assert [len(e["action"]) for e in episodes] == [10, 10]


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
