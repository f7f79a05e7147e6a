"""`robot-rl bench serve`: settings, and one real short run against a policy server in its own process."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from robot_rl.bench.serve import print_table, run_serve_bench
from robot_rl.config import ConfigError, load_config


def test_bench_settings_are_typed_and_the_server_settings_are_serve():
    cfg = load_config(["+bench=serve", "bench.robots=[2,8]", "serve.batch_window_ms=2"])
    assert cfg.bench.robots == [2, 8] and cfg.bench.serial and cfg.serve.batch_window_ms == 2.0
    assert load_config(["+bench=serve_quick"]).bench.robots == [1, 4]


def test_bad_settings_are_refused_before_anything_runs():
    with pytest.raises(ConfigError, match="robots >= 1"):
        load_config(["+bench=serve", "bench.robots=[0]"])
    with pytest.raises(ConfigError, match="lerobot_robots >= 1"):
        load_config(["+bench=serve", "bench.lerobot_robots=[]"])


@pytest.mark.slow(order=1)
def test_two_robots_are_served_in_one_forward_and_a_published_version_reaches_them(capsys):
    cfg = load_config(["+bench=serve", "bench.robots=[2]", "bench.seconds=2", "bench.swaps=1", "bench.serial=false",
                       "serve.batch_window_ms=200"])
    report = run_serve_bench(cfg, cfg.bench)
    row = report["robots"][2]
    assert row["chunks_per_s"] > 0 and row["mean_batch"] > 1.0  # the two robots shared forwards
    assert row["dropped_late"] == 0 and row["latency_p95_s"] >= row["latency_p50_s"] > 0
    assert len(report["swap_to_serve_s"]) == 1  # version 1 reached the robot
    # what the target allows it: one forward plus that robot's request interval (NaN without chunks)
    assert report["swap_to_serve_bound_s"] > row["compute_per_chunk_s"]
    assert report["serial"] == {} and report["bytes_per_request"]["224x224"] > 0
    assert report["capacity"][2]["robots"] > 0  # robots asking back to back were answered
    # today's network path for the same weights: the version reached an edge's policy process
    assert report["hot_swap"]["swaps"] == 1 and report["hot_swap_p95_s"] > 0
    print_table(report)
    assert "| 2 | batched |" in capsys.readouterr().out


@pytest.mark.slow(order=1)
def test_lerobot_baseline_runs_lerobots_server_and_clients_and_ours_on_the_same_act(capsys):
    cfg = load_config(["+bench=serve", "bench.fleet=false", "bench.lerobot_baseline=true",
                       "bench.lerobot_robots=[1,2]", "bench.lerobot_seconds=1.5"])
    report = run_serve_bench(cfg, cfg.bench)
    assert report["robots"] == {} and report["serial"] == {}  # only the baseline ran
    baseline = report["lerobot_baseline"]
    alone = baseline["lerobot"][1]
    assert "error" not in alone, alone.get("error")
    assert alone["chunks_per_s"] > 0 and alone["foreign_chunks"] == 0  # one robot: its own chunks only
    assert alone["latency_p95_s"] >= alone["latency_p50_s"] > 0
    # LeRobot's request is the raw frames pickled; ours the same frames as JPEG
    assert alone["bytes_per_request"] > baseline["raw_frames_bytes"] > baseline["ours"][1]["bytes_per_request"]
    shared = baseline["lerobot"][2]
    assert "error" not in shared and len(shared["chunks_per_robot"]) == 2  # two clients, measured, not hung
    assert baseline["ours"][1]["chunks_per_s"] > 0 and baseline["ours"][2]["chunks_per_s"] > 0
    print_table(report)
    assert "| 2 | lerobot |" in capsys.readouterr().out
