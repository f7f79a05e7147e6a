"""`robot-rl bench replan`: settings, the floor reaching the edge, the paired summary, one real tiny run."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from robot_rl.bench import replan
from robot_rl.bench.config import ReplanBenchConfig
from robot_rl.bench.replan import summarize, with_floor
from robot_rl.config import ConfigError, load_config


def test_bench_settings_are_typed_and_the_rest_is_the_config(tmp_path):
    cfg = load_config(["+bench=replan", f"bench.weights=[{tmp_path / 'a'},{tmp_path / 'b'}]", "bench.floors=[0,8,12]",
                       "edge.threshold_margin=3"])
    assert cfg.bench.weights == [str(tmp_path / "a"), str(tmp_path / "b")] and cfg.bench.floors == [0, 8, 12]
    assert cfg.bench.episodes == 80 and cfg.edge.threshold_margin == 3
    assert load_config(["+bench=replan_quick"]).bench.episodes == 4


@pytest.mark.parametrize("override, message", [
    ("bench.floor=10", "bench.floor is not a setting"),
    ("bench.floors=[0,-1]", "floors must be integers >= 0"),
    ("bench.episodes=0", "episodes must be >= 1"),
])
def test_bad_settings_are_refused_before_anything_runs(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(["+bench=replan", override])


def test_missing_weights_are_refused_before_anything_runs():
    cfg = load_config(["+bench=replan", "bench.weights=[/no/such/weights]"])
    with pytest.raises(ConfigError, match="not a directory"):
        replan.run_replan_bench(cfg, cfg.bench)


def test_with_floor_sets_the_edge_floor_on_a_copy():
    cfg = load_config([])
    assert with_floor(cfg, 10).edge.min_request_threshold == 10
    assert cfg.edge.min_request_threshold == 0


def test_every_weights_is_scored_at_every_floor_and_summarized_pairwise(tmp_path, monkeypatch):
    for name in ("start", "final"):
        (tmp_path / name).mkdir()
    seen = []

    def fake_evaluate(weights, job, desc):
        floor, episodes = job.edge.min_request_threshold, len(job.seeds)
        seen.append((weights.name, floor, episodes))
        success = {"start": 0.5, "final": 0.8}[weights.name] + (0.1 if floor else 0.0)
        return {"success": success, "ci95": [success - 0.1, success + 0.1], "episodes": episodes}

    monkeypatch.setattr(replan, "evaluate_weights", fake_evaluate)
    bench = ReplanBenchConfig(weights=[str(tmp_path / "start"), str(tmp_path / "final")], floors=[0, 10], episodes=3)
    report = replan.run_replan_bench(load_config([]), bench)
    assert seen == [("start", 0, 3), ("start", 10, 3), ("final", 0, 3), ("final", 10, 3)]
    assert report["mean"][0] == pytest.approx(0.65) and report["vs_first_floor"][10] == pytest.approx(0.1)
    assert summarize(report["scores"], [10, 0])["vs_first_floor"][0] == pytest.approx(-0.1)


def test_a_real_tiny_policy_runs_through_the_edge_at_each_floor(tmp_path, monkeypatch, capsys):
    from tests.learner_helpers import tiny_sim_weights

    _, cfg = tiny_sim_weights(tmp_path / "weights", monkeypatch)
    report = replan.run_replan_bench(cfg, ReplanBenchConfig(weights=[str(tmp_path / "weights")], floors=[0, 4],
                                                            episodes=1))
    cells = report["scores"][str(tmp_path / "weights")]
    assert set(cells) == {0, 4} and all(cell["episodes"] == 1 for cell in cells.values())
    assert report["vs_first_floor"][0] == 0.0
    replan.print_table(report)
    assert "floor 4" in capsys.readouterr().out
